"""torch.compile backends side by side on Hugging Face ``generate()`` with a static KV cache:
a 32-token prompt then 32 new greedy tokens (prefill included), for eager, ``backend="inductor"`` and
``backend="kwker"``; plus the first (cold) compile time of each backend and whether tokens match eager and
Inductor. For kwker it also times one decode step alone (the native executor's call, median of many) against
the weights it reads per token divided by the STREAM-triad bandwidth measured in the same run.

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
from common import machine, save, stream_triad_gbs, table  # noqa: E402

from kwker_torch import compile_backend  # noqa: E402
from kwker_torch.testing import generate_greedy, load_smollm2, random_model  # noqa: E402


class DecodeProbe:
    """The kwker backend, remembering the last decode-step call (one new token) so it can be re-timed."""

    def __init__(self) -> None:
        self.fn: object = None
        self.args: list = []
        self.counters: list[tuple[torch.Tensor, torch.Tensor]] = []

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list) -> object:
        fn = compile_backend.kwker_backend(gm, example_inputs)

        def run(*args: object) -> object:
            ids = [a for a in args if isinstance(a, torch.Tensor) and a.dtype == torch.int64 and a.dim() == 2]
            if ids and ids[0].shape[1] == 1:
                self.fn, self.args = fn, list(args)
                # integer state the step advances in place (the cache's cumulative length), as it was
                ints = [a for a in args if isinstance(a, torch.Tensor) and a.dtype == torch.int64 and a.dim() == 0]
                self.counters = [(a, a.clone()) for a in ints]
            return fn(*args)

        return run

    def step_seconds(self, rounds: int = 50) -> tuple[float, int]:
        """Median seconds of the captured decode step, and the weight bytes it reads. The step's integer
        state is restored before every call, so each call redoes the same step."""
        times = []
        with torch.no_grad():
            for _ in range(rounds):
                for a, v in self.counters:
                    a.copy_(v)
                t0 = time.perf_counter()
                self.fn(*self.args)  # type: ignore[operator]
                times.append(time.perf_counter() - t0)
        gm = self.fn.kwker_state["gm"]  # type: ignore[attr-defined]
        gm = getattr(gm, "gm", gm)
        weights = sum(b.numel() * b.element_size() for n, b in gm.named_buffers() if n.startswith("_kwker_w"))
        return statistics.median(times), weights


def generate(model: torch.nn.Module, ids: torch.Tensor, new: int) -> tuple[torch.Tensor, float]:
    t0 = time.perf_counter()
    out = generate_greedy(model, ids, new, exact=True, inference=False, cache_implementation="static")
    return out[0, ids.shape[1] :], time.perf_counter() - t0


def bench_model(
    label: str, model: torch.nn.Module, ids: torch.Tensor, rounds: int, new: int, gbs: float
) -> tuple[list[list[object]], list[object]]:
    original = model.forward
    compiled: dict[str, object] = {"eager": original}
    first: dict[str, float] = {}
    tokens: dict[str, torch.Tensor] = {}
    probe = DecodeProbe()
    for name in ("inductor", "kwker"):  # cold compiles, one backend at a time
        torch._dynamo.reset()
        model.forward = torch.compile(original, backend=name if name == "inductor" else probe)
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
    step, weight_bytes = probe.step_seconds()
    model.forward = original
    rate = {k: new / statistics.median(v) for k, v in samples.items()}
    rows = [
        [
            label,
            name,
            rate[name],
            rate[name] / rate["inductor"],
            first.get(name, 0.0),
            "yes" if torch.equal(tokens[name], tokens["eager"]) else "NO",
            "yes" if torch.equal(tokens[name], tokens["inductor"]) else "NO",
        ]
        for name in compiled
    ]
    floor = weight_bytes / (gbs * 1e9)
    return rows, [label, step * 1e3, weight_bytes / 1e6, floor * 1e3, step / floor, weight_bytes / step / 1e9]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--models", nargs="+", default=["SmolLM2-135M f32", "SmolLM2-135M bf16", "Qwen2.5-0.5B"])
    a = p.parse_args()
    print(machine())
    gbs = stream_triad_gbs()
    print(f"STREAM triad: {gbs:.1f} GB/s")
    rows, steps = [], []
    step_headers = ["model", "kwker decode step ms", "weights MB", "bytes/bandwidth ms", "ratio (bar 1.25)", "GB/s"]
    for name in a.models:
        if name.startswith("SmolLM2-135M"):
            model, tok = load_smollm2(torch.float32 if name.endswith("f32") else torch.bfloat16)
            label = f"{name} (real)"
        else:
            model, label = random_model(name, torch.bfloat16), f"{name} bf16 (random init)"
        ids = torch.randint(3, 10000, (1, 32), generator=torch.Generator().manual_seed(0))
        got, step = bench_model(label, model, ids, a.rounds, a.new_tokens, gbs)
        rows += got
        steps.append(step)
        print(table(["model", "backend", "tok/s", "vs inductor", "first call s", "= eager", "= inductor"], got))
        print(table(step_headers, [step]))
    headers = [
        "model",
        "backend",
        "tok/s (prefill + 32 new)",
        "vs inductor",
        "first call s (cold compile)",
        "tokens = eager",
        "tokens = inductor",
    ]
    print("\n" + table(headers, rows))
    print("\n" + table(step_headers, steps))
    payload = {"headers": headers, "rows": rows, "rounds": a.rounds, "triad_gbs": gbs}
    payload |= {"step_headers": step_headers, "steps": steps}
    print(f"\nsaved {save('compile', payload)}")


if __name__ == "__main__":
    main()
