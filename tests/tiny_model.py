"""A tiny random Llama saved as a Hugging Face folder (2 layers, hidden 128, a byte-level BPE tokenizer with
a ChatML template): a real ``--model`` for server processes that must start in a second."""

from __future__ import annotations


def tiny_model(folder: str) -> str:
    """A 2-layer random Llama (hidden 128) with a byte-level BPE tokenizer and a ChatML template, saved as a
    Hugging Face folder."""
    from tokenizers import Tokenizer, decoders, pre_tokenizers
    from tokenizers import models as tokenizer_models
    from transformers import PreTrainedTokenizerFast

    from kwker_torch.testing import random_model

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    vocab = {c: i for i, c in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    vocab.update({t: 256 + i for i, t in enumerate(specials)})
    bpe = Tokenizer(tokenizer_models.BPE(vocab=vocab, merges=[]))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.add_special_tokens(specials)
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    tok.chat_template = (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    model = random_model(
        "SmolLM2-360M", num_hidden_layers=2, hidden_size=128, intermediate_size=256, num_attention_heads=2,
        num_key_value_heads=1, head_dim=64, vocab_size=len(vocab), bos_token_id=None,
        eos_token_id=vocab["<|im_end|>"],
    )  # fmt: skip
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder
