"""``KwkDecoder``: a whole Hugging Face Llama-family model (Llama incl. Llama-3 rope scaling, SmolLM2,
Qwen2/Qwen2.5, Mistral) run natively, one call into Rust per step, over a ragged batch of sequence slots.

    dec = KwkDecoder.from_hf(model, max_batch=4, max_context=2048)
    out = dec.generate(prompt_ids, max_new_tokens=64)            # native loop: greedy or sampling
    logits = dec.step([(0, prompt_a), (1, [tok_b])])             # prompt chunk and decode token, one pass
    dec.truncate(0, 10); dec.copy_prefix(0, 1, 10); dec.reset()  # slot verbs for speculation / prompt cache

Weights are copied into the decoder once (``precision="preserve"``: the checkpoint's own numbers; float32
matrices whose values are all exactly bf16 are stored as bf16, the same numbers in half the bytes). Every
activation, sum and the KV cache are float32, so logits equal the model's float32 forward up to summation
order (tests: <= 1e-5 of the largest logit; measured ~1e-6) and greedy tokens equal HF float32's.
``precision="int8"`` / ``"int4"`` store matrices as 8-/4-bit codes instead (``kwker_torch.quantize``); their
cost in quality is measured with ``python -m kwker_torch.quality``.

Threads: a decoder is safe to call from several Python threads; each decoder has a lock, so calls on one
decoder run one after another (use one decoder per thread to run them in parallel). The GIL is released
while Rust runs. The streaming callback of ``generate`` must not call back into the same decoder.
"""

from __future__ import annotations

import ctypes
import logging
import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from . import _native, quantize
from .quantize import BITS

log = logging.getLogger("kwker_torch")

PRECISIONS = ("preserve", "balanced", "int8", "int4")
ARCHITECTURES = {"llama": "Llama/SmolLM2", "qwen2": "Qwen2/Qwen2.5", "mistral": "Mistral"}
LOGITS = {"none": 0, "last": 1, "all": 2}
FINISH = {0: "stop", 1: "length", 2: "callback"}
ERR_LEN = 2048
# Rows (tokens) per pass over the weights: prompts longer than this are read in chunks.
CHUNK_ROWS = 512

# Tensor kinds (rust/src/decoder/builder.rs, Kind).
EMBED, LM_HEAD, FINAL_NORM, ATTN_NORM, WQKV, BQKV, WO, BO, FFN_NORM, WGATEUP, BGATEUP, WDOWN, BDOWN = range(13)


class _DecoderConfig(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_int64)
        for name in (
            "vocab", "hidden", "layers", "heads", "kv_heads", "head_dim", "intermediate", "sliding_window",
            "tied_embeddings", "slots", "max_context", "chunk_rows",
        )
    ] + [("rms_eps", ctypes.c_double), ("attn_scale", ctypes.c_double), ("rope_scale", ctypes.c_double),
         ("inv_freq", ctypes.POINTER(ctypes.c_float))]  # fmt: skip


class _GenParams(ctypes.Structure):
    _fields_ = [
        ("max_new", ctypes.c_int64), ("temperature", ctypes.c_double), ("top_k", ctypes.c_int64),
        ("top_p", ctypes.c_double), ("seed", ctypes.c_uint64), ("max_draft", ctypes.c_int64),
    ]  # fmt: skip


_CALLBACK = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p)


def _setup_ctypes() -> None:
    lib = _native.LIB
    P, I64, I32, SZ = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int32, ctypes.c_size_t
    i64p, i32p, f32p, buf = (ctypes.POINTER(ctypes.c_int64), ctypes.POINTER(ctypes.c_int32),
                             ctypes.POINTER(ctypes.c_float), ctypes.c_char_p)  # fmt: skip
    sigs: dict[str, tuple[Any, list[Any]]] = {
        "kwker_decoder_builder": (P, [ctypes.POINTER(_DecoderConfig), buf, SZ]),
        "kwker_decoder_set": (I32, [P, I32, I64, I32, P, I64, I64, buf, SZ]),
        "kwker_decoder_set_quant": (I32, [P, I32, I64, I32, P, I64, I64, I32, P, buf, SZ]),
        "kwker_decoder_set_packed": (I32, [P, I32, I64, I32, P, SZ, I64, I64, buf, SZ]),
        "kwker_decoder_export": (I32, [P, I32, I64, P, P, P, P, SZ, P, buf, SZ]),
        "kwker_decoder_build": (P, [P, buf, SZ]),
        "kwker_decoder_builder_free": (None, [P]),
        "kwker_decoder_free": (None, [P]),
        "kwker_decoder_step": (I32, [P, I64, i64p, i64p, i64p, i32p, f32p, I64, buf, SZ]),
        "kwker_decoder_slot_len": (I64, [P, I64]),
        "kwker_decoder_slot_tokens": (I32, [P, I64, i64p, I64, buf, SZ]),
        "kwker_decoder_truncate": (I32, [P, I64, I64, buf, SZ]),
        "kwker_decoder_copy_prefix": (I32, [P, I64, I64, I64, buf, SZ]),
        "kwker_decoder_set_position": (I32, [P, I64, I64, buf, SZ]),
        "kwker_decoder_weight_bytes": (I64, [P]),
        "kwker_decoder_pool_stalls": (I64, []),
        "kwker_decoder_generate": (
            I32,
            [P, I64, i64p, i64p, i64p, ctypes.POINTER(_GenParams), i64p, I64, i64p, i64p, i32p, i64p, _CALLBACK, P,
             buf, SZ],
        ),  # fmt: skip
    }
    for name, (res, args) in sigs.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = res, args


_setup_ctypes()


class DecoderError(RuntimeError):
    """A decoder call was refused (bad input) or failed; the message says what to do."""


def _ptr(t: torch.Tensor, ctype: Any) -> Any:
    return ctypes.cast(t.data_ptr(), ctypes.POINTER(ctype))


def _i64(values: Sequence[int] | torch.Tensor) -> torch.Tensor:
    return torch.as_tensor(values, dtype=torch.int64).contiguous()


@dataclass
class Completion:
    """What ``generate`` returns per prompt: the new tokens and why it stopped ("stop": a stop token,
    the last of ``tokens``; "length": ``max_new_tokens`` or the slot's ``max_context``; "callback"); the
    slot it ran in, how many prompt tokens that slot already held (``cached``: not read again), and the
    prompt-lookup drafts proposed and accepted."""

    tokens: list[int]
    finish_reason: str
    slot: int = 0
    cached: int = 0
    drafted: int = 0
    accepted: int = 0


# Most draft tokens per speculative step that generate() proposes by default (prompt lookup).
PROMPT_LOOKUP = 8


def bf16_exact(w: torch.Tensor) -> bool:
    """True when every value of a float32 tensor is exactly representable in bfloat16."""
    return w.dtype == torch.float32 and torch.equal(w, w.to(torch.bfloat16).to(torch.float32))


def _mem_total() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def check_model(model: torch.nn.Module) -> Any:
    """The model's config if KwkDecoder can run it; else a ValueError naming what is not supported."""
    cfg = getattr(model, "config", None)
    kind = getattr(cfg, "model_type", None)
    arch = type(model).__name__
    if kind not in ARCHITECTURES or not hasattr(model, "model") or not hasattr(model, "lm_head"):
        raise ValueError(
            f"kwker: KwkDecoder does not support {arch} (model_type={kind!r}); supported: "
            f"{', '.join(ARCHITECTURES.values())} causal LMs (model_type {sorted(ARCHITECTURES)}). "
            "Use kwker_torch.torch_ops.install() or torch.compile(backend='kwker') for other models."
        )
    act = getattr(cfg, "hidden_act", "silu")
    if act != "silu":
        raise ValueError(f"kwker: {arch} with hidden_act={act!r} is not supported (only 'silu')")
    rope = dict(getattr(cfg, "rope_parameters", None) or {})
    rope_type = rope.get("rope_type", "default")
    if "dynamic" in rope_type or rope_type == "longrope":
        raise ValueError(
            f"kwker: rope_parameters rope_type={rope_type!r} changes the rotary frequencies with the sequence "
            "length, which KwkDecoder does not support (static types such as default, linear, llama3 and yarn are)"
        )
    types = set(getattr(cfg, "layer_types", None) or [])
    if kind == "qwen2" and "sliding_attention" in types and len(types) > 1:
        raise ValueError(
            "kwker: Qwen2 with use_sliding_window=True and max_window_layers < num_hidden_layers (sliding window "
            "on some layers only) is not supported; set use_sliding_window=False"
        )
    params = list(model.parameters())
    if any(p.device.type != "cpu" for p in params):
        raise ValueError("kwker: the model is not on the CPU; call model.to('cpu') first (KwkDecoder is CPU-only)")
    dtypes = {p.dtype for p in params}
    if not dtypes <= {torch.float32, torch.bfloat16}:
        bad = sorted(str(d) for d in dtypes - {torch.float32, torch.bfloat16})
        raise ValueError(
            f"kwker: the model holds {', '.join(bad)} weights; KwkDecoder takes float32 or bfloat16 "
            "(load it with dtype=torch.bfloat16 or torch.float32)"
        )
    for i, layer in enumerate(model.model.layers):
        attn = layer.self_attn
        extra = [n for n in ("q_norm", "k_norm") if hasattr(attn, n)]
        if extra:
            raise ValueError(f"kwker: layer {i} has {', '.join(extra)} (per-head q/k norms), not supported")
    return cfg


def _sliding_window(cfg: Any) -> int:
    kind = cfg.model_type
    if kind == "mistral" and getattr(cfg, "sliding_window", None):
        return int(cfg.sliding_window)
    types = set(getattr(cfg, "layer_types", None) or [])
    if kind == "qwen2" and types == {"sliding_attention"} and getattr(cfg, "sliding_window", None):
        return int(cfg.sliding_window)
    return 0


def _matrix(t: torch.Tensor) -> torch.Tensor:
    """A weight matrix as stored: bf16 as is, float32 as bf16 when exactly representable, else float32."""
    t = t.detach()
    if t.dtype == torch.float32 and bf16_exact(t):
        return t.to(torch.bfloat16).contiguous()
    return t.contiguous()


class KwkDecoder:
    """A native decoder of one model with ``max_batch`` sequence slots of ``max_context`` tokens each."""

    def __init__(self, handle: int, cfg: Any, vocab: int, max_batch: int, max_context: int, info: dict) -> None:
        self._h = ctypes.c_void_p(handle)
        self.config = cfg
        self.vocab_size = vocab
        self.max_batch = max_batch
        self.max_context = max_context
        self.info = info  # what was stored how (dtypes, bytes): for reports and tests
        self.native_steps = 0  # native calls made (tests prove the fast path ran with it)
        self._count_lock = threading.Lock()
        self._err = threading.local()
        self._callback_thread: int | None = None
        self._eos: list[int] = []
        # generate(): one call at a time picks slots and runs (so two threads never share a slot), and
        # when each slot was last used (the prompt cache evicts the least recently used prefix).
        self._gen_lock = threading.RLock()
        self._slot_used = [0] * max_batch
        self._clock = 0
        self._start_pos: dict[int, int] = {}  # slot -> rotary position of its first token, when not 0

    # ---- construction
    @classmethod
    def from_hf(
        cls,
        model: torch.nn.Module,
        precision: str = "preserve",
        max_batch: int = 1,
        max_context: int | None = None,
        *,
        calib: str | Sequence[int] | torch.Tensor | None = None,
        tokenizer: Any | None = None,
        formats: dict[str, str] | None = None,
    ) -> KwkDecoder:
        """Builds a decoder from a loaded Hugging Face model (its weights are copied; the model is not
        changed). ``max_context`` defaults to the model's ``max_position_embeddings``, capped at 4096.

        ``precision``: "preserve" (the model's own weights), "balanced"/"int8" or "int4" (see
        ``kwker_torch.quantize``). ``calib``: a text (with ``tokenizer``) or token ids whose activations weight
        the quantization error (4- and 8-bit formats). ``formats``: per-matrix overrides of the plan."""
        if precision not in PRECISIONS:
            raise ValueError(f"kwker: unknown precision {precision!r}; expected one of {PRECISIONS}")
        cfg = check_model(model)
        choose = quantize.plan(precision, len(model.model.layers), formats)
        if not isinstance(max_batch, int) or max_batch < 1:
            raise ValueError(f"kwker: max_batch must be a positive int (sequence slots), got {max_batch!r}")
        limit = int(getattr(cfg, "max_position_embeddings", 4096) or 4096)
        if max_context is None:
            max_context = min(limit, 4096)
        if not isinstance(max_context, int) or max_context < 1:
            raise ValueError(f"kwker: max_context must be a positive int, got {max_context!r}")
        imp = None  # calibration last among the checks: it runs the model over the whole text
        if calib is not None:
            if precision == "preserve" and not formats:
                raise ValueError(
                    "kwker: calib= only applies to quantized precisions ('int8', 'int4'); drop it for preserve"
                )
            imp = quantize.importance(model, quantize.calib_ids(calib, tokenizer))
        inner = model.model
        attn0 = inner.layers[0].self_attn
        head_dim = int(getattr(attn0, "head_dim", cfg.hidden_size // cfg.num_attention_heads))
        heads, kv_heads = int(cfg.num_attention_heads), int(cfg.num_key_value_heads)
        layers = len(inner.layers)
        kv_bytes = max_batch * layers * 2 * kv_heads * max_context * head_dim * 4
        total = _mem_total()
        if total is not None and kv_bytes > 0.8 * total:
            raise ValueError(
                f"kwker: a KV cache for max_batch={max_batch} x max_context={max_context} needs "
                f"{kv_bytes / 2**30:.1f} GiB, more than this machine's memory allows ({total / 2**30:.1f} GiB); "
                "lower max_batch or max_context"
            )
        rotary = inner.rotary_emb
        inv_freq = rotary.inv_freq.detach().float().contiguous()
        if inv_freq.numel() != head_dim // 2:
            raise ValueError(
                f"kwker: the rotary embedding has {inv_freq.numel()} frequencies for head_dim {head_dim} (a partial "
                "rotary factor such as partial_rotary_factor < 1); KwkDecoder rotates the whole head only"
            )
        tied = model.lm_head.weight is inner.embed_tokens.weight or bool(getattr(cfg, "tie_word_embeddings", False))
        if tied and not torch.equal(model.lm_head.weight, inner.embed_tokens.weight):
            tied = False  # a config that says tied, with separate weights: keep both
        c = _DecoderConfig(
            vocab=int(inner.embed_tokens.weight.shape[0]), hidden=int(cfg.hidden_size), layers=layers, heads=heads,
            kv_heads=kv_heads, head_dim=head_dim, intermediate=int(cfg.intermediate_size),
            sliding_window=_sliding_window(cfg), tied_embeddings=int(tied), slots=max_batch, max_context=max_context,
            chunk_rows=CHUNK_ROWS, rms_eps=float(cfg.rms_norm_eps), attn_scale=float(getattr(attn0, "scaling",
            head_dim**-0.5)), rope_scale=float(getattr(rotary, "attention_scaling", 1.0)),
            inv_freq=_ptr(inv_freq, ctypes.c_float),
        )  # fmt: skip
        err = ctypes.create_string_buffer(ERR_LEN)
        b = _native.LIB.kwker_decoder_builder(ctypes.byref(c), err, ERR_LEN)
        if not b:
            raise ValueError(f"kwker: {err.value.decode()}")
        info: dict[str, Any] = {
            "precision": precision, "bf16_matrices": 0, "f32_matrices": 0, "q8_matrices": 0, "q4_matrices": 0,
            "tied_embeddings": tied, "kv_bytes": kv_bytes, "calibrated": imp is not None, "formats": {},
        }  # fmt: skip
        try:
            with torch.no_grad():
                cls._load(b, model, info, err, tied, choose, imp)
        except BaseException:
            _native.LIB.kwker_decoder_builder_free(b)
            raise
        h = _native.LIB.kwker_decoder_build(b, err, ERR_LEN)
        if not h:
            raise ValueError(f"kwker: {err.value.decode()}")
        info["weight_bytes_per_token"] = int(_native.LIB.kwker_decoder_weight_bytes(h))
        dec = cls(h, cfg, c.vocab, max_batch, max_context, info)
        dec._eos = _eos_ids(model)
        dec._native_cfg = {name: getattr(c, name) for name, _ in _DecoderConfig._fields_ if name != "inv_freq"}
        dec._native_cfg["inv_freq"] = inv_freq.tolist()
        log.info(
            "kwker: KwkDecoder for %s (%s): %d bf16, %d float32, %d q8 and %d q4 matrices (%.2f bits per weight), "
            "%.0f MB of weights per token, KV cache %.0f MB (float32, %d slots x %d positions)",
            type(model).__name__, precision, info["bf16_matrices"], info["f32_matrices"], info["q8_matrices"],
            info["q4_matrices"], info["bits_per_weight"],
            info["weight_bytes_per_token"] / 1e6, kv_bytes / 1e6, max_batch, max_context,
        )  # fmt: skip
        return dec

    @staticmethod
    def _load(
        b: int,
        model: torch.nn.Module,
        info: dict,
        err: Any,
        tied: bool,
        choose: Callable[[str, int], str],
        imp: dict[tuple[str, int], torch.Tensor] | None,
    ) -> None:
        lib = _native.LIB
        bits = [0.0, 0]  # stored bits and weights of every matrix, for bits_per_weight

        def put(kind: int, layer: int, t: torch.Tensor, matrix: bool, name: str = "") -> None:
            fmt = choose(name, layer) if matrix else "preserve"
            t = _matrix(t) if matrix else t.detach().contiguous()
            rows, cols = (t.shape[0], t.shape[1]) if t.dim() == 2 else (1, t.shape[0])
            code = 1 if t.dtype == torch.bfloat16 else 0
            if matrix:
                stored = fmt if fmt != "preserve" else ("bf16" if t.dtype == torch.bfloat16 else "f32")
                info[f"{stored}_matrices"] += 1
                info["formats"][f"{name}.{layer}"] = stored
                bits[0] += BITS[stored] * t.numel()
                bits[1] += t.numel()
                info["bits_per_weight"] = bits[0] / bits[1]
            if fmt == "preserve":
                failed = lib.kwker_decoder_set(b, kind, layer, code, t.data_ptr(), rows, cols, err, ERR_LEN)
            else:
                quantize.check_quantizable(name, layer, fmt, cols)
                key = ("lm_head", 0) if name == "embed" and tied else (name, layer)
                w = imp.get(key) if imp is not None else None
                wp = w.data_ptr() if w is not None else None
                failed = lib.kwker_decoder_set_quant(
                    b, kind, layer, code, t.data_ptr(), rows, cols, quantize.FORMAT_CODES[fmt], wp, err, ERR_LEN
                )
            if failed:
                raise ValueError(f"kwker: {err.value.decode()}")

        def cat(*ts: torch.Tensor) -> torch.Tensor:
            dt = torch.float32 if any(t.dtype == torch.float32 for t in ts) else ts[0].dtype
            return torch.cat([t.detach().to(dt) for t in ts], 0)

        inner = model.model
        put(EMBED, 0, inner.embed_tokens.weight, True, "embed")
        put(FINAL_NORM, 0, inner.norm.weight, False)
        if not tied:  # the same rule the config given to Rust was made with
            put(LM_HEAD, 0, model.lm_head.weight, True, "lm_head")
        rows: Any = enumerate(inner.layers)
        if any(choose(k, i) != "preserve" for k in quantize.KINDS for i in range(len(inner.layers))):
            from tqdm.auto import tqdm

            rows = tqdm(rows, total=len(inner.layers), desc="kwker: quantizing", unit="layer")
        for i, layer in rows:
            a, mlp = layer.self_attn, layer.mlp
            put(ATTN_NORM, i, layer.input_layernorm.weight, False)
            put(WQKV, i, cat(a.q_proj.weight, a.k_proj.weight, a.v_proj.weight), True, "qkv")
            biases = [p.bias for p in (a.q_proj, a.k_proj, a.v_proj)]
            if any(x is not None for x in biases):
                parts = [
                    x if x is not None else torch.zeros(p.weight.shape[0])
                    for x, p in zip(biases, (a.q_proj, a.k_proj, a.v_proj), strict=True)
                ]
                put(BQKV, i, cat(*parts).float(), False)
            put(WO, i, a.o_proj.weight, True, "o")
            if a.o_proj.bias is not None:
                put(BO, i, a.o_proj.bias.float(), False)
            put(FFN_NORM, i, layer.post_attention_layernorm.weight, False)
            put(WGATEUP, i, cat(mlp.gate_proj.weight, mlp.up_proj.weight), True, "gate_up")
            if mlp.gate_proj.bias is not None or mlp.up_proj.bias is not None:
                gb = mlp.gate_proj.bias if mlp.gate_proj.bias is not None else torch.zeros(cfg_i(mlp.gate_proj))
                ub = mlp.up_proj.bias if mlp.up_proj.bias is not None else torch.zeros(cfg_i(mlp.up_proj))
                put(BGATEUP, i, cat(gb, ub).float(), False)
            put(WDOWN, i, mlp.down_proj.weight, True, "down")
            if mlp.down_proj.bias is not None:
                put(BDOWN, i, mlp.down_proj.bias.float(), False)

    def save(self, path: str | os.PathLike[str]) -> None:
        """Writes this decoder's weights as stored (packed, quantized if so) to the folder ``path``:
        ``weights.safetensors`` plus ``kwker.json`` (config, formats, checksums), so a server loads a
        converted model without quantizing again (``KwkDecoder.load``)."""
        from . import decoder_io

        decoder_io.save(self, path)

    @classmethod
    def load(
        cls, path: str | os.PathLike[str], max_batch: int | None = None, max_context: int | None = None
    ) -> KwkDecoder:
        """A decoder saved by ``save``; ``max_batch`` / ``max_context`` default to the saved ones. A folder from
        another kwker save format or with a damaged file raises ``ValueError`` saying which."""
        from . import decoder_io

        return decoder_io.load(cls, path, max_batch, max_context)

    def __del__(self) -> None:
        h = getattr(self, "_h", None)
        if h is not None and h.value:
            _native.LIB.kwker_decoder_free(h)
            self._h = None

    # ---- calls into Rust
    def _buf(self) -> Any:
        b = getattr(self._err, "buf", None)
        if b is None:
            b = self._err.buf = ctypes.create_string_buffer(ERR_LEN)
        return b

    def _check_reentry(self) -> None:
        if self._callback_thread == threading.get_ident():
            raise DecoderError(
                "kwker: the decoder was called from its own generate() callback; the callback must not call the "
                "decoder that is generating (collect tokens there and act on them after generate() returns)"
            )

    def _call(self, fn: Callable[..., int], *args: Any) -> None:
        self._check_reentry()
        err = self._buf()
        if fn(self._h, *args, err, ERR_LEN):
            raise DecoderError(f"kwker: {err.value.decode()}")

    def _tokens(self, ids: Sequence[int] | torch.Tensor, what: str) -> torch.Tensor:
        if isinstance(ids, torch.Tensor):
            t = ids
        else:
            items = list(ids)
            t = torch.as_tensor(items) if items else torch.empty(0, dtype=torch.int64)
        if t.dtype.is_floating_point or t.dtype == torch.bool:
            raise TypeError(f"kwker: {what} must be integer token ids, got dtype {t.dtype}")
        if t.dim() != 1:
            raise ValueError(f"kwker: {what} must be a 1-D sequence of token ids, got shape {tuple(t.shape)}")
        return t.to(torch.int64).contiguous()

    # ---- slots
    def slot_len(self, slot: int) -> int:
        """Tokens slot ``slot`` holds."""
        self._check_reentry()
        n = int(_native.LIB.kwker_decoder_slot_len(self._h, slot))
        if n < 0:
            raise DecoderError(f"kwker: slot {slot} does not exist (this decoder has {self.max_batch} slots)")
        return n

    def slot_tokens(self, slot: int) -> list[int]:
        """The tokens slot ``slot`` holds (its cached prefix)."""
        n = self.slot_len(slot)
        out = torch.empty(n, dtype=torch.int64)
        self._call(_native.LIB.kwker_decoder_slot_tokens, slot, _ptr(out, ctypes.c_int64), n)
        return out.tolist()

    def truncate(self, slot: int, length: int) -> None:
        """Keeps the first ``length`` tokens of a slot (e.g. to drop rejected speculative tokens)."""
        if length < 0:
            raise ValueError(f"kwker: cannot truncate slot {slot} to a negative length ({length})")
        self._call(_native.LIB.kwker_decoder_truncate, slot, length)
        if length == 0:
            self._start_pos.pop(slot, None)

    def reset(self, slot: int | None = None) -> None:
        """Empties one slot, or every slot."""
        for s in range(self.max_batch) if slot is None else [slot]:
            self.truncate(s, 0)

    def set_position(self, slot: int, position: int) -> None:
        """Gives the first token of an empty slot rotary position ``position`` (later tokens follow it),
        e.g. the column of the first real token of a left-padded row, as Hugging Face numbers it."""
        self._call(_native.LIB.kwker_decoder_set_position, slot, position)
        if position:
            self._start_pos[slot] = position

    def copy_prefix(self, src: int, dst: int, length: int) -> None:
        """Makes slot ``dst`` hold the first ``length`` tokens of slot ``src`` (K/V copied)."""
        start = self._start_pos.get(src, 0) if length else 0
        self._call(_native.LIB.kwker_decoder_copy_prefix, src, dst, length)
        if start:
            self._start_pos[dst] = start
        else:
            self._start_pos.pop(dst, None)

    # ---- steps
    def step(
        self,
        seqs: Sequence[tuple[int, Sequence[int] | torch.Tensor]],
        logits: str | Sequence[str] = "last",
    ) -> list[torch.Tensor]:
        """One native pass over the weights for several sequences: ``seqs`` is a list of (slot, new tokens)
        whose tokens follow what each slot holds (a prompt or a chunk of one, or one decode token). Returns,
        per sequence, the float32 logits ``logits`` asks for ("last": [1, vocab], "all": [n, vocab],
        "none": [0, vocab]); one mode for all or one per sequence."""
        if not seqs:
            raise ValueError("kwker: step() needs at least one (slot, tokens) pair")
        modes = [logits] * len(seqs) if isinstance(logits, str) else list(logits)
        if len(modes) != len(seqs):
            raise ValueError(f"kwker: {len(modes)} logits modes for {len(seqs)} sequences")
        for m in modes:
            if m not in LOGITS:
                raise ValueError(f"kwker: logits={m!r}; expected one of {list(LOGITS)}")
        toks = [self._tokens(t, f"the tokens of sequence {i}") for i, (_, t) in enumerate(seqs)]
        counts = [len(t) for t in toks]
        rows = [{"none": 0, "last": 1 if n else 0, "all": n}[m] for m, n in zip(modes, counts, strict=True)]
        out = torch.empty(sum(rows), self.vocab_size, dtype=torch.float32)
        slots, n_tok = _i64([s for s, _ in seqs]), _i64(counts)
        flat = torch.cat(toks) if toks else torch.empty(0, dtype=torch.int64)
        mode_t = torch.tensor([LOGITS[m] for m in modes], dtype=torch.int32)
        self._call(
            _native.LIB.kwker_decoder_step, len(seqs), _ptr(slots, ctypes.c_int64), _ptr(n_tok, ctypes.c_int64),
            _ptr(flat, ctypes.c_int64), _ptr(mode_t, ctypes.c_int32), _ptr(out, ctypes.c_float), out.numel(),
        )  # fmt: skip
        with self._count_lock:
            self.native_steps += 1
        return list(out.split(rows))

    def score(self, ids: Sequence[int] | torch.Tensor, slot: int = 0) -> torch.Tensor:
        """Logits [len(ids), vocab] (float32) of every position of ``ids``, read from an emptied slot."""
        self.reset(slot)
        (logits,) = self.step([(slot, ids)], logits="all")
        return logits

    # ---- generation
    def generate(
        self,
        prompts: Sequence[int] | torch.Tensor | Sequence[Sequence[int] | torch.Tensor],
        max_new_tokens: int = 64,
        *,
        temperature: float = 0.0,
        top_k: int = 0,
        top_p: float = 1.0,
        seed: int = 0,
        stop_tokens: Sequence[int] | None = None,
        callback: Callable[[int, int], bool | None] | None = None,
        slots: Sequence[int] | None = None,
        keep: bool = False,
        prompt_lookup: int = PROMPT_LOOKUP,
        prompt_cache: bool = True,
        draft: KwkDecoder | None = None,
        draft_tokens: int = 8,
    ) -> Completion | list[Completion]:
        """Generates from one prompt (1-D ids) or several (a list of them, decoded together in one batch),
        natively: temperature 0 is greedy; else temperature, then top-k, then top-p sampling from ``seed``.
        ``stop_tokens`` default to the model's EOS ids. ``callback(i, token)`` sees each token of prompt
        i as it is chosen (return False to end that sequence).

        ``prompt_lookup``: most draft tokens per step copied from the earlier text and verified in one
        pass (0 turns it off); greedy text is the same either way, sampled text keeps the model's
        distribution. ``prompt_cache``: a slot that already holds the start of a prompt (the previous chat
        turn) reads only the rest; with ``slots`` not given, each prompt goes to the slot holding its
        longest cached prefix, else to the least recently used one (any slot: one driven only by ``step()``
        counts as least recently used; pass ``slots`` to pin prompts to slots). ``keep=True`` instead appends each
        prompt to what its slot holds; ``prompt_cache=False`` empties the slots first."""
        single = isinstance(prompts, torch.Tensor) and prompts.dim() == 1
        single = single or (len(prompts) > 0 and isinstance(prompts[0], int))  # type: ignore[index]
        plist = [prompts] if single else list(prompts)  # type: ignore[list-item]
        if not plist:
            raise ValueError("kwker: generate() needs at least one prompt")
        toks = [self._tokens(p, f"prompt {i}") for i, p in enumerate(plist)]
        if slots is not None and len(slots) != len(toks):
            raise ValueError(f"kwker: {len(slots)} slots for {len(toks)} prompts")
        if not isinstance(max_new_tokens, int) or max_new_tokens < 0:
            raise ValueError(f"kwker: max_new_tokens must be an int >= 0, got {max_new_tokens!r}")
        if not isinstance(top_k, int) or top_k < 0:
            raise ValueError(f"kwker: top_k must be an int >= 0 (0 = off), got {top_k!r}")
        if isinstance(prompt_lookup, bool) or not isinstance(prompt_lookup, int) or prompt_lookup < 0:
            raise ValueError(
                f"kwker: prompt_lookup is the most draft tokens per step, an int >= 0 (0 = off), got {prompt_lookup!r}"
            )
        if len(toks) > self.max_batch:
            raise ValueError(
                f"kwker: {len(toks)} prompts for a decoder of {self.max_batch} slots; build it with "
                f"max_batch={len(toks)} or more, or generate in smaller groups"
            )
        if draft is not None:
            return self._generate_with_draft(
                toks, single, slots, keep, prompt_cache, draft, draft_tokens, max_new_tokens, temperature, top_k,
                top_p, seed, stop_tokens, callback,
            )  # fmt: skip
        stop = _i64(list(self._eos) if stop_tokens is None else list(stop_tokens))
        params = _GenParams(max_new=max_new_tokens, temperature=float(temperature), top_k=top_k, top_p=float(top_p),
                            seed=int(seed) & (2**64 - 1), max_draft=prompt_lookup)  # fmt: skip
        self._check_reentry()
        with self._gen_lock:
            chosen, cached, feed = self._place(toks, slots, keep, prompt_cache)
            n = len(toks)
            out = torch.zeros(n, max(max_new_tokens, 1), dtype=torch.int64)
            lens = torch.zeros(n, dtype=torch.int64)
            finish = torch.zeros(n, dtype=torch.int32)
            drafts = torch.zeros(n, 2, dtype=torch.int64)
            failure: list[BaseException] = []

            def on_token(i: int, tok: int, _user: Any) -> int:
                if failure:
                    return 1
                try:
                    return 1 if callback is not None and callback(i, tok) is False else 0
                except BaseException as e:  # noqa: BLE001  (re-raised after the native call returns)
                    failure.append(e)
                    return 1

            cb = _CALLBACK(on_token)
            self._callback_thread = threading.get_ident() if callback is not None else None
            try:
                self._call_generate(feed, chosen, params, stop, out, lens, finish, drafts, cb)
            finally:
                self._callback_thread = None
        if failure:
            raise failure[0]
        results = [
            Completion(out[i, : int(lens[i])].tolist(), FINISH[int(finish[i])], chosen[i], cached[i],
                       int(drafts[i, 0]), int(drafts[i, 1]))  # fmt: skip
            for i in range(n)
        ]
        return results[0] if single else results

    def _generate_with_draft(self, toks: list[torch.Tensor], single: bool, slots: Sequence[int] | None, keep: bool,
                             reuse: bool, draft: KwkDecoder, draft_tokens: int, max_new: int, temperature: float,
                             top_k: int, top_p: float, seed: int, stop_tokens: Sequence[int] | None,
                             callback: Callable[[int, int], bool | None] | None) -> Completion:  # fmt: skip
        from . import speculative

        if not isinstance(draft, KwkDecoder):
            raise TypeError(f"kwker: draft must be a KwkDecoder (KwkDecoder.from_hf(small_model)), got {type(draft)}")
        speculative.check_pair(self, draft)
        if not single:
            raise ValueError("kwker: generate(draft=...) runs one prompt at a time; give one prompt (1-D ids)")
        if isinstance(draft_tokens, bool) or not isinstance(draft_tokens, int) or draft_tokens < 1:
            raise ValueError(f"kwker: draft_tokens must be an int >= 1, got {draft_tokens!r}")
        if not (float(temperature) >= 0.0 and 0.0 < float(top_p) <= 1.0):
            raise ValueError(f"kwker: temperature must be >= 0 and top_p in (0, 1], got {temperature}, {top_p}")
        stop = list(self._eos) if stop_tokens is None else [int(t) for t in stop_tokens]
        self._check_reentry()
        first, second = sorted((self, draft), key=id)  # one lock order, whichever decoder is the target
        with first._gen_lock, second._gen_lock:
            chosen, cached, feed = self._place(toks, slots, keep, reuse)
            (dslot,), _, _ = draft._place([toks[0]], None, False, True)
            if max_new == 0:
                return Completion([], "length", chosen[0], cached[0])
            out, why, drafted, kept = speculative.generate(
                self, draft, chosen[0], dslot, feed[0], max_new, max_draft=draft_tokens, temperature=float(temperature),
                top_k=top_k, top_p=float(top_p), seed=int(seed), stop=stop, callback=callback,
            )  # fmt: skip
        return Completion(out, why, chosen[0], cached[0], drafted, kept)

    def _place(
        self, toks: list[torch.Tensor], slots: Sequence[int] | None, keep: bool, reuse: bool
    ) -> tuple[list[int], list[int], list[torch.Tensor]]:
        from . import prompt_cache

        return prompt_cache.place(self, toks, slots, keep, reuse)

    def _call_generate(self, toks: list[torch.Tensor], slots: list[int], params: _GenParams, stop: torch.Tensor,
                       out: torch.Tensor, lens: torch.Tensor, finish: torch.Tensor, drafts: torch.Tensor,
                       cb: Any) -> None:  # fmt: skip
        err = self._buf()
        sl, counts, flat = _i64(slots), _i64([len(t) for t in toks]), torch.cat(toks)
        rc = _native.LIB.kwker_decoder_generate(
            self._h, len(toks), _ptr(sl, ctypes.c_int64), _ptr(counts, ctypes.c_int64), _ptr(flat, ctypes.c_int64),
            ctypes.byref(params), _ptr(stop, ctypes.c_int64), stop.numel(), _ptr(out, ctypes.c_int64),
            _ptr(lens, ctypes.c_int64), _ptr(finish, ctypes.c_int32), _ptr(drafts, ctypes.c_int64), cb, None, err,
            ERR_LEN,
        )  # fmt: skip
        if rc:
            raise DecoderError(f"kwker: {err.value.decode()}")
        with self._count_lock:
            self.native_steps += 1


def cfg_i(lin: torch.nn.Linear) -> int:
    return int(lin.weight.shape[0])


def _eos_ids(model: torch.nn.Module) -> list[int]:
    """The model's end-of-sequence ids (generation config first, then the model config)."""
    for src in (getattr(model, "generation_config", None), getattr(model, "config", None)):
        eos = getattr(src, "eos_token_id", None)
        if eos is not None:
            return [int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos])]
    return []


def pool_stalls() -> int:
    """Times the decoder's thread pool ran a step alone because a worker thread was not scheduled."""
    return int(_native.LIB.kwker_decoder_pool_stalls())


__all__ = ["Completion", "DecoderError", "KwkDecoder", "bf16_exact", "check_model", "pool_stalls"]
