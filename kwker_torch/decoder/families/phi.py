"""Phi-3 / Phi-4-mini (``phi3``) and Phi-2 (``phi``).

Phi-3: Llama's layout with q/k/v fused in ``qkv_proj`` and gate/up in ``gate_up_proj`` (already [q; k; v]
and [gate; up]), partial rotary (Phi-4-mini rotates 3/4 of each head), LongRoPE (short and long
frequency sets, switched on the whole call's largest position against
``original_max_position_embeddings``), a sliding window on every layer when set (Phi-3-mini-4k).
Phi-2: a parallel block with one shared LayerNorm, ``x + (attn(ln x) + mlp(ln x))`` summed as
``(attn + mlp) + x``, a plain GELU MLP (``fc1``, ``fc2``), biases everywhere including lm_head, partial
rotary, optional per-head q/k LayerNorms (``qk_layernorm``).
"""

from __future__ import annotations

from typing import Any

import torch

from .base import fused_bias, head_layer_norms, norm, window_every_layer
from .fields import Fields
from .llama import LlamaStyle


class Phi3(LlamaStyle):
    name = "Phi-3"
    model_types = ("phi3",)
    UPS = ("gate_up_proj",)  # already [gate; up]

    def qkv(self, a: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor | None, torch.nn.Module]:
        p = a.qkv_proj
        return p.weight, fused_bias(p), p

    def windows(self, f: Fields, layers: int) -> list[int | None]:
        f["original_max_position_embeddings"]  # LongRoPE's switch: read with rope_parameters
        return window_every_layer(f, layers)


class Phi(LlamaStyle):
    name = "Phi-2"
    model_types = ("phi",)
    NORMS = {"attn_norm": "input_layernorm"}
    QK_NORMS = {"q_norm": "q_layernorm", "k_norm": "k_layernorm"}
    FINAL_NORM = "final_layernorm"
    OUT_PROJ = "dense"
    UPS, DOWN = ("fc1",), "fc2"
    gated = False

    def norm(self, f: Fields) -> dict[str, Any]:
        return norm("layer", f["layer_norm_eps"], weight=True, bias=True)

    def qk_norm(self, f: Fields) -> dict[str, Any] | None:
        return head_layer_norms(f, bias=True, per_head_weights=False)

    def block(self, f: Fields) -> Any:
        return {"parallel": {"shared_norm": True, "residual_last": True}}


FAMILIES = (Phi3(), Phi())
