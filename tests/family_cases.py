"""Tiny configs of every family KwkDecoder runs: each published shape (``kwker_torch.models.CONFIGS``) made
small, keeping what makes the family itself (its norms, head_dim larger than hidden / heads, partial rotary,
windows, soft-caps, scalars, fused or interleaved projections), plus variants for the optional parts
(q/k norms, parallel blocks, a window on some layers only, clipping, LongRoPE across its switch, post-norm,
a narrower embedding). Token ids are kept inside the small vocabulary.
"""

from __future__ import annotations

from typing import Any

import torch

from kwker_torch.models import random_model

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
}
# Drop the overrides a config class does not have (num_key_value_heads=None marks one).
for _name, (_base, _over) in CASES.items():
    for _k in [k for k, v in _over.items() if v is None]:
        del _over[_k]


def tiny(case: str, dtype: torch.dtype = torch.float32, layers: int = 2, seed: int = 0) -> torch.nn.Module:
    """The case's random model with ``layers`` layers, in ``dtype`` (bf16 weights as a bf16 checkpoint has)."""
    base, over = CASES[case]
    return random_model(base, dtype, num_hidden_layers=layers, seed=seed, **over)
