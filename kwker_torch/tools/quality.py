"""Quality tool: perplexity, KL divergence and top-1 agreement of kwker (and llama.cpp) against the
model's own float32 forward, on a text scored with llama.cpp's perplexity protocol.

Run: ``python -m kwker_torch.quality [--model M] [--precision P] [--text FILE ...] [--ctx 512]
[--chunks N] [--kv-cache F ...] [--gguf FILE ...] [--peer-cache f16 q8_0] [--json]``.

Contenders (each scored by the very same code, on the very same token ids):
  - ``hf-f32``: the Hugging Face float32 forward of the model; it is also the reference (KL 0, top-1 1).
  - ``kwker <precision>``: ``kwker_torch.KwkDecoder.from_hf(model, precision=...)``, ``dec.score(ids)``.
    If the decoder is not in this build the row is skipped with a note (an error if ``--precision`` was
    given); a precision the decoder refuses ("not yet") prints its error and exits with status 2.
  - ``kwker gguf`` (``--precision gguf`` with ``--model FILE.gguf``): ``KwkDecoder.from_gguf(FILE)``, the file's
    quantized tensors repacked as they are; the reference is then the file's values dequantized, so the
    row's KL is what the decoder's own arithmetic (activation codes) costs.
    ``--kv-cache f32 bf16 q8``: each kwker precision once per KV cache format (rows ``kwker P kv f32`` ...);
    without it, each precision with the cache KwkDecoder gives it by default (row ``kwker P``).
  - ``llama.cpp`` (``--gguf FILE``): ``kwker_torch.peer.llama_cpp.LlamaCppWorker`` on that GGUF, once per
    ``--peer-cache``: ``f16`` (its default cache, flash attention "auto", as llama-bench; row ``llama.cpp
    Q4_0``) and/or ``q8_0`` (``-ctk q8_0 -ctv q8_0 -fa 1``; row ``llama.cpp Q4_0 kv q8_0``), each a worker of
    its own (``kwker_torch.peer.PEER_CACHES``).

Protocol (llama.cpp ``tools/perplexity/perplexity.cpp``, function ``perplexity``, the default path with
``--ppl-stride 0``):
  - The text is tokenized once, whole. The model's tokenizer is asked whether it prepends BOS (as
    ``llama_vocab_get_add_bos``, which llama.cpp reads from the GGUF key ``tokenizer.ggml.add_bos_token``);
    if it does, the ids are ``[BOS] + tokens`` (llama.cpp's ``common_tokenize(ctx, text, true)``), and the
    first token of every chunk is replaced by BOS before the forward (``tokens[seq_start] =
    llama_vocab_bos(vocab)`` for the first batch of each chunk). EOS is never appended (llama.cpp asserts
    ``!add_eos``). SmolLM2 has ``add_bos_token = False`` in its GGUF and its tokenizer adds nothing, so
    for it nothing is prepended or replaced: chunk 0 starts with the text's first token.
  - ``n_chunk = len(ids) // ctx`` non-overlapping chunks ``ids[i*ctx:(i+1)*ctx]`` (``--chunks N``: the
    first ``min(N, n_chunk)``); the tail that does not fill a chunk is not scored. Each chunk is a fresh
    sequence (llama.cpp clears the KV cache per chunk).
  - With ``first = ctx // 2``, the logits at positions ``j = first .. ctx-2`` predict token ``j+1``
    (``process_logits(..., tokens + start + first, n_ctx - 1 - first, ...)``, which reads
    ``tokens[i+1]`` for logits row ``i``): ``ctx - 1 - ctx//2`` tokens per chunk (255 for 512).
  - Perplexity = ``exp(mean NLL)`` over all scored tokens of all chunks.
  - Text: the files given by ``--text`` are concatenated in the order given (as ``cat FILE...``), then one
    trailing newline is dropped (as llama.cpp's ``-f`` does). Default: the project's own sample story
    (``kwker_torch/texts/sample.txt``, 2,167 tokens: four chunks of 512); published numbers pass the Austen
    novels explicitly (``--text ../shared/data/text/mansfieldpark.txt``). At least one full chunk is needed
    (llama-perplexity itself refuses texts shorter than ``2*ctx`` tokens; on any text it accepts the scores are
    the same).
  - The ids come from the model's Hugging Face tokenizer for every contender, including llama.cpp (whose
    own tokenizer could split a rare string differently); a llama.cpp GGUF must have the model's vocabulary.

Numerical contract:
  - NLL per scored token: ``-log_softmax(logits.double())[target]``, summed in float64 (llama.cpp: float
    ``expf`` terms summed in double; the two agree to ~1e-7 relative).
  - KL: mean over scored positions of ``KL(p_ref || p_test) = sum_v p_ref (log p_ref - log p_test)``, with
    ``p = softmax`` of the float32 logits, computed in float64 from log-softmax; terms with ``p_ref == 0``
    contribute 0. This is the direction of llama.cpp's ``--kl-divergence`` (base = reference), computed
    exactly: llama.cpp stores the base log-probs as 16-bit codes over a 16-nat range and drops base terms
    below ``e^-16``, so its numbers can differ in the last digits.
  - Top-1 agreement: fraction of scored positions where ``argmax(test) == argmax(ref)`` (first index on
    ties, as llama.cpp's strict ``>`` scan), on the float32 logits.
  - The reference is the float32 HF forward of the same weights on the same chunk, computed once per chunk
    and shared by every contender; at most two ``[ctx, vocab]`` float32 logits tensors are alive at once,
    and scoring works in blocks of ``BLOCK`` rows.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import math
import os
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ..decoder.common import KV_CACHES
from ..peer import PEER_CACHES
from .quality_inputs import (  # noqa: F401  (the tool's public names, as before the split)
    DEFAULT_TEXT,
    DecoderUnavailable,
    LogitsFn,
    QualityError,
    gguf_metadata,
    hf_logits_fn,
    kwker_gguf_logits_fn,
    kwker_logits_fn,
    llama_cpp_logits_fn,
    load_model,
    read_texts,
    tokenize,
    tokenizer_bos,
)

REF_NAME = "hf-f32"
PRECISIONS = ("preserve", "balanced", "int8", "int4", "gguf")  # gguf: --model FILE.gguf's tensors as stored
DEFAULT_PRECISION = "preserve"
DEFAULT_CTX = 512
BLOCK = 64  # rows of logits scored at once in float64 (64 x 49152 x 8 bytes = 25 MB per temporary)


# --------------------------------------------------------------------------------------------------
# Protocol pieces (reusable by the benchmarks)


@dataclass
class Stats:
    """Running sums over scored positions: NLL (float64), KL (float64) and top-1 matches."""

    count: int = 0
    nll_sum: float = 0.0
    kl_sum: float = 0.0
    top1_same: int = 0
    compared: bool = False  # KL and top-1 were computed against a reference

    def __iadd__(self, other: Stats) -> Stats:
        if self.count and other.count and self.compared != other.compared:
            raise ValueError("kwker quality: cannot add statistics with and without a reference")
        self.compared = other.compared if not self.count else self.compared
        self.count += other.count
        self.nll_sum += other.nll_sum
        self.kl_sum += other.kl_sum
        self.top1_same += other.top1_same
        return self

    @property
    def nll_mean(self) -> float:
        return self.nll_sum / self.count if self.count else math.nan

    @property
    def perplexity(self) -> float:
        return math.exp(self.nll_mean) if self.count else math.nan

    @property
    def kl(self) -> float | None:
        return self.kl_sum / self.count if self.compared and self.count else None

    @property
    def top1(self) -> float | None:
        return self.top1_same / self.count if self.compared and self.count else None


def chunks(ids: torch.Tensor, ctx: int, n: int | None = None, bos: int | None = None) -> list[torch.Tensor]:
    """The non-overlapping ``ctx``-token chunks of the 1-D ids, as llama-perplexity cuts them.

    ``len(ids) // ctx`` chunks (at most ``n``); the tail that does not fill a chunk is dropped. With ``bos``
    (the tokenizer adds BOS), each chunk's first token is replaced by ``bos``, as llama.cpp does before the
    forward (position 0 is never scored, so the targets are unchanged). Returns new int64 tensors.
    Raises QualityError if not even one full chunk fits.
    """
    if ids.dim() != 1:
        raise QualityError(f"chunks() expects 1-D token ids, got shape {tuple(ids.shape)}")
    if ctx < 3:
        raise QualityError(f"--ctx must be at least 3 (a chunk scores positions ctx//2..ctx-2), got {ctx}")
    if n is not None and n < 1:
        raise QualityError(f"--chunks must be at least 1, got {n}")
    n_max = ids.numel() // ctx
    if n_max == 0:
        if ids.numel() == 0:
            raise QualityError(
                f"the text gives no tokens; at least {ctx} tokens (one chunk of --ctx {ctx}) are needed. "
                "Pass a longer --text file"
            )
        raise QualityError(
            f"the text gives only {ids.numel()} tokens; at least {ctx} (one chunk of --ctx {ctx}) are needed "
            f"(llama-perplexity itself asks for {2 * ctx}). Pass a longer --text file or a smaller --ctx"
        )
    count = n_max if n is None else min(n, n_max)
    out = []
    for i in range(count):
        c = ids[i * ctx : (i + 1) * ctx].to(torch.int64).clone()
        if bos is not None:
            c[0] = bos
        out.append(c)
    return out


def score_chunk(
    logits: torch.Tensor, ids: torch.Tensor, ref_logits: torch.Tensor | None = None, first: int | None = None
) -> Stats:
    """Statistics of one chunk: the logits at positions ``first .. T-2`` predict ``ids[first+1 .. T-1]``.

    ``logits`` and ``ref_logits`` are ``[T, V]`` (any float dtype; scored in float64), ``ids`` is ``[T]``;
    ``first`` defaults to ``T // 2`` (llama.cpp). Without ``ref_logits`` only the NLL is accumulated.
    Passing the same tensor as both (the reference scoring itself) gives KL 0 and top-1 1 without
    computing them. Rows outside ``first .. T-2`` are never read.
    """
    if ids.dim() != 1:
        raise QualityError(f"score_chunk() expects 1-D ids, got shape {tuple(ids.shape)}")
    t = ids.shape[0]
    first = t // 2 if first is None else first
    if logits.dim() != 2 or logits.shape[0] != t:
        raise QualityError(f"logits must be [{t}, vocab] for a chunk of {t} tokens, got {tuple(logits.shape)}")
    if ref_logits is not None and ref_logits.shape != logits.shape:
        raise QualityError(
            f"logits {tuple(logits.shape)} and reference logits {tuple(ref_logits.shape)} differ in shape "
            "(a different vocabulary?)"
        )
    if not 0 <= first < t - 1:
        raise QualityError(f"first scored position {first} out of range for a chunk of {t} tokens")
    vocab = logits.shape[1]
    targets = ids.to(torch.int64)
    if targets[first + 1 :].min() < 0 or targets[first + 1 :].max() >= vocab:
        raise QualityError(f"a target token id is outside the logits' vocabulary of {vocab}")
    same = ref_logits is logits
    stats = Stats(compared=ref_logits is not None)
    nll = torch.zeros((), dtype=torch.float64)
    kl = torch.zeros((), dtype=torch.float64)
    top1 = 0
    for b in range(first, t - 1, BLOCK):
        e = min(b + BLOCK, t - 1)
        rows = logits[b:e]
        if torch.isnan(rows).any():
            raise QualityError(f"the logits contain NaN at scored positions {b}..{e - 1}")
        lp = torch.log_softmax(rows.double(), dim=-1)
        nll -= lp.gather(1, targets[b + 1 : e + 1, None]).sum()
        if ref_logits is None:
            continue
        if same:
            top1 += e - b
            continue
        ref_rows = ref_logits[b:e]
        if torch.isnan(ref_rows).any():
            raise QualityError(f"the reference logits contain NaN at scored positions {b}..{e - 1}")
        lr = torch.log_softmax(ref_rows.double(), dim=-1)
        pr = lr.exp()
        kl += torch.where(pr > 0, pr * (lr - lp), torch.zeros((), dtype=torch.float64)).sum()
        top1 += int((rows.argmax(dim=-1) == ref_rows.argmax(dim=-1)).sum())
        del lr, pr
    stats.count = t - 1 - first
    stats.nll_sum = float(nll)
    stats.kl_sum = float(kl)
    stats.top1_same = top1
    return stats


def _result(stats: Stats, n_chunks: int, seconds: float, setup_seconds: float = 0.0) -> dict[str, Any]:
    return {
        "perplexity": stats.perplexity,
        "nll_mean": stats.nll_mean,
        "kl": stats.kl,
        "top1": stats.top1,
        "tokens": stats.count,
        "chunks": n_chunks,
        "seconds": seconds,
        "setup_seconds": setup_seconds,
    }


def _checked(name: str, out: Any, chunk: torch.Tensor, vocab: int | None) -> torch.Tensor:
    """The contender's logits as a float32 [T, V] tensor, or a QualityError saying what it returned."""
    if not isinstance(out, torch.Tensor):
        try:
            import numpy as np

            out = torch.from_numpy(np.ascontiguousarray(out))
        except Exception as exc:  # any non-array output is the same user-facing error
            raise QualityError(f"{name} returned {type(out).__name__}, expected logits [T, vocab]") from exc
    if out.dim() == 3 and out.shape[0] == 1:
        out = out[0]
    if out.dim() != 2 or out.shape[0] != chunk.shape[0]:
        raise QualityError(
            f"{name} returned logits of shape {tuple(out.shape)} for a chunk of {chunk.shape[0]} tokens; "
            f"expected [{chunk.shape[0]}, vocab] (logits at every position)"
        )
    if vocab is not None and out.shape[1] != vocab:
        raise QualityError(
            f"{name} returned logits over {out.shape[1]} tokens but the reference model has {vocab}; "
            "the contender must use the model's vocabulary"
        )
    return out.float()


def evaluate_many(
    contenders: Mapping[str, LogitsFn],
    ref_logits_fn: LogitsFn | None,
    chunk_list: Sequence[torch.Tensor],
    *,
    ref_name: str | None = REF_NAME,
    progress: bool | None = None,
) -> dict[str, dict[str, Any]]:
    """Scores every contender on every chunk against one reference forward per chunk.

    Returns ``{name: {"perplexity", "nll_mean", "kl", "top1", "tokens", "chunks", "seconds",
    "setup_seconds"}}``, the reference itself first under ``ref_name`` (if given and ``ref_logits_fn``
    is not None); ``seconds`` is the time inside that contender's logits calls. ``kl``/``top1`` are None
    without a reference. ``progress``: a tqdm bar over chunks on stderr (None: on a terminal, 2+ chunks).
    """
    if not chunk_list:
        raise QualityError("no chunks to score")
    names = list(contenders)
    if ref_name is not None and ref_logits_fn is not None and ref_name in contenders:
        raise QualityError(f"contender name {ref_name!r} is taken by the reference")
    stats = {name: Stats() for name in names}
    seconds = dict.fromkeys(names, 0.0)
    ref_stats = Stats()
    ref_seconds = 0.0
    vocab: int | None = None
    it: Iterator[torch.Tensor] | Any = chunk_list
    bar = None
    if progress is None:
        progress = len(chunk_list) > 1 and sys.stderr.isatty()
    if progress:
        from tqdm import tqdm

        bar = tqdm(chunk_list, desc="kwker quality", unit="chunk", file=sys.stderr, leave=False)
        it = bar
    try:
        for index, chunk in enumerate(it):
            first = chunk.shape[0] // 2
            ref = None
            if ref_logits_fn is not None:
                t0 = time.perf_counter()
                ref = _checked(ref_name or "the reference", ref_logits_fn(chunk), chunk, None)
                ref_seconds += time.perf_counter() - t0
                vocab = ref.shape[1]
                try:
                    ref_stats += score_chunk(ref, chunk, ref, first)
                except QualityError as exc:
                    raise QualityError(f"{ref_name or 'the reference'}, chunk {index}: {exc}") from exc
            for name in names:
                t0 = time.perf_counter()
                logits = _checked(name, contenders[name](chunk), chunk, vocab)
                seconds[name] += time.perf_counter() - t0
                try:
                    stats[name] += score_chunk(logits, chunk, ref, first)
                except QualityError as exc:
                    raise QualityError(f"{name}, chunk {index}: {exc}") from exc
                del logits
            del ref
            if bar is not None and ref_logits_fn is not None:
                bar.set_postfix(ppl=f"{ref_stats.perplexity:.4f}")
    finally:
        if bar is not None:
            bar.close()
    out: dict[str, dict[str, Any]] = {}
    if ref_name is not None and ref_logits_fn is not None:
        out[ref_name] = _result(ref_stats, len(chunk_list), ref_seconds)
    for name in names:
        out[name] = _result(stats[name], len(chunk_list), seconds[name])
    return out


def evaluate(
    contender_logits_fn: LogitsFn,
    ref_logits_fn: LogitsFn | None,
    chunk_list: Sequence[torch.Tensor],
    *,
    progress: bool | None = None,
) -> dict[str, Any]:
    """One contender's ``{"perplexity", "nll_mean", "kl", "top1", "tokens", "chunks", "seconds", ...}``
    over the chunks, against ``ref_logits_fn``'s logits (KL/top-1 None without it)."""
    name = "contender"
    return evaluate_many({name: contender_logits_fn}, ref_logits_fn, chunk_list, ref_name=None, progress=progress)[name]


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="python -m kwker_torch.quality",
        description="Perplexity, KL divergence and top-1 agreement against the model's float32 forward, "
        "with llama.cpp's perplexity protocol (second half of each ctx-token chunk).",
    )
    ap.add_argument("--model", default=None, help="local HF folder or .gguf file (default: bundled SmolLM2-135M)")
    ap.add_argument(
        "--precision",
        choices=PRECISIONS,
        nargs="+",
        default=None,
        help=f"kwker decoder precision(s), one contender each (default {DEFAULT_PRECISION})",
    )
    ap.add_argument(
        "--calib",
        default=None,
        metavar="FILE",
        help="also run each quantized precision calibrated on this text (its first --calib-tokens tokens)",
    )
    ap.add_argument("--calib-tokens", type=int, default=8192, help="calibration tokens (default 8192)")
    ap.add_argument(
        "--gptq",
        action="store_true",
        help="also run each quantized precision calibrated with GPTQ (needs --calib)",
    )
    ap.add_argument(
        "--formats",
        nargs="+",
        default=None,
        metavar="KIND=FORMAT",
        help="override the plan of every kwker contender per matrix, as KwkDecoder's formats= "
        "(e.g. down=q6k lm_head=q8 qkv.0=q8)",
    )
    ap.add_argument(
        "--text",
        nargs="+",
        default=None,
        metavar="FILE",
        help="text file(s), concatenated (default: the project's sample story, kwker_torch/texts/sample.txt)",
    )
    ap.add_argument("--ctx", type=int, default=DEFAULT_CTX, help="chunk length in tokens (default 512)")
    ap.add_argument("--kv-cache", nargs="+", default=None, choices=KV_CACHES,
                    help="KV cache format(s) of the kwker contenders, one contender each (rows 'kwker P kv F'); "
                    "default: each precision's own, as KwkDecoder picks it (f32 for preserve, q8 for int8 / int4)")
    ap.add_argument("--chunks", type=int, default=None, help="score at most N chunks (default: all)")
    ap.add_argument("--gguf", nargs="+", default=None, metavar="FILE", help="also score these GGUFs with llama.cpp")
    ap.add_argument("--peer-cache", nargs="+", default=["f16"], choices=list(PEER_CACHES),
                    help="llama.cpp's KV cache for each --gguf, one contender each: f16 (its default, flash "
                    "attention auto) and/or q8_0 (-ctk q8_0 -ctv q8_0 -fa 1) (default f16)")
    ap.add_argument("--json", action="store_true", help="print one JSON line instead of the table")
    return ap.parse_args(argv)


def peer_name(file_type: str, cache: str) -> str:
    """The row of llama.cpp on a GGUF of ``file_type`` with KV cache ``cache`` (a key of PEER_CACHES): ``llama.cpp
    Q4_0`` for its default f16 cache, ``llama.cpp Q4_0 kv q8_0`` otherwise (as bench_depth names them)."""
    return f"llama.cpp {file_type}" + ("" if cache == "f16" else f" kv {cache}")


def _fmt(x: float | None, spec: str) -> str:
    return "-" if x is None or not math.isfinite(x) else format(x, spec)


def _no_negative_zero(x: float | None, digits: int) -> float | None:
    """``x`` rounded to ``digits`` decimals, without a "-0.000" for a tiny negative number."""
    return None if x is None or not math.isfinite(x) else round(x, digits) + 0.0


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Does the work of main(); returns the report (what --json prints). Raises QualityError."""
    if args.ctx < 3:
        raise QualityError(f"--ctx must be at least 3, got {args.ctx}")
    if args.chunks is not None and args.chunks < 1:
        raise QualityError(f"--chunks must be at least 1, got {args.chunks}")
    text, text_files = read_texts(args.text)
    t0 = time.perf_counter()
    model, tok, model_label = load_model(args.model)
    load_seconds = time.perf_counter() - t0
    max_pos = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    if isinstance(max_pos, int) and args.ctx > max_pos:
        raise QualityError(f"--ctx {args.ctx} exceeds the model's {max_pos} positions; pass a smaller --ctx")
    ids, bos = tokenize(tok, text)
    chunk_list = chunks(ids, args.ctx, args.chunks, bos)
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    vocab = int(head.weight.shape[0]) if head is not None else int(model.config.vocab_size)

    precisions = list(args.precision or [DEFAULT_PRECISION])
    calib_ids = None
    if args.calib is not None:
        if not os.path.isfile(args.calib):
            raise QualityError(f"--calib file {args.calib!r} not found; pass an existing text file")
        calib_text, _ = read_texts([args.calib])
        calib_ids = tokenize(tok, calib_text)[0][: args.calib_tokens]
    formats_arg: dict[str, str] | None = None
    if args.formats:
        bad = [f for f in args.formats if f.count("=") != 1]
        if bad:
            raise QualityError(f"--formats takes KIND=FORMAT pairs (e.g. down=q6k); got {bad}")
        formats_arg = dict(f.split("=") for f in args.formats)
    if args.gptq and calib_ids is None:
        raise QualityError("--gptq fits each matrix to calibration text: pass --calib FILE with it")
    runs: list[tuple[str, torch.Tensor | None, bool]] = [(p, None, False) for p in precisions]
    quantized = [p for p in precisions if calib_ids is not None and p not in ("preserve", "gguf")]
    runs += [(p, calib_ids, False) for p in quantized]
    runs += [(p, calib_ids, True) for p in quantized if args.gptq]
    kv_caches: list[str | None] = list(dict.fromkeys(args.kv_cache)) if args.kv_cache else [None]
    contenders: dict[str, LogitsFn] = {}
    formats: dict[str, str] = {REF_NAME: "float32"}
    caches: dict[str, str] = {}  # contender -> its KV cache format (kwker's kv_cache=, llama.cpp's type_k/type_v)
    bits: dict[str, float] = {REF_NAME: 32.0}
    setup: dict[str, float] = {}
    skipped: list[dict[str, str]] = []
    with contextlib.ExitStack() as stack:
        for (precision, calib, gptq), kv in itertools.product(runs, kv_caches):
            name = f"kwker {precision}" + ("+calib" if calib is not None else "") + ("+gptq" if gptq else "")
            name += "" if kv is None else f" kv {kv}"  # (None: the decoder's default for the precision)
            if formats_arg:
                name += " [" + ",".join(args.formats) + "]"
            t0 = time.perf_counter()
            info: dict[str, Any] = {}
            try:
                if precision == "gguf":
                    if args.model is None or not args.model.lower().endswith(".gguf"):
                        raise QualityError("--precision gguf runs a GGUF file's tensors as stored: "
                                           "pass the file as --model FILE.gguf")  # fmt: skip
                    if calib is not None or formats_arg:
                        continue  # the file's own formats: nothing to calibrate or override
                    contenders[name] = kwker_gguf_logits_fn(args.model, args.ctx, info, kv)
                else:
                    contenders[name] = kwker_logits_fn(model, precision, args.ctx, calib, info, formats_arg, gptq,
                                                       kv)  # fmt: skip
                formats[name] = "as stored" if precision == "gguf" else precision
                caches[name] = info.get("kv_cache", kv)  # (what the decoder took)
                bits[name] = info.get("bits_per_weight", float("nan"))
                setup[name] = time.perf_counter() - t0
            except DecoderUnavailable as exc:
                if args.precision is not None:
                    raise QualityError(f"--precision {precision} needs the kwker decoder: {exc}") from exc
                skipped.append({"name": "kwker", "reason": str(exc)})
        peer_caches = list(dict.fromkeys(args.peer_cache))
        for path, cache in itertools.product(args.gguf or [], peer_caches):
            t0 = time.perf_counter()
            meta = gguf_metadata(path)
            name = peer_name(meta.get("file_type", os.path.basename(path)), cache)
            if name in contenders:  # two GGUFs of one file type: tell them apart by file
                name = f"{name} ({os.path.basename(path)})"
            contenders[name] = llama_cpp_logits_fn(stack, path, args.ctx, vocab, bos, meta, cache)
            formats[name] = f"gguf {meta.get('file_type', '?')}"
            caches[name] = cache
            bits[name] = meta.get("bits_per_weight", float("nan"))
            setup[name] = time.perf_counter() - t0
        results = evaluate_many(contenders, hf_logits_fn(model), chunk_list, ref_name=REF_NAME)

    ref_ppl = results[REF_NAME]["perplexity"]
    rows = []
    for name, r in results.items():
        r["setup_seconds"] = setup.get(name, load_seconds if name == REF_NAME else 0.0)
        rows.append(
            {
                "name": name,
                "format": formats.get(name, "?"),
                **r,
                "bits_per_weight": bits.get(name, float("nan")),
                "kv_cache": caches.get(name),
                "delta_ppl_pct": (r["perplexity"] / ref_ppl - 1.0) * 100.0,
            }
        )
    first = args.ctx // 2
    return {
        "tool": "kwker_torch.quality",
        "model": model_label,
        "text_files": text_files,
        "text_tokens": int(ids.numel()),
        "ctx": args.ctx,
        "chunks": len(chunk_list),
        "tokens_scored": len(chunk_list) * (args.ctx - 1 - first),
        "scored_positions": [first, args.ctx - 2],
        "bos": bos,
        "vocab": vocab,
        "contenders": rows,
        "skipped": skipped,
    }


def print_table(report: dict[str, Any], file: Any = None) -> None:
    file = file or sys.stdout
    first, last = report["scored_positions"]
    bos = report["bos"]
    print(f"kwker quality: {report['model']}", file=file)
    print(
        f"text {', '.join(report['text_files'])} ({report['text_tokens']} tokens); ctx {report['ctx']}, "
        f"{report['chunks']} chunks, {report['tokens_scored']} tokens scored (logits at positions "
        f"{first}..{last} of each chunk, llama-perplexity protocol); "
        + (f"BOS {bos} at the start of each chunk" if bos is not None else "no BOS (the tokenizer adds none)"),
        file=file,
    )
    width = max([22] + [len(r["name"]) for r in report["contenders"]])  # "llama.cpp Q4_0 kv q8_0" and longer
    header = (
        f"{'contender':<{width}} {'format':<12} {'bpw':>5} {'perplexity':>11} {'Δppl %':>8} {'KL':>11} {'top-1':>7} "
        f"{'seconds':>8}"
    )
    print(header, file=file)
    for r in report["contenders"]:
        delta = _no_negative_zero(r["delta_ppl_pct"], 3)
        print(
            f"{r['name']:<{width}} {r['format']:<12} {_fmt(r['bits_per_weight'], '5.2f')} "
            f"{_fmt(r['perplexity'], '11.4f')} {_fmt(delta, '+8.3f')} "
            f"{_fmt(r['kl'], '11.3e')} {_fmt(r['top1'], '7.4f')} {_fmt(r['seconds'], '8.1f')}",
            file=file,
        )
    print("KL = mean KL(p_hf-f32 || p_contender); top-1 = share of positions with the same argmax as hf-f32", file=file)
    print("bpw = stored bits per weight of the matrices (kwker: scales included; GGUF: tensor data)", file=file)
    for s in report["skipped"]:
        print(f"skipped {s['name']}: {s['reason']}", file=file)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        report = run(args)
    except QualityError as exc:
        print(f"kwker quality: error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        # non-finite numbers (an infinite perplexity) become null: the line stays strict JSON
        clean = json.loads(json.dumps(report, default=str), parse_constant=lambda _: None)
        print(json.dumps(clean, allow_nan=False))
    else:
        print_table(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
