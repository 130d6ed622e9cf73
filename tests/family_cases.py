"""Tiny configs of every family KwkDecoder runs: each published shape (``kwker_torch.testing.models.CONFIGS``) made
small, keeping what makes the family itself (its norms, head_dim larger than hidden / heads, partial rotary,
windows, soft-caps, scalars, fused or interleaved projections), plus variants for the optional parts
(q/k norms, parallel blocks, a window on some layers only, clipping, LongRoPE across its switch, post-norm,
a narrower embedding). Token ids are kept inside the small vocabulary.
"""

from __future__ import annotations

from typing import Any

import torch

from kwker_torch.testing import random_model

VOCAB = 2048
IDS = {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0}
SMALL = {"hidden_size": 256, "intermediate_size": 512, "num_attention_heads": 4, "num_key_value_heads": 2,
         "vocab_size": VOCAB, **IDS}  # fmt: skip

# case -> (published config, overrides)
CASES: dict[str, tuple[str, dict[str, Any]]] = {
    "llama": ("SmolLM2-360M", dict(SMALL, head_dim=64)),
    "llama3-rope": ("Llama-3.2-1B", dict(SMALL, head_dim=64)),
    "mistral-window": ("Mistral-7B-v0.1", dict(SMALL, sliding_window=7)),
    "qwen2": ("Qwen2.5-0.5B", dict(SMALL)),
    "qwen2-window-layers": ("Qwen2.5-0.5B", dict(SMALL, use_sliding_window=True, sliding_window=5,
                                                  max_window_layers=1)),
    "qwen3": ("Qwen3-0.6B", dict(SMALL, head_dim=128)),  # q is 512 wide for a hidden of 256
    "gemma2": ("Gemma-2-2B", dict(SMALL, head_dim=64, sliding_window=5)),
    # hidden 320: sqrt(320) = 17.889 is 17.875 in a bf16 model's embedding-scale buffer, which HF multiplies by.
    "gemma2-tight-caps": ("Gemma-2-2B", dict(SMALL, hidden_size=320, head_dim=64, sliding_window=5,
                                             attn_logit_softcapping=0.5, final_logit_softcapping=2.0)),
    "gemma3": ("Gemma-3-1B", dict(SMALL, head_dim=128, num_key_value_heads=1, sliding_window=5,
                                  layer_types=["sliding_attention", "full_attention"])),
    "gemma3-270m": ("Gemma-3-270M", dict(SMALL, head_dim=64, num_key_value_heads=1, sliding_window=5,
                                         layer_types=["full_attention", "sliding_attention"])),
    "phi4-mini-longrope": ("Phi-4-mini", dict(
        SMALL, max_position_embeddings=64, original_max_position_embeddings=16, sliding_window=262144,
        rope_scaling=dict(type="longrope", short_factor=[1.0 + 0.01 * i for i in range(24)],
                          long_factor=[1.0 + 1.5 * i for i in range(24)]),
    )),  # fmt: skip
    "phi3-window": ("Phi-3-mini-4k", dict(SMALL, num_key_value_heads=4, sliding_window=6)),
    "granite": ("Granite-3.1-2B", dict(SMALL)),
    "stablelm": ("StableLM-2-1.6B", dict(SMALL, num_key_value_heads=4)),
    "stablelm-parallel-qknorm": ("StableLM-2-1.6B", dict(SMALL, num_key_value_heads=2, use_parallel_residual=True,
                                                         qk_layernorm=True, use_qkv_bias=False)),
    "starcoder2": ("StarCoder2-3B", dict(SMALL, sliding_window=6)),
    "olmo": ("OLMo-1B", dict(SMALL, num_key_value_heads=4)),
    "olmo-clip": ("OLMo-1B", dict(SMALL, num_key_value_heads=4, clip_qkv=0.05)),
    "olmo2": ("OLMo-2-1B", dict(SMALL, num_key_value_heads=4)),
    "pythia": ("Pythia-160M", dict(SMALL, num_key_value_heads=None)),
    "neox-sequential": ("Pythia-160M", dict(SMALL, num_key_value_heads=None, use_parallel_residual=False)),
    "phi2": ("Phi-2", dict(SMALL, hidden_size=320, num_key_value_heads=4)),  # head_dim 80, 32 rotated
    "phi2-qk-layernorm": ("Phi-2", dict(SMALL, hidden_size=320, num_key_value_heads=4, qk_layernorm=True)),
    "gpt2": ("GPT-2", dict(n_embd=256, n_head=4, vocab_size=VOCAB, bos_token_id=1, eos_token_id=2)),
    "gpt2-layer-scale": ("GPT-2", dict(n_embd=256, n_head=4, vocab_size=VOCAB, bos_token_id=1, eos_token_id=2,
                                       scale_attn_by_inverse_layer_idx=True)),
    "opt": ("OPT-125m", dict(hidden_size=256, ffn_dim=512, num_attention_heads=4, vocab_size=VOCAB,
                             word_embed_proj_dim=256, **IDS)),
    "opt-350m-post-norm": ("OPT-350m", dict(hidden_size=256, ffn_dim=512, num_attention_heads=4, vocab_size=VOCAB,
                                            word_embed_proj_dim=128, **IDS)),
    # Falcon: the 7B's multi-query parallel block with one norm; the 40B's new architecture (k/v groups, two
    # norms, and one); falcon-rw's sequential per-head q/k/v with biases (with rotary: its ALiBi is refused).
    "falcon-7b": ("Falcon-7B", dict(hidden_size=256, num_attention_heads=4, num_kv_heads=4, ffn_hidden_size=512,
                                    vocab_size=VOCAB, **IDS)),
    "falcon-40b-new-arch": ("Falcon-40B", dict(hidden_size=256, num_attention_heads=8, num_kv_heads=2,
                                               ffn_hidden_size=512, vocab_size=VOCAB, **IDS)),
    "falcon-new-arch-one-norm": ("Falcon-40B", dict(hidden_size=256, num_attention_heads=8, num_kv_heads=4,
                                                    num_ln_in_parallel_attn=1, ffn_hidden_size=512, bias=True,
                                                    vocab_size=VOCAB, **IDS)),
    "falcon-rw-rotary": ("Falcon-RW-1B", dict(hidden_size=256, num_attention_heads=4, num_kv_heads=4, alibi=False,
                                              ffn_hidden_size=512, vocab_size=VOCAB, **IDS)),
    # Mixtures of experts (their routers made decisive: see ``tiny``).
    "mixtral": ("Mixtral-8x7B", dict(SMALL, intermediate_size=128, num_local_experts=8, num_experts_per_tok=2)),
    "mixtral-window": ("Mixtral-8x7B", dict(SMALL, intermediate_size=64, num_local_experts=4, num_experts_per_tok=2,
                                            sliding_window=7)),
    # Layer 1 of 3 dense (mlp_only_layers), the others sparse; head_dim 128 for a hidden of 256.
    "qwen3-moe": ("Qwen3-30B-A3B", dict(SMALL, moe_intermediate_size=64, head_dim=128, num_experts=16,
                                        num_experts_per_tok=4, mlp_only_layers=[1])),
    "qwen3-moe-step2-unnormed": ("Qwen3-30B-A3B", dict(SMALL, moe_intermediate_size=64, head_dim=64, num_experts=8,
                                                       num_experts_per_tok=3, decoder_sparse_step=2,
                                                       norm_topk_prob=False)),
    "granite-moe": ("Granite-3.1-1B-A400M", dict(SMALL, intermediate_size=64, num_local_experts=8,
                                                 num_experts_per_tok=3)),
    "olmoe": ("OLMoE-1B-7B", dict(SMALL, intermediate_size=64, num_key_value_heads=4, num_experts=16,
                                  num_experts_per_tok=4)),
    "olmoe-clip-normed": ("OLMoE-1B-7B", dict(SMALL, intermediate_size=64, num_key_value_heads=4, num_experts=8,
                                              num_experts_per_tok=2, clip_qkv=1.5, norm_topk_prob=True)),
}
# Cases with three layers (a dense layer between sparse ones).
LAYERS = {"qwen3-moe": 3, "qwen3-moe-step2-unnormed": 4}
# A random router can near-tie in its top k, where the ~1e-6 by which summation order moves a router logit
# could pick another expert. Scaling a router does not move its ties (the order margin relative to the largest
# logit is scale-free), but it makes the softmax weights decisive, as trained routers are; the tie margin is
# checked instead (tests/test_moe.py: the k-th and (k+1)-th logits of every routed row of the exactness runs
# at least 1e-4 of the row's largest apart), and a case whose random draw near-ties takes another seed (SEEDS).
ROUTER_SCALE = 20.0
# Mixtral's seed-0 draw has a row whose 2nd and 3rd router logits are 4.8e-6 of its largest apart.
SEEDS = {"mixtral": 1}
# Drop the overrides a config class does not have (num_key_value_heads=None marks one).
for _name, (_base, _over) in CASES.items():
    for _k in [k for k, v in _over.items() if v is None]:
        del _over[_k]


def routers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The router modules of a mixture's sparse layers (none for a dense model)."""
    return [m for name, m in model.named_modules() if name.endswith((".mlp.gate", ".block_sparse_moe.router"))]


def tiny(case: str, dtype: torch.dtype = torch.float32, layers: int | None = None, seed: int | None = None
         ) -> torch.nn.Module:  # fmt: skip
    """The case's random model with ``layers`` layers (2, or the case's ``LAYERS``), in ``dtype`` (bf16 weights
    as a bf16 checkpoint has), from ``seed`` (0, or the case's ``SEEDS``); a mixture's routers scaled by
    ``ROUTER_SCALE``."""
    base, over = CASES[case]
    seed = SEEDS.get(case, 0) if seed is None else seed
    model = random_model(base, dtype, num_hidden_layers=layers or LAYERS.get(case, 2), seed=seed, **over)
    decisive(model)
    return model


def decisive(model: torch.nn.Module) -> None:
    with torch.no_grad():
        for r in routers(model):
            r.weight.mul_(ROUTER_SCALE)
