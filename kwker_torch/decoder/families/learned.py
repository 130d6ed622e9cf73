"""Families with learned absolute positions: GPT-2 (``gpt2``) and OPT (``opt``).

GPT-2: ``transformer.{wte, wpe, h, ln_f}``; Conv1D layers store their weights [in, out], transposed here;
``c_attn`` is [q | k | v] along its outputs; positions from 0; a plain GELU (tanh) MLP; biases everywhere;
the attention scale optionally divided by layer index + 1 (``scale_attn_by_inverse_layer_idx``).
OPT: ``model.decoder``; positions are ``cumsum(attention_mask) - 1`` looked up at ``+ 2``; pre-norm
(``do_layer_norm_before``) or post-norm of each residual sum (opt-350m); an embedding narrower than the
layers (``word_embed_proj_dim``) with projections in and out; a plain ReLU MLP.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from .base import Family, Source, act, biases, cat, fused_bias, layer_spec, norm, scaling, tied
from .fields import Fields


def _ln(name: str, layer: int, mod: torch.nn.Module | None) -> Iterator[Source]:
    if mod is None:
        return
    if getattr(mod, "weight", None) is not None:
        yield Source(name, layer, mod.weight.detach().float())
    if getattr(mod, "bias", None) is not None:
        yield Source(f"{name}.bias", layer, mod.bias.detach().float())


def _t(conv: torch.nn.Module) -> torch.Tensor:
    """A Conv1D's weight as nn.Linear stores it: [out, in]."""
    return conv.weight.detach().t().contiguous()


class Gpt2(Family):
    name = "GPT-2"
    model_types = ("gpt2",)

    def inert(self) -> frozenset[str]:
        # reorder_and_upcast_attn only changes the precision of a half-precision attention; the summary_*
        # fields belong to the double-heads model's classifier.
        return frozenset({"reorder_and_upcast_attn", "summary_type", "summary_use_proj", "summary_activation",
                          "summary_proj_to_labels"})  # fmt: skip

    def recipe(self, model: torch.nn.Module, f: Fields) -> dict[str, Any]:
        t = model.transformer
        hidden, heads, n = int(f["n_embd"]), int(f["n_head"]), int(f["n_layer"])
        inner = f["n_inner"]
        inter = int(inner) if inner is not None else 4 * hidden
        head_dim = hidden // heads
        scales = []
        by_layer = f["scale_attn_by_inverse_layer_idx"]
        for i, block in enumerate(t.h):
            s = head_dim**-0.5 if f["scale_attn_weights"] else 1.0
            if by_layer:
                s /= float(i + 1)
            scales.append(scaling(block.attn, s, self.name))
        return {
            "vocab": int(t.wte.weight.shape[0]), "hidden": hidden, "embed_dim": hidden, "layers": n,
            "heads": heads, "kv_heads": heads, "head_dim": head_dim, "intermediate": inter,
            "norm": norm("layer", f["layer_norm_epsilon"], weight=True, bias=True), "placement": "pre",
            "block": "sequential", "mlp": {"gated": False, "act": act(f, "activation_function")},
            "bias": biases(qkv=True, o=True, up=True, down=True, lm_head=model.lm_head.bias is not None),
            "final_norm": True, "tied_embeddings": tied(model, t.wte.weight, model.lm_head.weight, f),
            "positions": {"learned": {"offset": 0, "len": int(t.wpe.weight.shape[0])}},
            "layer_specs": [layer_spec(s) for s in scales],
        }  # fmt: skip

    def tensors(self, model: torch.nn.Module, recipe: dict[str, Any]) -> Iterator[Source]:
        t = model.transformer
        yield Source("embed", 0, t.wte.weight)
        yield Source("pos_embed", 0, t.wpe.weight)
        yield from _ln("final_norm", 0, t.ln_f)
        if not recipe["tied_embeddings"]:
            yield Source("lm_head", 0, model.lm_head.weight, model.lm_head)
        for i, block in enumerate(t.h):
            yield from _ln("attn_norm", i, block.ln_1)
            yield Source("qkv", i, _t(block.attn.c_attn), block.attn.c_attn)
            yield Source("qkv.bias", i, block.attn.c_attn.bias.detach().float())
            yield Source("o", i, _t(block.attn.c_proj), block.attn.c_proj)
            yield Source("o.bias", i, block.attn.c_proj.bias.detach().float())
            yield from _ln("mlp_norm", i, block.ln_2)
            yield Source("up", i, _t(block.mlp.c_fc), block.mlp.c_fc)
            yield Source("up.bias", i, block.mlp.c_fc.bias.detach().float())
            yield Source("down", i, _t(block.mlp.c_proj), block.mlp.c_proj)
            yield Source("down.bias", i, block.mlp.c_proj.bias.detach().float())


class Opt(Family):
    name = "OPT"
    model_types = ("opt",)
    positions_from_mask = True

    def recipe(self, model: torch.nn.Module, f: Fields) -> dict[str, Any]:
        d = model.model.decoder
        hidden, heads, n = int(f["hidden_size"]), int(f["num_attention_heads"]), int(f["num_hidden_layers"])
        head_dim = hidden // heads
        pre = bool(f["do_layer_norm_before"])
        f["_remove_final_layer_norm"], f["enable_bias"]  # decided which modules exist; read from them
        affine = bool(f["layer_norm_elementwise_affine"])
        f["word_embed_proj_dim"]
        a = d.layers[0].self_attn
        scale = scaling(a, head_dim**-0.5, self.name)
        emb = d.embed_tokens.weight
        return {
            "vocab": int(emb.shape[0]), "hidden": hidden, "embed_dim": int(emb.shape[1]), "layers": n,
            "heads": heads, "kv_heads": heads, "head_dim": head_dim, "intermediate": int(f["ffn_dim"]),
            # nn.LayerNorm's default eps: OPT does not set one.
            "norm": norm("layer", 1e-5, weight=affine, bias=affine),
            "placement": "pre" if pre else "post_residual", "block": "sequential",
            "mlp": {"gated": False, "act": act(f, "activation_function")},
            "bias": biases(qkv=a.q_proj.bias is not None, o=a.out_proj.bias is not None,
                           up=d.layers[0].fc1.bias is not None, down=d.layers[0].fc2.bias is not None,
                           lm_head=model.lm_head.bias is not None),
            "final_norm": d.final_layer_norm is not None, "tied_embeddings": tied(model, emb, model.lm_head.weight, f),
            "positions": {"learned": {"offset": int(d.embed_positions.offset),
                                      "len": int(d.embed_positions.weight.shape[0])}},
            "layer_specs": [layer_spec(scale) for _ in range(n)],
        }  # fmt: skip

    def tensors(self, model: torch.nn.Module, recipe: dict[str, Any]) -> Iterator[Source]:
        d = model.model.decoder
        pre = recipe["placement"] == "pre"
        yield Source("embed", 0, d.embed_tokens.weight)
        yield Source("pos_embed", 0, d.embed_positions.weight)
        if d.project_in is not None:
            yield Source("proj_in", 0, d.project_in.weight, d.project_in)
            yield Source("proj_out", 0, d.project_out.weight, d.project_out)
        yield from _ln("final_norm", 0, d.final_layer_norm)
        if not recipe["tied_embeddings"]:
            yield Source("lm_head", 0, model.lm_head.weight, model.lm_head)
        for i, layer in enumerate(d.layers):
            a = layer.self_attn
            yield from _ln("attn_norm" if pre else "post_attn_norm", i, layer.self_attn_layer_norm)
            yield Source("qkv", i, cat(a.q_proj.weight, a.k_proj.weight, a.v_proj.weight), a.q_proj)
            b = fused_bias(a.q_proj, a.k_proj, a.v_proj)
            if b is not None:
                yield Source("qkv.bias", i, b)
            yield Source("o", i, a.out_proj.weight, a.out_proj)
            if a.out_proj.bias is not None:
                yield Source("o.bias", i, a.out_proj.bias.detach().float())
            yield from _ln("mlp_norm" if pre else "post_mlp_norm", i, layer.final_layer_norm)
            yield Source("up", i, layer.fc1.weight, layer.fc1)
            if layer.fc1.bias is not None:
                yield Source("up.bias", i, layer.fc1.bias.detach().float())
            yield Source("down", i, layer.fc2.weight, layer.fc2)
            if layer.fc2.bias is not None:
                yield Source("down.bias", i, layer.fc2.bias.detach().float())


FAMILIES = (Gpt2(), Opt())
