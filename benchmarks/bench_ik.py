"""KwkDecoder int4 / int8 against ik_llama.cpp (the fastest CPU fork of llama.cpp) on Q4_0 / Q8_0 GGUFs of the same
weights, with and without its run-time repacking (``-rtr 1`` / ``-rtr 0``), interleaved in one run.

ik_llama.cpp is timed by its own ``llama-bench`` (built for this host by ``kwker_torch.peer.ik_build``), one
repetition per round: ``-p 512 -n 128 -t 2 -fa 1 -r 1``; KwkDecoder by the same definitions (pp512: one 512-token
batch from an empty context; tg128: 128 single-token steps after a warm-up token), 2 threads. Each round runs
every contender in turn; medians over ``--rounds``. The GGUFs are llama.cpp's own quantization of the F32 export
of the same weights (made and cached by ``bench_quant.py``'s ``peer_ggufs``). Ratios are ours over ik's best of
``-rtr 0`` / ``-rtr 1`` for each format (int4 over Q4_0, int8 over Q8_0).

Run: ``python benchmarks/bench_ik.py [--rounds 3] [--models SmolLM2-135M] [--isa avx2]``. Results:
``benchmarks/results/ik*.json``.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import subprocess
import time

from bench_decoder import MODELS, cpu_flags, kwk_pp, kwk_tg, load, say, start
from bench_quant import peer_ggufs
from common import save, stream_triad_gbs, table

from kwker_torch import KwkDecoder
from kwker_torch.peer.ik_build import ensure_ik_llama_bench, pinned_version

OURS = {"int4": "Q4_0", "int8": "Q8_0"}  # our precision and the ik format it is compared with
HEADERS = ["model", "contender", "pp512 tok/s", "tg128 tok/s", "pp vs ik best", "tg vs ik best"]


def ik_run(exe: str, gguf: str, rtr: int) -> tuple[float, float]:
    """pp512 and tg128 tok/s of one llama-bench repetition."""
    cmd = [exe, "-m", gguf, "-p", "512", "-n", "128", "-t", "2", "-fa", "1", "-r", "1", "-rtr", str(rtr), "-o", "json"]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"ik llama-bench failed ({' '.join(cmd)}):\n{out.stderr[-2000:]}")
    res = json.loads(out.stdout)
    speed = {("pp" if r["n_prompt"] else "tg"): r["avg_ts"] for r in res}
    return speed["pp"], speed["tg"]


def bench(name: str, rounds: int, kind: str, exe: str, rows: list) -> None:
    model, label = load(name)
    say(f"\n== {label}: KwkDecoder {', '.join(OURS)} and ik_llama.cpp {', '.join(OURS.values())} (-rtr 0 / 1)")
    decs = {p: KwkDecoder.from_hf(model, precision=p, max_batch=1, max_context=1024) for p in OURS}
    paths = peer_ggufs(name, model, kind)
    del model
    gc.collect()
    peers = [f"{ft} -rtr {rtr}" for ft in OURS.values() for rtr in (0, 1)]
    t: dict[str, dict[str, list[float]]] = {c: {"pp": [], "tg": []} for c in [*OURS, *peers]}
    for r in range(rounds + 1):  # round 0 warms up
        for c in t:
            time.sleep(0.2)
            if c in decs:
                pp, tg = 512 / kwk_pp(decs[c]), 128 / kwk_tg(decs[c])
            else:
                ft, rtr = c.split(" -rtr ")
                pp, tg = ik_run(exe, paths[ft], int(rtr))
            if r:
                t[c]["pp"].append(pp)
                t[c]["tg"].append(tg)
        if r:
            say(f"  round {r}: " + ", ".join(f"{c} pp {t[c]['pp'][-1]:.0f} tg {t[c]['tg'][-1]:.1f}" for c in t))
    med = {c: {k: statistics.median(v) for k, v in d.items()} for c, d in t.items()}
    best = {ft: {k: max(med[f"{ft} -rtr {x}"][k] for x in (0, 1)) for k in ("pp", "tg")} for ft in OURS.values()}
    for c in t:
        ft = OURS.get(c) or c.split(" -rtr ")[0]
        desc = f"KwkDecoder {c}" if c in decs else f"ik_llama.cpp {c}"
        rows.append([label, desc, med[c]["pp"], med[c]["tg"], med[c]["pp"] / best[ft]["pp"],
                     med[c]["tg"] / best[ft]["tg"]])  # fmt: skip
    say(table(HEADERS, rows[-len(t) :]))
    del decs
    gc.collect()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--models", nargs="+", default=["SmolLM2-135M"], choices=MODELS)
    p.add_argument("--isa", choices=["native", "avx2"], default="native",
                   help="avx2 forces KwkDecoder's AVX2 tier (ik_llama.cpp stays a native build)")  # fmt: skip
    p.add_argument("--out", default=None, help="results/OUT.json (default ik)")
    a = p.parse_args()
    exe = ensure_ik_llama_bench()
    triad = start(a.isa)
    say(f"ik_llama.cpp {pinned_version()} (PyPI ik-llama-cpp-python's source), native build: {exe}")
    rows: list = []
    for name in a.models:
        bench(name, a.rounds, a.isa, exe, rows)
    say("\n" + table(HEADERS, rows))
    end = stream_triad_gbs()
    say(f"\nSTREAM triad at the end {end:.1f} GB/s")
    out = {"triad_gbs": triad, "triad_gbs_end": end, "rounds": a.rounds, "cpu_flags": cpu_flags(), "isa": a.isa,
           "rows": rows, "headers": HEADERS}  # fmt: skip
    say(f"saved {save(a.out or 'ik', out)}")


if __name__ == "__main__":
    main()
