"""Causal LMs outside KwkDecoder's recipe (the compile backend's path, ``kwker_torch/decoder/compiled.py``) against
stock torch, interleaved in one run: random-initialised models of the real shapes of BLOOM-560m (ALiBi),
CodeGen-350M-mono and GPT-J-6B (``--gptj-layers`` of its 28 layers), in bf16 (how transformers 5 loads a bf16
checkpoint) and in float32 (the same bf16 weights loaded as float32, where Hugging Face float32 is the reference).

Contenders, each through Hugging Face ``generate()`` (16-token prompt, 64 greedy new tokens, prefill included):
stock eager (its default dynamic cache), Inductor (``model.forward = torch.compile(model.forward)`` with
``cache_implementation="static"``: its cold compile is reported, not timed), and ``decode.install(model)``. Rounds
interleave the contenders; medians. Tokens are compared with eager's of the same dtype (bf16 models round where
each backend rounds, so they may part at near-ties; float32 ones must be identical). Also reported: the ops of the
kwker decode step that still run through torch, and the STREAM triad of the run.

Bar (issue 17): decode.install() >= 1.5x stock eager on each architecture, tokens identical (float32).

Run: ``python benchmarks/bench_generic.py [--rounds 3] [--models ...] [--gptj-layers 4]``. Results:
``benchmarks/results/generic.json``.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import tempfile
import time
from typing import Any

os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", tempfile.mkdtemp(prefix="kwker-inductor-"))

import torch  # noqa: E402
from bench_decoder import cpu_flags  # noqa: E402
from common import machine, save, stream_triad_gbs, table  # noqa: E402

from kwker_torch import decode  # noqa: E402
from kwker_torch.testing import random_model  # noqa: E402

MODELS = ["BLOOM-560m", "CodeGen-350M-mono", "GPT-J-6B"]
PROMPT, NEW = 16, 64
HEADERS = ["model", "dtype", "contender", "tok/s", "vs eager", "first call s", "tokens = eager", "torch ops per step"]


def generate(model: torch.nn.Module, ids: torch.Tensor, **kw: Any) -> tuple[torch.Tensor, float]:
    t0 = time.perf_counter()
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=NEW, min_new_tokens=NEW, do_sample=False,
                             attention_mask=torch.ones_like(ids), **kw)  # fmt: skip
    return out[0, ids.shape[1] :], time.perf_counter() - t0


def first_difference(a: torch.Tensor, b: torch.Tensor) -> int:
    return int((a != b).nonzero()[0, 0]) if a.shape == b.shape and not torch.equal(a, b) else min(len(a), len(b))


def bench(name: str, dtype: str, layers: int | None, rounds: int, rows: list) -> None:
    model = random_model(name, torch.bfloat16, num_hidden_layers=layers)
    if dtype == "f32":
        model = model.float()  # a bf16 checkpoint loaded as float32
    label = name + (f" ({layers} of its layers)" if layers else "")
    print(f"\n== {label} {dtype}", flush=True)
    ids = torch.randint(3, 10000, (1, PROMPT), generator=torch.Generator().manual_seed(0))
    own = model.forward
    torch._dynamo.reset()
    first: dict[str, float] = {}
    tokens: dict[str, torch.Tensor] = {}
    # Each contender names its cache: decode.install() sets the model's generation_config to a static one.
    static, dynamic = {"cache_implementation": "static"}, {"cache_implementation": "dynamic"}
    generate(model, ids, **dynamic)
    inductor = torch.compile(own, backend="inductor")
    model.forward = inductor
    _, first["inductor"] = generate(model, ids, **static)
    generate(model, ids, **static)  # its decode graph may compile on the second call too
    del model.forward
    decode.install(model, max_context=PROMPT + NEW)
    kwker = model.forward
    _, first["kwker"] = generate(model, ids, **static)
    generate(model, ids, **static)  # the decode step is planned on its second call, native from the third
    runs = {"eager": (own, dynamic), "inductor": (inductor, static), "kwker": (kwker, static)}
    times: dict[str, list[float]] = {k: [] for k in runs}
    steady: dict[str, bool] = {k: True for k in runs}  # every timed round gave the same tokens
    for r in range(rounds):
        for k, (fwd, kw) in runs.items():
            model.forward = fwd
            toks, dt = generate(model, ids, **kw)
            times[k].append(dt)
            steady[k] = steady[k] and (k not in tokens or torch.equal(toks, tokens[k]))
            tokens[k] = toks
        print("  round", r + 1, ", ".join(f"{k} {NEW / times[k][-1]:.2f} tok/s" for k in runs), flush=True)
    model.forward = kwker
    dec = decode.decoder_of(model)
    step_ops = max((len(p.torch_ops) for p in dec.plans() if p.runs > 0), default=0)
    on_torch = sorted({op for p in dec.plans() for op in p.torch_ops})
    decode.uninstall(model)
    rate = {k: NEW / statistics.median(v) for k, v in times.items()}
    for k in runs:
        same = torch.equal(tokens[k], tokens["eager"])
        rows.append([label, dtype, k, rate[k], rate[k] / rate["eager"], first.get(k, 0.0),
                     ("yes" if same else f"from token {first_difference(tokens[k], tokens['eager'])}")
                     + ("" if steady[k] else " (rounds differ)"),
                     f"{step_ops} ({', '.join(on_torch)})" if k == "kwker" else ""])  # fmt: skip
    print(table(HEADERS, rows[-len(runs) :]), flush=True)
    del model, inductor, kwker, runs, dec
    torch._dynamo.reset()
    gc.collect()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--models", nargs="+", default=MODELS, choices=MODELS)
    p.add_argument("--dtypes", nargs="+", default=["bf16", "f32"], choices=["bf16", "f32"])
    p.add_argument("--gptj-layers", type=int, default=4, help="GPT-J-6B's layers (of 28) for 24 GB of memory")
    a = p.parse_args()
    print(machine(), flush=True)
    print(f"CPU flags: {cpu_flags()}", flush=True)
    triad = stream_triad_gbs()
    print(f"STREAM triad {triad:.1f} GB/s", flush=True)
    rows: list[Any] = []
    for name in a.models:
        for dt in a.dtypes:
            bench(name, dt, a.gptj_layers if name == "GPT-J-6B" else None, a.rounds, rows)
    end = stream_triad_gbs()
    print("\n" + table(HEADERS, rows))
    print(f"\nSTREAM triad at the start {triad:.1f}, at the end {end:.1f} GB/s")
    out = {"headers": HEADERS, "rows": rows, "rounds": a.rounds, "triad_gbs": triad, "triad_gbs_end": end,
           "machine": machine(), "cpu_flags": cpu_flags(), "gptj_layers": a.gptj_layers}  # fmt: skip
    print(f"saved {save('generic', out)}")


if __name__ == "__main__":
    main()
