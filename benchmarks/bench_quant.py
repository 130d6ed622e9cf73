"""KwkDecoder int8 / int4 against llama.cpp Q8_0 / Q4_0 / Q4_K_M, interleaved in one run.

For each model (``--models``: the real SmolLM2-135M and random-initialised SmolLM2-360M, Qwen2.5-0.5B,
Qwen3-0.6B, SmolLM2-1.7B with their published shapes): KwkDecoder ``precision="int8"`` and ``"int4"``
built from the bf16 weights, and llama.cpp GGUFs of the same weights quantized by llama.cpp itself
(``llama_model_quantize`` from the F32 export, cached). Each round times every contender's pp512 (one
512-token batch from an empty context; ``--prompt 2048`` for llama-bench's ``-p 2048``) and tg128 (128
single-token steps after one warm-up token), llama-bench's definitions, 2 threads; medians over
``--rounds``. The decode floor is weight bytes per token / the STREAM triad measured between the rounds.

Run: ``python benchmarks/bench_quant.py [--rounds 5] [--models ...] [--isa avx2] [--prompt 2048]``;
``--isa avx2`` forces KwkDecoder's AVX2 tier and uses llama.cpp built for AVX2 only. "pp GMAC/s" counts
the layers' matrices' multiply-adds per prompt token; "% of peak" sets it against this CPU's integer
multiply-add peak for the tier's instruction (``rust/examples/dot_peak.rs``, measured at the start).
Results: ``benchmarks/results/quant*.json``.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import time
from typing import Any

import torch
from bench_decoder import MODELS, cpu_flags, ggufs, kwk_pp, kwk_tg, load, say, start
from common import rust_example, save, stream_triad_gbs, table

import kwker_torch
from kwker_torch import KwkDecoder
from kwker_torch.peer.gguf_export import quantize
from kwker_torch.peer.llama_cpp import LlamaCppWorker

MODELS_Q = [*MODELS, "Qwen3-0.6B"]  # bench_decoder's models and Qwen3's shape (GGUF architecture qwen3)
OURS = ("int8", "int4")  # our precisions, each timed beside every llama.cpp format in PEERS
PEERS = ["Q8_0", "Q4_0", "Q4_K_M"]
HEADERS = ["model", "contender", "bits/weight", "MB/token", "pp tok/s", "tg128 tok/s", "pp vs Q8_0",
           "tg vs Q8_0", "pp vs Q4_0", "tg vs Q4_0", "pp vs Q4_K_M", "tg vs Q4_K_M", "floor / step",
           "pp GMAC/s", "pp % of peak"]  # fmt: skip


def peer_ggufs(name: str, model: torch.nn.Module, kind: str) -> dict[str, str]:
    """Q8_0 / Q4_0 / Q4_K_M GGUFs of ``model``, quantized by llama.cpp from the F32 export (cached)."""
    f32 = ggufs(name, model)["f32"]
    out = {}
    for ft in PEERS:
        path = f32.replace(".F32.gguf", f".{ft}.gguf")
        if not os.path.exists(path):
            say(f"  quantizing {os.path.basename(path)} with llama.cpp ...")
            quantize(f32, path, ft, kind=kind)
        out[ft] = path
    return out


def gguf_bits(path: str) -> tuple[float, float]:
    """(bits per weight of the matrices, MB of matrix data) of a GGUF."""
    import gguf

    r = gguf.GGUFReader(path)
    mats = [t for t in r.tensors if len(t.shape) > 1]
    nbytes = sum(int(t.n_bytes) for t in mats)
    return 8.0 * nbytes / sum(int(t.n_elements) for t in mats), nbytes / 1e6


def peak_gmacs(tier: str) -> tuple[float, str]:
    """This CPU's integer multiply-add peak on 2 threads for the instruction ``tier``'s quantized tiles are built
    on (``rust/examples/dot_peak.rs``): AVX-512 / AVX-VNNI ``vpdpbusd``, AVX2 ``vpmaddubsw + vpaddw``."""
    out = rust_example("dot_peak")
    want = {"avx512": "avx512 vpdpbusd", "avxvnni": "avxvnni vpdpbusd"}.get(tier, "avx2 vpmaddubsw + vpaddw")
    for line in out.splitlines():
        if line.startswith(want) and "skipped" not in line:
            return float(line.rsplit(",", 1)[1]), want
    return float("nan"), want


def layer_macs(model: torch.nn.Module) -> int:
    """Multiply-adds per prompt token in the layers' matrices (the lm_head reads only the last row)."""
    return sum(m.weight.numel() for m in model.model.layers.modules() if isinstance(m, torch.nn.Linear))


def interleaved_pptg(decs: dict[str, KwkDecoder], workers: dict[str, LlamaCppWorker], rounds: int,
                     prompt: int = 512) -> tuple[dict[str, dict[str, float]], float]:  # fmt: skip
    """Each round times every contender's pp (``prompt`` tokens) and tg128 in turn (round 0 warms up), with a
    STREAM triad between rounds; returns the medians ``{contender: {"pp", "tg"}}`` (tok/s) and the median triad."""
    t: dict[str, dict[str, list[float]]] = {c: {"pp": [], "tg": []} for c in [*decs, *workers]}
    triads: list[float] = []
    for r in range(rounds + 1):
        if r:
            triads.append(stream_triad_gbs(rounds=3))
        for c in t:
            time.sleep(0.2)  # let the other contenders' spinning threads settle
            if c in decs:
                pp, tg = kwk_pp(decs[c], prompt), kwk_tg(decs[c])
            else:
                pp, tg = workers[c].pp(prompt), workers[c].tg(128)
            if r:
                t[c]["pp"].append(prompt / pp)
                t[c]["tg"].append(128 / tg)
        if r:
            say(f"  round {r}: " + ", ".join(f"{c} pp {t[c]['pp'][-1]:.0f} tg {t[c]['tg'][-1]:.1f}" for c in t))
    say(f"  triad during the rounds: {', '.join(f'{x:.1f}' for x in triads)} GB/s")
    med = {c: {k: statistics.median(v) for k, v in d.items()} for c, d in t.items()}
    return med, statistics.median(triads)


def bench(name: str, rounds: int, kind: str, rows: list, peak: float = float("nan"), prompt: int = 512) -> None:
    model, label = load(name)
    macs = layer_macs(model)
    say(f"\n== {label}: KwkDecoder int8 / int4 and llama.cpp {', '.join(PEERS)}")
    ctx = max(1024, prompt + 256)
    decs = {p: KwkDecoder.from_hf(model, precision=p, max_batch=1, max_context=ctx) for p in OURS}
    paths = peer_ggufs(name, model, kind)
    del model
    gc.collect()
    workers = {ft: LlamaCppWorker(kind) for ft in PEERS}
    try:
        sysinfo = ""
        for ft, w in workers.items():
            sysinfo = w.load(paths[ft], n_ctx=ctx, n_batch=512).get("system_info", "")
        med, triad = interleaved_pptg(decs, workers, rounds, prompt)
        for c in med:
            if c in decs:
                bits, mb = decs[c].info["bits_per_weight"], decs[c].info["weight_bytes_per_token"] / 1e6
                desc = f"KwkDecoder {c}"
            else:
                bits, mb = gguf_bits(paths[c])
                desc = f"llama.cpp {c}"
            floor = mb * 1e6 / (triad * 1e9)
            row: list[Any] = [label, desc, bits, mb, med[c]["pp"], med[c]["tg"]]
            for p in PEERS:
                row += [med[c]["pp"] / med[p]["pp"], med[c]["tg"] / med[p]["tg"]]
            gmacs = macs * med[c]["pp"] / 1e9
            rows.append(row + [floor * med[c]["tg"], gmacs, 100 * gmacs / peak])
        say(table(HEADERS, rows[-len(med) :]))
        say(f"  llama.cpp: {sysinfo.strip()}")
    finally:
        for w in workers.values():
            w.close()
    del decs
    gc.collect()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--models", nargs="+", default=MODELS, choices=MODELS_Q)
    p.add_argument("--prompt", type=int, default=512, help="prompt tokens of the pp test (llama-bench -p)")
    p.add_argument("--isa", choices=["native", "avx2"], default="native")
    p.add_argument("--out", default=None, help="results/OUT.json (default quant, or quant_avx2 with --isa avx2)")
    a = p.parse_args()
    triad = start(a.isa)
    peak, instr = peak_gmacs(kwker_torch.isa())
    say(f"integer multiply-add peak ({instr}, 2 threads): {peak:.0f} GMAC/s")
    rows: list = []
    for name in a.models:
        bench(name, a.rounds, a.isa, rows, peak, a.prompt)
    say("\n" + table(HEADERS, rows))
    end = stream_triad_gbs()
    say(f"\nSTREAM triad at the end {end:.1f} GB/s")
    out = {"triad_gbs": triad, "triad_gbs_end": end, "rounds": a.rounds, "cpu_flags": cpu_flags(), "isa": a.isa,
           "rows": rows, "headers": HEADERS, "peak_gmacs": peak, "peak_instruction": instr,
           "prompt_tokens": a.prompt}  # fmt: skip
    name = a.out or ("quant" if a.isa == "native" else "quant_avx2")
    say(f"saved {save(name, out)}")


if __name__ == "__main__":
    main()
