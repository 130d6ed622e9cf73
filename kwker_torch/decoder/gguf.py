"""``KwkDecoder.from_gguf``: a llama.cpp GGUF file run as it is, its quantized tensors repacked into the
decoder's formats without changing a value, not dequantized to float32 and quantized again.

    dec = KwkDecoder.from_gguf("gemma-3-270m-q4_k_m.gguf", max_batch=4)
    dec.info["gguf"]   # which tensors came over exactly, and which were converted (and to what)

What each GGUF type becomes (``rust/src/quant/gguf.rs`` states the exactness contract):
- Q8_0 -> ``q8_0``, Q5_0 -> ``q5_0``, Q4_0 -> ``q4_0`` (their codes under one f16 scale per 32 values, in the
  file's own bits per weight: 8.5, 5.5, 4.5), Q4_1 -> ``q4``, Q4_K -> ``q4k``: every value the file's, bit for
  bit; parts of one fused matrix in Q4_0 / Q5_0 / Q8_0 stack in the widest of their formats, exactly (a Q4_0
  q beside Q5_0 k and v: ``q5_0``; beside a Q8_0 part: ``q8_0``);
- Q6_K -> ``q6_k`` (6-bit codes, an i8 scale per 16 values under an f16 one per 256: 6.5625 bits, as the file);
- F32 / F16 / BF16 -> kept as float (F16 widened exactly to f32; bf16-valued f32 stored as bf16);
- any other type (Q5_1, Q2_K, Q3_K, Q5_K, IQ*, ...) is dequantized by the ``gguf`` package and quantized into
  the nearest format here by bits (q4k up to 4.5 bits, q6k up to 6.6, else q8_0), with one warning naming them;
- a fused projection whose parts come in types no one format holds (a Q4_K_M file's q/k in Q4_K beside v in
  Q6_K) keeps each run of rows in its own format, exactly (stored as ``q4k+q6_k``: ``rust/src/decoder/parts.rs``;
  counted in ``info["parts_matrices"]``); only where a run is not whole 16-row panels are the parts quantized
  together into the widest of their formats, named in ``info["gguf"]["converted"]`` (the real SmolLM2 and Gemma 3
  files have no mixed parts: Gemma's Q5_0 q/k beside a Q8_0 v stack exactly in ``q8_0``).

The model's config and tokenizer come from the file through transformers (as ``from_pretrained(...,
gguf_file=)`` reads them); the family mapping (``families/``) is the one ``from_hf`` uses, run on a model
whose matrices are never materialised: each matrix parameter holds, per row, a number naming its tensor and
row, so the mapping's own stacking (q/k/v, gate/up) and transformers' row reordering of llama.cpp's q/k
layout (``TENSOR_PROCESSORS``) say which file rows each decoder row is. A mapping that changes a matrix's
values (rather than stacking rows) is refused by name. The file is memory-mapped, so resident memory is
about the file's size plus the decoder's copy.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from . import families, native, plan
from .build import _limits, bf16_exact
from .common import CHUNK_ROWS, eos_ids, kv_cache_for
from .gguf_reader import reading

log = logging.getLogger("kwker_torch")

# A matrix row's marker: tensor index * ROW_SPAN + row (exact in float64 for any vocabulary below 2^20).
ROW_SPAN = 1 << 20
FLOAT_TYPES = ("F32", "F16", "BF16")


@contextlib.contextmanager
def _params_on_meta() -> Iterator[None]:
    """Modules built inside get their parameters on the meta device (no memory, no initialisation) and their
    buffers (rotary frequencies) on the CPU, computed as usual."""
    register = torch.nn.Module.register_parameter

    def on_meta(module: torch.nn.Module, name: str, param: Any) -> None:
        register(module, name, param)
        if param is not None and param.device.type != "meta":  # a tied weight re-registered stays itself
            kind = type(module._parameters[name])
            module._parameters[name] = kind(module._parameters[name].to("meta"), requires_grad=False)

    torch.nn.Module.register_parameter = on_meta  # type: ignore[method-assign]
    try:
        yield
    finally:
        torch.nn.Module.register_parameter = register  # type: ignore[method-assign]


def _field(reader: Any, key: str) -> Any:
    f = reader.fields.get(key)
    if f is None:
        return None
    return bytes(f.parts[f.data[0]]).decode() if f.types and f.types[0].name == "STRING" else f.parts[f.data[0]][0]


def _nearest(type_name: str) -> str:
    """The format here nearest a ggml type by bits per weight (types without an exact repack)."""
    import gguf

    qt = gguf.GGMLQuantizationType[type_name]
    size, bytes_ = gguf.GGML_QUANT_SIZES[qt]
    bits = 8 * bytes_ / size
    return "q4k" if bits <= 4.5 else "q6k" if bits <= 6.6 else "q8_0"


class _File:
    """The GGUF file's tensors by name, each matrix's row order as transformers reads it into the HF model."""

    def __init__(self, path: str, reader: Any) -> None:
        from transformers import modeling_gguf_pytorch_utils as hf_gguf
        from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS, TensorProcessor

        self.reader = reader
        self.tensors = {t.name: t for t in self.reader.tensors}
        self.arch = _field(self.reader, "general.architecture")
        parsed = hf_gguf.load_gguf_checkpoint(path, return_tensors=False)  # the one `reading` parsed
        self.processor = TENSOR_PROCESSORS.get(self.arch, TensorProcessor)(config=parsed.get("config", {}))
        self._orders: dict[str, tuple[np.ndarray, bool]] = {}

    def values(self, name: str) -> np.ndarray:
        """A tensor's values as float32, in HF's layout and order (transformers' processing applied)."""
        import gguf

        t = self.tensors[name]
        w = gguf.dequantize(t.data, t.tensor_type).astype(np.float32)
        return np.ascontiguousarray(self.processor.process(weights=w, name=name).weights, dtype=np.float32)

    def row_order(self, name: str, rows: int) -> tuple[np.ndarray, bool]:
        """For each HF row of a matrix, the file row it is (llama.cpp permutes Llama's q/k rows), and whether
        transformers transposes the matrix (GPT-2's Conv1D layout)."""
        if name not in self._orders:
            marker = np.arange(rows, dtype=np.float64)[:, None]
            out = np.asarray(self.processor.process(weights=marker, name=name).weights)
            order = out.reshape(rows).astype(np.int64)
            if out.shape not in ((rows, 1), (1, rows)) or not np.array_equal(np.sort(order), np.arange(rows)):
                raise ValueError(f"kwker: transformers' GGUF reader changes {name}'s values, not only its row order; "
                                 "this file cannot be repacked as it is (load it with transformers and use from_hf)")
            self._orders[name] = (order, out.shape == (1, rows) and rows > 1)
        return self._orders[name]


def _names(model: torch.nn.Module, file: _File) -> dict[str, str]:
    """HF parameter name -> GGUF tensor name, by gguf-py's name table for the file's architecture (as
    transformers' ``get_gguf_hf_weights_map``, whose walk over every submodule rebuilds the table hundreds
    of times: seconds; that walk is used only for names the top-level table does not know)."""
    import gguf

    arch = next((k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == file.arch), None)
    if arch is None:
        raise ValueError(f"kwker: the gguf package does not know the file's architecture {file.arch!r}")
    table = gguf.get_tensor_name_map(arch, model.config.num_hidden_layers)
    out: dict[str, str] = {}
    for hf_name, _ in model.named_parameters():
        base, _, suffix = file.processor.preprocess_name(hf_name).rpartition(".")
        g = table.get_name(base)
        if g is None:
            from transformers.modeling_gguf_pytorch_utils import get_gguf_hf_weights_map

            return {hf: g for g, hf in get_gguf_hf_weights_map(model, file.processor).items()}
        out[hf_name] = f"{g}.{suffix}"
    return out


def load_tokenizer(path: str | os.PathLike[str]) -> Any:
    """The tokenizer and chat template a GGUF file carries (transformers' reader, through ``reading``)."""
    from transformers import AutoTokenizer

    path = os.fspath(path)
    folder, fname = os.path.split(os.path.abspath(path))
    with reading(path):
        return AutoTokenizer.from_pretrained(folder, gguf_file=fname)


def _skeleton(cfg: Any) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    with _params_on_meta():
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    return model.eval()


def from_gguf(cls: Any, path: str | os.PathLike[str], max_batch: int = 1, max_context: int | str | None = None,
              kv_cache: str | None = None) -> Any:  # fmt: skip
    from transformers import AutoConfig

    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"kwker: no GGUF file at {path!r}")
    with open(path, "rb") as f:
        if f.read(4) != b"GGUF":
            raise ValueError(f"kwker: {path!r} is not a GGUF file (it does not start with the GGUF magic bytes)")
    folder, fname = os.path.split(os.path.abspath(path))
    with reading(path) as reader:
        try:
            cfg = AutoConfig.from_pretrained(folder, gguf_file=fname)
        except ValueError as exc:
            raise ValueError(f"kwker: transformers cannot read {fname}'s architecture ({exc})") from exc
        file = _File(path, reader)
    model = _skeleton(cfg)
    if not families.maps(model):
        families.family_of(model)  # raises: names the architecture and what runs it
    to_file = _names(model, file)
    owners: dict[int, list[tuple[torch.nn.Module, str]]] = {}
    for mod in model.modules():
        for n, prm in mod._parameters.items():
            if prm is not None:
                owners.setdefault(id(prm), []).append((mod, n))
    mats: list[tuple[str, int]] = []  # marker index -> (file tensor name, rows)
    for hf_name, p in list(model.named_parameters()):
        g = to_file.get(hf_name)
        if g is None or g not in file.tensors:
            raise ValueError(f"kwker: {fname} has no tensor for the model's {hf_name} (looked for {g!r})")
        if p.dim() == 1:
            value = torch.from_numpy(file.values(g).reshape(p.shape))
        elif p.dim() == 2:
            rows, cols = (int(d) for d in file.tensors[g].shape[::-1])  # as the file stores them
            _, transposed = file.row_order(g, rows)  # GPT-2's Conv1D parameters are the file's matrices transposed
            want = [cols, rows] if transposed else [rows, cols]
            if rows >= ROW_SPAN or list(p.shape) != want:
                raise ValueError(f"kwker: {fname}'s {g} has shape {[rows, cols]}, "
                                 f"the model's {hf_name} {list(p.shape)}")  # fmt: skip
            marks = len(mats) * ROW_SPAN + torch.arange(rows, dtype=torch.float64)
            value = marks[None, :] if transposed else marks[:, None]
            mats.append((g, rows))
        else:
            raise ValueError(f"kwker: {hf_name} is a {p.dim()}-D tensor (a mixture's stacked experts); GGUF files "
                             "of mixtures are not run as they are yet: load the model with transformers and use "
                             "KwkDecoder.from_hf")  # fmt: skip
        new = torch.nn.Parameter(value, requires_grad=False)
        for mod, n in owners[id(p)]:  # every module sharing it (a tied lm_head) gets the same one
            mod._parameters[n] = new
    fam, recipe = families.read(model)
    # The default cache follows the weights: q8 beside quantized matrices (as from_hf's int4 / int8), else f32.
    quantized = any(file.tensors[g].tensor_type.name not in FLOAT_TYPES for g, _ in mats)
    kv_cache = kv_cache_for("int4" if quantized else "preserve", kv_cache)
    max_batch, max_context = _limits(model, recipe, max_batch, max_context, kv_cache)
    wanted = native.recipe_tensors(recipe)
    sources = {s.key: s for s in fam.tensors(model, recipe)}
    builder = native.Builder(recipe, max_batch, max_context, CHUNK_ROWS, kv_cache)
    info: dict[str, Any] = {
        "family": fam.name, "precision": "gguf", "calibrated": False, "tied_embeddings": recipe["tied_embeddings"],
        "formats": {}, "plan": f"as stored in {fname}",
        "gguf": {"file": path, "exact": [], "converted": {}},
        **{f"{q}_matrices": 0 for q in ("bf16", "f32", "parts", *plan.QUANT)},
    }  # fmt: skip
    bits = [0.0, 0.0]
    requantized: set[str] = set()
    for t in wanted:
        key = (t["name"], t["layer"], t["expert"])
        src = sources.get(key)
        if src is None:
            raise ValueError(f"kwker: the {fam.name} mapping did not give {t['name']} of layer {t['layer']}")
        if not native.TENSORS[t["name"]]["matrix"]:
            builder.set(t["name"], t["layer"], src.value.detach().float().contiguous())
            continue
        parts = _parts(src.value, mats, t["name"], fam.name)
        stored, exact, note, run_rows = _put_matrix(builder, file, t, parts, requantized)
        label = f"{t['name']}.{t['layer']}"
        info["formats"][label] = stored
        info[f"{'parts' if '+' in stored else stored}_matrices"] += 1
        (info["gguf"]["exact"].append(label) if exact else info["gguf"]["converted"].__setitem__(label, note))
        rows, cols = t["rows"], t["cols"]
        if t["name"] != "pos_embed":
            bits[0] += sum(plan.row_bits(f, cols) * n for f, n in zip(stored.split("+"), run_rows, strict=True)) * cols
            bits[1] += rows * cols
    if requantized:
        log.warning("kwker: %s holds tensors of types with no exact repacking here (%s); they were quantized into "
                    "the nearest format (dec.info['gguf']['converted'] says which)",
                    fname, ", ".join(sorted(requantized)))  # fmt: skip
    info["bits_per_weight"] = bits[0] / bits[1] if bits[1] else 0.0
    info["active_weights"] = info["total_weights"] = int(bits[1])
    info["kv_cache"] = kv_cache
    h = builder.build()
    info["weight_bytes_per_token"] = int(native.LIB.kwker_decoder_weight_bytes(h))
    dec = cls(h, cfg, recipe["vocab"], max_batch, max_context, info, eos_ids(model), fam.name)
    log.info("kwker: KwkDecoder from %s (%s): %d matrices exactly as stored, %d converted, %.2f bits per weight",
             fname, fam.name, len(info["gguf"]["exact"]), len(info["gguf"]["converted"]),
             info["bits_per_weight"])  # fmt: skip
    return dec


def _parts(value: torch.Tensor, mats: list[tuple[str, int]], name: str, family: str) -> list[tuple[str, np.ndarray]]:
    """The (file tensor, HF rows) runs a decoder matrix stacks, read from its row markers."""
    if value.dtype != torch.float64 or value.dim() != 2 or value.shape[1] != 1:
        raise ValueError(f"kwker: the {family} mapping transforms {name} (not only stacking rows); GGUF files "
                         "of this family are not run as they are: load the model with transformers and use "
                         "from_hf")  # fmt: skip
    marks = value[:, 0]
    codes = marks.to(torch.int64)
    if not torch.equal(codes.to(torch.float64), marks) or int(codes.min()) < 0:
        raise ValueError(f"kwker: the {family} mapping changes {name}'s values; GGUF files of this family are not run "
                         "as they are: load the model with transformers and use from_hf")  # fmt: skip
    idx, rows = (codes // ROW_SPAN).numpy(), (codes % ROW_SPAN).numpy()
    cuts = np.flatnonzero(np.diff(idx)) + 1
    return [(mats[int(i[0])][0], r) for i, r in zip(np.split(idx, cuts), np.split(rows, cuts), strict=True)]


def _put_matrix(b: native.Builder, file: _File, t: dict[str, Any], parts: list[tuple[str, np.ndarray]],
                requantized: set[str]) -> tuple[str, bool, str, list[int]]:  # fmt: skip
    """Hands one decoder matrix over; returns (format stored, exact, what was done if not exact, the rows of each
    run of the stored format: one run, or a run per name of ``a+b``)."""
    types = [file.tensors[g].tensor_type.name for g, _ in parts]
    file_rows = [file.row_order(g, int(file.tensors[g].shape[1]))[0][rows] for g, rows in parts]
    name, layer, expert, cols = t["name"], t["layer"], t["expert"], t["cols"]
    if all(ty in native.GGUF_TYPES for ty in types):
        # Each part's rows as bytes, one after another (parts of different types have different row sizes).
        data = np.concatenate([file.tensors[g].data[r].reshape(-1) for (g, _), r in zip(parts, file_rows, strict=True)])
        spec = [(native.GGUF_TYPES[ty], len(r)) for ty, r in zip(types, file_rows, strict=True)]
        stored, exact = b.set_gguf(name, layer, spec, data, cols, expert=expert)
        # Runs of parts in their own formats: consecutive parts of one type (Rust's `exact_runs`).
        runs = [sum(n for _, n in g) for _, g in itertools.groupby(spec, key=lambda p: p[0])]
        run_rows = runs if "+" in stored else [sum(runs)]
        return stored, exact, "" if exact else f"{'+'.join(sorted(set(types)))} -> {stored}", run_rows
    # Float types are kept as float; other types are quantized into the nearest format.
    import gguf

    values = np.concatenate([
        gguf.dequantize(file.tensors[g].data[r], file.tensors[g].tensor_type).astype(np.float32)
        for (g, _), r in zip(parts, file_rows, strict=True)
    ])  # fmt: skip
    w = torch.from_numpy(np.ascontiguousarray(values.reshape(-1, cols)))
    if all(ty in FLOAT_TYPES for ty in types):
        if all(ty == "BF16" for ty in types) or bf16_exact(w):
            w = w.to(torch.bfloat16)
        b.set(name, layer, w, expert=expert)
        stored = "bf16" if w.dtype == torch.bfloat16 else "f32"
        return stored, True, "", [w.shape[0]]
    others = sorted({ty for ty in types if ty not in FLOAT_TYPES})
    requantized.update(others)
    fmt = max((_nearest(ty) for ty in others), key=lambda f: plan.BITS[f])
    plan.check_quantizable(name, layer, fmt, cols)
    b.set(name, layer, w, fmt, expert=expert)
    return fmt, False, f"{'+'.join(sorted(set(types)))} -> {fmt} (dequantized and quantized again)", [w.shape[0]]
