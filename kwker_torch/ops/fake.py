"""Fake (meta) kernels of the kwker ops: output shapes and dtypes from input shapes, with symbolic
sizes, so ``torch.compile`` traces the ops once for all lengths and ``opcheck`` can check them.

They mirror the native checks that depend only on metadata (ranks, matching sizes, dtypes).
"""

from __future__ import annotations

import torch

_FLOATS = (torch.float32, torch.bfloat16)


def _check_float(op: str, name: str, t: torch.Tensor) -> None:
    torch._check(
        t.dtype in _FLOATS,
        lambda: f"kwker::{op}: expected '{name}' to be float32 or bfloat16, got {t.dtype}",
    )


@torch.library.register_fake("kwker::linear")
def _linear_fake(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    torch._check(x.dim() >= 1, lambda: "kwker::linear: expected x of shape [..., K], got a 0-d tensor")
    torch._check(weight.dim() == 2, lambda: f"kwker::linear: expected weight of shape [N, K], got {list(weight.shape)}")
    _check_float("linear", "x", x)
    _check_float("linear", "weight", weight)
    torch._check(
        x.shape[-1] == weight.shape[1],
        lambda: f"kwker::linear: x has {x.shape[-1]} features but weight has shape {list(weight.shape)}",
    )
    if bias is not None:
        _check_float("linear", "bias", bias)
        torch._check(
            bias.dim() == 1 and bias.shape[0] == weight.shape[0],
            lambda: f"kwker::linear: expected bias of shape [{weight.shape[0]}], got {list(bias.shape)}",
        )
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


@torch.library.register_fake("kwker::decode_attention")
def _decode_attention_fake(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    for name, t in (("q", q), ("k", k), ("v", v)):
        torch._check(
            t.dim() == 4,
            lambda name=name, t=t: f"kwker::decode_attention: expected 4-D {name}, got {list(t.shape)}",
        )
    _check_float("decode_attention", "q", q)
    torch._check(
        k.dtype == q.dtype and v.dtype == q.dtype,
        lambda: f"kwker::decode_attention: expected q, k and v of one dtype, got {q.dtype}, {k.dtype}, {v.dtype}",
    )
    torch._check(k.shape == v.shape, lambda: "kwker::decode_attention: k and v must have the same shape")
    torch._check(
        k.shape[0] == q.shape[0] and k.shape[3] == q.shape[3],
        lambda: f"kwker::decode_attention: q {list(q.shape)} and k {list(k.shape)} differ in batch or head dim",
    )
    torch._check(
        k.shape[1] > 0 and q.shape[1] % k.shape[1] == 0,
        lambda: f"kwker::decode_attention: Hq={q.shape[1]} must be a multiple of Hkv={k.shape[1]}",
    )
    torch._check(q.shape[2] <= k.shape[2], lambda: "kwker::decode_attention: more new tokens than cached keys")
    return q.new_empty(q.shape)  # new_empty is contiguous, like the native output
