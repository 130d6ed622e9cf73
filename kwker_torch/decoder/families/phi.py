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

from .base import cat, fused_bias, norm
from .fields import Fields
from .llama import LlamaStyle


class Phi3(LlamaStyle):
    name = "Phi-3"
    model_types = ("phi3",)

    def qkv(self, a: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor | None, torch.nn.Module]:
        p = a.qkv_proj
        return p.weight, fused_bias(p), p

    def mlp_mats(self, layer: torch.nn.Module) -> tuple[list[torch.nn.Module], torch.nn.Module]:
        return [layer.mlp.gate_up_proj], layer.mlp.down_proj

    def windows(self, f: Fields, layers: int) -> list[int | None]:
        f["original_max_position_embeddings"]  # LongRoPE's switch: read with rope_parameters
        w = f["sliding_window"]
        return [int(w) if w else None] * layers


class Phi(LlamaStyle):
    name = "Phi-2"
    model_types = ("phi",)
    NORMS = {"attn_norm": "input_layernorm"}
    QK_NORMS = {"q_norm": "q_layernorm", "k_norm": "k_layernorm"}
    FINAL_NORM = "final_layernorm"
    gated = False

    def norm(self, f: Fields) -> dict[str, Any]:
        return norm("layer", f["layer_norm_eps"], weight=True, bias=True)

    def qk_norm(self, f: Fields) -> dict[str, Any] | None:
        if not f["qk_layernorm"]:
            return None
        return {"norm": norm("layer", f["layer_norm_eps"], weight=True, bias=True), "scope": "head",
                "per_head_weights": False}  # fmt: skip

    def block(self, f: Fields) -> Any:
        return {"parallel": {"shared_norm": True, "residual_last": True}}

    def out_proj(self, a: torch.nn.Module) -> torch.nn.Module:
        return a.dense

    def mlp_mats(self, layer: torch.nn.Module) -> tuple[list[torch.nn.Module], torch.nn.Module]:
        return [layer.mlp.fc1], layer.mlp.fc2

    def qkv(self, a: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor | None, torch.nn.Module]:
        parts = (a.q_proj, a.k_proj, a.v_proj)
        return cat(*[p.weight for p in parts]), fused_bias(*parts), a.q_proj


FAMILIES = (Phi3(), Phi())
