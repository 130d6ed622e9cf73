"""Per-kernel benchmark: kwker ops against torch float32 and bfloat16 on the same shapes, interleaved.

- GEMV (one row, decode): GB/s of weights read, against the STREAM-triad bandwidth measured here.
  Every call reads a different copy of the weights (768 MB cycled), so they come from DRAM as in decode.
- GEMM (M >= 128, prompt): GFLOP/s.
- Decode attention: µs per call against torch's scaled_dot_product_attention (GQA).

Run: ``python benchmarks/bench_kernels.py [--rounds 7]``; writes benchmarks/results/kernels.json.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from common import interleaved, machine, save, stream_triad_gbs, table

import kwker_torch

# (N, K) of the SmolLM2-135M / SmolLM2-360M / Qwen2.5-0.5B linears, and their lm_heads.
GEMV = [(576, 576), (1536, 576), (576, 1536), (2560, 960), (4864, 896), (896, 4864), (49152, 576), (151936, 896)]
GEMM = [(128, 576, 1536), (128, 1536, 576), (128, 960, 2560), (512, 896, 4864)]  # (M, K, N)
ATTN = [(9, 3, 64, 128), (9, 3, 64, 1024), (14, 2, 64, 512), (32, 8, 128, 2048)]  # (Hq, Hkv, D, S)


COLD_BYTES = 768 * 2**20  # each contender cycles through this much weight memory: larger than any cache


def cycling(fn: object, weights: list[torch.Tensor], x: torch.Tensor) -> object:
    """A call that uses the next weight copy each time, so weights come from DRAM as in a real decode
    step (one pass over all layers), not from a cache warmed by the previous call."""
    state = {"i": 0}

    def call() -> torch.Tensor:
        state["i"] = (state["i"] + 1) % len(weights)
        return fn(x, weights[state["i"]])

    return call


def bench_gemv(rounds: int, triad: float) -> list[list[object]]:
    rows = []
    for n, k in GEMV:
        copies = max(1, COLD_BYTES // (n * k * 4))
        w32 = [torch.randn(n, k) for _ in range(copies)]
        w16 = [w.bfloat16() for w in w32]
        x32, x16 = torch.randn(1, k), torch.randn(1, k).bfloat16()
        kw = torch.ops.kwker.linear
        t = interleaved(
            {
                "kwker bf16": cycling(kw, w16, x16),
                "kwker f32": cycling(kw, w32, x32),
                "torch bf16": cycling(F.linear, w16, x16),
                "torch f32": cycling(F.linear, w32, x32),
            },
            rounds,
        )
        del w32, w16
        mb16, mb32 = n * k * 2 / 1e6, n * k * 4 / 1e6
        gbs = {key: (mb16 if "bf16" in key else mb32) / 1e3 / v for key, v in t.items()}
        rows.append(
            [
                f"{n}x{k}",
                mb16,
                t["kwker bf16"] * 1e6,
                gbs["kwker bf16"],
                gbs["kwker bf16"] / triad,
                gbs["kwker f32"],
                gbs["torch bf16"],
                gbs["torch f32"],
                t["torch bf16"] / t["kwker bf16"],
            ]
        )
    return rows


def bench_gemm(rounds: int) -> list[list[object]]:
    rows = []
    for m, k, n in GEMM:
        w32 = torch.randn(n, k)
        w16 = w32.bfloat16()
        x32, x16 = torch.randn(m, k), torch.randn(m, k).bfloat16()
        t = interleaved(
            {
                "kwker bf16": lambda: torch.ops.kwker.linear(x16, w16),
                "kwker f32": lambda: torch.ops.kwker.linear(x32, w32),
                # float32 activations, bf16 weights: the preserve decoder's prompt GEMM (on the amx
                # tier: three exact bf16 pieces of x, against one for "kwker bf16")
                "kwker f32·bf16": lambda: torch.ops.kwker.linear(x32, w16),
                "torch bf16": lambda: F.linear(x16, w16),
                "torch f32": lambda: F.linear(x32, w32),
            },
            rounds,
            min_seconds=0.05,
        )
        gf = {key: 2 * m * k * n / v / 1e9 for key, v in t.items()}
        rows.append(
            [
                f"{m}x{k}x{n}",
                gf["kwker bf16"],
                gf["kwker f32"],
                gf["kwker f32·bf16"],
                gf["torch bf16"],
                gf["torch f32"],
                t["torch bf16"] / t["kwker bf16"],
                t["torch f32"] / t["kwker bf16"],
            ]
        )
    return rows


def bench_attention(rounds: int) -> list[list[object]]:
    rows = []
    for hq, hkv, d, s in ATTN:
        q = torch.randn(1, hq, 1, d).bfloat16()
        k, v = torch.randn(1, hkv, s, d).bfloat16(), torch.randn(1, hkv, s, d).bfloat16()
        q32, k32, v32 = q.float(), k.float(), v.float()
        scale = d**-0.5
        t = interleaved(
            {
                "kwker bf16": lambda: torch.ops.kwker.decode_attention(q, k, v, scale),
                "kwker f32": lambda: torch.ops.kwker.decode_attention(q32, k32, v32, scale),
                "torch bf16": lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True),
                "torch f32": lambda: F.scaled_dot_product_attention(q32, k32, v32, enable_gqa=True),
            },
            rounds,
        )
        rows.append(
            [
                f"Hq={hq} Hkv={hkv} D={d} S={s}",
                t["kwker bf16"] * 1e6,
                t["kwker f32"] * 1e6,
                t["torch bf16"] * 1e6,
                t["torch f32"] * 1e6,
                t["torch bf16"] / t["kwker bf16"],
            ]
        )
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=7)
    a = p.parse_args()
    print(f"{machine()}; kwker tier {kwker_torch.isa()}, {kwker_torch.num_threads()} threads")
    triad = stream_triad_gbs()
    print(f"STREAM triad (torch, {torch.get_num_threads()} threads): {triad:.1f} GB/s\n")
    gemv = bench_gemv(a.rounds, triad)
    gemv_h = [
        "N x K",
        "bf16 MB",
        "kwker bf16 µs",
        "kwker bf16 GB/s",
        "of triad",
        "kwker f32 GB/s",
        "torch bf16 GB/s",
        "torch f32 GB/s",
        "speed-up vs torch bf16",
    ]
    print("GEMV, one row (weights read per call)\n" + table(gemv_h, gemv) + "\n")
    gemm = bench_gemm(a.rounds)
    gemm_h = [
        "M x K x N",
        "kwker bf16 GFLOP/s",
        "kwker f32 GFLOP/s",
        "kwker f32·bf16 GFLOP/s",
        "torch bf16 GFLOP/s",
        "torch f32 GFLOP/s",
        "vs torch bf16",
        "vs torch f32",
    ]
    print("GEMM\n" + table(gemm_h, gemm) + "\n")
    attn = bench_attention(a.rounds)
    attn_h = [
        "decode attention (B=1, T=1)",
        "kwker bf16 µs",
        "kwker f32 µs",
        "torch bf16 µs",
        "torch f32 µs",
        "vs torch bf16",
    ]
    print("Decode attention\n" + table(attn_h, attn))
    path = save(
        "kernels",
        {
            "triad_gbs": triad,
            "tier": kwker_torch.isa(),
            "threads": kwker_torch.num_threads(),
            "gemv": {"headers": gemv_h, "rows": gemv},
            "gemm": {"headers": gemm_h, "rows": gemm},
            "attention": {"headers": attn_h, "rows": attn},
        },
    )
    print(f"\nsaved {path}")


if __name__ == "__main__":
    main()
