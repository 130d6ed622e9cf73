"""torch.compile backends side by side on Hugging Face ``generate()`` with a static KV cache:
a 32-token prompt then 32 new greedy tokens (prefill included), for eager, ``backend="inductor"`` and
``backend="kwker"``; plus the first (cold) compile time of each backend and whether tokens match eager.

Inductor's on-disk caches are pointed at a fresh temporary folder so its compile is cold.
Run: ``python benchmarks/bench_compile.py [--rounds 5] [--models ...]``; writes results/compile.json.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", tempfile.mkdtemp(prefix="kwker-inductor-"))

import torch  # noqa: E402
from common import machine, save, table  # noqa: E402

from kwker_torch.models import generate_greedy, load_smollm2, random_model  # noqa: E402


def generate(model: torch.nn.Module, ids: torch.Tensor, new: int) -> tuple[torch.Tensor, float]:
    t0 = time.perf_counter()
    out = generate_greedy(model, ids, new, exact=True, inference=False, cache_implementation="static")
    return out[0, ids.shape[1] :], time.perf_counter() - t0


def bench_model(label: str, model: torch.nn.Module, ids: torch.Tensor, rounds: int, new: int) -> list[list[object]]:
    original = model.forward
    compiled: dict[str, object] = {"eager": original}
    first: dict[str, float] = {}
    tokens: dict[str, torch.Tensor] = {}
    for name in ("inductor", "kwker"):  # cold compiles, one backend at a time
        torch._dynamo.reset()
        model.forward = torch.compile(original, backend=name)
        tokens[name], first[name] = generate(model, ids, new)
        generate(model, ids, new)  # the decode graph may compile on the second call too
        compiled[name] = model.forward
    samples: dict[str, list[float]] = {k: [] for k in compiled}
    for _ in range(rounds):
        for name, fwd in compiled.items():
            model.forward = fwd
            toks, dt = generate(model, ids, new)
            tokens.setdefault(name, toks)
            samples[name].append(dt)
    model.forward = original
    rate = {k: new / statistics.median(v) for k, v in samples.items()}
    return [
        [
            label,
            name,
            rate[name],
            rate[name] / rate["inductor"],
            first.get(name, 0.0),
            "yes" if torch.equal(tokens[name], tokens["eager"]) else "NO",
        ]
        for name in compiled
    ]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--models", nargs="+", default=["SmolLM2-135M f32", "SmolLM2-135M bf16", "Qwen2.5-0.5B"])
    a = p.parse_args()
    print(machine())
    rows = []
    for name in a.models:
        if name.startswith("SmolLM2-135M"):
            model, tok = load_smollm2(torch.float32 if name.endswith("f32") else torch.bfloat16)
            label = f"{name} (real)"
        else:
            model, label = random_model(name, torch.bfloat16), f"{name} bf16 (random init)"
        ids = torch.randint(3, 10000, (1, 32), generator=torch.Generator().manual_seed(0))
        rows += bench_model(label, model, ids, a.rounds, a.new_tokens)
        print(table(["model", "backend", "tok/s", "vs inductor", "first call s", "tokens = eager"], rows[-3:]))
    headers = [
        "model",
        "backend",
        "tok/s (prefill + 32 new)",
        "vs inductor",
        "first call s (cold compile)",
        "tokens = eager",
    ]
    print("\n" + table(headers, rows))
    print(f"\nsaved {save('compile', {'headers': headers, 'rows': rows, 'rounds': a.rounds})}")


if __name__ == "__main__":
    main()
