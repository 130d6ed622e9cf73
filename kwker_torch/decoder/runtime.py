"""``KwkDecoder``: a whole Hugging Face causal LM of any family in ``families/`` run natively, one call into
Rust per step, over a ragged batch of sequence slots (the runtime: slots, steps, the generation loop).

    dec = KwkDecoder.from_hf(model, max_batch=4, max_context=2048)
    out = dec.generate(prompt_ids, max_new_tokens=64)            # native loop: greedy or sampling
    logits = dec.step([(0, prompt_a), (1, [tok_b])])             # prompt chunk and decode token, one pass
    vecs = dec.embed([ids_a, ids_b], pooling="last")             # final hidden states pooled (embed.py)
    dec.truncate(0, 10); dec.copy_prefix(0, 1, 10); dec.reset()  # slot verbs for speculation / prompt cache

Weights are copied into the decoder once (``build.py``; ``precision="preserve"``: the checkpoint's own
numbers; float32 matrices whose values are all exactly bf16 are stored as bf16, the same numbers in half the
bytes). Every activation, sum and the KV cache are float32, so logits equal the model's float32 forward up to
summation order (tests: <= 1e-5 of the largest logit; measured ~1e-6) and greedy tokens equal HF float32's.
``precision="int8"`` / ``"int4"`` store matrices as 8-/4-bit codes instead (``plan.py``); their cost in
quality is measured with ``python -m kwker_torch.quality``.

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
from typing import Any

import torch

from . import native
from .common import PRECISIONS, PROMPT_LOOKUP, Completion, eos_ids
from .native import CALLBACK, FINISH, LOGITS, OUTPUTS, DecoderError, GenParams

log = logging.getLogger("kwker_torch")



_ptr, _i64 = native.ptr, native.i64




class KwkDecoder:
    """A native decoder of one model with ``max_batch`` sequence slots of ``max_context`` tokens each."""

    def __init__(self, handle: int, cfg: Any, vocab: int, max_batch: int, max_context: int, info: dict,
                 eos: Sequence[int] = (), family: str = "") -> None:  # fmt: skip
        self._h = ctypes.c_void_p(handle)
        self.config = cfg
        self.family = family  # the mapping it was built with (families/): "Llama", "Gemma 3", ...
        self.vocab_size = vocab
        # Width of a hidden row (step(output="hidden"), embed()): the lm_head's input, embed_dim wide.
        self.hidden_size = int(native.describe(self._h)["recipe"]["embed_dim"])
        self.max_batch = max_batch
        self.max_context = max_context
        self.info = info  # what was stored how (dtypes, bytes): for reports and tests
        # The KV cache as built: sliding-window layers hold only their window (rust/src/decoder/cache.rs).
        info["kv_bytes_per_slot"] = int(native.LIB.kwker_decoder_kv_bytes(self._h, 0))
        info["kv_bytes_per_token"] = int(native.LIB.kwker_decoder_kv_bytes(self._h, 1))
        info["kv_bytes"] = max_batch * info["kv_bytes_per_slot"]
        self.native_steps = 0  # native calls made (tests prove the fast path ran with it)
        self._count_lock = threading.Lock()
        self._err = threading.local()
        self._callback_thread: int | None = None
        self._eos: list[int] = [int(e) for e in eos]
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
        max_context: int | str | None = None,
        *,
        calib: str | Sequence[int] | torch.Tensor | None = None,
        tokenizer: Any | None = None,
        formats: dict[str, str] | None = None,
        gptq: bool = False,
        act_order: bool = False,
        kv_cache: str | None = None,
    ) -> Any:
        """Builds a decoder from a loaded Hugging Face causal LM of any family ``families.supported()`` lists
        (its weights are copied; the model is not changed). ``max_context`` defaults to the model's
        ``max_position_embeddings``, capped at 4096; ``"auto"`` takes the whole trained context where
        ``max_batch`` slots of it fit in half of the memory available (else the longest that does), logged.

        ``precision``: "preserve" (the model's own weights), "balanced"/"int8" or "int4" (see ``plan.py``).
        ``calib``: a text (with ``tokenizer``) or token ids whose activations weight the quantization error
        (4- and 8-bit formats). ``formats``: per-matrix overrides of the plan. ``gptq``: with ``calib``, each
        quantized matrix's codes chosen by GPTQ (``gptq.py``: column-by-column error compensation through the
        calibration inputs' Hessian); ``act_order``: GPTQ's columns in decreasing order of activation energy.
        ``kv_cache``: how the KV cache stores K and V: "f32" (logits within 1e-5 of float32), "bf16" (half the
        bytes) or "q8" (int8 codes with a scale per head and position, about a quarter); by default f32 for
        "preserve", bf16 for int8 and q8 for int4 (``common.DEFAULT_KV_CACHE``: measured at 4,096 tokens, bf16 costs
        int8 nothing measurable and q8 costs int4 +0.03 points of perplexity); ``dec.info["kv_cache"]`` says which.

        Any other causal LM gets a ``compiled.CompiledDecoder`` (the compile backend's path: ``generate()`` with
        these arguments, precision "preserve" only), logged once."""
        from . import build, compiled, families

        if not families.maps(model) and compiled.is_causal_lm(model):
            quantized = precision != "preserve" or calib is not None or formats is not None or gptq
            if quantized or kv_cache not in (None, "f32"):
                raise compiled.refuse(model, f"precision={precision!r} (or calib=, formats=, gptq=, kv_cache=)")
            # "auto": the compile path sizes its static cache per generate() call, up to its own limit.
            return compiled.CompiledDecoder(model, max_batch, None if max_context == "auto" else max_context)
        return build.from_hf(cls, model, precision, max_batch, max_context, calib=calib, tokenizer=tokenizer,
                             formats=formats, gptq=gptq, act_order=act_order, kv_cache=kv_cache)  # fmt: skip

    @classmethod
    def from_gguf(
        cls, path: str | os.PathLike[str], max_batch: int = 1, max_context: int | str | None = None,
        kv_cache: str | None = None,
    ) -> KwkDecoder:
        """Builds a decoder from a llama.cpp GGUF file as it is: its quantized tensors repacked into this
        library's formats without changing a value where a format holds them (``gguf.py`` lists which),
        ``dec.info["gguf"]`` saying which tensors came over exactly. The config comes from the file; its
        tokenizer loads with ``AutoTokenizer.from_pretrained(folder, gguf_file=name)``. ``kv_cache`` defaults to
        q8 when the file's matrices are quantized (as ``from_hf``'s 4- and 8-bit precisions), else f32."""
        from . import gguf

        return gguf.from_gguf(cls, path, max_batch, max_context, kv_cache)

    # ---- what save/load, the prompt cache and reports read
    @property
    def eos_ids(self) -> list[int]:
        """The model's end-of-sequence ids (generate()'s default stop tokens)."""
        return list(self._eos)

    def describe(self) -> dict[str, Any]:
        """The native decoder as it is: {"recipe", "limits", "tensors": [{name, layer, expert, rows, cols, format}]}."""
        return native.describe(self._h)

    def export(self, name: str, layer: int = 0, expert: int = 0) -> tuple[str, int, int, bytes]:
        """Tensor ``name`` of ``layer`` (and ``expert``) exactly as stored: (format, rows, cols, bytes) ("vector" =
        f32 values)."""
        return native.export(self._h, name, layer, expert)

    def weight(self, name: str, layer: int = 0, expert: int = 0) -> torch.Tensor:
        """Tensor ``name`` of ``layer`` (and ``expert``) as the kernels read it: a float32 [rows, cols] tensor
        (quantized matrices dequantized; vectors as [1, n])."""
        _, rows, cols, data = native.export(self._h, name, layer, expert, values=True)
        return torch.frombuffer(bytearray(data), dtype=torch.float32).reshape(rows, cols)

    def start_position(self, slot: int) -> int:
        """The rotary position of the first token of ``slot`` (0 unless ``set_position`` gave another)."""
        return self._start_pos.get(slot, 0)

    def lru_order(self, candidates: Sequence[int]) -> list[int]:
        """``candidates`` least recently used first (slots ``mark_used`` has touched least recently)."""
        return sorted(candidates, key=lambda s: (self._slot_used[s], s))

    def mark_used(self, slot: int) -> None:
        """Records that ``slot`` was just given to a sequence (the prompt cache evicts by this)."""
        self._clock += 1
        self._slot_used[slot] = self._clock

    def save(self, path: str | os.PathLike[str]) -> None:
        """Writes this decoder's weights as stored (packed, quantized if so) to the folder ``path``:
        ``weights.safetensors`` plus ``kwker.json`` (config, formats, checksums), so a server loads a
        converted model without quantizing again (``KwkDecoder.load``)."""
        from . import io

        io.save(self, path)

    @classmethod
    def load(
        cls, path: str | os.PathLike[str], max_batch: int | None = None, max_context: int | None = None,
        kv_cache: str | None = None,
    ) -> KwkDecoder:
        """A decoder saved by ``save``; ``max_batch`` / ``max_context`` / ``kv_cache`` default to the saved ones. A
        folder from another kwker save format or with a damaged file raises ``ValueError`` saying which."""
        from . import io

        return io.load(cls, path, max_batch, max_context, kv_cache)

    def __del__(self) -> None:
        h = getattr(self, "_h", None)
        if h is not None and h.value:
            native.LIB.kwker_decoder_free(h)
            self._h = None

    # ---- calls into Rust
    def _buf(self) -> Any:
        b = getattr(self._err, "buf", None)
        if b is None:
            b = self._err.buf = ctypes.create_string_buffer(native.ERR_LEN)
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
        if fn(self._h, *args, err, native.ERR_LEN):
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
        n = int(native.LIB.kwker_decoder_slot_len(self._h, slot))
        if n < 0:
            raise DecoderError(f"kwker: slot {slot} does not exist (this decoder has {self.max_batch} slots)")
        return n

    def slot_min_len(self, slot: int) -> int:
        """The shortest length other than 0 that ``truncate`` and ``copy_prefix`` accept for this slot: its
        sliding-window layers keep only their window and 64 older tokens (0 when nothing was dropped)."""
        self._check_reentry()
        n = int(native.LIB.kwker_decoder_slot_min_len(self._h, slot))
        if n < 0:
            raise DecoderError(f"kwker: slot {slot} does not exist (this decoder has {self.max_batch} slots)")
        return n

    def slot_tokens(self, slot: int) -> list[int]:
        """The tokens slot ``slot`` holds (its cached prefix)."""
        n = self.slot_len(slot)
        out = torch.empty(n, dtype=torch.int64)
        self._call(native.LIB.kwker_decoder_slot_tokens, slot, _ptr(out, ctypes.c_int64), n)
        return out.tolist()

    def truncate(self, slot: int, length: int) -> None:
        """Keeps the first ``length`` tokens of a slot (e.g. to drop rejected speculative tokens)."""
        if length < 0:
            raise ValueError(f"kwker: cannot truncate slot {slot} to a negative length ({length})")
        self._call(native.LIB.kwker_decoder_truncate, slot, length)
        if length == 0:
            self._start_pos.pop(slot, None)

    def reset(self, slot: int | None = None) -> None:
        """Empties one slot, or every slot."""
        for s in range(self.max_batch) if slot is None else [slot]:
            self.truncate(s, 0)

    def set_position(self, slot: int, position: int) -> None:
        """Gives the first token of an empty slot rotary position ``position`` (later tokens follow it),
        e.g. the column of the first real token of a left-padded row, as Hugging Face numbers it."""
        self._call(native.LIB.kwker_decoder_set_position, slot, position)
        if position:
            self._start_pos[slot] = position

    def copy_prefix(self, src: int, dst: int, length: int) -> None:
        """Makes slot ``dst`` hold the first ``length`` tokens of slot ``src`` (K/V copied)."""
        start = self._start_pos.get(src, 0) if length else 0
        self._call(native.LIB.kwker_decoder_copy_prefix, src, dst, length)
        if start:
            self._start_pos[dst] = start
        else:
            self._start_pos.pop(dst, None)

    # ---- steps
    def step(
        self,
        seqs: Sequence[tuple[int, Sequence[int] | torch.Tensor]],
        logits: str | Sequence[str] = "last",
        output: str = "logits",
    ) -> list[torch.Tensor]:
        """One native pass over the weights for several sequences: ``seqs`` is a list of (slot, new tokens)
        whose tokens follow what each slot holds (a prompt or a chunk of one, or one decode token). Returns,
        per sequence, the float32 logits ``logits`` asks for ("last": [1, vocab], "all": [n, vocab],
        "none": [0, vocab]); one mode for all or one per sequence. ``output="hidden"`` returns those rows'
        final normed hidden states instead ([rows, hidden_size]: the lm_head's input, Hugging Face's
        ``last_hidden_state``), what ``embed`` pools."""
        if not seqs:
            raise ValueError("kwker: step() needs at least one (slot, tokens) pair")
        if output not in OUTPUTS:
            raise ValueError(f"kwker: output={output!r}; expected one of {list(OUTPUTS)}")
        modes = [logits] * len(seqs) if isinstance(logits, str) else list(logits)
        if len(modes) != len(seqs):
            raise ValueError(f"kwker: {len(modes)} logits modes for {len(seqs)} sequences")
        for m in modes:
            if m not in LOGITS:
                raise ValueError(f"kwker: logits={m!r}; expected one of {list(LOGITS)}")
        toks = [self._tokens(t, f"the tokens of sequence {i}") for i, (_, t) in enumerate(seqs)]
        counts = [len(t) for t in toks]
        rows = [{"none": 0, "last": 1 if n else 0, "all": n}[m] for m, n in zip(modes, counts, strict=True)]
        width = self.vocab_size if output == "logits" else self.hidden_size
        out = torch.empty(sum(rows), width, dtype=torch.float32)
        slots, n_tok = _i64([s for s, _ in seqs]), _i64(counts)
        flat = torch.cat(toks) if toks else torch.empty(0, dtype=torch.int64)
        mode_t = torch.tensor([LOGITS[m] for m in modes], dtype=torch.int32)
        self._call(
            native.LIB.kwker_decoder_step, len(seqs), _ptr(slots, ctypes.c_int64), _ptr(n_tok, ctypes.c_int64),
            _ptr(flat, ctypes.c_int64), _ptr(mode_t, ctypes.c_int32), OUTPUTS[output], _ptr(out, ctypes.c_float),
            out.numel(),
        )  # fmt: skip
        with self._count_lock:
            self.native_steps += 1
        return list(out.split(rows))

    def score(self, ids: Sequence[int] | torch.Tensor, slot: int = 0) -> torch.Tensor:
        """Logits [len(ids), vocab] (float32) of every position of ``ids``, read from an emptied slot."""
        self.reset(slot)
        (logits,) = self.step([(slot, ids)], logits="all")
        return logits

    def embed(
        self,
        ids_or_batch: Sequence[int] | torch.Tensor | Sequence[Sequence[int] | torch.Tensor],
        pooling: str = "last",
        normalize: bool = True,
        *,
        slots: Sequence[int] | None = None,
    ) -> torch.Tensor:
        """Embeddings: each sequence's final normed hidden state (Hugging Face's ``last_hidden_state``, what
        sentence-transformers pools) pooled by ``pooling`` ("last": the last token's row, as Qwen3-Embedding;
        "mean": the average of its rows), L2-normalized when ``normalize``. One sequence (1-D ids) gives
        [hidden_size], a list of them [n, hidden_size] (float32). Sequences are read several per native step,
        one per slot of ``slots`` (default: every slot), which are emptied (``embed.py``)."""
        from . import embed

        return embed.embed(self, ids_or_batch, pooling, normalize, slots)

    # ---- generation
    def generate(
        self,
        prompts: Sequence[int] | torch.Tensor | Sequence[Sequence[int] | torch.Tensor],
        max_new_tokens: int = 64,
        *,
        temperature: float = 0.0,
        top_k: int = 0,
        top_p: float = 1.0,
        min_p: float = 0.0,
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
        natively: temperature 0 is greedy; else temperature, then top-k, top-p and min-p sampling from ``seed``
        (the project's one sampler, ``rust/src/decoder/sample.rs``, which the server also samples with).
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
                top_p, min_p, seed, stop_tokens, callback,
            )  # fmt: skip
        stop = _i64(list(self._eos) if stop_tokens is None else list(stop_tokens))
        params = GenParams(max_new=max_new_tokens, temperature=float(temperature), top_k=top_k, top_p=float(top_p),
                            seed=int(seed) & (2**64 - 1), max_draft=prompt_lookup, min_p=float(min_p))  # fmt: skip
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

            cb = CALLBACK(on_token)
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
                             top_k: int, top_p: float, min_p: float, seed: int, stop_tokens: Sequence[int] | None,
                             callback: Callable[[int, int], bool | None] | None) -> Completion:  # fmt: skip
        from . import speculative

        if not isinstance(draft, KwkDecoder):
            raise TypeError(f"kwker: draft must be a KwkDecoder (KwkDecoder.from_hf(small_model)), got {type(draft)}")
        speculative.check_pair(self, draft)
        if not single:
            raise ValueError("kwker: generate(draft=...) runs one prompt at a time; give one prompt (1-D ids)")
        if isinstance(draft_tokens, bool) or not isinstance(draft_tokens, int) or draft_tokens < 1:
            raise ValueError(f"kwker: draft_tokens must be an int >= 1, got {draft_tokens!r}")
        if not (float(temperature) >= 0.0 and 0.0 < float(top_p) <= 1.0 and 0.0 <= float(min_p) <= 1.0):
            raise ValueError(f"kwker: temperature must be >= 0, top_p in (0, 1] and min_p in [0, 1], got "
                             f"{temperature}, {top_p}, {min_p}")  # fmt: skip
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
                top_k=top_k, top_p=float(top_p), min_p=float(min_p), seed=int(seed), stop=stop, callback=callback,
            )  # fmt: skip
        return Completion(out, why, chosen[0], cached[0], drafted, kept)

    def _place(
        self, toks: list[torch.Tensor], slots: Sequence[int] | None, keep: bool, reuse: bool
    ) -> tuple[list[int], list[int], list[torch.Tensor]]:
        from . import prompt_cache

        return prompt_cache.place(self, toks, slots, keep, reuse)

    def _call_generate(self, toks: list[torch.Tensor], slots: list[int], params: GenParams, stop: torch.Tensor,
                       out: torch.Tensor, lens: torch.Tensor, finish: torch.Tensor, drafts: torch.Tensor,
                       cb: Any) -> None:  # fmt: skip
        err = self._buf()
        sl, counts, flat = _i64(slots), _i64([len(t) for t in toks]), torch.cat(toks)
        rc = native.LIB.kwker_decoder_generate(
            self._h, len(toks), _ptr(sl, ctypes.c_int64), _ptr(counts, ctypes.c_int64), _ptr(flat, ctypes.c_int64),
            ctypes.byref(params), _ptr(stop, ctypes.c_int64), stop.numel(), _ptr(out, ctypes.c_int64),
            _ptr(lens, ctypes.c_int64), _ptr(finish, ctypes.c_int32), _ptr(drafts, ctypes.c_int64), cb, None, err,
            native.ERR_LEN,
        )  # fmt: skip
        if rc:
            raise DecoderError(f"kwker: {err.value.decode()}")
        with self._count_lock:
            self.native_steps += 1


pool_stalls = native.pool_stalls

__all__ = ["Completion", "DecoderError", "KwkDecoder", "PRECISIONS", "eos_ids", "pool_stalls"]
