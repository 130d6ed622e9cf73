"""Mixtures of experts laid out as Llama (``llama.py``) with a sparse MLP: Mixtral, Qwen3-MoE, Granite-MoE and
OLMoE. A sparse layer's block holds a router ``[experts, hidden]`` and its experts as 3-D parameters
(transformers 5): ``gate_up_proj [experts, 2 * inter, hidden]`` (gate rows first) and ``down_proj [experts,
hidden, inter]``, each slice an ``nn.Linear``-style ``[out, in]`` matrix, which the decoder stores per expert
(``expert_up``, ``expert_down``; ``rust/src/decoder/moe.rs`` runs them).

The routers, as each modeling file computes them (``recipe.rs``: ``Router``):
- Mixtral: softmax over all experts in float32, the top k, always renormalised.
- Qwen3-MoE, OLMoE: the same, renormalised only when ``norm_topk_prob``.
- Granite-MoE: the top k of the raw logits, then a softmax over those k.
Qwen3-MoE mixes dense and sparse layers: a layer is sparse unless it is in ``mlp_only_layers``, when
``(layer + 1) % decoder_sparse_step == 0``; its dense layers use ``intermediate_size``, its experts
``moe_intermediate_size``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from .base import Family, Source, f32, norm, window_every_layer
from .fields import Fields
from .llama import Granite, LlamaStyle, Qwen3

# A mixture's int4 plan: the SmolLM2 rule (base.Family.plan_note), with the experts' down projections of the
# first and last layers at 6 bits (q6k) as the dense down projections are there.
MOE_SENSITIVE = (("down", "ends"), ("qkv", "ends"), ("expert_down", "ends"))
# Router settings that only matter in training (auxiliary loss, router-logit outputs, jitter noise).
TRAINING_ONLY = frozenset({"output_router_logits", "router_aux_loss_coef", "router_jitter_noise"})


class Mixture(LlamaStyle):
    """The shared reading of a sparse layer; families name the block, router and the config's fields."""

    sensitive = MOE_SENSITIVE
    BLOCK = "mlp"  # the decoder layer's attribute holding the sparse block
    ROUTER = "gate"  # the block's attribute holding the router
    EXPERTS_FIELD = "num_local_experts"
    INTER_FIELD = "intermediate_size"

    def router_kind(self, f: Fields) -> Any:
        raise NotImplementedError

    def sparse_layers(self, f: Fields, layers: int) -> list[bool]:
        return [True] * layers

    def mixture(self, f: Fields, layers: int) -> tuple[dict[str, Any] | None, list[bool]]:
        experts, k = int(f[self.EXPERTS_FIELD]), int(f["num_experts_per_tok"])
        if experts < 1 or not 1 <= k <= experts:
            raise f.refuse("num_experts_per_tok", f"expected 1 ..= num_experts ({experts}) experts per token")
        moe = {"experts": experts, "top_k": k, "intermediate": int(f[self.INTER_FIELD]), "router": self.router_kind(f)}
        return moe, self.sparse_layers(f, layers)

    def inert(self) -> frozenset[str]:
        return TRAINING_ONLY

    def block_of(self, layer: torch.nn.Module) -> torch.nn.Module:
        return getattr(layer, self.BLOCK)

    def expert_sources(self, i: int, layer: torch.nn.Module) -> Iterator[Source]:
        block = self.block_of(layer)
        router = getattr(block, self.ROUTER)
        yield Source("router", i, router.weight, block)
        experts = block.experts
        gate_up, down = experts.gate_up_proj, experts.down_proj
        if getattr(experts, "has_bias", False) or getattr(experts, "is_transposed", False):
            raise ValueError(f"kwker: {self.name}: layer {i}'s experts have biases or a transposed layout")
        for e in range(gate_up.shape[0]):
            yield Source("expert_up", i, gate_up[e], experts, e, _routed_rows(e))
            yield Source("expert_down", i, down[e], experts, e, _routed_hidden(e, experts))


def _routed_rows(e: int) -> Any:
    """Calibration: the rows of the experts module's input (hidden_states, top_k_index, ...) routed to e."""

    def rows(args: tuple[Any, ...]) -> torch.Tensor | None:
        x, index = args[0], args[1]
        x = x.reshape(-1, x.shape[-1])
        return x[(index.reshape(x.shape[0], -1) == e).any(-1)]

    return rows


def _routed_hidden(e: int, experts: torch.nn.Module) -> Any:
    """Calibration: expert e's down-projection input, act(gate x) * up x, over the rows routed to it."""
    pick = _routed_rows(e)

    def rows(args: tuple[Any, ...]) -> torch.Tensor | None:
        x = pick(args)
        if x is None or x.shape[0] == 0:
            return None
        gate, up = torch.nn.functional.linear(x, experts.gate_up_proj[e]).chunk(2, dim=-1)
        return experts.act_fn(gate) * up

    return rows


class Mixtral(Mixture):
    name = "Mixtral"
    model_types = ("mixtral",)

    def router_kind(self, f: Fields) -> dict[str, Any]:
        return {"softmax_topk": {"renormalize": True}}

    def windows(self, f: Fields, layers: int) -> list[int | None]:
        return window_every_layer(f, layers)


class Qwen3Moe(Mixture, Qwen3):
    """Qwen3-MoE: Qwen3's attention (per-head q/k norms), dense layers among sparse ones."""

    name = "Qwen3-MoE"
    model_types = ("qwen3_moe",)
    EXPERTS_FIELD = "num_experts"
    INTER_FIELD = "moe_intermediate_size"

    def router_kind(self, f: Fields) -> dict[str, Any]:
        return {"softmax_topk": {"renormalize": bool(f["norm_topk_prob"])}}

    def sparse_layers(self, f: Fields, layers: int) -> list[bool]:
        dense = set(f["mlp_only_layers"] or [])
        step = int(f["decoder_sparse_step"])
        if step < 1:
            raise f.refuse("decoder_sparse_step", "expected a positive step")
        return [i not in dense and (i + 1) % step == 0 for i in range(layers)]

    def windows(self, f: Fields, layers: int) -> list[int | None]:
        f["use_sliding_window"]  # folded into sliding_window by the config
        return window_every_layer(f, layers)


class GraniteMoe(Mixture, Granite):
    """Granite-MoE: Granite's scalars; the sparse block is ``block_sparse_moe`` with a ``router``."""

    name = "Granite-MoE"
    model_types = ("granitemoe",)
    BLOCK = "block_sparse_moe"
    ROUTER = "router"

    def router_kind(self, f: Fields) -> dict[str, Any]:
        return "topk_softmax"  # type: ignore[return-value]  # a unit variant of the recipe's Router


class Olmoe(Mixture):
    """OLMoE: q/k RMSNorms over the whole projection, then the clamp of q, k and v (``clip_qkv``)."""

    name = "OLMoE"
    model_types = ("olmoe",)
    EXPERTS_FIELD = "num_experts"

    def router_kind(self, f: Fields) -> dict[str, Any]:
        return {"softmax_topk": {"renormalize": bool(f["norm_topk_prob"])}}

    def qk_norm(self, f: Fields) -> dict[str, Any] | None:
        return {"norm": norm("rms", f["rms_norm_eps"]), "scope": "full", "per_head_weights": False}

    def scalars(self, f: Fields, model: torch.nn.Module) -> dict[str, Any]:
        clip = f["clip_qkv"]
        return {"clip_qkv": f32(clip), "clip_after_norm": True} if clip is not None else {}


FAMILIES: tuple[Family, ...] = (Mixtral(), Qwen3Moe(), GraniteMoe(), Olmoe())
