"""torch.ops.kwker.linear against a float64 reference, on every ISA tier the host supports.

Tolerances (measured max errors are printed with -s):
- float32 in/out: |y - ref| <= 2e-6 * sum_k |x w| + 1e-6 (rounding of an f32 sum of K products).
- bfloat16 out: ref (exact f64 product of the bf16 inputs) rounded to bf16 may differ by one bf16 ulp
  because the f32 sum is rounded once: |y - ref| <= 2^-8 |ref| + 2e-6 * sum_k |x w| + 1e-6.
"""

from __future__ import annotations

import pytest
import torch

import kwker_torch  # noqa: F401

SHAPES = [  # (M, K, N): decode rows, awkward K and N, prompt-sized GEMM
    (1, 1, 1),
    (1, 63, 65),
    (1, 65, 63),
    (1, 576, 1536),
    (2, 576, 576),
    (3, 257, 17),
    (4, 64, 15),
    (5, 1536, 576),
    (7, 7, 129),
    (17, 65, 63),
    (64, 576, 193),
    (130, 257, 65),
    (128, 576, 1536),
]


def _reference(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    xd, wd = x.double(), w.double()
    ref = xd @ wd.T + (b.double() if b is not None else 0)
    bound = xd.abs() @ wd.abs().T
    return ref, bound


def _check(y: torch.Tensor, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> float:
    ref, bound = _reference(x.reshape(-1, x.shape[-1]), w, b)
    ref = ref.reshape(*x.shape[:-1], w.shape[0])
    bound = bound.reshape(ref.shape)
    assert y.dtype == x.dtype and y.shape == ref.shape
    err = (y.double() - ref).abs()
    tol = 2e-6 * bound + 1e-6
    if y.dtype == torch.bfloat16:
        tol = tol + ref.abs() * 2.0**-8
    assert bool((err <= tol).all()), f"max err {err.max().item():.3g}, worst excess {(err - tol).max().item():.3g}"
    return float(err.max()) if err.numel() else 0.0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("m,k,n", SHAPES)
def test_linear_matches_reference(tier: str, dtype: torch.dtype, bias: bool, m: int, k: int, n: int) -> None:
    g = torch.Generator().manual_seed(m * 1000 + k * 10 + n)
    x = torch.randn(m, k, generator=g).to(dtype)
    w = torch.randn(n, k, generator=g).to(dtype)
    b = torch.randn(n, generator=g).to(dtype) if bias else None
    _check(torch.ops.kwker.linear(x, w, b), x, w, b)


def test_bf16_weights_with_f32_activations(tier: str) -> None:
    x = torch.randn(3, 100)
    w = torch.randn(33, 100).to(torch.bfloat16)
    _check(torch.ops.kwker.linear(x, w), x, w, None)


def test_bf16_output_equals_torch_nearly_everywhere() -> None:
    """Same f32 sum, one rounding: differences to torch's bf16 linear are rare single-ulp ties."""
    x = torch.randn(4, 576).to(torch.bfloat16)
    w = torch.randn(1536, 576).to(torch.bfloat16)
    ours, theirs = torch.ops.kwker.linear(x, w), torch.nn.functional.linear(x, w)
    differ = (ours != theirs).float().mean().item()
    assert differ < 0.05, f"{differ:.1%} of outputs differ from torch's bf16 linear"


def test_leading_dims_and_noncontiguous_inputs(tier: str) -> None:
    x = torch.randn(2, 3, 5, 40).transpose(1, 2)  # [2, 5, 3, 40], not contiguous
    w = torch.randn(40, 24).T  # [24, 40], not contiguous
    b = torch.randn(48)[::2]  # strided
    y = torch.ops.kwker.linear(x, w, b)
    assert y.shape == (2, 5, 3, 24)
    _check(y, x.contiguous(), w.contiguous(), b.contiguous())


@pytest.mark.parametrize("shape_x,shape_w", [((0, 8), (4, 8)), ((3, 8), (0, 8)), ((3, 0), (4, 0)), ((2, 0, 8), (4, 8))])
def test_zero_size(shape_x: tuple[int, ...], shape_w: tuple[int, ...]) -> None:
    x, w = torch.randn(shape_x), torch.randn(shape_w)
    b = torch.randn(shape_w[0])
    torch.testing.assert_close(torch.ops.kwker.linear(x, w, b), torch.nn.functional.linear(x, w, b))


@pytest.mark.parametrize(
    "x,w,b,message",
    [
        (
            torch.randn(2, 8, dtype=torch.float16),
            torch.randn(4, 8),
            None,
            "expected 'x' to be float32 or bfloat16, got float16",
        ),
        (
            torch.randn(2, 8),
            torch.randint(0, 3, (4, 8)),
            None,
            "expected 'weight' to be float32 or bfloat16, got int64",
        ),
        (torch.randn(2, 8), torch.randn(4, 8, 1), None, "expected weight of shape [N, K], got shape [4, 8, 1]"),
        (torch.randn(2, 8), torch.randn(8), None, "expected weight of shape [N, K]"),
        (torch.tensor(1.0), torch.randn(4, 8), None, "got a 0-d tensor"),
        (torch.randn(2, 8), torch.randn(4, 7), None, "x has 8 features"),
        (torch.randn(2, 8), torch.randn(4, 8), torch.randn(5), "expected bias of shape [4]"),
        (torch.randn(2, 8), torch.randn(4, 8), torch.randn(4, 1), "expected bias of shape [4]"),
        (torch.randn(2, 8), torch.randn(4, 8), torch.randn(4, dtype=torch.float64), "expected 'bias' to be float32"),
    ],
)
def test_bad_input_raises_clear_error(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, message: str) -> None:
    with pytest.raises(RuntimeError, match="kwker::linear") as e:
        torch.ops.kwker.linear(x, w, b)
    assert message in str(e.value)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a second device type (no GPU here)")
def test_wrong_device() -> None:
    with pytest.raises(RuntimeError, match="kwker::linear"):
        torch.ops.kwker.linear(torch.randn(2, 8, device="cuda"), torch.randn(4, 8, device="cuda"))


def test_gradients_match_torch() -> None:
    x = torch.randn(2, 3, 8, requires_grad=True)
    w = torch.randn(4, 8, requires_grad=True)
    b = torch.randn(4, requires_grad=True)
    g = torch.randn(2, 3, 4)
    torch.ops.kwker.linear(x, w, b).backward(g)
    ours = [x.grad, w.grad, b.grad]
    x.grad = w.grad = b.grad = None
    torch.nn.functional.linear(x, w, b).backward(g)
    for a, e in zip(ours, [x.grad, w.grad, b.grad], strict=True):
        torch.testing.assert_close(a, e)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("xs,n,bias", [((1, 64), 32, False), ((3, 17), 9, True), ((2, 5, 40), 24, True)])
def test_opcheck(dtype: torch.dtype, xs: tuple[int, ...], n: int, bias: bool) -> None:
    x = torch.randn(xs, dtype=dtype)
    w = torch.randn(n, xs[-1], dtype=dtype)
    b = torch.randn(n, dtype=dtype) if bias else None
    x.requires_grad_(dtype == torch.float32)  # also checks the autograd registration
    torch.library.opcheck(torch.ops.kwker.linear.default, (x, w, b))


def test_inside_torch_compile_fullgraph() -> None:
    w = torch.randn(48, 32)

    def f(x: torch.Tensor) -> torch.Tensor:
        return torch.relu(torch.ops.kwker.linear(x, w)) * 2

    compiled = torch.compile(f, fullgraph=True, dynamic=True)
    for m in (1, 5, 9):
        x = torch.randn(m, 32)
        torch.testing.assert_close(compiled(x), f(x))
