"""``KwkDecoder.from_hf``: a loaded Hugging Face causal LM into a native decoder.

The model's family (``families/``) gives the recipe and the tensors by table name; the tensor table of that
recipe (``native.recipe_tensors``, from Rust) says which tensors must come and their shapes, so a mapping
that forgets one, adds one, or shapes one wrongly is refused by name before anything runs. Each matrix is
stored as the plan says (``plan.py``): as given (bf16 stays bf16; float32 that is exactly bf16-valued is
stored as bf16, the same numbers in half the bytes) or quantized; vectors become float32.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import torch

from . import families, native, plan
from .common import CHUNK_ROWS, PRECISIONS, eos_ids, kv_cache_bytes, kv_cache_for, kv_row_bytes, mem_total, meminfo

log = logging.getLogger("kwker_torch")


def bf16_exact(w: torch.Tensor) -> bool:
    """True when every value of a float32 tensor is exactly representable in bfloat16."""
    return w.dtype == torch.float32 and torch.equal(w, w.to(torch.bfloat16).to(torch.float32))


def _matrix(t: torch.Tensor) -> torch.Tensor:
    """A weight matrix as stored: bf16 as is, float32 as bf16 when exactly representable, else float32."""
    t = t.detach()
    if t.dtype == torch.float32 and bf16_exact(t):
        return t.to(torch.bfloat16).contiguous()
    return t.contiguous()


def check_model(model: torch.nn.Module) -> tuple[families.Family, dict[str, Any]]:
    """The model's family and recipe if KwkDecoder can run it; else a ValueError naming what is not
    supported (the architecture, a config field, the device or the dtype) and what to do."""
    families.family_of(model)  # the architecture first: its error is the most useful
    params = list(model.parameters())
    if any(p.device.type != "cpu" for p in params):
        raise ValueError("kwker: the model is not on the CPU; call model.to('cpu') first (KwkDecoder is CPU-only)")
    dtypes = {p.dtype for p in params}
    if not dtypes <= {torch.float32, torch.bfloat16}:
        bad = sorted(str(d) for d in dtypes - {torch.float32, torch.bfloat16})
        raise ValueError(
            f"kwker: the model holds {', '.join(bad)} weights; KwkDecoder takes float32 or bfloat16 "
            "(load it with dtype=torch.bfloat16 or torch.float32)"
        )
    return families.read(model)


def mem_available() -> int | None:
    """Bytes of RAM free for new allocations (MemAvailable), or None where it cannot be read."""
    return meminfo("MemAvailable")


def context_that_fits(recipe: dict[str, Any], trained: int, max_batch: int, kv_cache: str = "f32",
                      share: float = 0.5) -> int:  # fmt: skip
    """``max_context="auto"``: the model's trained context, or less where ``max_batch`` slots of that would
    take more than ``share`` of the memory available now (the longest context that fits, in steps of 256);
    logged with the reason."""
    budget = mem_available()
    fits = trained if budget is None else 0
    if budget is not None:
        lo, hi = 1, trained  # the cache grows with the context: the longest that fits, by bisection
        while lo <= hi:
            mid = (lo + hi) // 2
            if max_batch * kv_cache_bytes(recipe, mid, kv_cache) <= share * budget:
                fits, lo = mid, mid + 1
            else:
                hi = mid - 1
        if fits < trained:
            fits = max(fits // 256 * 256, min(trained, 256))
    kv = max_batch * kv_cache_bytes(recipe, fits, kv_cache)
    why = ("the model's trained context" if fits == trained else
           f"the model is trained for {trained}; {max_batch} slots of that would take more than half of the "
           f"{budget / 2**30:.1f} GiB of memory available: lower the slots for more")  # fmt: skip
    log.info("kwker: max_context auto = %d tokens per slot (%s); KV cache %.2f GiB for %d slot(s), %s",
             fits, why, kv / 2**30, max_batch, kv_cache)  # fmt: skip
    return fits


def _limits(model: torch.nn.Module, recipe: dict[str, Any], max_batch: Any, max_context: Any,
            kv_cache: str = "f32") -> tuple[int, int]:  # fmt: skip
    kv_row_bytes(kv_cache, 1)  # a clear error for an unknown format, before anything is built
    if not isinstance(max_batch, int) or isinstance(max_batch, bool) or max_batch < 1:
        raise ValueError(f"kwker: max_batch must be a positive int (sequence slots), got {max_batch!r}")
    cfg = model.config
    limit = next((int(getattr(cfg, n)) for n in families.MAX_POSITIONS if getattr(cfg, n, None)), 4096)
    if max_context is None:
        max_context = min(limit, 4096)
    elif max_context == "auto":
        max_context = context_that_fits(recipe, limit, max_batch, kv_cache)
    if not isinstance(max_context, int) or isinstance(max_context, bool) or max_context < 1:
        raise ValueError(f"kwker: max_context must be a positive int or \"auto\", got {max_context!r}")
    learned = recipe["positions"].get("learned")
    if learned is not None and max_context > learned["len"] - learned["offset"]:
        raise ValueError(
            f"kwker: max_context={max_context} is more than this model's {learned['len'] - learned['offset']} learned "
            "positions (max_position_embeddings / n_positions); use a smaller max_context"
        )
    kv_bytes = max_batch * kv_cache_bytes(recipe, max_context, kv_cache)
    total = mem_total()
    if total is not None and kv_bytes > 0.8 * total:
        raise ValueError(
            f"kwker: a KV cache for max_batch={max_batch} x max_context={max_context} needs "
            f"{kv_bytes / 2**30:.1f} GiB, more than this machine's memory allows ({total / 2**30:.1f} GiB); "
            "lower max_batch or max_context"
        )
    return max_batch, max_context


def from_hf(
    cls: Any,
    model: torch.nn.Module,
    precision: str,
    max_batch: int,
    max_context: int | None,
    *,
    calib: str | Sequence[int] | torch.Tensor | None,
    tokenizer: Any | None,
    formats: dict[str, str] | None,
    gptq: bool,
    act_order: bool,
    kv_cache: str | None = None,
) -> Any:
    """``KwkDecoder.from_hf`` for a model a family maps: every argument as given there (where the defaults and
    their meaning live), ``cls`` the class to build."""
    if precision not in PRECISIONS:
        raise ValueError(f"kwker: unknown precision {precision!r}; expected one of {PRECISIONS}")
    kv_cache = kv_cache_for(precision, kv_cache)
    fam, recipe = check_model(model)
    weights = sum(p.numel() for p in model.parameters())
    choose = plan.plan(precision, recipe["layers"], formats, fam.sensitive, weights=weights)
    max_batch, max_context = _limits(model, recipe, max_batch, max_context, kv_cache)
    wanted = native.recipe_tensors(recipe)
    with torch.no_grad():
        sources = {s.key: s for s in fam.tensors(model, recipe)}
    need = {(t["name"], t["layer"], t["expert"]) for t in wanted}
    extra = sorted(set(sources) - need)
    if extra:
        raise ValueError(f"kwker: the {fam.name} mapping gives tensors its recipe has no place for: {extra}")
    if (gptq or act_order) and calib is None:
        raise ValueError(
            "kwker: gptq=True needs calibration text: pass calib= (a few thousand tokens of text like the model's "
            "own use) with tokenizer=, or token ids"
        )
    if act_order and not gptq:
        raise ValueError("kwker: act_order=True is a GPTQ option; pass gptq=True with it")
    imp = None  # calibration last among the checks: it runs the model over the whole text
    if calib is not None:
        if precision == "preserve" and not formats:
            raise ValueError(
                "kwker: calib= only applies to quantized precisions ('int8', 'int4'); drop it for preserve"
            )
        modules = {k: (s.module, s.rows) for k, s in sources.items() if s.module is not None}
        modules[LM_HEAD] = (model.lm_head, None)  # a tied embedding is calibrated as its lm_head
        ids = plan.calib_ids(calib, tokenizer)
        # GPTQ's Hessians hold the importance (their diagonals): one pass over the text, not two.
        imp = {} if gptq else plan.importance(model, ids, modules)
    builder = native.Builder(recipe, max_batch, max_context, CHUNK_ROWS, kv_cache)
    done: set[tuple[str, int, int]] = set()
    if gptq:
        done = _gptq(builder, model, ids, sources, choose, recipe["tied_embeddings"], act_order)
    info: dict[str, Any] = {
        "family": fam.name, "precision": precision, "bf16_matrices": 0, "f32_matrices": 0,
        **{f"{q}_matrices": 0 for q in plan.QUANT},
        "tied_embeddings": recipe["tied_embeddings"], "calibrated": imp is not None, "formats": {},
        "plan": fam.plan_note if precision == "int4" else None,
        "gptq": len(done) if gptq else None, "kv_cache": kv_cache,
    }  # fmt: skip
    # Stored bits and weights of the matrices a token reads, for bits_per_weight: a sparse layer's experts count
    # top_k / experts of their size (a token reads its k), and every weight once in total_weights.
    bits = [0.0, 0.0]
    moe = recipe.get("moe")
    share = moe["top_k"] / moe["experts"] if moe else 1.0
    quantizing = any(choose(n, i) != "preserve" for n in plan.KINDS for i in range(recipe["layers"]))
    rows: Any = wanted
    if quantizing:
        from tqdm.auto import tqdm

        rows = tqdm(wanted, desc="kwker: quantizing", unit="tensor")
    with torch.no_grad():
        for t in rows:
            key = (t["name"], t["layer"], t["expert"])
            src = sources.get(key)
            if src is None:
                where = f" of layer {t['layer']}" if native.TENSORS[t["name"]]["per_layer"] else ""
                where += f", expert {t['expert']}" if native.TENSORS[t["name"]]["per_expert"] else ""
                raise ValueError(f"kwker: the {fam.name} mapping did not give {t['name']}{where} (its recipe needs it)")
            _put(builder, src, choose, info, bits, imp, recipe["tied_embeddings"], share, key in done)
    h = builder.build()
    info["weight_bytes_per_token"] = int(native.LIB.kwker_decoder_weight_bytes(h))
    dec = cls(h, model.config, recipe["vocab"], max_batch, max_context, info, eos_ids(model), fam.name)
    counts = ", ".join(
        f"{info[f + '_matrices']} {f}" for f in ("bf16", "f32", *plan.QUANT) if info[f + "_matrices"]
    )
    log.info(
        "kwker: KwkDecoder for %s (%s, %s): %s matrices (%.2f bits per weight), "
        "%.0f MB of weights per token, KV cache %.0f MB (%s, %d slots x %d positions)",
        type(model).__name__, fam.name, precision, counts, info["bits_per_weight"],
        info["weight_bytes_per_token"] / 1e6, info["kv_bytes"] / 1e6, kv_cache, max_batch, max_context,
    )  # fmt: skip
    return dec


LM_HEAD = ("lm_head", 0, 0)


def _input_key(src: families.Source, tied: bool) -> tuple[str, int, int]:
    """Whose inputs a matrix is calibrated on: its own, but a tied embedding's are the lm_head's it also is."""
    return LM_HEAD if src.name == "embed" and tied else src.key


def _gptq(b: native.Builder, model: torch.nn.Module, ids: torch.Tensor, sources: dict, choose: Any, tied: bool,
          act_order: bool) -> set[tuple[str, int, int]]:  # fmt: skip
    """Stores every quantized matrix that has calibration inputs through GPTQ (``gptq.py``); returns their keys.
    A tied embedding is GPTQ'd as the lm_head it also is (its inputs are lm_head's)."""
    from . import gptq

    jobs = []
    for key, src in sources.items():
        name, layer, _ = key
        if not native.TENSORS[name]["matrix"] or name not in plan.KINDS or choose(name, layer) == "preserve":
            continue
        hk = _input_key(src, tied)
        mod, rows = (model.lm_head, None) if hk == LM_HEAD else (src.module, src.rows)
        if mod is None:  # an untied embedding is a lookup: no inputs to compensate for
            continue
        fmt = choose(name, layer)
        plan.check_quantizable(name, layer, fmt, src.value.shape[1])
        jobs.append((key, hk, mod, rows, src.value, fmt))

    def store(key: tuple[str, int, int], fmt: str, fit: torch.Tensor, codes: torch.Tensor, w: torch.Tensor) -> None:
        b.set_coded(key[0], key[1], fmt, fit, codes, w, expert=key[2])

    return set(gptq.run(model, ids, jobs, store, act_order=act_order))


def _put(b: native.Builder, src: families.Source, choose: Any, info: dict, bits: list, imp: Any,
         tied: bool, share: float, stored_already: bool = False) -> None:  # fmt: skip
    name, layer, expert = src.name, src.layer, src.expert
    matrix = native.TENSORS[name]["matrix"]
    fmt = choose(name, layer) if matrix and name in plan.KINDS else "preserve"
    if not matrix:
        b.set(name, layer, src.value.detach().float().contiguous())
        return
    t = _matrix(src.value)
    stored = fmt if fmt != "preserve" else ("bf16" if t.dtype == torch.bfloat16 else "f32")
    if name != "pos_embed":  # a lookup table, not multiplied: not counted as weights read
        info[f"{stored}_matrices"] += 1
        info["formats"][f"{name}.{layer}" + (f".{expert}" if native.TENSORS[name]["per_expert"] else "")] = stored
        part = share if native.TENSORS[name]["per_expert"] else 1.0
        bits[0] += plan.row_bits(stored, t.shape[1]) * t.numel() * part
        bits[1] += t.numel() * part
        info["bits_per_weight"] = bits[0] / bits[1]
        info["active_weights"] = int(round(bits[1]))
        info["total_weights"] = info.get("total_weights", 0) + t.numel()
    if stored_already:  # GPTQ put it in
        return
    if fmt == "preserve":
        b.set(name, layer, t, expert=expert)
        return
    plan.check_quantizable(name, layer, fmt, t.shape[1])
    key = _input_key(src, tied)
    w = imp.get(key) if imp is not None else None
    b.set(name, layer, t, fmt, w, expert=expert)
