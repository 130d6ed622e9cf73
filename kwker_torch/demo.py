"""Demo on the real SmolLM2-135M-Instruct: greedy generation with stock torch and with
``kwker_torch.torch_ops.install()``, interleaved, in bfloat16 (the speed story) and float32; prints
tokens/s for both and whether the tokens are identical.

In bfloat16 the logits themselves are rounded to bf16 (8 bits of mantissa), so two candidate tokens
often get exactly the same logit; which one wins is then decided by the last bit of a sum, and any other
summation order (kwker's, or torch's on another CPU) can pick the other one. The demo says so when it
happens and checks that it was such a tie; in float32 the tokens must be identical.

Run: ``python -m kwker_torch.demo [--prompt TEXT] [--new-tokens N] [--runs R] [--dtype bf16 f32]``.
Exit status 1 if tokens differ other than at a bf16 tie.
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import dataclass

import torch

from . import isa, num_threads, torch_ops
from .models import chat_ids, generate_greedy, load_smollm2

DTYPES = {"bf16": torch.bfloat16, "f32": torch.float32}


@dataclass
class Result:
    rate: dict[str, float]
    text: str
    verdict: str
    ok: bool


def _generate(model: torch.nn.Module, ids: torch.Tensor, new_tokens: int) -> tuple[torch.Tensor, torch.Tensor, float]:
    """(new tokens, their logits, seconds) of a greedy generation of exactly ``new_tokens`` tokens."""
    t0 = time.perf_counter()
    out = generate_greedy(model, ids, new_tokens, exact=True, output_logits=True, return_dict_in_generate=True)
    dt = time.perf_counter() - t0
    return out.sequences[0, ids.shape[1] :], torch.stack(out.logits, 1)[0], dt


def say(msg: str, end: str = "\n") -> None:
    print(msg, end=end, flush=True)


def compare(dtype: str, prompt: str, new_tokens: int, runs: int) -> Result:
    say(f"[{dtype}] loading the model ...", end=" ")
    t0 = time.perf_counter()
    model, tok = load_smollm2(DTYPES[dtype])
    ids = chat_ids(tok, prompt)
    say(f"{time.perf_counter() - t0:.1f} s; warming up both paths", end="")
    times: dict[str, list[float]] = {"torch": [], "kwker": []}
    tokens: dict[str, torch.Tensor] = {}
    logits: dict[str, torch.Tensor] = {}
    torch_ops.reset_choices()
    for run in range(runs + 1):  # run 0 warms up both (and lets install() measure each shape)
        for name in ("torch", "kwker"):
            if name == "kwker":
                torch_ops.install()
            try:
                tokens[name], logits[name], dt = _generate(model, ids, new_tokens)
            finally:
                torch_ops.uninstall()
            if run > 0:
                times[name].append(dt)
            say(f" .. {name} {new_tokens / dt:.1f} t/s" if run > 0 else ".", end="")
        if run == 0:
            say(f"; {runs} timed runs each:", end="")
    say("")
    rate = {k: new_tokens / statistics.median(v) for k, v in times.items()}
    text = tok.decode(tokens["kwker"], skip_special_tokens=True)
    if torch.equal(tokens["torch"], tokens["kwker"]):
        return Result(rate, text, "yes", True)
    step = int((tokens["torch"] != tokens["kwker"]).nonzero()[0, 0])
    theirs = logits["torch"][step].float()
    top = theirs.max()
    ulp = 2.0 ** (torch.floor(torch.log2(top.abs())) - 7)
    kw_choice = theirs[tokens["kwker"][step]]
    tie = dtype == "bf16" and bool(kw_choice >= top - ulp)
    verdict = (
        f"no: from token {step}, where torch's own bf16 logits tie "
        f"({top:.3f} vs {kw_choice:.3f}, one bf16 step = {ulp:.3f})"
        if tie
        else f"NO: token {step} differs without a tie (torch's top {top:.4f}, kwker's pick {kw_choice:.4f})"
    )
    return Result(rate, text, verdict, tie)


HEADER = f"{'dtype':6} {'stock torch':>12} {'install()':>12} {'speed-up':>9}  {'on torch':>8}  tokens identical"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--prompt", default="Write a short story about a lighthouse keeper who finds a message in a bottle.")
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--dtype", nargs="+", choices=list(DTYPES), default=["bf16", "f32"])
    a = p.parse_args()

    say(f"kwker demo: real SmolLM2-135M-Instruct, kernels tier {isa()}, {num_threads()} threads")
    say(f"prompt: {a.prompt!r}; {a.new_tokens} greedy tokens; median of {a.runs} interleaved runs")
    say("'on torch': call shapes install() measured as faster on torch's own kernels, of all it measured\n")
    rows: list[str] = []
    ok = True
    for d in a.dtype:
        r = compare(d, a.prompt, a.new_tokens, a.runs)
        ok &= r.ok
        speedup = r.rate["kwker"] / r.rate["torch"]
        c = torch_ops.choices()
        on_torch = f"{c['torch']}/{c['torch'] + c['kwker']}"
        row = f"{d:6} {r.rate['torch']:8.1f} t/s {r.rate['kwker']:8.1f} t/s {speedup:8.2f}x  {on_torch:>8}  {r.verdict}"
        rows.append(row)
        say(f"kwker's {d} output: {r.text!r}")
        say(HEADER)
        say(row + "\n")
    if len(rows) > 1:
        say("summary:\n" + HEADER)
        for row in rows:
            say(row)
    if not ok:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
