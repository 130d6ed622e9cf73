"""End-to-end Hugging Face ``generate()``: a 128-token prompt of real English text, then 64 greedy tokens,
for stock torch bfloat16 and float32 and ``torch_ops.install()`` on each (its default measured per-shape
choice, decided in the warm-up round), interleaved.

Prompt and generation rates are reported apart: prompt = 128 / time of ``generate(max_new_tokens=1)``;
generation = 63 / (time of 64 new tokens - that). The bar for generation is
    per-token time <= HF loop overhead + 1.15 x (weight bytes / measured STREAM-triad bandwidth),
with the loop overhead measured here on a 30-layer Llama of width 64 (its weights are negligible).

Models: the real SmolLM2-135M-Instruct, and random-initialised models with the exact configs of
SmolLM2-360M and Qwen2.5-0.5B. Run: ``python benchmarks/bench_generate.py [--rounds 5] [--models ...]``.
"""

from __future__ import annotations

import argparse
import glob
import os
import statistics
import time

import torch
from common import DEFAULT_TEXTS, machine, save, stream_triad_gbs, table, texts_dir

import kwker_torch
from kwker_torch import torch_ops
from kwker_torch.testing import generate_greedy, load_smollm2, random_model


def prompt_ids(tok: object, n: int, text_path: str | None) -> torch.Tensor:
    """n tokens from the middle of a public-domain novel (``--text FILE``, default the first of --texts)."""
    paths = [text_path] if text_path else sorted(glob.glob(os.path.join(texts_dir(DEFAULT_TEXTS), "*.txt")))
    text = open(paths[0], encoding="utf-8").read()[20000:40000]
    ids = tok(text, return_tensors="pt")["input_ids"][:, :n]
    assert ids.shape[1] == n, f"text too short for a {n}-token prompt"
    return ids


def run_generate(model: torch.nn.Module, ids: torch.Tensor, new: int) -> float:
    t0 = time.perf_counter()
    generate_greedy(model, ids, new, exact=True)
    return time.perf_counter() - t0


def weight_bytes(model: torch.nn.Module) -> int:
    """Bytes of linear weights read per generated token (a tied lm_head is read as a linear)."""
    return sum(m.weight.numel() * m.weight.element_size() for m in model.modules() if isinstance(m, torch.nn.Linear))


def loop_overhead_ms(rounds: int) -> dict[str, float]:
    """ms per generated token of HF's eager loop on a 30-layer Llama of width 64 (tiny weights)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        hidden_size=64,
        intermediate_size=256,
        num_hidden_layers=30,
        num_attention_heads=1,
        num_key_value_heads=1,
        head_dim=64,
        vocab_size=256,
    )
    model = LlamaForCausalLM(cfg).eval()
    ids = torch.randint(0, 256, (1, 128))
    out = {}
    for name in ("torch", "kwker"):
        if name == "kwker":
            torch_ops.install()
        ts = []
        for _ in range(rounds):
            ts.append((run_generate(model, ids, 33) - run_generate(model, ids, 1)) / 32 * 1e3)
        torch_ops.uninstall()
        out[name] = statistics.median(ts)
    return out


def bench_model(
    label: str, bf16: torch.nn.Module, ids: torch.Tensor, rounds: int, new: int, triad: float, overhead_ms: float
) -> list[list[object]]:
    f32 = None
    contenders = ["torch bf16", "torch f32", "kwker bf16", "kwker f32"]
    prefill: dict[str, list[float]] = {c: [] for c in contenders}
    gen: dict[str, list[float]] = {c: [] for c in contenders}
    for r in range(rounds + 1):  # round 0 warms up
        for c in contenders:
            if c.endswith("f32"):
                f32 = f32 if f32 is not None else _f32_copy(bf16)
            model = f32 if c.endswith("f32") else bf16
            if c.startswith("kwker"):
                torch_ops.install()
            try:
                t1 = run_generate(model, ids, 1)
                tn = run_generate(model, ids, new)
            finally:
                torch_ops.uninstall()
            if r:
                prefill[c].append(t1)
                gen[c].append((tn - t1) / (new - 1))
    wb = weight_bytes(bf16)
    floor_ms = wb / (triad * 1e9) * 1e3
    bar_ms = overhead_ms + 1.15 * floor_ms
    rows = []
    p = {c: ids.shape[1] / statistics.median(v) for c, v in prefill.items()}
    g = {c: 1 / statistics.median(v) for c, v in gen.items()}
    for c in contenders:
        ms = 1e3 / g[c]
        rows.append(
            [
                label,
                c,
                p[c],
                p[c] / p["torch bf16"],
                p[c] / p["torch f32"],
                g[c],
                ms,
                g[c] / g["torch bf16"],
                g[c] / g["torch f32"],
                f"{bar_ms:.1f} ({'met' if ms <= bar_ms else 'not met'})" if c == "kwker bf16" else "",
            ]
        )
    print(f"{label}: bf16 linear weights {wb / 1e6:.0f} MB -> {floor_ms:.1f} ms/token at {triad:.1f} GB/s")
    return rows


def _f32_copy(model: torch.nn.Module) -> torch.nn.Module:
    import copy

    return copy.deepcopy(model).float()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--prompt-tokens", type=int, default=128)
    p.add_argument("--models", nargs="+", default=["SmolLM2-135M", "SmolLM2-360M", "Qwen2.5-0.5B"])
    p.add_argument("--text", default=None, help="plain-text file for the prompt (default: shared/data/text)")
    a = p.parse_args()
    print(f"{machine()}; kwker tier {kwker_torch.isa()}, {kwker_torch.num_threads()} threads")
    triad = stream_triad_gbs()
    overhead = loop_overhead_ms(a.rounds)
    print(
        f"STREAM triad {triad:.1f} GB/s; HF loop overhead (30-layer Llama, width 64): "
        f"{overhead['torch']:.1f} ms/token stock, {overhead['kwker']:.1f} ms/token with install()"
    )
    model, tok = load_smollm2(torch.bfloat16)
    ids = prompt_ids(tok, a.prompt_tokens, a.text)
    rows = []
    for name in a.models:
        if name == "SmolLM2-135M":
            label, m = "SmolLM2-135M (real)", model
        else:
            label, m = f"{name} (random init)", random_model(name, torch.bfloat16)
        rows += bench_model(label, m, ids % m.config.vocab_size, a.rounds, a.new_tokens, triad, overhead["kwker"])
    headers = [
        "model",
        "run",
        "prompt tok/s",
        "vs torch bf16",
        "vs torch f32",
        "gen tok/s",
        "gen ms/token",
        "vs torch bf16",
        "vs torch f32",
        "bar ms/token",
    ]
    print("\n" + table(headers, rows))
    path = save(
        "generate",
        {
            "triad_gbs": triad,
            "loop_overhead_ms": overhead,
            "rows": rows,
            "headers": headers,
            "prompt_tokens": a.prompt_tokens,
            "new_tokens": a.new_tokens,
            "rounds": a.rounds,
        },
    )
    print(f"\nsaved {path}")


if __name__ == "__main__":
    main()
