"""GPT-NeoX / Pythia (``gpt_neox``) and StableLM (``stablelm``): LayerNorms with bias, partial rotary, and
optionally a parallel block.

GPT-NeoX: ``query_key_value`` holds q/k/v interleaved per head ([heads, 3, head_dim] rows), reordered here
into [q; k; v]; parallel (``use_parallel_residual``) with two norms, summed as ``(mlp + attn) + x``, else
sequential pre-norm; a plain GELU MLP; untied ``lm_head``.
StableLM: Llama's module names with LayerNorms; parallel with one shared norm summed as
``(x + attn) + mlp`` when ``use_parallel_residual``; optional per-head q/k LayerNorms with their own
weights per head (``qk_layernorm``); q/k/v biases with ``use_qkv_bias``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from .base import Source, head_layer_norms, norm
from .fields import Fields
from .llama import LlamaStyle


class GptNeox(LlamaStyle):
    name = "GPT-NeoX"
    model_types = ("gpt_neox",)
    FINAL_NORM = "final_layer_norm"
    INNER, EMBED, ATTN, OUT_PROJ = "gpt_neox", "embed_in", "attention", "dense"
    UPS, DOWN = ("dense_h_to_4h",), "dense_4h_to_h"
    gated = False

    def inert(self) -> frozenset[str]:
        return frozenset({"is_decoder"})

    def norm(self, f: Fields) -> dict[str, Any]:
        return norm("layer", f["layer_norm_eps"], weight=True, bias=True)

    def block(self, f: Fields) -> Any:
        if f["use_parallel_residual"]:
            return {"parallel": {"shared_norm": False, "residual_last": True}}
        return "sequential"

    def qkv(self, a: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor | None, torch.nn.Module]:
        p = a.query_key_value
        d = a.head_size
        w = p.weight.detach().reshape(-1, 3, d, p.weight.shape[1])  # [heads, (q, k, v), head_dim, hidden]
        weight = torch.cat([w[:, j].reshape(-1, w.shape[-1]) for j in range(3)])
        bias = None
        if p.bias is not None:
            b = p.bias.detach().float().reshape(-1, 3, d)
            bias = torch.cat([b[:, j].reshape(-1) for j in range(3)])
        return weight.contiguous(), bias, p


class StableLm(LlamaStyle):
    name = "StableLM"
    model_types = ("stablelm",)
    QK_NORMS = {"q_norm": "q_layernorm", "k_norm": "k_layernorm"}

    def norm(self, f: Fields) -> dict[str, Any]:
        return norm("layer", f["layer_norm_eps"], weight=True, bias=True)

    def bias_fields(self, f: Fields) -> None:
        f["use_qkv_bias"]

    def qk_norm(self, f: Fields) -> dict[str, Any] | None:
        # StableLmLayerNormPerHead: one nn.LayerNorm(head_dim, bias=False) per head.
        return head_layer_norms(f, bias=False, per_head_weights=True)

    def block(self, f: Fields) -> Any:
        if f["use_parallel_residual"]:
            return {"parallel": {"shared_norm": True, "residual_last": False}}
        return "sequential"

    def norm_sources(self, name: str, layer: int, mod: torch.nn.Module) -> Iterator[Source]:
        norms = getattr(mod, "norms", None)
        if norms is None:
            yield from super().norm_sources(name, layer, mod)
            return
        # Per-head norms: their weights side by side, [heads * head_dim].
        yield Source(name, layer, torch.cat([n.weight.detach().float() for n in norms]))


FAMILIES = (GptNeox(), StableLm())
