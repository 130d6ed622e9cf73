"""What a family mapping is, and the parts every mapping shares.

A family turns a loaded Hugging Face model into (1) a recipe, the JSON the native decoder composes its
layers from (``rust/src/decoder/recipe.rs``), read from the config through ``Fields`` (strict: see
``fields.py``), and (2) its tensors by their names in the decoder's tensor table
(``rust/src/decoder/tensors.rs``), each with the module whose input it multiplies (calibration hooks
there). The shared parts here read what the model itself computes where it keeps it (rotary frequencies
from its own buffers, so a bf16 model's rounded ``inv_freq`` is used as that model uses it).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from .fields import Fields

# Hugging Face activation names -> the recipe's (rust/src/vmath.rs: Act).
ACTS = {
    "silu": "silu", "swish": "silu",
    "gelu_pytorch_tanh": "gelu_tanh", "gelu_new": "gelu_tanh",
    "gelu": "gelu_erf",
    "relu": "relu",
}  # fmt: skip
# Rotary types whose frequencies do not change with the sequence length: the module's buffer is them.
STATIC_ROPE = ("default", "linear", "llama3", "yarn")


@dataclass
class Source:
    """One tensor handed to the decoder: its table name, layer (0 for model-level), value (2-D matrix
    [out, in] or 1-D vector), and for matrices the module whose forward input is the matrix's input;
    ``expert`` places a sparse layer's per-expert matrix, and ``rows`` (calibration) picks the matrix's input
    rows from that module's forward arguments when they are not simply its first argument (an expert reads
    only the tokens routed to it)."""

    name: str
    layer: int
    value: torch.Tensor
    module: torch.nn.Module | None = None
    expert: int = 0
    rows: Callable[[tuple[Any, ...]], torch.Tensor | None] | None = None

    @property
    def key(self) -> tuple[str, int, int]:
        return (self.name, self.layer, self.expert)


class Family:
    """A mapping from one or more Hugging Face ``model_type``s to the decoder. Subclasses define
    ``recipe`` and ``tensors``; ``positions_from_mask``: the model numbers a padded row's positions from
    its attention mask when no ``position_ids`` are given (OPT), else by column."""

    name = "?"
    model_types: tuple[str, ...] = ()
    positions_from_mask = False
    # int4 plan: matrices kept at 6 bits (plan.INT4_SENSITIVE), (kind, which layers) as plan's SENSITIVE;
    # None = default.
    sensitive: tuple[tuple[str, str], ...] | None = None
    plan_note = (
        "layer matrices q4k (4.5 bits); embeddings/lm_head and the first and last layers' q/k/v and down "
        "projections q6k (6.3 bits): the rule measured on real SmolLM2-135M weights (no real weights of this "
        "family were at hand)"
    )

    def recipe(self, model: torch.nn.Module, f: Fields) -> dict[str, Any]:
        raise NotImplementedError

    def tensors(self, model: torch.nn.Module, recipe: dict[str, Any]) -> Iterator[Source]:
        """Every tensor of ``model`` by its table name (only those ``recipe`` has: e.g. no lm_head when tied)."""
        raise NotImplementedError

    def inert(self) -> frozenset[str]:
        """Config fields of this family that do not change the forward, beyond ``fields.BASE_INERT``."""
        return frozenset()


def act(f: Fields, field: str) -> str:
    name = f[field]
    if name not in ACTS:
        raise f.refuse(field, f"activation {name!r} is not supported; KwkDecoder runs {sorted(ACTS)}")
    return ACTS[name]


def norm(kind: str, eps: float, weight: bool = True, bias: bool = False) -> dict[str, Any]:
    return {"kind": kind, "eps": float(eps), "weight": weight, "bias": bias}


def biases(qkv: bool = False, o: bool = False, up: bool = False, down: bool = False,
           lm_head: bool = False) -> dict[str, bool]:  # fmt: skip
    return {"qkv": qkv, "o": o, "up": up, "down": down, "lm_head": lm_head}


def f32(x: float) -> float:
    """``x`` rounded to float32, as a Python float (what a float32 model multiplies by)."""
    return float(torch.tensor(x, dtype=torch.float32))


def rope_params(f: Fields, layer_type: str | None = None) -> dict[str, Any]:
    rp = dict(f["rope_parameters"] or {})
    if layer_type is not None and layer_type in rp:
        rp = dict(rp[layer_type] or {})
    return rp


def rope_table(f: Fields, rotary: torch.nn.Module, layer_type: str | None = None) -> dict[str, Any]:
    """The recipe's rotary table from the model's rotary module: its own inverse frequencies (the buffer,
    as rounded in the model's dtype) and attention scaling; LongRoPE's short set (``original_inv_freq``)
    and long set (as Hugging Face computes it, or its cached copy) with the length that switches them."""
    rp = rope_params(f, layer_type)
    rope_type = rp.get("rope_type", "default")
    prefix = f"{layer_type}_" if layer_type is not None else ""
    if rope_type in STATIC_ROPE:
        inv = getattr(rotary, f"{prefix}inv_freq")
        scale = getattr(rotary, f"{prefix}attention_scaling", None) if layer_type else rotary.attention_scaling
        table = {"inv_freq": inv.detach().float().tolist(), "scale": float(1.0 if scale is None else scale)}
        return table
    if rope_type == "longrope":
        from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

        orig = int(rp["original_max_position_embeddings"])
        short = getattr(rotary, f"{prefix}original_inv_freq")
        long = getattr(rotary, f"{prefix}long_inv_freq", None)
        if long is None:
            kw = {"layer_type": layer_type} if layer_type else {}
            long, _ = ROPE_INIT_FUNCTIONS["longrope"](rotary.config, short.device, seq_len=orig + 1, **kw)
        scale = getattr(rotary, f"{prefix}attention_scaling", None) if layer_type else rotary.attention_scaling
        return {
            "inv_freq": short.detach().float().tolist(), "scale": float(scale),
            "long": {"inv_freq": long.detach().float().tolist(), "from_len": orig},
        }  # fmt: skip
    raise f.refuse(
        "rope_parameters",
        f"rope_type {rope_type!r} changes the rotary frequencies with the sequence length in a way KwkDecoder "
        f"does not implement (it runs {', '.join(STATIC_ROPE)} and longrope)",
    )


def check_rot_dim(table: dict[str, Any], head_dim: int, factor: float, what: str) -> None:
    """The model rotates int(head_dim * factor) values; the table must cover exactly that many."""
    want = int(head_dim * factor)
    if 2 * len(table["inv_freq"]) != want:
        raise ValueError(
            f"kwker: {what}: the rotary table covers {2 * len(table['inv_freq'])} of each head's values but the "
            f"model rotates {want} (head_dim {head_dim} x partial_rotary_factor {factor}); not supported"
        )


def tied(model: torch.nn.Module, embed: torch.Tensor, lm_head: torch.Tensor, f: Fields) -> bool:
    """Whether lm_head is the embedding (the same tensor, or a config that ties them and equal values)."""
    if lm_head is embed:
        return True
    return bool(f["tie_word_embeddings"]) and lm_head.shape == embed.shape and torch.equal(lm_head, embed)


def layer_spec(scale: float, window: int | None = None, rope: int = 0) -> dict[str, Any]:
    return {"window": window, "rope": rope, "attn_scale": float(scale)}


def head_layer_norms(f: Fields, bias: bool, per_head_weights: bool) -> dict[str, Any] | None:
    """The optional q/k LayerNorms over each head (``qk_layernorm``, eps ``layer_norm_eps``; Phi-2, StableLM):
    with or without bias, one weight for all heads or one per head."""
    if not f["qk_layernorm"]:
        return None
    return {"norm": norm("layer", f["layer_norm_eps"], weight=True, bias=bias), "scope": "head",
            "per_head_weights": per_head_weights}  # fmt: skip


def window_every_layer(f: Fields, layers: int) -> list[int | None]:
    """Per layer: the sliding window (``sliding_window``) on every layer when set, else none."""
    w = f["sliding_window"]
    return [int(w) if w else None] * layers


def windows_from_types(f: Fields, layers: int) -> list[int | None]:
    """Per layer: the sliding window (``sliding_window``) where ``layer_types`` says sliding_attention."""
    types = f["layer_types"] or ["full_attention"] * layers
    window = f["sliding_window"]
    bad = sorted(set(types) - {"full_attention", "sliding_attention"})
    if bad:
        raise f.refuse("layer_types", f"layer types {bad} are not supported (full_attention, sliding_attention)")
    return [int(window) if t == "sliding_attention" and window else None for t in types]


def scaling(attn: torch.nn.Module, want: float, what: str) -> float:
    """The attention scale the mapping derived from the config, checked against the module's own."""
    have = getattr(attn, "scaling", None)
    if have is not None and not math.isclose(float(have), want, rel_tol=1e-7):
        raise ValueError(f"kwker: {what}: the attention module scales by {have}, the config implies {want}")
    return want


def cat(*ts: torch.Tensor) -> torch.Tensor:
    """Rows of several tensors stacked (a fused projection), float32 if any part is."""
    dt = torch.float32 if any(t.dtype == torch.float32 for t in ts) else ts[0].dtype
    return torch.cat([t.detach().to(dt) for t in ts], 0)


def bias_or_zeros(lin: torch.nn.Module) -> torch.Tensor:
    b = lin.bias
    return b.detach().float() if b is not None else torch.zeros(lin.weight.shape[0])


def fused_bias(*lins: torch.nn.Module) -> torch.Tensor | None:
    """The stacked biases of fused projections (zeros for a part without), or None if none has one."""
    if all(x.bias is None for x in lins):
        return None
    return torch.cat([bias_or_zeros(x) for x in lins])


def one_plus(w: torch.Tensor) -> torch.Tensor:
    """Gemma's RMSNorm weight as it multiplies: ``1.0 + w.float()`` in float32, bit for bit."""
    return 1.0 + w.detach().float()
