"""GGUF files of the families transformers reads from GGUF, written for tests: the inverse of transformers'
own GGUF reader (``modeling_gguf_pytorch_utils``: its tensor name map, its per-architecture tensor processors
and ``GGUF_CONFIG_MAPPING``), so that ``AutoModelForCausalLM.from_pretrained(folder, gguf_file=...)`` rebuilds
the model. The tokenizer is the real SmolLM2's (the model needs its 49152-token vocabulary). Real GGUF files
come from llama.cpp's converter; this writer exists so the tests need neither it nor a network.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

# transformers' GGUF architecture name of each model_type (the readable ones among KwkDecoder's families).
GGUF_ARCH = {
    "llama": "llama", "mistral": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "phi3": "phi3",
    "stablelm": "stablelm", "gpt2": "gpt2", "starcoder2": "starcoder2", "gemma2": "gemma2", "gemma3_text": "gemma3",
}  # fmt: skip


def _permute(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """llama.cpp's q/k order (transformers' LlamaTensorProcessor undoes it)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _value(v: Any) -> tuple[Any, Any]:
    import gguf

    if isinstance(v, bool):
        return v, gguf.GGUFValueType.BOOL
    if isinstance(v, int):
        return v, gguf.GGUFValueType.UINT32
    return float(v), gguf.GGUFValueType.FLOAT32


# (GGUF tensor name, float32 values in the file's layout) -> (raw bytes [rows, bytes per row], ggml type), or
# None to store the values as float32.
Quantizer = Callable[[str, np.ndarray], "tuple[np.ndarray, Any] | None"]


def write_gguf(model: torch.nn.Module, path: str, tokenizer: bool = True, quantize: Quantizer | None = None) -> str:
    """``model`` as a float32 GGUF at ``path`` that transformers loads back as the same model (with the real
    SmolLM2's tokenizer metadata when ``tokenizer``: 49152 tokens, which take seconds to write and read).
    ``quantize`` stores chosen tensors in a quantized ggml type instead (transformers then loads back their
    dequantized values)."""
    import gguf
    from transformers.integrations.ggml import GGUF_CONFIG_MAPPING
    from transformers.modeling_gguf_pytorch_utils import TensorProcessor, get_gguf_hf_weights_map

    from kwker_torch.testing import SMOLLM2_GGUF, smollm2_dir

    cfg = model.config
    # llama.cpp writes Mistral as the llama architecture.
    arch = "llama" if cfg.model_type == "mistral" else GGUF_ARCH[cfg.model_type]
    names = get_gguf_hf_weights_map(model, TensorProcessor(), model_type=arch)  # GGUF name -> HF name
    sd = model.state_dict()
    w = gguf.GGUFWriter(path, arch)
    # (transformers would read it back as Mistral if general.name were "mistral", then fail: gguf-py has no
    # mistral architecture; as llama.cpp's files of Mistral models, it reads back as Llama.)
    w.add_name(f"kwker test {cfg.model_type}")
    rope = dict(getattr(cfg, "rope_parameters", None) or {})
    rope = dict(rope.get("full_attention", rope))
    for key, field in GGUF_CONFIG_MAPPING[arch].items():
        value = rope.get("rope_theta") if field == "rope_theta" else getattr(cfg, field, None) if field else None
        if value is None:
            continue
        value, vtype = _value(value)
        w.add_key_value(f"{arch}.{key}", value, vtype)
    reader = gguf.GGUFReader(os.path.join(smollm2_dir(), SMOLLM2_GGUF))
    for key, f in reader.fields.items():
        if tokenizer and key.startswith("tokenizer."):
            vtype = f.types[0]
            sub = f.types[1] if vtype == gguf.GGUFValueType.ARRAY and len(f.types) > 1 else None
            w.add_key_value(key, f.contents(), vtype, sub)
    tied = cfg.tie_word_embeddings
    for gname, hname in sorted(names.items()):
        if hname not in sd or (tied and gname == "output.weight"):
            continue
        t = sd[hname].detach().float()
        if arch == "llama" and ".attn_q." in gname:
            t = _permute(t, cfg.num_attention_heads)
        elif arch == "llama" and ".attn_k." in gname:
            t = _permute(t, cfg.num_key_value_heads)
        elif arch in ("gemma2", "gemma3") and "norm.weight" in gname:
            t = t + 1  # llama.cpp stores Gemma's norms as 1 + w; transformers subtracts the 1
        elif arch == "gpt2" and any(n in gname for n in ("attn_qkv.weight", "ffn_down.weight", "ffn_up.weight",
                                                         "attn_output.weight")):  # fmt: skip
            t = t.t()
        values = np.ascontiguousarray(t.numpy())
        q = quantize(gname, values) if quantize is not None else None
        if q is None:
            w.add_tensor(gname, values)
        else:
            w.add_tensor(gname, np.ascontiguousarray(q[0]), raw_dtype=q[1])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
