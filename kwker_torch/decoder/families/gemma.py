"""Gemma 2 and Gemma 3 text models (``Gemma2ForCausalLM``, ``Gemma3ForCausalLM``): Llama's layout with
"sandwich" norms (a norm before and after attention and MLP), RMSNorm weights applied as ``1 + w``
(folded in at load, bit-exactly: the model computes ``1.0 + w.float()`` in float32 itself), the
embeddings scaled by sqrt(hidden), the attention scaled by ``query_pre_attn_scalar ** -0.5``, sliding
windows on the layers ``layer_types`` names, GELU (tanh). Gemma 2 soft-caps attention scores and final
logits; Gemma 3 adds per-head q/k norms and a rotary table per layer type (local and global bases).
"""

from __future__ import annotations

from typing import Any

import torch

from .base import f32, norm, one_plus, rope_table, windows_from_types
from .fields import Fields
from .llama import LlamaStyle


class Gemma2(LlamaStyle):
    name = "Gemma 2"
    model_types = ("gemma2",)
    NORMS = {
        "attn_norm": "input_layernorm", "post_attn_norm": "post_attention_layernorm",
        "mlp_norm": "pre_feedforward_layernorm", "post_mlp_norm": "post_feedforward_layernorm",
    }  # fmt: skip
    placement = "sandwich"
    act_field = "hidden_activation"

    def norm_weight(self, w: torch.Tensor) -> torch.Tensor:
        return one_plus(w)

    def attn_scale(self, f: Fields, head_dim: int) -> float:
        return float(f["query_pre_attn_scalar"]) ** -0.5

    def windows(self, f: Fields, layers: int) -> list[int | None]:
        return windows_from_types(f, layers)

    def bias_fields(self, f: Fields) -> None:
        f["attention_bias"]
        if f["use_bidirectional_attention"]:
            raise f.refuse("use_bidirectional_attention", "bidirectional attention is not a causal LM's")

    def embed_scale(self, f: Fields, model: torch.nn.Module) -> float:
        # Gemma2/3's ScaledWordEmbedding multiplies by its embed_scale buffer, cast to the weights' dtype: a
        # bf16 model's buffer holds the bf16-rounded sqrt(hidden) (59.75 for Gemma-2-9B's 3584, not 59.87),
        # and that is what it multiplies by.
        f["hidden_size"]
        return float(self.inner(model).embed_tokens.embed_scale.float())

    def scalars(self, f: Fields, model: torch.nn.Module) -> dict[str, Any]:
        out: dict[str, Any] = {"embed_scale": self.embed_scale(f, model)}
        for field, key in (("attn_logit_softcapping", "attn_softcap"), ("final_logit_softcapping", "final_softcap")):
            cap = f[field]
            if cap is not None:
                out[key] = f32(cap)
        return out


class Gemma3(Gemma2):
    name = "Gemma 3"
    model_types = ("gemma3_text",)
    # int4: q/k/v and gate/up at 6 bits in every layer, chosen on the real Gemma 3 270M (quality tool, 20 chunks
    # of Austen; benchmarks/HISTORY.md, issue 31 part 2). Its source file is Q4_K_M, whose q/k/v and gate/up are Q5_0:
    # re-rounding those to 4 bits cost most of the +13.3 % (qkv alone at 6 bits: +3.65 % calibrated, up alone
    # +3.26 %, down or o alone under +0.5 pp).
    sensitive = (("qkv", "all"), ("up", "all"), ("down", "ends"))
    plan_note = (
        "q/k/v and gate/up projections q6k in every layer, the first and last layers' down projections and the "
        "embedding q6k, the rest q4k (6.1 bits per weight on Gemma 3 270M, 63 % of whose weights are the "
        "embedding): measured on the real Gemma 3 270M (a Q4_K_M file, its q/k/v and gate/up stored as Q5_0): "
        "perplexity +1.45 % (SmolLM2's rule: +13.3 %), +1.27 % calibrated, +0.29 % with GPTQ; llama.cpp's "
        "Q4_K_M of the same values +0.56 % at 7.35 bits, Q4_0 +40 %"
    )

    def qk_norm(self, f: Fields) -> dict[str, Any] | None:
        return {"norm": norm("rms", f["rms_norm_eps"]), "scope": "head", "per_head_weights": False}

    def rope_tables(self, f: Fields, inner: torch.nn.Module, head_dim: int) -> tuple[list[dict], list[int]]:
        types = list(f["layer_types"])
        order = sorted(set(types))
        tables = [rope_table(f, inner.rotary_emb, t) for t in order]
        for t in tables:
            if 2 * len(t["inv_freq"]) != head_dim:
                raise ValueError("kwker: Gemma 3 with a partial rotary table is not supported")
        return tables, [order.index(t) for t in types]


FAMILIES = (Gemma2(), Gemma3())
