"""The quantization plan: which storage format each weight matrix of a ``KwkDecoder`` gets, and calibration
statistics.

Precisions (``KwkDecoder.from_hf(model, precision=...)``, ``decode.install(model, precision=...)``):

- ``"preserve"``: the checkpoint's own numbers (bf16, or float32; bf16-exact float32 stored as bf16).
- ``"balanced"`` / ``"int8"``: every matrix (embedding and lm_head included) as q8_0: 8-bit codes, one f16
  scale per 32 values (8.5 bits per weight, ggml's Q8_0 layout). Chosen over q8 (one f32 scale per 64 values,
  the same bits) by measured quality: on the real Gemma 3 270M +0.087 % perplexity, KL 5.6e-4 against q8's
  +0.246 %, 1.4e-3; on the real SmolLM2-135M +0.250 %, 1.1e-3 against +0.261 %, 1.7e-3 (llama.cpp's Q8_0 of
  the same weights: +0.080 % / 2.6e-3 and +0.565 % / 3.8e-3; benchmarks/HISTORY.md, issue 31). q8 stays available
  through ``formats=`` (its kernels are up to 5 % faster in cache on AVX-512, 14 % on AVX2 prompts).
- ``"int4"``: layer matrices as q4k (4-bit codes on an asymmetric grid per 32 values whose 6-bit scales and
  mins refine an f16 pair per 256: 4.5 bits per weight); the embedding/lm_head (and OPT's projections in and
  out) and the matrices in ``SENSITIVE`` as q6k (6-bit codes, an i8 scale per 32 refining an f16 one per 256:
  6.3 bits), chosen by measured quality on the real SmolLM2-135M (benchmarks/HISTORY.md, issue 18). A family may name
  other sensitive matrices (``Family.sensitive``) and says how its plan was chosen (``Family.plan_note``,
  reported in ``dec.info["plan"]``).
- Other formats by name through ``formats=``: ``q4`` (the previous int4 body: f16 scale and min per 32
  values, 5.0 bits) and any of the above; folders saved with them keep loading.

A quantized matrix's linear reads its input rounded to int8 per 32 values (``rust/src/quant.rs``); the
rest of the forward stays float32. ``formats={"down": "q8", "down.3": "q4", "embed": "preserve", ...}``
overrides the plan per matrix (the tensor table's names: ``embed``, ``lm_head``, ``qkv``, ``o``, ``up`` (alias
``gate_up``), ``down``, ``proj_in``, ``proj_out``, and a mixture's ``router``, ``expert_up``, ``expert_down``:
every expert of a layer alike), optionally for one layer (``kind.layer``). A mixture's routers stay as stored
unless ``formats=`` says otherwise (``KEEP``).

Calibration (``calib=`` a text with ``tokenizer=``, or token ids): the model runs in torch over the text and
each linear's input columns get an importance, their mean square; the quantizers then weight each
value's error by it (as llama.cpp's importance matrix does), so the columns the text exercises most are
kept closest. An expert's importance is the mean over the tokens the router sent to it (an expert no token
chose is quantized unweighted).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import torch

from .native import MATRICES, QUANT_FORMATS

log = logging.getLogger("kwker_torch")

# The quantized formats, from the library's table (rust/src/quant.rs: Format, through the decoder ABI).
QUANT = tuple(QUANT_FORMATS)
# Bits per stored weight (scales included) of whole blocks; panel padding and norms/biases not counted.
BITS = {"bf16": 16.0, "f32": 32.0, **{n: float(f["bits"]) for n, f in QUANT_FORMATS.items()}}
# Matrices a plan may quantize: every matrix of the tensor table but the position table (a lookup).
KINDS = tuple(m for m in MATRICES if m != "pos_embed")
ALIASES = {"gate_up": "up"}
# Matrices int4 keeps at 6 bits (INT4_EMBEDDING) wherever they are: the embedding/lm_head and the embedding
# projections.
EMBEDDING_KINDS = ("embed", "lm_head", "proj_in", "proj_out")
# What k must be a multiple of for each format (Format::granule).
BLOCK = {n: int(f["granule"]) for n, f in QUANT_FORMATS.items()}
MIN_CALIB_TOKENS = 128
CALIB_CHUNK = 512

# int4's matrices kept at 6 bits (INT4_SENSITIVE), by kind and by layer position: (kind, which layers).
# "ends" = the first and last layer. Measured on the real SmolLM2-135M (quality tool, Austen text).
SENSITIVE: tuple[tuple[str, str], ...] = (("down", "ends"), ("qkv", "ends"))
# From this many weights up, int4 keeps only the embedding/lm_head at 6 bits ("ends" rules are dropped): a
# deep, wide model's first and last layers carry a smaller share of its error, and their 6 bits would cost
# SmolLM2-1.7B 0.06 bits per weight, more than llama.cpp's Q4_0 file (4.62 bits, its output at Q6_K). Not
# measured on real weights of that size (none is available offline); "all" rules still apply.
LARGE_WEIGHTS = 1_000_000_000
# int4's formats: the layer matrices, the sensitive ones, the embedding/lm_head (measured on the real
# SmolLM2-135M with the quality tool; benchmarks/HISTORY.md, issue 18).
INT4_BODY, INT4_SENSITIVE, INT4_EMBEDDING = "q4k", "q6k", "q6k"
# int8's format for every matrix (measured against q8 on both real models; see the module's header).
INT8_FORMAT = "q8_0"
# Kept as stored at every precision: a mixture's router (experts x hidden, a few hundred KB per layer), whose
# rounding would move rows to other experts rather than perturb a sum.
KEEP: tuple[str, ...] = ("router",)


def plan(
    precision: str, layers: int, formats: dict[str, str] | None = None,
    sensitive: tuple[tuple[str, str], ...] | None = None, keep: tuple[str, ...] = KEEP, weights: int = 0,
) -> Callable[[str, int], str]:
    """The format ("preserve" or one of ``QUANT``) of matrix ``kind`` of ``layer`` (0 for model-level matrices).
    ``sensitive``: the family's int4 matrices kept at 6 bits (default ``SENSITIVE``); ``keep``: kinds kept as
    the checkpoint stores them at every precision (default ``KEEP``: the routers); ``weights``: the model's
    parameter count (from ``LARGE_WEIGHTS`` up, the "ends" rules are dropped)."""
    keep8 = SENSITIVE if sensitive is None else sensitive
    if weights >= LARGE_WEIGHTS:
        keep8 = tuple((k, which) for k, which in keep8 if which != "ends")
    overrides: dict[str, str] = {}
    for key, val in dict(formats or {}).items():
        kind, _, layer = key.partition(".")
        kind = ALIASES.get(kind, kind)
        if kind not in KINDS or (layer and not layer.isdigit()):
            raise ValueError(
                f"kwker: formats key {key!r} is not a matrix kind; expected one of {KINDS + tuple(ALIASES)}, "
                "optionally 'kind.layer' (e.g. 'down.3')"
            )
        if val not in ("preserve", *QUANT):
            raise ValueError(
                f"kwker: formats[{key!r}] = {val!r}; expected 'preserve' or one of {QUANT}"
            )
        overrides[f"{kind}.{layer}" if layer else kind] = val

    def base(kind: str, layer: int) -> str:
        if precision == "preserve" or kind in keep:
            return "preserve"
        if precision in ("balanced", "int8"):
            return INT8_FORMAT
        if kind in EMBEDDING_KINDS:
            return INT4_EMBEDDING
        for k, which in keep8:
            if k == kind and (which == "all" or (which == "ends" and layer in (0, layers - 1))):
                return INT4_SENSITIVE
        return INT4_BODY

    def choose(kind: str, layer: int) -> str:
        return overrides.get(f"{kind}.{layer}", overrides.get(kind, base(kind, layer)))

    return choose


def calib_ids(calib: str | Sequence[int] | torch.Tensor, tokenizer: Any | None) -> torch.Tensor:
    """Calibration token ids from a text (with its tokenizer) or ids, checked for length."""
    if isinstance(calib, str):
        if tokenizer is None:
            raise ValueError(
                "kwker: calib= is a text, so pass tokenizer= too (the model's tokenizer), or pass token ids"
            )
        ids = torch.as_tensor(tokenizer(calib)["input_ids"], dtype=torch.int64).flatten()
    else:
        ids = torch.as_tensor(calib).flatten()
        if ids.dtype.is_floating_point or ids.dtype == torch.bool:
            raise TypeError(f"kwker: calib= token ids must be integers, got dtype {ids.dtype}")
        ids = ids.to(torch.int64)
    if ids.numel() < MIN_CALIB_TOKENS:
        raise ValueError(
            f"kwker: the calibration text has {ids.numel()} tokens; at least {MIN_CALIB_TOKENS} are needed "
            "(a few paragraphs of text like the model's own use; a few thousand tokens is typical)"
        )
    return ids


Rows = Callable[[tuple[Any, ...]], "torch.Tensor | None"]


def importance(
    model: torch.nn.Module, ids: torch.Tensor, modules: dict[tuple[str, int, int], tuple[torch.nn.Module, Rows | None]]
) -> dict[tuple[str, int, int], torch.Tensor]:
    """Mean square of each input column of every matrix over ``ids``, keyed (matrix name, layer, expert): the
    model runs in torch in chunks of 512 tokens with a forward pre-hook on each matrix's input module
    (``modules``: the family's ``Source.module`` and ``Source.rows``, which picks the matrix's input rows from
    the module's arguments, by default its first; a tied embedding's key is lm_head's)."""
    stats = run_inputs(model, ids, modules, lambda x: (x * x).sum(0), "kwker: calibrating")
    return {k: (v / n).contiguous() for k, (v, n) in stats.items()}


def run_inputs(
    model: torch.nn.Module,
    ids: torch.Tensor,
    modules: dict[tuple[str, int, int], tuple[torch.nn.Module, Rows | None]],
    stat: Callable[[torch.Tensor], torch.Tensor],
    desc: str,
) -> dict[tuple[str, int, int], tuple[torch.Tensor, int]]:
    """Runs the model's own forward over ``ids`` in chunks of 512 tokens and sums ``stat`` of each matrix's
    input rows (float32 [tokens, cols]) per key, with how many rows were summed (``importance``'s engine, and
    GPTQ's Hessians). Keys that saw no rows (an expert no token chose) are absent."""
    vocab = model.get_input_embeddings().weight.shape[0]
    if int(ids.min()) < 0 or int(ids.max()) >= vocab:
        raise ValueError(
            f"kwker: calibration token ids must be in [0, {vocab}); got {int(ids.min())}..{int(ids.max())}"
        )
    sums: dict[tuple[str, int, int], torch.Tensor] = {}
    counts: dict[tuple[str, int, int], int] = {}

    def hook(key: tuple[str, int, int], rows: Rows | None) -> Callable[..., None]:
        def run(_mod: torch.nn.Module, args: tuple[Any, ...]) -> None:
            x = rows(args) if rows is not None else args[0]
            if x is None or x.numel() == 0:
                return
            x = x.detach().float().reshape(-1, x.shape[-1])
            s = stat(x)
            if key in sums:
                sums[key] += s
            else:
                sums[key] = s
            counts[key] = counts.get(key, 0) + x.shape[0]

        return run

    # The model's own forward, also when decode.install() has replaced it (a rebuild after a weight change).
    installed = getattr(model, "_kwker_decode", None)
    forward = installed.original if installed is not None else model
    handles = [mod.register_forward_pre_hook(hook(key, rows)) for key, (mod, rows) in modules.items()]
    try:
        from tqdm.auto import tqdm

        with torch.no_grad():
            for s in tqdm(range(0, ids.numel(), CALIB_CHUNK), desc=desc, unit="chunk"):
                forward(ids[s : s + CALIB_CHUNK][None])
    finally:
        for h in handles:
            h.remove()
    return {k: (v, counts[k]) for k, v in sums.items()}


def row_bits(fmt: str, cols: int) -> float:
    """Bits per weight of a row of ``cols`` values stored as ``fmt``: a q4k/q6k row whose length is not a
    multiple of 256 ends in a shorter super-block that still carries its header."""
    row_bytes = QUANT_FORMATS.get(fmt, {}).get("super_row_bytes")
    if not row_bytes or cols % 256 == 0:
        return BITS[fmt]
    full, t = divmod(cols // 32 * 32, 256)
    # Bytes per row of a super-block of n sub-blocks of 32 (16 rows share a panel; kblock.rs).
    return (full * row_bytes[8] + row_bytes[t // 32]) * 8 / cols


def check_quantizable(kind: str, layer: int, fmt: str, cols: int) -> None:
    if fmt in BLOCK and cols % BLOCK[fmt]:
        where = f"the {kind} matrix" + (f" of layer {layer}" if kind not in EMBEDDING_KINDS else "")
        raise ValueError(
            f"kwker: {where} has k = {cols} inputs, not a multiple of {fmt}'s block of "
            f"{BLOCK[fmt]}; store it another way (formats={{'{kind}': 'preserve'}}) or use precision='preserve'"
        )
