"""Families laid out as Llama: ``model.model.{embed_tokens, layers, norm, rotary_emb}``, each layer
``self_attn.{q,k,v,o}_proj`` and ``mlp.{gate,up,down}_proj`` (or a plain ``c_fc``/``c_proj``), sequential
blocks. Llama / SmolLM2, Mistral, Qwen2 / Qwen2.5, Qwen3, Granite, OLMo, OLMo2, StarCoder2, and Gemma 2 /
Gemma 3 (``gemma.py`` subclasses ``LlamaStyle``).

``LlamaStyle`` holds the shared reading; each family names what differs: its modules' attribute names (``INNER``
... ``DOWN``), its norm, where its norm modules sit (``NORMS``: table name -> module attribute), q/k norms,
windows, scalars and inert fields.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from .base import (
    Family,
    Source,
    act,
    biases,
    cat,
    check_rot_dim,
    f32,
    fused_bias,
    layer_spec,
    norm,
    rope_params,
    rope_table,
    scaling,
    tied,
    window_every_layer,
    windows_from_types,
)  # fmt: skip
from .fields import Fields, has_field


class LlamaStyle(Family):
    """The shared reading. A family overrides the hooks below where its model differs."""

    # Table name of each layer norm -> the layer's module attribute (pre-norm placement).
    NORMS: dict[str, str] = {"attn_norm": "input_layernorm", "mlp_norm": "post_attention_layernorm"}
    # Table name of each q/k norm -> the attention module's attribute.
    QK_NORMS: dict[str, str] = {"q_norm": "q_norm", "k_norm": "k_norm"}
    FINAL_NORM = "norm"
    # The model's layout, by attribute name: the causal LM's inner model, the inner model's token embedding and
    # layer list, a layer's attention, the attention's output projection, and in the layer's ``mlp`` its first
    # projection(s) (stacked in this order: [gate; up] when gated) and its down projection.
    INNER = "model"
    EMBED = "embed_tokens"
    LAYERS = "layers"
    ATTN = "self_attn"
    OUT_PROJ = "o_proj"
    UPS: tuple[str, ...] = ("gate_proj", "up_proj")
    DOWN = "down_proj"
    placement = "pre"
    gated = True
    act_field = "hidden_act"

    # ---- the model's layout
    def inner(self, model: torch.nn.Module) -> torch.nn.Module:
        return getattr(model, self.INNER)

    def embedding(self, inner: torch.nn.Module) -> torch.nn.Module:
        return getattr(inner, self.EMBED)

    def layers(self, inner: torch.nn.Module) -> list[torch.nn.Module]:
        return list(getattr(inner, self.LAYERS))

    def attention(self, layer: torch.nn.Module) -> torch.nn.Module:
        return getattr(layer, self.ATTN)

    def qkv(self, a: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor | None, torch.nn.Module]:
        """The fused q/k/v weight [q; k; v], its bias (or None), and the module whose input it reads."""
        parts = (a.q_proj, a.k_proj, a.v_proj)
        return cat(*[p.weight for p in parts]), fused_bias(*parts), a.q_proj

    def out_proj(self, a: torch.nn.Module) -> torch.nn.Module:
        return getattr(a, self.OUT_PROJ)

    def mlp_mats(self, layer: torch.nn.Module) -> tuple[list[torch.nn.Module], torch.nn.Module]:
        """The MLP's first projection(s) (``UPS``, stacked in that order) and its down projection."""
        m = layer.mlp
        return [getattr(m, name) for name in self.UPS], getattr(m, self.DOWN)

    # ---- the recipe's parts a family overrides
    def norm(self, f: Fields) -> dict[str, Any]:
        return norm("rms", f["rms_norm_eps"])

    def qk_norm(self, f: Fields) -> dict[str, Any] | None:
        return None

    def block(self, f: Fields) -> Any:
        return "sequential"

    def windows(self, f: Fields, layers: int) -> list[int | None]:
        return [None] * layers

    def scalars(self, f: Fields, model: torch.nn.Module) -> dict[str, Any]:
        return {}

    def attn_scale(self, f: Fields, head_dim: int) -> float:
        return head_dim**-0.5

    def bias_fields(self, f: Fields) -> None:
        """Reads the config fields that decide the projections' biases (their presence is then read from
        the modules the config built)."""
        for name in ("attention_bias", "mlp_bias"):
            if has_field(f.cfg, name):
                f[name]

    def norm_weight(self, w: torch.Tensor) -> torch.Tensor:
        return w.detach().float()

    def intermediate(self, f: Fields) -> int:
        return int(f["intermediate_size"])

    def norm_modules(self, layer: torch.nn.Module) -> Iterator[tuple[str, str]]:
        """(table name, the layer's attribute) of each layer norm."""
        yield from self.NORMS.items()

    def rotary_factor(self, f: Fields) -> float:
        return float(rope_params(f).get("partial_rotary_factor", 1.0))

    def rope_tables(self, f: Fields, inner: torch.nn.Module, head_dim: int) -> tuple[list[dict], list[int]]:
        table = rope_table(f, inner.rotary_emb)
        check_rot_dim(table, head_dim, self.rotary_factor(f), self.name)
        return [table], [0] * len(self.layers(inner))

    def heads(self, f: Fields, attn: torch.nn.Module) -> tuple[int, int, int]:
        heads = int(f["num_attention_heads"])
        kv = int(f["num_key_value_heads"]) if has_field(f.cfg, "num_key_value_heads") else heads
        # Some configs (Qwen3-MoE, Granite-MoE, OLMoE) take head_dim as an extra keyword, not a declared field.
        hd = f["head_dim"] if has_field(f.cfg, "head_dim") or hasattr(f.cfg, "head_dim") else None
        head_dim = int(hd) if hd else int(f["hidden_size"]) // heads
        have = getattr(attn, "head_dim", getattr(attn, "head_size", head_dim))
        if int(have) != head_dim:
            raise ValueError(f"kwker: {self.name}: attention head_dim {have} differs from the config's {head_dim}")
        return heads, kv, head_dim

    # ---- shared reading
    def recipe(self, model: torch.nn.Module, f: Fields) -> dict[str, Any]:
        inner = self.inner(model)
        layers = self.layers(inner)
        a = self.attention(layers[0])
        heads, kv, head_dim = self.heads(f, a)
        hidden, n = int(f["hidden_size"]), int(f["num_hidden_layers"])
        if n != len(layers):
            raise ValueError(f"kwker: {self.name}: {len(layers)} layers for num_hidden_layers={n}")
        self.bias_fields(f)
        _, qkv_bias, _ = self.qkv(a)
        moe, sparse = self.mixture(f, n)
        dense = [layer for i, layer in enumerate(layers) if not sparse[i]]
        ups, down = self.mlp_mats(dense[0]) if dense else ([], None)
        ropes, rope_of = self.rope_tables(f, inner, head_dim)
        windows = self.windows(f, n)
        scale = scaling(a, self.attn_scale(f, head_dim), self.name)
        emb = self.embedding(inner).weight
        is_tied = tied(model, emb, model.lm_head.weight, f)
        return {
            "vocab": int(emb.shape[0]), "hidden": hidden, "embed_dim": hidden, "layers": n, "heads": heads,
            "kv_heads": kv, "head_dim": head_dim, "intermediate": self.intermediate(f),
            "norm": self.norm(f), "placement": self.placement, "block": self.block(f),
            "mlp": {"gated": self.gated, "act": act(f, self.act_field)},
            "moe": moe,
            "bias": biases(qkv=qkv_bias is not None, o=self.out_proj(a).bias is not None,
                           up=bool(ups) and ups[0].bias is not None, down=down is not None and down.bias is not None,
                           lm_head=model.lm_head.bias is not None),
            "qk_norm": self.qk_norm(f), "final_norm": True, "tied_embeddings": is_tied,
            "positions": {"rotary": {"ropes": ropes}},
            "layer_specs": [{**layer_spec(scale, windows[i], rope_of[i]), "sparse": sparse[i]} for i in range(n)],
            **self.scalars(f, model),
        }  # fmt: skip

    def tensors(self, model: torch.nn.Module, recipe: dict[str, Any]) -> Iterator[Source]:
        inner = self.inner(model)
        yield Source("embed", 0, self.embedding(inner).weight)
        yield from self.norm_sources("final_norm", 0, getattr(inner, self.FINAL_NORM))
        if not recipe["tied_embeddings"]:
            yield Source("lm_head", 0, model.lm_head.weight, model.lm_head)
        if model.lm_head.bias is not None:
            yield Source("lm_head.bias", 0, model.lm_head.bias.detach().float())
        for i, layer in enumerate(self.layers(inner)):
            a = self.attention(layer)
            for name, attr in self.norm_modules(layer):
                mod = getattr(layer, attr, None)
                if mod is not None:
                    yield from self.norm_sources(name, i, mod)
            w, b, mod = self.qkv(a)
            yield Source("qkv", i, w, mod)
            if b is not None:
                yield Source("qkv.bias", i, b)
            if recipe["qk_norm"] is not None:
                for name, attr in self.QK_NORMS.items():
                    mod = getattr(a, attr, None)
                    if mod is None:
                        raise ValueError(
                            f"kwker: {self.name}: the config asks for q/k norms but layer {i}'s attention has no "
                            f"{attr} (a config changed after the model was built?)"
                        )
                    yield from self.norm_sources(name, i, mod)
            o = self.out_proj(a)
            yield Source("o", i, o.weight, o)
            if o.bias is not None:
                yield Source("o.bias", i, o.bias.detach().float())
            if recipe["layer_specs"][i]["sparse"]:
                yield from self.expert_sources(i, layer)
                continue
            ups, down = self.mlp_mats(layer)
            yield Source("up", i, cat(*[u.weight for u in ups]), ups[0])
            b = fused_bias(*ups)
            if b is not None:
                yield Source("up.bias", i, b)
            yield Source("down", i, down.weight, down)
            if down.bias is not None:
                yield Source("down.bias", i, down.bias.detach().float())

    def mixture(self, f: Fields, layers: int) -> tuple[dict[str, Any] | None, list[bool]]:
        """The recipe's experts (None for a dense model) and which layers are sparse (``moe.py``)."""
        return None, [False] * layers

    def expert_sources(self, i: int, layer: torch.nn.Module) -> Iterator[Source]:
        raise NotImplementedError(f"{self.name} has no sparse layers")

    def norm_sources(self, name: str, layer: int, mod: torch.nn.Module) -> Iterator[Source]:
        w = getattr(mod, "weight", None)
        if w is not None:
            yield Source(name, layer, self.norm_weight(w))
        b = getattr(mod, "bias", None)
        if b is not None:
            yield Source(f"{name}.bias", layer, b.detach().float())


class Llama(LlamaStyle):
    name = "Llama"
    model_types = ("llama",)

    def inert(self) -> frozenset[str]:
        return frozenset({"pretraining_tp"})  # a training-time matmul split; transformers 5 ignores it


class Mistral(LlamaStyle):
    name = "Mistral"
    model_types = ("mistral",)

    def windows(self, f: Fields, layers: int) -> list[int | None]:
        return window_every_layer(f, layers)


class Qwen2(LlamaStyle):
    name = "Qwen2"
    model_types = ("qwen2",)

    def windows(self, f: Fields, layers: int) -> list[int | None]:
        f["use_sliding_window"], f["max_window_layers"]  # folded into layer_types by the config
        return windows_from_types(f, layers)


class Qwen3(Qwen2):
    name = "Qwen3"
    model_types = ("qwen3",)

    def qk_norm(self, f: Fields) -> dict[str, Any] | None:
        return {"norm": norm("rms", f["rms_norm_eps"]), "scope": "head", "per_head_weights": False}


class Granite(LlamaStyle):
    name = "Granite"
    model_types = ("granite",)

    def attn_scale(self, f: Fields, head_dim: int) -> float:
        return float(f["attention_multiplier"])

    def scalars(self, f: Fields, model: torch.nn.Module) -> dict[str, Any]:
        return {
            "embed_scale": f32(f["embedding_multiplier"]), "residual_scale": f32(f["residual_multiplier"]),
            "logit_divisor": f32(f["logits_scaling"]),
        }  # fmt: skip


class Olmo(LlamaStyle):
    """OLMo (1): weightless LayerNorms (eps 1e-5, fixed in the model), q/k/v clamped to +-clip_qkv."""

    name = "OLMo"
    model_types = ("olmo",)

    def norm(self, f: Fields) -> dict[str, Any]:
        return norm("layer", 1e-5, weight=False, bias=False)

    def scalars(self, f: Fields, model: torch.nn.Module) -> dict[str, Any]:
        clip = f["clip_qkv"]
        return {"clip_qkv": float(clip)} if clip is not None else {}


class Olmo2(LlamaStyle):
    """OLMo2: norms after each sub-layer (post-only), q/k RMSNorms over the whole projection."""

    name = "OLMo2"
    model_types = ("olmo2",)
    NORMS = {"post_attn_norm": "post_attention_layernorm", "post_mlp_norm": "post_feedforward_layernorm"}
    placement = "post"

    def qk_norm(self, f: Fields) -> dict[str, Any] | None:
        return {"norm": norm("rms", f["rms_norm_eps"]), "scope": "full", "per_head_weights": False}


class Starcoder2(LlamaStyle):
    """StarCoder2: LayerNorms with bias, a plain GELU MLP (``c_fc``, ``c_proj``), biases on every projection
    (``use_bias``), a sliding window on every layer when set."""

    name = "StarCoder2"
    model_types = ("starcoder2",)
    UPS, DOWN = ("c_fc",), "c_proj"
    gated = False

    def norm(self, f: Fields) -> dict[str, Any]:
        return norm("layer", f["norm_epsilon"], weight=True, bias=True)

    def bias_fields(self, f: Fields) -> None:
        f["use_bias"]

    def windows(self, f: Fields, layers: int) -> list[int | None]:
        return window_every_layer(f, layers)


FAMILIES: tuple[Family, ...] = (Llama(), Mistral(), Qwen2(), Qwen3(), Granite(), Olmo(), Olmo2(), Starcoder2())
