"""pp512 and tg128 at depth: KwkDecoder against llama.cpp's ``llama-bench -d``, interleaved in one run.

For each model (``--models``: the real SmolLM2-135M, random-initialised Qwen2.5-0.5B and SmolLM2-1.7B with their
published shapes) and each precision pair (``--precisions``: KwkDecoder int4 against a llama.cpp Q4_0 GGUF of the
same weights by default; int8 against Q8_0 and preserve against BF16 on request), at each depth d (``--depths``,
default 0 1,024 4,096 16,384): d tokens of context are filled (untimed) into KwkDecoder and into llama.cpp, then
each round times every contender in turn: pp512 (one 512-token chunk after the d tokens) and tg128 (128
single-token steps after the d tokens); between the two, and before every round, each contender's context is cut
back to its d tokens (KwkDecoder ``truncate``, llama.cpp ``llama_memory_seq_rm``; llama-bench restores a saved copy
of the filled state, which holds the same cells). Round 0 warms up; the tables give medians over ``--rounds``.

Context: real English text, ``--text FILE`` or else the project's own sample story
(``kwker_torch.texts.sample_text()``) repeated as needed, read through SmolLM2's tokenizer (its ids fit every
model's vocabulary; the random models' weights make any ids alike). Both contenders get the same ids: the fill, the
pp chunk and the tg tokens (llama-bench draws random ones), in 512-token batches for the fill.
Depths are clipped to each model's context (d + 512 must fit; a note says which were dropped); a random model whose
``max_position_embeddings`` is shorter gets it raised after its GGUF is written (a note says so; the weights do not
depend on it, and llama.cpp only warns that the context passes the file's ``context_length``).

KV caches: KwkDecoder's format is ``--kv-cache`` (f32, bf16, q8; several run as separate contenders, each a decoder
of its own, ``KwkDecoder.from_hf(kv_cache=...)``).
llama.cpp runs with its default f16 cache (flash attention "auto", as llama-bench), or with ``--peer-cache q8_0``
type_k = type_v = q8_0 and flash attention on (``-ctk q8_0 -ctv q8_0 -fa 1``); ``--peer-cache f16 q8_0`` runs both.
llama.cpp's own lines about flash attention are printed after each load. KV bytes per token: KwkDecoder's from
``dec.info["kv_bytes_per_token"]`` (what each token adds: its global layers'); llama.cpp's from its cache type
(f16: 2 bytes a value, q8_0: 34/32).

Run: ``flock /tmp/kwker-build.lock python benchmarks/bench_depth.py [--rounds 3] [--models ...] [--depths ...]
[--precisions int4 int8 preserve] [--peer-cache f16 q8_0] [--kv-cache f32 bf16 q8] [--text FILE]``; 2 threads.
Depth 16,384 on SmolLM2-1.7B fills ~17k tokens per contender and holds ~6.7 GB of float32 KV: expect a long run.
Results: ``benchmarks/results/depth.json`` (with each fill's seconds); tables are printed as they are measured, a
progress line per measurement.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import time
from typing import Any

import torch
from bench_decoder import cpu_flags, ggufs, say, start
from common import save, stream_triad_gbs, table

from kwker_torch import KwkDecoder
from kwker_torch.decoder.common import KV_CACHES
from kwker_torch.peer import PEER_CACHES
from kwker_torch.peer.gguf_export import quantize
from kwker_torch.peer.llama_cpp import LlamaCppWorker
from kwker_torch.testing import SMOLLM2_GGUF, load_smollm2, random_model, smollm2_dir
from kwker_torch.texts import sample_text

MODELS = ["SmolLM2-135M", "Qwen2.5-0.5B", "SmolLM2-1.7B"]
PAIRS = {"int4": "Q4_0", "int8": "Q8_0", "preserve": "BF16"}  # KwkDecoder precision -> llama.cpp GGUF type
PEER_VALUE_BYTES = {"f16": 2.0, "q8_0": 34 / 32}  # q8_0: 32 int8 values and one f16 scale a block
PEER_KIND = "native"
PP, TG, BATCH = 512, 128, 512
HEADERS = ["model", "depth", "contender", "KV cache", "KV bytes/token", "KV bytes from", "pp512 tok/s",
           "tg128 tok/s", "pp vs llama.cpp", "tg vs llama.cpp", "pp vs depth 0", "tg vs depth 0"]  # fmt: skip


class Eta:
    """A rough time-left estimate for one model: work units weighted by depth, seconds per unit so far."""

    def __init__(self, total: float) -> None:
        self.total, self.done, self.t0 = total, 0.0, time.perf_counter()

    def add(self, units: float) -> str:
        self.done += units
        spent = time.perf_counter() - self.t0
        left = spent * max(self.total - self.done, 0.0) / max(self.done, 1e-9)
        return f"{_mins(spent)} spent, ~{_mins(left)} left for this model"


def _mins(s: float) -> str:
    return f"{s / 60:.1f} min" if s >= 60 else f"{s:.0f} s"


def measure_units(d: int) -> float:
    """Work of one pp512 + tg128 at depth d (attention grows with d), in units of one at depth 0."""
    return 1.0 + d / 4096


def fill_units(d: int) -> float:
    """Work of filling d tokens, in the units of ``measure_units`` (a 512-token prompt is ~a third of a unit)."""
    return d / PP * 0.3 * (1.0 + d / 8192)


def text_ids(path: str | None, n: int) -> tuple[list[int], str]:
    """``n`` token ids of real English text (``path``, else the sample story), the text repeated as needed."""
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    if path:
        with open(path, encoding="utf-8") as f:
            text, what = f.read(), os.path.basename(path)
    else:
        text, what = sample_text(), "kwker_torch.texts sample story"
    hf_logging.set_verbosity_error()
    tok = AutoTokenizer.from_pretrained(smollm2_dir(), gguf_file=SMOLLM2_GGUF)
    once = tok(text[: 8 * n], add_special_tokens=False)["input_ids"]  # English runs ~4 characters a token
    if not once:
        raise SystemExit(f"--text {path}: no tokens in that file")
    reps = -(-n // len(once))
    ids = (once * reps)[:n]
    return ids, f"{what}: {len(once)} tokens (SmolLM2 tokenizer), repeated x{reps} for {n}"


def load_model(name: str) -> tuple[torch.nn.Module, str, bool]:
    """The bf16 model of ``name``, a label, and whether it is the real one (its context cannot be raised)."""
    if name == "SmolLM2-135M":
        return load_smollm2(torch.bfloat16)[0], "SmolLM2-135M (real)", True
    return random_model(name, torch.bfloat16), f"{name} (random init)", False


def plan_depths(model: torch.nn.Module, label: str, real: bool, depths: list[int], notes: list[str]) -> list[int]:
    """The depths this model runs: for the real model those with d + 512 within its context; a random model's
    ``max_position_embeddings`` raised to fit the deepest (the GGUF is already written with the published one)."""
    cfg = model.config
    limit = int(cfg.max_position_embeddings)
    need = max(depths) + PP
    if real:
        kept = [d for d in depths if d + PP <= limit]
        if len(kept) < len(depths):
            notes.append(f"{label}: depths {[d for d in depths if d not in kept]} dropped: its context is {limit} "
                         f"tokens (max_position_embeddings) and depth + {PP} must fit")  # fmt: skip
        return kept
    if need > limit:
        cfg.max_position_embeddings = need
        gguf = f"its GGUF keeps context_length {limit} (llama.cpp only warns)"
        notes.append(f"{label}: max_position_embeddings raised from {limit} to {need} on the random model for depth "
                     f"{max(depths)} (+{PP}); {gguf}")  # fmt: skip
    return list(depths)


def peer_gguf(name: str, model: torch.nn.Module, ftype: str) -> str:
    """The llama.cpp GGUF of ``model`` for ``ftype`` (BF16 exported; Q8_0/Q4_0 quantized by llama.cpp from the F32
    export), cached under the names bench_decoder / bench_quant use."""
    paths = ggufs(name, model)
    if ftype == "BF16":
        return paths["bf16"]
    path = paths["f32"].replace(".F32.gguf", f".{ftype}.gguf")
    if not os.path.exists(path):
        say(f"  quantizing {os.path.basename(path)} with llama.cpp ...")
        quantize(paths["f32"], path, ftype, kind=PEER_KIND)
    return path


def kv_dims(cfg: Any) -> tuple[int, int, int]:
    """(layers, KV heads, head dim) of a config."""
    heads = int(cfg.num_attention_heads)
    kv_heads = int(getattr(cfg, "num_key_value_heads", None) or heads)
    head_dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // heads)
    return int(cfg.num_hidden_layers), kv_heads, head_dim


def kwk_kv_bytes(dec: KwkDecoder, fmt: str) -> tuple[float, str]:
    """KwkDecoder's KV bytes per token (its global layers'), as the native cache states them in ``dec.info``."""
    assert dec.info["kv_cache"] == fmt, (dec.info["kv_cache"], fmt)
    return float(dec.info["kv_bytes_per_token"]), "dec.info"


def peer_kv_bytes(cfg: Any, n_layer: int, cache: str) -> float:
    _, kv_heads, head_dim = kv_dims(cfg)
    return 2 * n_layer * kv_heads * head_dim * PEER_VALUE_BYTES[cache]


def kwk_fill(dec: KwkDecoder, ids: list[int]) -> float:
    """Empties slot 0 and reads ``ids`` in 512-token steps (as llama.cpp's n_batch); seconds (not a test's time)."""
    dec.reset(0)
    t0 = time.perf_counter()
    for s in range(0, len(ids), BATCH):
        dec.step([(0, ids[s : s + BATCH])], logits="none")
    return time.perf_counter() - t0


def kwk_pp(dec: KwkDecoder, depth: int, ids: list[int]) -> float:
    """Seconds of one 512-token chunk after the slot's first ``depth`` tokens (the slot cut back to them)."""
    dec.truncate(0, depth)
    chunk = torch.tensor(ids[depth : depth + PP])
    t0 = time.perf_counter()
    dec.step([(0, chunk)], logits="last")
    return time.perf_counter() - t0


def kwk_tg(dec: KwkDecoder, depth: int, ids: list[int]) -> float:
    """Seconds of 128 single-token steps after the slot's first ``depth`` tokens (the slot cut back to them)."""
    dec.truncate(0, depth)
    toks = ids[depth : depth + TG]
    t0 = time.perf_counter()
    for t in toks:
        dec.step([(0, [t])])
    return time.perf_counter() - t0


def bench_pair(name: str, label: str, model: torch.nn.Module, prec: str, depths: list[int], ids: list[int],
               a: argparse.Namespace, eta: Eta, rows: list, extra: dict[str, Any]) -> None:  # fmt: skip
    """One precision pair on one model: KwkDecoder ``prec`` and llama.cpp ``PAIRS[prec]`` under each peer cache."""
    ftype = PAIRS[prec]
    path = peer_gguf(name, model, ftype)
    ctx = max(depths) + PP
    decs = {f"KwkDecoder {prec}" + ("" if f == "f32" else f" kv {f}"):
            KwkDecoder.from_hf(model, precision=prec, max_batch=1, max_context=ctx, kv_cache=f)
            for f in a.kv_cache}  # fmt: skip
    peers = [f"llama.cpp {ftype}" + ("" if c == "f16" else f" kv {c}") for c in a.peer_cache]
    names = [*decs, *peers]
    kv: dict[str, tuple[str, float, str]] = {
        n: (f, *kwk_kv_bytes(dec, f)) for (n, dec), f in zip(decs.items(), a.kv_cache, strict=True)
    }
    workers: dict[str, LlamaCppWorker] = {}
    try:
        for c, n in zip(a.peer_cache, peers, strict=True):
            w = workers[n] = LlamaCppWorker(PEER_KIND)
            info = w.load(path, n_ctx=-(-ctx // 256) * 256, n_batch=BATCH, **PEER_CACHES[c])
            fa = "; ".join(info.get("flash_attn_log") or ["(no line)"])
            say(f"  {n}: cache type_k = type_v = {c}, flash_attn {PEER_CACHES[c]['flash_attn']}: llama.cpp says {fa}")
            extra.setdefault("flash_attn_log", {})[f"{label} {n}"] = info.get("flash_attn_log")
            extra["system_info"] = info.get("system_info", "").strip()
            cache = c + (" (fa on)" if c == "q8_0" else "")
            kv[n] = (cache, peer_kv_bytes(model.config, int(info["n_layer"]), c), "cache type")
        base: dict[str, dict[str, float]] = {}
        for d in depths:
            say(f"\n  -- {label}, {prec} vs {ftype}, depth {d}")
            if d:
                for n in names:
                    secs = kwk_fill(decs[n], ids[:d]) if n in decs else workers[n].fill(ids[:d])
                    extra.setdefault("fill_seconds", {})[f"{label} {n} depth {d}"] = secs
                    rate = f"{secs:.1f} s ({d / secs:.0f} tok/s, untimed)"
                    say(f"  fill {d} tokens: {n} {rate}; {eta.add(fill_units(d))}")
            t: dict[str, dict[str, list[float]]] = {n: {"pp": [], "tg": []} for n in names}
            for r in range(a.rounds + 1):  # round 0 warms up
                for n in names:
                    time.sleep(0.2)  # let the other contenders' spinning threads settle
                    if n in decs:
                        pp, tg = kwk_pp(decs[n], d, ids), kwk_tg(decs[n], d, ids)
                    else:
                        w = workers[n]
                        pp = w.pp(PP, warmup=False, depth=d, tokens=ids[d : d + PP])
                        tg = w.tg(TG, warmup=False, depth=d, tokens=ids[d : d + TG])
                    if r:
                        t[n]["pp"].append(PP / pp)
                        t[n]["tg"].append(TG / tg)
                    tag = f"round {r}/{a.rounds}" + (" (warm-up)" if r == 0 else "")
                    say(f"  [d={d} {tag}] {n}: pp512 {PP / pp:.1f} tok/s, tg128 {TG / tg:.2f} tok/s; "
                        f"{eta.add(measure_units(d) / len(names))}")  # fmt: skip
            med = {n: {k: statistics.median(v) for k, v in x.items()} for n, x in t.items()}
            if d == 0:
                base = med
            ref = med[peers[0]]
            for n in names:
                cache, per, src = kv[n]
                m = med[n]
                rel0 = [m["pp"] / base[n]["pp"], m["tg"] / base[n]["tg"]] if base else ["", ""]
                rows.append([label, d, n, cache, per, src, m["pp"], m["tg"], m["pp"] / ref["pp"], m["tg"] / ref["tg"],
                             *rel0])  # fmt: skip
            say(table(HEADERS, rows[-len(names) :]))
    finally:
        for w in workers.values():
            w.close()
        decs.clear()
        gc.collect()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--models", nargs="+", default=MODELS[:1], choices=MODELS)
    p.add_argument("--depths", nargs="+", type=int, default=[0, 1024, 4096, 16384])
    p.add_argument("--precisions", nargs="+", default=["int4"], choices=list(PAIRS),
                   help="KwkDecoder precisions, each against its llama.cpp GGUF: int4 - Q4_0, int8 - Q8_0, "
                        "preserve - BF16")  # fmt: skip
    p.add_argument("--peer-cache", nargs="+", default=["f16"], choices=list(PEER_CACHES),
                   help="llama.cpp KV cache: f16 (its default, flash attention auto) and/or q8_0 (-ctk q8_0 "
                        "-ctv q8_0 -fa 1)")  # fmt: skip
    p.add_argument("--kv-cache", nargs="+", default=["f32"], choices=KV_CACHES,
                   help="KwkDecoder's KV cache formats, each a contender (KwkDecoder.from_hf(kv_cache=...))")
    p.add_argument("--text", default=None, metavar="FILE",
                   help="English text to fill the context with (default: the project's sample story)")  # fmt: skip
    a = p.parse_args()
    if any(d < 0 for d in a.depths) or a.rounds < 1:
        raise SystemExit("--depths must be >= 0 and --rounds >= 1")
    depths = sorted(set(a.depths))
    a.models, a.precisions, a.peer_cache, a.kv_cache = (
        list(dict.fromkeys(x)) for x in (a.models, a.precisions, a.peer_cache, a.kv_cache)
    )
    triad = start("native")
    ids, about = text_ids(a.text, max(depths) + PP)
    say(f"context text: {about}")
    rows: list = []
    notes: list[str] = []
    extra: dict[str, Any] = {}
    for name in a.models:
        model, label, real = load_model(name)
        say(f"\n== {label}: KwkDecoder {', '.join(a.precisions)} (KV {a.kv_cache}) against llama.cpp "
            f"{', '.join(PAIRS[x] for x in a.precisions)} (KV {', '.join(a.peer_cache)})")  # fmt: skip
        for prec in a.precisions:  # every GGUF written before the context limit changes
            peer_gguf(name, model, PAIRS[prec])
        mine = plan_depths(model, label, real, depths, notes)
        for n in notes:
            if n.startswith(label):
                say(f"  note: {n}")
        if not mine:
            continue
        units = sum(fill_units(d) * (1 + len(a.peer_cache)) + measure_units(d) * (a.rounds + 1) for d in mine)
        eta = Eta(units * len(a.precisions))
        for prec in a.precisions:
            bench_pair(name, label, model, prec, mine, ids, a, eta, rows, extra)
        del model
        gc.collect()
    say("\n" + table(HEADERS, rows))
    say("pp/tg vs llama.cpp: against the llama.cpp GGUF of the same pair with the first --peer-cache "
        f"({a.peer_cache[0]}); vs depth 0: the same contender's depth-0 medians")  # fmt: skip
    for n in notes:
        say(f"note: {n}")
    end = stream_triad_gbs()
    say(f"\nSTREAM triad at the start {triad:.1f} GB/s, at the end {end:.1f} GB/s")
    out = {"triad_gbs": triad, "triad_gbs_end": end, "rounds": a.rounds, "cpu_flags": cpu_flags(),
           "depths": depths, "precisions": a.precisions, "peer_cache": a.peer_cache, "kv_cache": a.kv_cache,
           "text": about, "rows": rows, "headers": HEADERS, "notes": notes, **extra}  # fmt: skip
    say(f"saved {save('depth', out)}")


if __name__ == "__main__":
    main()
