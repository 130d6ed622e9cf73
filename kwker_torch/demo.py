"""Demo on the real SmolLM2-135M-Instruct: greedy generation with stock torch and with
``kwker_torch.torch_ops.install()``, interleaved; prints tokens/s for both and whether the tokens match.

Run: ``python -m kwker_torch.demo [--prompt TEXT] [--new-tokens N] [--runs R] [--dtype bf16|f32]``.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from . import isa, num_threads, torch_ops
from .models import chat_ids, load_smollm2


def _generate(model: torch.nn.Module, ids: torch.Tensor, new_tokens: int) -> tuple[torch.Tensor, float]:
    t0 = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            do_sample=False,
        )
    return out[0, ids.shape[1] :], time.perf_counter() - t0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--prompt", default="Write a short story about a lighthouse keeper who finds a message in a bottle.")
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--dtype", choices=["bf16", "f32"], default="bf16")
    a = p.parse_args()
    dtype = torch.bfloat16 if a.dtype == "bf16" else torch.float32

    print(f"kwker demo: SmolLM2-135M-Instruct ({a.dtype}), kernels tier {isa()}, {num_threads()} threads")
    model, tok = load_smollm2(dtype)
    ids = chat_ids(tok, a.prompt)
    print(f"prompt: {a.prompt!r} ({ids.shape[1]} tokens), generating {a.new_tokens} tokens greedily\n")

    times: dict[str, list[float]] = {"torch": [], "kwker": []}
    tokens: dict[str, torch.Tensor] = {}
    for run in range(a.runs + 1):  # run 0 warms up both
        for name in ("torch", "kwker"):
            if name == "kwker":
                torch_ops.install()
            try:
                toks, dt = _generate(model, ids, a.new_tokens)
            finally:
                torch_ops.uninstall()
            if run > 0:
                times[name].append(dt)
            tokens[name] = toks

    rate = {k: a.new_tokens / statistics.median(v) for k, v in times.items()}
    same = torch.equal(tokens["torch"], tokens["kwker"])
    print(f"kwker output: {tok.decode(tokens['kwker'], skip_special_tokens=True)!r}\n")
    print(
        f"stock torch {a.dtype}:        {rate['torch']:7.1f} tokens/s (prompt + {a.new_tokens} new, median of {a.runs})"
    )
    print(f"torch_ops.install():    {rate['kwker']:7.1f} tokens/s")
    print(f"speed-up:               {rate['kwker'] / rate['torch']:7.2f}x")
    print(f"tokens identical:       {'yes' if same else 'NO'}")
    if not same:
        diff = int((tokens["torch"] != tokens["kwker"]).nonzero()[0, 0])
        print(f"first difference at generated token {diff}")
        raise SystemExit(1)


if __name__ == "__main__":
    main()
