"""KwkDecoder against llama.cpp (and Hugging Face on torch), interleaved in one run.

Sections (``--sections``, default all):
  ``pptg``   pp512 / tg128 as llama-bench times them (pp512: one 512-token batch from an empty context;
             tg128: 128 single-token steps from an empty context after one warm-up token), KwkDecoder
             preserve against llama.cpp BF16 and F32 GGUFs of the same weights, 2 threads; GB/s of weights
             during tg against the STREAM triad of the same run.
  ``batch``  1, 4 and 8 sequences, 64-token prompts + 64 new tokens: summed generated tokens/s of one step
             per token for all sequences, against llama.cpp's batched decoding (llama-batched-bench's S_TG).
  ``hf``     HF ``generate()`` on the real SmolLM2-135M with ``decode.install()`` against torch eager float32
             and bf16: bf16 weights loaded as float32 (bf16-exact, read as bf16), and the GGUF's own float32
             weights (not bf16-exact, read as float32); greedy tokens checked against torch float32.
  ``contention``  decode step time with a busy loop pinned to one core, against quiet (KwkDecoder, llama.cpp
             BF16, stock torch bf16 generate).
Models (``--models``): the real SmolLM2-135M and random-initialised SmolLM2-360M, Qwen2.5-0.5B, SmolLM2-1.7B
(exact published shapes). llama.cpp comes from ``python -m kwker_torch.peer.build`` (benchmark-only); GGUFs
are exported once into its cache folder.

Run: ``python benchmarks/bench_decoder.py [--rounds 5] [--models ...] [--sections ...] [--isa avx2]``. Results go to
``benchmarks/results/decoder.json``; tables are printed as they are measured.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import torch
from common import machine, save, stream_triad_gbs, table

import kwker_torch
from kwker_torch import KwkDecoder, decode
from kwker_torch.peer import build
from kwker_torch.peer.build import cache_root
from kwker_torch.peer.gguf_export import export_gguf
from kwker_torch.peer.llama_cpp import LlamaCppWorker
from kwker_torch.testing import chat_ids, generate_greedy, load_smollm2, random_model

MODELS = ["SmolLM2-135M", "SmolLM2-360M", "Qwen2.5-0.5B", "SmolLM2-1.7B"]
SECTIONS = ["pptg", "batch", "hf", "contention"]
PEER_KIND = "native"  # the llama.cpp build: "native" (-DGGML_NATIVE=ON) or "avx2" (--isa avx2)
PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle."


def say(msg: str) -> None:
    print(msg, flush=True)


def cpu_flags() -> str:
    flags = build.cpu_flags()
    return " ".join(sorted(x for x in flags if x.startswith(("avx", "amx", "fma")))) if flags else "?"


def load(name: str) -> tuple[torch.nn.Module, str]:
    """The bf16 model of ``name`` and a label."""
    if name == "SmolLM2-135M":
        return load_smollm2(torch.bfloat16)[0], "SmolLM2-135M (real)"
    return random_model(name, torch.bfloat16), f"{name} (random init)"


def ggufs(name: str, model: torch.nn.Module) -> dict[str, str]:
    """BF16 and F32 GGUFs of ``model``'s weights (exported once, cached)."""
    folder = os.path.join(cache_root(), "gguf")
    os.makedirs(folder, exist_ok=True)
    tag = "real" if name == "SmolLM2-135M" else "random-seed0"
    out = {}
    for dt in ("bf16", "f32"):
        path = os.path.join(folder, f"bench-{name}-{tag}.{dt.upper()}.gguf")
        if not os.path.exists(path):
            say(f"  exporting {os.path.basename(path)} ...")
            src = model if dt == "bf16" else model.float()
            export_gguf(src, path, dt)
            if dt == "f32":
                model.bfloat16()
            gc.collect()
        out[dt] = path
    return out


def median_of(fn: Callable[[], float], n: int) -> float:
    return statistics.median(fn() for _ in range(n))


def kwk_pp(dec: KwkDecoder, n: int = 512) -> float:
    ids = torch.randint(100, 20000, (n,), generator=torch.Generator().manual_seed(0))
    dec.reset(0)
    t0 = time.perf_counter()
    dec.step([(0, ids)], logits="last")
    return time.perf_counter() - t0


def kwk_tg(dec: KwkDecoder, n: int = 128) -> float:
    dec.reset(0)
    dec.step([(0, [1])])  # warm-up token, as llama-bench
    dec.reset(0)
    t0 = time.perf_counter()
    tok = 1
    for _ in range(n):
        (lg,) = dec.step([(0, [tok])])
        tok = int(lg[0].argmax()) % 20000 + 100
    return time.perf_counter() - t0


def kwk_batched(dec: KwkDecoder, n_seq: int, n_prompt: int = 64, n_gen: int = 64) -> float:
    """Seconds of the n_gen decode steps of n_seq sequences (prompts read first, in one step)."""
    g = torch.Generator().manual_seed(n_seq)
    dec.reset()
    dec.step([(s, torch.randint(100, 20000, (n_prompt,), generator=g)) for s in range(n_seq)], logits="last")
    toks = [1] * n_seq
    t0 = time.perf_counter()
    for _ in range(n_gen):
        out = dec.step([(s, [toks[s]]) for s in range(n_seq)])
        toks = [int(o[0].argmax()) % 20000 + 100 for o in out]
    return time.perf_counter() - t0


def bench_pptg(name: str, rounds: int, triad: float, rows: list, batch_rows: list, sections: list[str]) -> None:
    model, label = load(name)
    say(f"\n== {label}: building the decoder and the GGUFs")
    dec = KwkDecoder.from_hf(model, max_batch=8, max_context=1024)
    wb = dec.info["weight_bytes_per_token"]
    paths = ggufs(name, model)
    del model
    gc.collect()
    with LlamaCppWorker(PEER_KIND) as bf, LlamaCppWorker(PEER_KIND) as f32:
        bf_info = bf.load(paths["bf16"], n_ctx=4096, n_batch=512, n_seq_max=8)
        f32.load(paths["f32"], n_ctx=4096, n_batch=512)
        if "pptg" in sections:
            t: dict[str, dict[str, list[float]]] = {c: {"pp": [], "tg": []} for c in ("kwker", "bf16", "f32")}
            triads: list[float] = []
            for r in range(rounds + 1):  # round 0 warms up
                if r:  # this VM's bandwidth drifts: the floor uses the triad measured between the rounds
                    triads.append(stream_triad_gbs(rounds=3))
                for c in ("kwker", "bf16", "f32"):
                    time.sleep(0.2)  # let the other contenders' spinning threads settle
                    pp = kwk_pp(dec) if c == "kwker" else (bf if c == "bf16" else f32).pp(512)
                    tg = kwk_tg(dec) if c == "kwker" else (bf if c == "bf16" else f32).tg(128)
                    if r:
                        t[c]["pp"].append(512 / pp)
                        t[c]["tg"].append(128 / tg)
                say(f"  round {r}: " + ", ".join(f"{c} pp {t[c]['pp'][-1]:.0f} tg {t[c]['tg'][-1]:.1f}"
                                                  for c in t if t[c]["pp"]))  # fmt: skip
            med = {c: {k: statistics.median(v) for k, v in d.items()} for c, d in t.items()}
            floor_ms = wb / (statistics.median(triads) * 1e9) * 1e3
            say(f"  triad during the rounds: {', '.join(f'{x:.1f}' for x in triads)} GB/s")
            for c, desc in (("kwker", "KwkDecoder preserve (bf16 weights)"), ("bf16", "llama.cpp BF16"),
                            ("f32", "llama.cpp F32")):  # fmt: skip
                tg_ms = 1e3 / med[c]["tg"]
                gbs = (wb if c != "f32" else 2 * wb) / (tg_ms / 1e3) / 1e9
                rows.append([label, desc, med[c]["pp"], med[c]["pp"] / med["bf16"]["pp"], med[c]["tg"],
                             med[c]["tg"] / med["bf16"]["tg"], med[c]["tg"] / med["f32"]["tg"], gbs,
                             floor_ms / tg_ms if c != "f32" else 2 * floor_ms / tg_ms,
                             statistics.median(triads)])  # fmt: skip
            say(table(PPTG_HEADERS, rows[-3:]))
        if "batch" in sections:
            res: dict[int, dict[str, list[float]]] = {n: {"kwker": [], "bf16": []} for n in (1, 4, 8)}
            for r in range(rounds + 1):
                for n in (1, 4, 8):
                    time.sleep(0.2)
                    ours = n * 64 / kwk_batched(dec, n)
                    theirs = bf.batched(n, 64, 64)["gen_tok_s"]
                    if r:
                        res[n]["kwker"].append(ours)
                        res[n]["bf16"].append(theirs)
            one = statistics.median(res[1]["kwker"])
            for n in (1, 4, 8):
                k, b = statistics.median(res[n]["kwker"]), statistics.median(res[n]["bf16"])
                batch_rows.append([label, n, k, k / one, b, k / b])
            say(table(BATCH_HEADERS, batch_rows[-3:]))
    say(f"  llama.cpp: {bf_info['system_info'].strip()}")
    del dec
    gc.collect()


PPTG_HEADERS = ["model", "contender", "pp512 tok/s", "vs llama.cpp BF16", "tg128 tok/s", "vs llama.cpp BF16",
                "vs llama.cpp F32", "GB/s of weights", "floor / step", "triad GB/s"]  # fmt: skip
BATCH_HEADERS = ["model", "sequences", "kwker gen tok/s (sum)", "vs 1 sequence", "llama.cpp BF16 gen tok/s",
                 "kwker vs llama.cpp"]  # fmt: skip
HF_HEADERS = ["run", "weights read", "tok/s (prefill + 128 new)", "vs torch f32 eager", "tokens = torch f32"]


def bench_hf(rounds: int, rows: list) -> None:
    """HF generate() on the real SmolLM2-135M, 128 greedy tokens, prompt included."""
    import copy

    bf16, tok = load_smollm2(torch.bfloat16)
    f32 = copy.deepcopy(bf16).float()  # bf16 values as float32: bf16-exact
    gguf_f32, _ = load_smollm2(torch.float32)  # the GGUF's dequantized float32 values: not bf16-exact
    ids = chat_ids(tok, PROMPT)
    inst_exact = decode.install(copy.deepcopy(f32), max_batch=1, max_context=512)
    inst_f32 = decode.install(gguf_f32, max_batch=1, max_context=512)
    contenders = {
        "torch f32 eager": (f32, "float32"),
        "torch bf16 eager": (bf16, "bf16"),
        "decode.install, bf16 weights as float32": (inst_exact, "bf16 (bf16-exact float32)"),
        "decode.install, GGUF float32 weights": (inst_f32, "float32 (not bf16-exact)"),
    }
    times: dict[str, list[float]] = {c: [] for c in contenders}
    out: dict[str, torch.Tensor] = {}
    for r in range(rounds + 1):
        for c, (m, _) in contenders.items():
            t0 = time.perf_counter()
            out[c] = generate_greedy(m, ids, 128, exact=True)
            if r:
                times[c].append(128 / (time.perf_counter() - t0))
        say(f"  round {r}: " + ", ".join(f"{c} {v[-1]:.1f}" for c, v in times.items() if v))
    ref = statistics.median(times["torch f32 eager"])
    gguf_ref = generate_greedy(load_smollm2(torch.float32)[0], ids, 128, exact=True)
    for c, (_, desc) in contenders.items():
        want = gguf_ref if "GGUF" in c else out["torch f32 eager"]
        same = "yes" if torch.equal(out[c], want) else "NO"
        if c == "torch bf16 eager":
            same = "yes" if torch.equal(out[c], want) else "no (bf16 rounding)"
        rows.append([c, desc, statistics.median(times[c]), statistics.median(times[c]) / ref, same])
    say(table(HF_HEADERS, rows))


def busy_loop() -> subprocess.Popen:
    """A busy loop pinned to the last core."""
    cpu = str(os.cpu_count() - 1 if os.cpu_count() else 1)
    return subprocess.Popen(["taskset", "-c", cpu, sys.executable, "-c", "while True: pass"])


def bench_contention(rounds: int, rows: list) -> None:
    model, tok = load_smollm2(torch.bfloat16)
    dec = KwkDecoder.from_hf(model, max_batch=1, max_context=1024)
    paths = ggufs("SmolLM2-135M", model)
    ids = chat_ids(tok, PROMPT)
    with LlamaCppWorker(PEER_KIND) as bf:
        bf.load(paths["bf16"], n_ctx=4096, n_batch=512)
        runs: dict[str, Callable[[], float]] = {
            "KwkDecoder tg128": lambda: kwk_tg(dec) / 128,
            "llama.cpp BF16 tg128": lambda: bf.tg(128) / 128,
            "torch bf16 generate (32 tokens)": lambda: _torch_gen(model, ids),
        }
        quiet: dict[str, list[float]] = {k: [] for k in runs}
        busy: dict[str, list[float]] = {k: [] for k in runs}
        for r in range(rounds):
            for k, fn in runs.items():
                quiet[k].append(fn())
                p = busy_loop()
                time.sleep(0.3)
                try:
                    busy[k].append(fn())
                finally:
                    p.kill()
                    p.wait()
            say(f"  round {r}: " + ", ".join(f"{k} {busy[k][-1] / quiet[k][-1]:.2f}x" for k in runs))
    for k in runs:
        q, b = statistics.median(quiet[k]), statistics.median(busy[k])
        rows.append([k, q * 1e3, b * 1e3, b / q])
    say(table(["run", "quiet ms/token", "busy-loop ms/token", "slow-down (bar <= 2.5)"], rows))
    say(f"  decoder pool stalls so far: {kwker_torch.decoder.pool_stalls()}")


def _torch_gen(model: torch.nn.Module, ids: torch.Tensor) -> float:
    t0 = time.perf_counter()
    generate_greedy(model, ids, 32, exact=True)
    return (time.perf_counter() - t0) / 32


def start(isa: str) -> float:
    """Sets kwker's tier ("avx2" forces it) and 2 threads, prints the machine, its ISA flags and the
    STREAM triad, and returns the triad (GB/s)."""
    if isa == "avx2":
        kwker_torch.set_isa("avx2")
    torch.set_num_threads(2)
    say(f"{machine()}; kwker tier {kwker_torch.isa()}, {kwker_torch.num_threads()} threads")
    say(f"CPU flags: {cpu_flags()}")
    triad = stream_triad_gbs()
    say(f"STREAM triad {triad:.1f} GB/s")
    return triad


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--models", nargs="+", default=MODELS, choices=MODELS)
    p.add_argument("--sections", nargs="+", default=SECTIONS, choices=SECTIONS)
    p.add_argument("--isa", choices=["native", "avx2"], default="native",
                   help="avx2: KwkDecoder forced to its AVX2 tier against llama.cpp built for AVX2 only")
    a = p.parse_args()
    global PEER_KIND
    PEER_KIND = a.isa
    triad = start(a.isa)
    results: dict[str, Any] = {"triad_gbs": triad, "rounds": a.rounds, "cpu_flags": cpu_flags()}
    pptg: list = []
    batch: list = []
    if {"pptg", "batch"} & set(a.sections):
        for name in a.models:
            bench_pptg(name, a.rounds, triad, pptg, batch, a.sections)
        results.update(pptg=pptg, pptg_headers=PPTG_HEADERS, batch=batch, batch_headers=BATCH_HEADERS)
        say("\n" + table(PPTG_HEADERS, pptg))
        say("\n" + table(BATCH_HEADERS, batch))
    if "hf" in a.sections:
        say("\n== HF generate() on the real SmolLM2-135M")
        hf: list = []
        bench_hf(a.rounds, hf)
        results.update(hf=hf, hf_headers=HF_HEADERS)
    if "contention" in a.sections:
        say("\n== contention: a busy loop pinned to one of the cores")
        cont: list = []
        bench_contention(max(3, a.rounds // 2), cont)
        results.update(contention=cont)
    results["triad_gbs_end"] = stream_triad_gbs()
    say(f"\nSTREAM triad at the end {results['triad_gbs_end']:.1f} GB/s")
    results["isa"] = a.isa
    say(f"saved {save('decoder' if a.isa == 'native' else 'decoder_avx2', results)}")


if __name__ == "__main__":
    main()
