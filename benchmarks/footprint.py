"""File size and resident memory of every weight format: KwkDecoder preserve / int8 / int4 beside llama.cpp
BF16 / Q8_0 / Q4_0 / Q4_K_M, the same weights.

Ours: the decoder converted from the bf16 model and written with ``KwkDecoder.save`` (the folder a server
loads), its size on disk; then, in a fresh process, ``KwkDecoder.load`` of it (max_batch 1, max_context
1024), one pp512 and tg128 run, and the process's resident memory (VmRSS) minus that of the same process
before the load (Python, torch, transformers and kwker imported), plus the peak (VmHWM) over the load.
llama.cpp: the GGUF's size, and its worker process's VmRSS after loading it (n_ctx 1024, f16 KV) and the
same run, minus the worker's before the load. llama.cpp maps the GGUF; its pages count once touched, which
one pp512 + tg128 run does for every weight. Memory is not timing: this needs no interleaving, but it must
not run beside a benchmark.

Run: ``python benchmarks/footprint.py [--models ...]``. Results: ``benchmarks/results/footprint.json``.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import subprocess
import sys
from typing import Any

from bench_decoder import MODELS, ggufs, load, say
from bench_quant import PEERS, peer_ggufs
from common import machine, save, table

from kwker_torch import KwkDecoder
from kwker_torch.peer.build import cache_root
from kwker_torch.peer.llama_cpp import LlamaCppWorker

OURS = ("preserve", "int8", "int4")
HEADERS = ["model", "format", "bits/weight", "file MB", "RSS MB", "peak RSS MB", "KV MB (ctx 1024)"]

# Runs in a fresh process: load a saved decoder, run pp512 + tg128, report resident memory in bytes.
PROBE = r"""
import json, sys, torch
import safetensors, transformers  # imported by load: their modules are not the model's memory
from transformers import AutoConfig
from kwker_torch import KwkDecoder
def status(key):
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) * 1024 for l in f if l.startswith(key + ":"))
base = status("VmRSS")
dec = KwkDecoder.load(sys.argv[1], max_batch=1, max_context=1024)
loaded = status("VmRSS")
dec.step([(0, torch.randint(100, 20000, (512,)))], logits="last")
dec.reset(0)
for _ in range(128):
    dec.step([(0, [7])])
print(json.dumps({"base": base, "loaded": loaded, "run": status("VmRSS"), "peak": status("VmHWM"),
                  "kv": dec.info["kv_bytes"]}))
"""


def rss_of(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))


def folder_bytes(path: str) -> int:
    return sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path))


def ours(model: Any, name: str, label: str, rows: list) -> None:
    for prec in OURS:
        dec = KwkDecoder.from_hf(model, precision=prec, max_batch=1, max_context=1024)
        bits = dec.info["bits_per_weight"]
        path = os.path.join(cache_root(), "footprint", f"{name}-{prec}")
        shutil.rmtree(path, ignore_errors=True)
        dec.save(path)
        del dec
        gc.collect()
        out = subprocess.run([sys.executable, "-c", PROBE, path], capture_output=True, text=True, check=False)
        if out.returncode:
            raise RuntimeError(f"footprint probe failed for {name} {prec}:\n{out.stderr[-3000:]}")
        m = json.loads(out.stdout.strip().splitlines()[-1])
        rows.append([label, f"KwkDecoder {prec}", bits, folder_bytes(path) / 1e6, (m["run"] - m["base"]) / 1e6,
                     (m["peak"] - m["base"]) / 1e6, m["kv"] / 1e6])  # fmt: skip
        say(table(HEADERS, rows[-1:]))
        shutil.rmtree(path, ignore_errors=True)


def peers(paths: dict[str, str], label: str, rows: list) -> None:
    from bench_quant import gguf_bits

    for ft, path in paths.items():
        with LlamaCppWorker("native") as w:
            assert w._proc is not None
            base = rss_of(w._proc.pid)
            w.load(path, n_ctx=1024, n_batch=512)
            w.pp(512)
            w.tg(128)
            used = rss_of(w._proc.pid) - base
        rows.append([label, f"llama.cpp {ft}", gguf_bits(path)[0], os.path.getsize(path) / 1e6, used / 1e6, "", ""])
        say(table(HEADERS, rows[-1:]))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", default=MODELS, choices=MODELS)
    a = p.parse_args()
    say(f"machine: {machine()}")
    rows: list = []
    for name in a.models:
        model, label = load(name)
        say(f"\n== {label}")
        paths = {"BF16": ggufs(name, model)["bf16"], **peer_ggufs(name, model, "native")}
        ours(model, name, label, rows)
        del model
        gc.collect()
        peers({ft: paths[ft] for ft in ["BF16", *PEERS]}, label, rows)
    say("\n" + table(HEADERS, rows))
    say(f"saved {save('footprint', {'rows': rows, 'headers': HEADERS, 'machine': machine()})}")


if __name__ == "__main__":
    main()
