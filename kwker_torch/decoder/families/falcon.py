"""Falcon (``falcon``): ``transformer.{word_embeddings, h, ln_f, rotary_emb}``, LayerNorms with bias, rotary,
a plain GELU MLP (``dense_h_to_4h`` / ``dense_4h_to_h``), biases when ``bias``, the embedding tied to the head.

Blocks, as ``FalconDecoderLayer.forward`` sums them:
- ``parallel_attn`` (falcon-7b/40b's shape): one shared ``input_layernorm`` feeds attention and MLP, summed
  ``(mlp + attn) + x``;
- ``new_decoder_architecture`` (falcon-40b/180b, Falcon 2): ``ln_attn`` and ``ln_mlp`` (``num_ln_in_parallel_attn``
  = 2, its default there), or one shared norm (= 1), summed as above;
- neither: sequential pre-norm (``input_layernorm``, ``post_attention_layernorm``).

Heads: ``multi_query`` keeps one k/v head, ``new_decoder_architecture`` ``num_kv_heads`` groups, otherwise one
per query head. ``query_key_value`` is fused three ways, reordered here into [q; k; v]:
- new architecture: per k/v group, its ``heads / kv`` query heads, then its k head, then its v head;
- multi-query: all query heads, then the k head, then the v head (already [q; k; v]);
- otherwise: per head, its q, k and v (``[heads, 3, head_dim]``, as GPT-NeoX).
ALiBi (falcon-rw) is refused by name: it runs on the compile backend's path.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from .base import norm
from .fields import Fields
from .llama import LlamaStyle


class Falcon(LlamaStyle):
    name = "Falcon"
    model_types = ("falcon",)
    FINAL_NORM = "ln_f"
    INNER, EMBED, LAYERS, ATTN, OUT_PROJ = "transformer", "word_embeddings", "h", "self_attention", "dense"
    UPS, DOWN = ("dense_h_to_4h",), "dense_4h_to_h"
    gated = False
    act_field = "activation"

    def inert(self) -> frozenset[str]:
        # Dropouts (inference), the initialiser's range, and the cache switch do not change a forward.
        return frozenset({"hidden_dropout", "attention_dropout", "initializer_range", "use_cache"})

    def norm(self, f: Fields) -> dict[str, Any]:
        return norm("layer", f["layer_norm_epsilon"], weight=True, bias=True)

    def intermediate(self, f: Fields) -> int:
        return int(f["ffn_hidden_size"])

    def bias_fields(self, f: Fields) -> None:
        f["bias"]

    def _shape(self, f: Fields) -> tuple[bool, bool, int | None]:
        """(new_decoder_architecture, parallel_attn, num_ln_in_parallel_attn), refusing what HF cannot run."""
        if f["alibi"]:
            raise f.refuse("alibi", "ALiBi positions are not in the recipe; torch.compile(model, backend='kwker') "
                                    "runs this model")  # fmt: skip
        new, parallel, lns = bool(f["new_decoder_architecture"]), bool(f["parallel_attn"]), f["num_ln_in_parallel_attn"]
        f["multi_query"]
        if new and not parallel:
            raise f.refuse("parallel_attn", "new_decoder_architecture without parallel_attn has no block Falcon's "
                                            "own forward runs")  # fmt: skip
        if not new and parallel and lns == 2:
            raise f.refuse("num_ln_in_parallel_attn", "two parallel norms without new_decoder_architecture are "
                                                      "built but not used by Falcon's own forward")  # fmt: skip
        return new, parallel, lns

    def block(self, f: Fields) -> Any:
        new, parallel, lns = self._shape(f)
        if not parallel:
            return "sequential"
        return {"parallel": {"shared_norm": not (new and lns == 2), "residual_last": True}}

    def heads(self, f: Fields, attn: torch.nn.Module) -> tuple[int, int, int]:
        new, _, _ = self._shape(f)
        heads, kv_field = int(f["num_attention_heads"]), f["num_kv_heads"]  # (read either way: see the module)
        kv = int(kv_field) if new else 1 if f["multi_query"] else heads
        head_dim = int(f["hidden_size"]) // heads
        if int(attn.head_dim) != head_dim or int(attn.num_kv_heads) not in (kv, heads):
            raise ValueError(f"kwker: Falcon: the attention module's heads differ from its config's "
                             f"(head_dim {attn.head_dim}, kv heads {attn.num_kv_heads})")  # fmt: skip
        return heads, kv, head_dim

    def norm_modules(self, layer: torch.nn.Module) -> Iterator[tuple[str, str]]:
        if hasattr(layer, "ln_attn"):
            yield from (("attn_norm", "ln_attn"), ("mlp_norm", "ln_mlp"))
        else:
            yield from (("attn_norm", "input_layernorm"), ("mlp_norm", "post_attention_layernorm"))

    def qkv(self, a: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor | None, torch.nn.Module]:
        p = a.query_key_value
        heads, d = a.num_heads, a.head_dim

        def order(t: torch.Tensor) -> torch.Tensor:
            """Rows [..., hidden?] of the fused projection in [q; k; v] order."""
            rest = t.shape[1:]
            if a.new_decoder_architecture:
                kv = a.num_kv_heads
                g = t.reshape(kv, heads // kv + 2, d, *rest)
                q, k, v = g[:, :-2], g[:, -2], g[:, -1]
                return torch.cat([q.reshape(-1, *rest), k.reshape(-1, *rest), v.reshape(-1, *rest)])
            if a.multi_query:
                return t
            g = t.reshape(heads, 3, d, *rest)
            return torch.cat([g[:, j].reshape(-1, *rest) for j in range(3)])

        weight = order(p.weight.detach())
        bias = order(p.bias.detach().float()) if p.bias is not None else None
        return weight.contiguous(), bias, p


FAMILIES = (Falcon(),)
