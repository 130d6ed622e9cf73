"""torch.ops.kwker.decode_attention against a float64 reference, on every ISA tier the host supports.

Semantics: q [B, Hq, T, D], k/v [B, Hkv, S, D]; query token t sees keys 0..=S-T+t; q head h reads kv
head h // (Hq // Hkv). Tolerance: float32 2e-5 absolute on outputs of unit-scale inputs (softmax and sums
in f32); bfloat16 adds one bf16 rounding of the output (2^-8 relative) and the rounding of the softmax
weights to bf16 before they multiply V, as torch does (2^-9 of sum_s p_s |v_s|).
"""

from __future__ import annotations

import math

import pytest
import torch

import kwker_torch  # noqa: F401


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, absolute: bool = False) -> torch.Tensor:
    """Exact attention in float64; with absolute=True, the same weights applied to |v| (an error scale)."""
    B, Hq, T, D = q.shape
    Hkv, S = k.shape[1], k.shape[2]
    rep = Hq // Hkv
    kd = k.double().repeat_interleave(rep, dim=1)
    vd = v.double().repeat_interleave(rep, dim=1)
    scores = (q.double() @ kd.transpose(-1, -2)) * scale  # [B, Hq, T, S]
    visible = torch.arange(S)[None, :] <= (S - T + torch.arange(T))[:, None]
    scores = scores.masked_fill(~visible, float("-inf"))
    return torch.softmax(scores, dim=-1) @ (vd.abs() if absolute else vd)


def _check(out: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> None:
    ref = reference(q, k, v, scale)
    assert out.shape == q.shape and out.dtype == q.dtype and out.is_contiguous()
    err = (out.double() - ref).abs()
    tol = 2e-5
    if q.dtype == torch.bfloat16:
        tol = tol + ref.abs() * 2.0**-8 + reference(q, k, v, scale, absolute=True) * 2.0**-9
    assert bool((err <= tol).all()), f"max err {err.max().item():.3g}"


CASES = [  # (B, Hq, Hkv, T, S, D)
    (1, 1, 1, 1, 1, 1),
    (1, 9, 3, 1, 65, 64),
    (2, 4, 1, 3, 5, 17),
    (1, 8, 8, 1, 200, 128),
    (2, 14, 2, 1, 33, 64),
    (1, 15, 5, 3, 200, 64),
    (1, 4, 2, 5, 5, 80),
    (2, 2, 1, 1, 1, 63),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("B,Hq,Hkv,T,S,D", CASES)
def test_attention_matches_reference(
    tier: str, dtype: torch.dtype, B: int, Hq: int, Hkv: int, T: int, S: int, D: int
) -> None:
    g = torch.Generator().manual_seed(B + Hq * 7 + T * 13 + S * 17 + D)
    q = torch.randn(B, Hq, T, D, generator=g).to(dtype)
    k = torch.randn(B, Hkv, S, D, generator=g).to(dtype)
    v = torch.randn(B, Hkv, S, D, generator=g).to(dtype)
    scale = 1 / math.sqrt(D)
    _check(torch.ops.kwker.decode_attention(q, k, v, scale), q, k, v, scale)


def test_strided_views_as_transformers_passes_them(tier: str) -> None:
    """q as transformers builds it: [B, T, H, D] transposed; k/v as a slice of a larger cache."""
    q = torch.randn(2, 3, 6, 64).transpose(1, 2)
    cache_k, cache_v = torch.randn(2, 2, 50, 64), torch.randn(2, 2, 50, 64)
    k, v = cache_k[:, :, :20], cache_v[:, :, :20]
    _check(torch.ops.kwker.decode_attention(q, k, v, 0.125), q, k, v, 0.125)


def test_last_dim_not_dense_is_copied() -> None:
    q = torch.randn(1, 2, 1, 32)[..., ::2]
    k = torch.randn(1, 1, 4, 16)
    v = torch.randn(1, 1, 4, 16)
    _check(torch.ops.kwker.decode_attention(q, k, v, 0.25), q, k, v, 0.25)


def test_matches_torch_sdpa_for_decode() -> None:
    q, k, v = torch.randn(1, 9, 1, 64), torch.randn(1, 3, 77, 64), torch.randn(1, 3, 77, 64)
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    torch.testing.assert_close(torch.ops.kwker.decode_attention(q, k, v, 0.125), ref, atol=2e-5, rtol=1e-4)


def test_zero_size() -> None:
    out = torch.ops.kwker.decode_attention(
        torch.randn(0, 4, 1, 8), torch.randn(0, 2, 3, 8), torch.randn(0, 2, 3, 8), 1.0
    )
    assert out.shape == (0, 4, 1, 8)
    out = torch.ops.kwker.decode_attention(
        torch.randn(1, 4, 0, 8), torch.randn(1, 2, 0, 8), torch.randn(1, 2, 0, 8), 1.0
    )
    assert out.shape == (1, 4, 0, 8)


@pytest.mark.parametrize(
    "q,k,v,message",
    [
        ((1, 6, 1, 8), (1, 4, 5, 8), (1, 4, 5, 8), "Hq to be a multiple of Hkv, got Hq=6 and Hkv=4"),
        ((1, 4, 6, 8), (1, 2, 5, 8), (1, 2, 5, 8), "T=6 new tokens but the cache holds only S=5"),
        ((1, 4, 1, 8), (1, 2, 5, 16), (1, 2, 5, 16), "head dims differ"),
        ((2, 4, 1, 8), (1, 2, 5, 8), (1, 2, 5, 8), "batch sizes differ"),
        ((1, 4, 1, 8), (1, 2, 5, 8), (1, 2, 6, 8), "must have the same shape"),
        ((4, 1, 8), (1, 2, 5, 8), (1, 2, 5, 8), "expected q of shape [B, Hq, T, D]"),
        ((1, 4, 1, 8), (2, 5, 8), (1, 2, 5, 8), "expected k of shape [B, Hkv, S, D]"),
    ],
)
def test_bad_shapes_raise_clear_errors(q: tuple, k: tuple, v: tuple, message: str) -> None:
    with pytest.raises(RuntimeError, match="kwker::decode_attention") as e:
        torch.ops.kwker.decode_attention(torch.randn(q), torch.randn(k), torch.randn(v), 1.0)
    assert message in str(e.value)


def test_backward_is_refused_with_a_clear_error() -> None:
    q = torch.randn(1, 2, 1, 8, requires_grad=True)
    out = torch.ops.kwker.decode_attention(q, torch.randn(1, 2, 3, 8), torch.randn(1, 2, 3, 8), 1.0)
    with pytest.raises(RuntimeError, match="kwker::decode_attention is inference-only"):
        out.sum().backward()


def test_bad_dtypes_raise_clear_errors() -> None:
    q, k, v = torch.randn(1, 2, 1, 8), torch.randn(1, 2, 3, 8), torch.randn(1, 2, 3, 8)
    with pytest.raises(RuntimeError, match="expected 'q' to be float32 or bfloat16, got float16"):
        torch.ops.kwker.decode_attention(q.half(), k.half(), v.half(), 1.0)
    with pytest.raises(RuntimeError, match="expected q, k and v of one dtype"):
        torch.ops.kwker.decode_attention(q, k.bfloat16(), v, 1.0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("B,Hq,Hkv,T,S,D", [(1, 4, 2, 1, 7, 16), (2, 2, 2, 3, 3, 8), (1, 6, 3, 2, 9, 32)])
def test_opcheck(dtype: torch.dtype, B: int, Hq: int, Hkv: int, T: int, S: int, D: int) -> None:
    args = (
        torch.randn(B, Hq, T, D, dtype=dtype),
        torch.randn(B, Hkv, S, D, dtype=dtype),
        torch.randn(B, Hkv, S, D, dtype=dtype),
        0.3,
    )
    torch.library.opcheck(torch.ops.kwker.decode_attention.default, args)


def test_inside_torch_compile_fullgraph() -> None:
    def f(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return torch.ops.kwker.decode_attention(q * 1.0, k, v, 0.125).transpose(1, 2).reshape(q.shape[0], -1)

    compiled = torch.compile(f, fullgraph=True, dynamic=True)
    for s in (5, 9, 31):
        q, k, v = torch.randn(1, 4, 1, 64), torch.randn(1, 2, s, 64), torch.randn(1, 2, s, 64)
        torch.testing.assert_close(compiled(q, k, v), f(q, k, v))
