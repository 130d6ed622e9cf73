"""Random-initialised models of published configs, for tests and benchmarks (no product module imports
this package; local and real models load through ``kwker_torch.hf``).

- ``random_model(name)``: a random-initialised model with the exact shapes of a published config (every
  family KwkDecoder runs: SmolLM2, Qwen2.5, Qwen3, Llama 3.2, Mistral, Gemma 2 / 3, Phi-2 / 3 / 4-mini, Granite,
  StableLM, StarCoder2, OLMo / OLMo2, Pythia, GPT-2, OPT; the mixtures Granite 3.1 1B-A400M, Qwen3-30B-A3B,
  Mixtral 8x7B, OLMoE 1B-7B; and, outside the recipe, BLOOM-560m, CodeGen-350M-mono, GPT-J-6B), optionally with fewer
  layers.
"""

from __future__ import annotations

from typing import Any

import torch

# microsoft/Phi-4-mini-instruct's LongRoPE long_factor (48 values: 96 of each head's 128 values rotate).
PHI4_MINI_LONG_FACTOR = [
    1.0, 1.118320672, 1.250641126, 1.398617824, 1.564103225, 1.74916897, 1.956131817, 2.187582649, 2.446418898,
    2.735880826, 3.059592084, 3.421605075, 3.826451687, 4.279200023, 4.785517845, 5.351743533, 5.984965424,
    6.693110555, 7.485043894, 8.370679318, 9.36110372, 10.4687158, 11.70738129, 13.09260651, 14.64173252,
    16.37415215, 18.31155283, 20.47818807, 22.90118105, 25.61086418, 28.64115884, 32.03, 32.1, 32.13, 32.23, 32.6,
    32.61, 32.64, 32.66, 32.7, 32.71, 32.93, 32.97, 33.28, 33.49, 33.5, 44.16, 47.77,
]

# Fields that checkpoints of one line share; each config below adds what differs (its own values win).
_SMOLLM2 = dict(
    model_type="llama", head_dim=64, vocab_size=49152, max_position_embeddings=8192, rms_norm_eps=1e-5,
    tie_word_embeddings=True, bos_token_id=1, eos_token_id=2,
)
_GEMMA3 = dict(
    model_type="gemma3_text", num_attention_heads=4, num_key_value_heads=1, head_dim=256, vocab_size=262144,
    max_position_embeddings=32768, rope_theta=1000000.0, rope_local_base_freq=10000.0, rms_norm_eps=1e-6,
    query_pre_attn_scalar=256, sliding_window=512, hidden_activation="gelu_pytorch_tanh", tie_word_embeddings=True,
    bos_token_id=2, eos_token_id=[1, 106], pad_token_id=0,
)
_FALCON = dict(
    model_type="falcon", max_position_embeddings=2048, layer_norm_epsilon=1e-5, activation="gelu",
    tie_word_embeddings=True,
)
# tiiuae/falcon-7b and falcon-40b: multi-query parallel blocks, no biases, their tokenizer.
_FALCON_PARALLEL = dict(
    _FALCON, vocab_size=65024, multi_query=True, parallel_attn=True, alibi=False, bias=False, bos_token_id=11,
    eos_token_id=11,
)
_OPT = dict(
    model_type="opt", vocab_size=50272, max_position_embeddings=2048, activation_function="relu", bos_token_id=2,
    eos_token_id=2, pad_token_id=1,
)

# Exact published shapes (config.json of each model on the Hugging Face hub).
CONFIGS: dict[str, dict[str, Any]] = {
    "SmolLM2-360M": dict(
        _SMOLLM2, hidden_size=960, intermediate_size=2560, num_hidden_layers=32, num_attention_heads=15,
        num_key_value_heads=5, rope_theta=100000.0,
    ),
    "SmolLM2-1.7B": dict(
        _SMOLLM2, hidden_size=2048, intermediate_size=8192, num_hidden_layers=24, num_attention_heads=32,
        num_key_value_heads=32, rope_theta=130000.0,
    ),
    "Qwen2.5-0.5B": dict(
        model_type="qwen2", hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
        num_key_value_heads=2, vocab_size=151936, max_position_embeddings=32768, rope_theta=1000000.0,
        rms_norm_eps=1e-6, tie_word_embeddings=True, use_sliding_window=False, bos_token_id=151643,
        eos_token_id=151643,
    ),
    "Llama-3.2-1B": dict(
        model_type="llama", hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
        num_key_value_heads=8, head_dim=64, vocab_size=128256, max_position_embeddings=131072, rope_theta=500000.0,
        rope_scaling=dict(
            rope_type="llama3", factor=32.0, high_freq_factor=4.0, low_freq_factor=1.0,
            original_max_position_embeddings=8192,
        ),  # fmt: skip
        rms_norm_eps=1e-5, tie_word_embeddings=True, bos_token_id=128000, eos_token_id=128001,
    ),
    "Mistral-7B-v0.1": dict(
        model_type="mistral", hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
        num_key_value_heads=8, vocab_size=32000, max_position_embeddings=32768, rope_theta=10000.0,
        rms_norm_eps=1e-5, sliding_window=4096, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2,
    ),
    "Qwen3-0.6B": dict(
        model_type="qwen3", hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
        num_key_value_heads=8, head_dim=128, vocab_size=151936, max_position_embeddings=40960, rope_theta=1000000.0,
        rms_norm_eps=1e-6, tie_word_embeddings=True, attention_bias=False, use_sliding_window=False,
        max_window_layers=28, bos_token_id=151643, eos_token_id=151645,
    ),
    "Gemma-3-1B": dict(_GEMMA3, hidden_size=1152, intermediate_size=6912, num_hidden_layers=26),
    "Gemma-3-270M": dict(_GEMMA3, hidden_size=640, intermediate_size=2048, num_hidden_layers=18),
    "Gemma-2-2B": dict(
        model_type="gemma2", hidden_size=2304, intermediate_size=9216, num_hidden_layers=26, num_attention_heads=8,
        num_key_value_heads=4, head_dim=256, vocab_size=256000, max_position_embeddings=8192, rope_theta=10000.0,
        rms_norm_eps=1e-6, query_pre_attn_scalar=256, sliding_window=4096, attn_logit_softcapping=50.0,
        final_logit_softcapping=30.0, hidden_activation="gelu_pytorch_tanh", tie_word_embeddings=True,
        bos_token_id=2, eos_token_id=1, pad_token_id=0,
    ),
    "Phi-4-mini": dict(
        model_type="phi3", hidden_size=3072, intermediate_size=8192, num_hidden_layers=32, num_attention_heads=24,
        num_key_value_heads=8, vocab_size=200064, max_position_embeddings=131072,
        original_max_position_embeddings=4096, partial_rotary_factor=0.75, rope_theta=10000.0,
        rope_scaling=dict(type="longrope", short_factor=[1.0] * 48, long_factor=PHI4_MINI_LONG_FACTOR),
        rms_norm_eps=1e-5, sliding_window=262144, tie_word_embeddings=True, hidden_act="silu",
        bos_token_id=199999, eos_token_id=199999, pad_token_id=199999,
    ),
    "Phi-3-mini-4k": dict(
        model_type="phi3", hidden_size=3072, intermediate_size=8192, num_hidden_layers=32, num_attention_heads=32,
        num_key_value_heads=32, vocab_size=32064, max_position_embeddings=4096, original_max_position_embeddings=4096,
        rope_theta=10000.0, rms_norm_eps=1e-5, sliding_window=2047, tie_word_embeddings=False, hidden_act="silu",
        bos_token_id=1, eos_token_id=32000, pad_token_id=32000,
    ),
    "Granite-3.1-2B": dict(
        model_type="granite", hidden_size=2048, intermediate_size=8192, num_hidden_layers=40, num_attention_heads=32,
        num_key_value_heads=8, vocab_size=49155, max_position_embeddings=131072, rope_theta=5000000.0,
        rms_norm_eps=1e-5, embedding_multiplier=12.0, residual_multiplier=0.22, attention_multiplier=0.015625,
        logits_scaling=8.0, tie_word_embeddings=True, attention_bias=False, mlp_bias=False, bos_token_id=0,
        eos_token_id=0, pad_token_id=0,
    ),
    "StableLM-2-1.6B": dict(
        model_type="stablelm", hidden_size=2048, intermediate_size=5632, num_hidden_layers=24, num_attention_heads=32,
        num_key_value_heads=32, vocab_size=100352, max_position_embeddings=4096, rope_theta=10000.0,
        partial_rotary_factor=0.25, layer_norm_eps=1e-5, use_qkv_bias=True, qk_layernorm=False,
        use_parallel_residual=False, tie_word_embeddings=False, bos_token_id=100257, eos_token_id=100257,
    ),
    "StarCoder2-3B": dict(
        model_type="starcoder2", hidden_size=3072, intermediate_size=12288, num_hidden_layers=30,
        num_attention_heads=24, num_key_value_heads=2, vocab_size=49152, max_position_embeddings=16384,
        rope_theta=999999.4420358813, norm_epsilon=1e-5, sliding_window=4096, use_bias=True,
        hidden_act="gelu_pytorch_tanh", tie_word_embeddings=True, bos_token_id=0, eos_token_id=0,
    ),
    "OLMo-1B": dict(
        model_type="olmo", hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=16,
        num_key_value_heads=16, vocab_size=50304, max_position_embeddings=2048, rope_theta=10000.0, clip_qkv=None,
        tie_word_embeddings=True, pad_token_id=1, eos_token_id=50279,
    ),
    "OLMo-2-1B": dict(
        model_type="olmo2", hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=16,
        num_key_value_heads=16, vocab_size=100352, max_position_embeddings=4096, rope_theta=500000.0,
        rms_norm_eps=1e-6, tie_word_embeddings=False, pad_token_id=100277, eos_token_id=100257,
    ),
    "Pythia-160M": dict(
        model_type="gpt_neox", hidden_size=768, intermediate_size=3072, num_hidden_layers=12, num_attention_heads=12,
        vocab_size=50304, max_position_embeddings=2048, rotary_pct=0.25, rotary_emb_base=10000,
        layer_norm_eps=1e-5, use_parallel_residual=True, tie_word_embeddings=False, hidden_act="gelu",
        bos_token_id=0, eos_token_id=0,
    ),
    # tiiuae/falcon-7b: multi-query attention, one shared LayerNorm per parallel block, no biases.
    "Falcon-7B": dict(
        _FALCON_PARALLEL, hidden_size=4544, num_hidden_layers=32, num_attention_heads=71, num_kv_heads=71,
        new_decoder_architecture=False, ffn_hidden_size=18176,
    ),
    # tiiuae/falcon-40b's block (new_decoder_architecture: 8 k/v groups, ln_attn and ln_mlp), its width.
    "Falcon-40B": dict(
        _FALCON_PARALLEL, hidden_size=8192, num_hidden_layers=60, num_attention_heads=128, num_kv_heads=8,
        new_decoder_architecture=True, ffn_hidden_size=32768,
    ),
    # tiiuae/falcon-rw-1b: sequential blocks, one k/v head per query head, biases; its ALiBi is not in the recipe
    # (the compile backend's path runs it), so the family's tests use its shape with rotary positions.
    "Falcon-RW-1B": dict(
        _FALCON, hidden_size=2048, num_hidden_layers=24, num_attention_heads=32, num_kv_heads=32, vocab_size=50304,
        multi_query=False, parallel_attn=False, new_decoder_architecture=False, alibi=True, bias=True,
        ffn_hidden_size=8192, bos_token_id=1, eos_token_id=2,
    ),
    "Phi-2": dict(
        model_type="phi", hidden_size=2560, intermediate_size=10240, num_hidden_layers=32, num_attention_heads=32,
        num_key_value_heads=32, vocab_size=51200, max_position_embeddings=2048, partial_rotary_factor=0.4,
        rope_theta=10000.0, layer_norm_eps=1e-5, hidden_act="gelu_new", qk_layernorm=False,
        tie_word_embeddings=False, bos_token_id=50256, eos_token_id=50256,
    ),
    "OPT-125m": dict(
        _OPT, hidden_size=768, ffn_dim=3072, num_hidden_layers=12, num_attention_heads=12, word_embed_proj_dim=768,
        do_layer_norm_before=True,
    ),
    # Mixtures of experts.
    "Granite-3.1-1B-A400M": dict(
        model_type="granitemoe", hidden_size=1024, intermediate_size=512, num_hidden_layers=24, num_attention_heads=16,
        num_key_value_heads=8, num_local_experts=32, num_experts_per_tok=8, vocab_size=49155,
        max_position_embeddings=131072, rope_theta=1500000.0, rms_norm_eps=1e-6, embedding_multiplier=12.0,
        residual_multiplier=0.22, attention_multiplier=0.015625, logits_scaling=6.0, tie_word_embeddings=True,
        attention_bias=False, bos_token_id=0, eos_token_id=0, pad_token_id=0,
    ),
    "Qwen3-30B-A3B": dict(
        model_type="qwen3_moe", hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768,
        num_hidden_layers=48, num_attention_heads=32, num_key_value_heads=4, head_dim=128, num_experts=128,
        num_experts_per_tok=8, norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[], vocab_size=151936,
        max_position_embeddings=40960, rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=False,
        attention_bias=False, use_sliding_window=False, bos_token_id=151643, eos_token_id=151645,
    ),
    "Mixtral-8x7B": dict(
        model_type="mixtral", hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
        num_key_value_heads=8, num_local_experts=8, num_experts_per_tok=2, vocab_size=32000,
        max_position_embeddings=32768, rope_theta=1000000.0, rms_norm_eps=1e-5, sliding_window=None,
        tie_word_embeddings=False, bos_token_id=1, eos_token_id=2,
    ),
    "OLMoE-1B-7B": dict(
        model_type="olmoe", hidden_size=2048, intermediate_size=1024, num_hidden_layers=16, num_attention_heads=16,
        num_key_value_heads=16, num_experts=64, num_experts_per_tok=8, norm_topk_prob=False, clip_qkv=None,
        vocab_size=50304, max_position_embeddings=4096, rope_theta=10000.0, rms_norm_eps=1e-5,
        tie_word_embeddings=False, bos_token_id=None, eos_token_id=50279, pad_token_id=1,
    ),
    # Outside the recipe (the compile backend's path, decoder/compiled.py).
    "BLOOM-560m": dict(
        model_type="bloom", hidden_size=1024, n_layer=24, n_head=16, vocab_size=250880, layer_norm_epsilon=1e-5,
        apply_residual_connection_post_layernorm=False, bos_token_id=1, eos_token_id=2, pad_token_id=3,
    ),
    "CodeGen-350M-mono": dict(
        model_type="codegen", n_embd=1024, n_layer=20, n_head=16, rotary_dim=32, n_positions=2048, n_ctx=2048,
        vocab_size=51200, activation_function="gelu_new", layer_norm_epsilon=1e-5, tie_word_embeddings=False,
        bos_token_id=1, eos_token_id=50256,
    ),
    "GPT-J-6B": dict(
        model_type="gptj", n_embd=4096, n_layer=28, n_head=16, rotary_dim=64, n_positions=2048, vocab_size=50400,
        activation_function="gelu_new", layer_norm_epsilon=1e-5, tie_word_embeddings=False, bos_token_id=50256,
        eos_token_id=50256,
    ),
    "OPT-350m": dict(
        _OPT, hidden_size=1024, ffn_dim=4096, num_hidden_layers=24, num_attention_heads=16, word_embed_proj_dim=512,
        do_layer_norm_before=False,
    ),
    "GPT-2": dict(
        model_type="gpt2", n_embd=768, n_layer=12, n_head=12, n_positions=1024, vocab_size=50257, bos_token_id=50256,
        eos_token_id=50256,
    ),
}


def make_config(name: str, num_hidden_layers: int | None = None, **overrides: Any) -> Any:
    """The transformers config of ``name`` (a key of CONFIGS), optionally with fewer layers or other
    fields overridden."""
    from transformers import AutoConfig

    if name not in CONFIGS:
        raise KeyError(f"kwker: unknown config {name!r}; known: {sorted(CONFIGS)}")
    kw = dict(CONFIGS[name], **overrides)
    model_type = kw.pop("model_type")
    if num_hidden_layers is not None:
        kw["n_layer" if model_type in ("gpt2", "bloom", "codegen", "gptj") else "num_hidden_layers"] = num_hidden_layers
    return AutoConfig.for_model(model_type, **kw)


def random_model(
    name: str, dtype: torch.dtype = torch.bfloat16, num_hidden_layers: int | None = None, seed: int = 0,
    **overrides: Any,
) -> Any:
    """A random-initialised causal LM with the exact shapes of ``name`` (config fields can be overridden),
    in eval mode."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(make_config(name, num_hidden_layers, **overrides), dtype=dtype)
    return model.eval()


