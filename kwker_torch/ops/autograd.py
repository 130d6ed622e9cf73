"""Autograd rules of the kwker ops, so that a backward through them is right or refused, never silently
wrong (torch's default for an op without a rule is a warning and a missing gradient).

- ``kwker::linear``: the exact gradients of ``x @ w.T + b`` (computed with torch's matmul).
- ``kwker::decode_attention``: inference-only; a backward raises an error naming the op.

Cost: the rule runs in Python on every call made with grad mode on (about 5 µs); calls under
``torch.inference_mode()`` skip it.
"""

from __future__ import annotations

from typing import Any

import torch


def _linear_setup(ctx: Any, inputs: tuple, output: torch.Tensor) -> None:
    x, w, b = inputs
    ctx.save_for_backward(x, w)
    ctx.has_bias = b is not None
    ctx.bias_dtype = b.dtype if b is not None else None


def _linear_backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
    x, w = ctx.saved_tensors
    g2 = grad.reshape(-1, grad.shape[-1])
    gx = (grad @ w.to(grad.dtype)).to(x.dtype) if ctx.needs_input_grad[0] else None
    gw = (g2.T @ x.reshape(-1, x.shape[-1]).to(grad.dtype)).to(w.dtype) if ctx.needs_input_grad[1] else None
    gb = g2.sum(0).to(ctx.bias_dtype) if ctx.has_bias and ctx.needs_input_grad[2] else None
    return gx, gw, gb


def _attention_setup(ctx: Any, inputs: tuple, output: torch.Tensor) -> None:
    pass


def _attention_backward(ctx: Any, grad: torch.Tensor) -> tuple[None, ...]:
    raise RuntimeError(
        "kwker::decode_attention is inference-only and has no backward; run training with torch's "
        "scaled_dot_product_attention (kwker_torch.torch_ops.install() leaves gradient-tracking calls on torch)"
    )


torch.library.register_autograd("kwker::linear", _linear_backward, setup_context=_linear_setup)
torch.library.register_autograd("kwker::decode_attention", _attention_backward, setup_context=_attention_setup)
