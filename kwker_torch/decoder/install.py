"""``decode.install(model)``: a Hugging Face causal LM's own ``model(input_ids)`` and ``model.generate()``
run on ``KwkDecoder``, one native step per forward, keeping Hugging Face's API (greedy and sampling,
streamers, stopping criteria, ``max_new_tokens``, left-padded batches with an attention mask,
``return_dict_in_generate``/``output_logits``, ``labels`` for a loss).

How it hooks in: ``model.forward`` (an instance attribute, so other models are untouched) maps each call
onto decoder steps. The first forward of a sequence batch leases one decoder slot per row and returns a
``KwkCache`` in place of Hugging Face's cache; ``generate()`` passes it back on every later step, which
then feeds each row's new tokens to its slot. Rows keep Hugging Face's positions (a left-padded row's
first real token sits at its column), padding tokens are skipped, and their logits are 0.

Speculative decoding: the cache can be cropped (``KwkCache.crop``), so Hugging Face's own
``prompt_lookup_num_tokens=`` and ``assistant_model=`` (an installed draft model runs on its own decoder)
verify their drafts in one native step and drop the rejected ones from the slot; prompt lookup's drafts
are sized from measured acceptance and step times (``hf_lookup.py``), as the decoder's own lookup is.
Prompt cache: slots keep their text when a sequence ends; a new single-row, unpadded ``generate()`` whose
prompt starts with what an idle slot holds (the previous chat turn) takes that slot and reads only the rest
(``install(..., prompt_cache=False)`` turns it off; ``stats(model)`` counts it).

Numerics: logits are float32 (the decoder computes in float32; a bf16 model's logits are not rounded to
bf16), equal to the model's float32 forward up to summation order, so greedy tokens are HF float32's.

Positions: each row's ``position_ids`` when given (``generate()`` always gives them); otherwise by column, or,
for families that number positions from the attention mask (OPT), ``cumsum(mask) - 1`` as the model does.

Falls back to the model's own forward, logged once, where the decoder cannot stand in: gradients needed,
``inputs_embeds``, ``token_type_ids``, ``output_attentions``/``output_hidden_states``, a pre-filled Hugging
Face cache, or position ids that are not consecutive per row. Weights changed after ``install`` are noticed at the start
of the next sequence and the decoder is rebuilt. Safe to use from several threads (each generation holds
its own slots; steps run one at a time on the decoder).
"""

from __future__ import annotations

import inspect
import logging
import threading
import weakref
from collections import OrderedDict
from typing import Any

import torch

from . import families, hf_lookup
from .runtime import KwkDecoder

log = logging.getLogger("kwker_torch")
_logged: set[str] = set()
ATTR = "_kwker_decode"


def _log_once(msg: str) -> None:
    if msg not in _logged:
        _logged.add(msg)
        log.info("kwker decode: %s (logged once)", msg)


def _snapshot(model: torch.nn.Module) -> list[tuple[torch.Tensor, int, int]]:
    return [(p, p._version, p.data_ptr()) for p in model.parameters()]


def _changed(model: torch.nn.Module, snap: list[tuple[torch.Tensor, int, int]]) -> bool:
    params = list(model.parameters())
    if len(params) != len(snap):
        return True
    return any(
        p is not s or p._version != v or p.data_ptr() != ptr for p, (s, v, ptr) in zip(params, snap, strict=True)
    )


def _cache_base() -> type:
    from transformers.cache_utils import Cache

    return Cache


class _Installed:
    """What install() keeps on a model: its decoder, the original forward and the slot leases."""

    def __init__(
        self, model: torch.nn.Module, precision: str, max_batch: int, max_context: int | None, build_kw: dict,
        prompt_cache: bool = True,
    ) -> None:
        self.precision, self.max_batch, self.max_context = precision, max_batch, max_context
        self.gguf = build_kw.pop("gguf", None)  # the GGUF file the model was loaded from: run its tensors as stored
        if self.gguf is not None and (precision != "preserve" or build_kw):
            raise ValueError(f"kwker decode.install(gguf=...) runs the file's tensors as stored, so precision must be "
                             f"'preserve' and there is nothing to calibrate or override (got precision={precision!r}"
                             f"{', ' + ', '.join(build_kw) if build_kw else ''}); drop gguf= to quantize the model's "
                             "weights instead")  # fmt: skip
        self.build_kw = build_kw
        self.prompt_cache = prompt_cache
        self.sequences = 0  # sequence batches started, and prompt tokens the prompt cache spared reading
        self.cached_tokens = 0
        self.original = model.forward
        # The forward's own parameter names, to map positional arguments (they differ between families).
        self.arg_names = [n for n in inspect.signature(self.original).parameters if n not in ("args", "kwargs")]
        self.positions_from_mask = families.family_of(model).positions_from_mask
        self.lock = threading.RLock()
        self.build(model)

    def build(self, model: torch.nn.Module) -> None:
        if self.gguf is not None:
            self.decoder = KwkDecoder.from_gguf(self.gguf, self.max_batch, self.max_context,
                                                kv_cache=self.build_kw.get("kv_cache"))  # fmt: skip
            _check_same_model(model, self.decoder, self.gguf)
        else:
            self.decoder = KwkDecoder.from_hf(model, self.precision, self.max_batch, self.max_context,
                                              **self.build_kw)  # fmt: skip
        self.snap = _snapshot(model)
        self.free = list(range(self.max_batch))
        self.leases: OrderedDict[int, weakref.ref] = OrderedDict()  # id(cache) -> cache, least recent first
        self.generation = getattr(self, "generation", 0) + 1

    def refresh(self, model: torch.nn.Module) -> None:
        """Rebuilds the decoder when the model's parameters changed since it was built."""
        if _changed(model, self.snap):
            log.info("kwker decode: the model's weights changed since install(); rebuilding its decoder%s",
                     " from them (no longer from the GGUF file)" if self.gguf else "")  # fmt: skip
            self.gguf = None
            for ref in list(self.leases.values()):
                c = ref()
                if c is not None:
                    c._evicted = "the model's weights changed, so its decoder was rebuilt"
            self.build(model)

    def lease(self, cache: KwkCache, n: int, prefix: torch.Tensor | None = None) -> tuple[list[int], int]:
        """``n`` free slots for ``cache``; the least recently used live caches are evicted if needed (their
        later use raises a clear error): e.g. outputs of plain forwards that a caller keeps alive. The slots
        come back empty, or with ``prefix`` (one row's tokens) holding the longest start of it the prompt
        cache has (returned with the slots)."""
        with self.lock:
            if n > self.max_batch:
                raise ValueError(
                    f"kwker: a batch of {n} sequences needs {n} decoder slots, but decode.install() made "
                    f"{self.max_batch}; call decode.install(model, max_batch={n})"
                )
            while len(self.free) < n:
                if not self.leases:  # slots still held by caches being collected in another thread
                    raise RuntimeError(
                        f"kwker: no free decoder slot for a batch of {n} (all {self.max_batch} are being released "
                        "by another thread); retry, or call decode.install(model, max_batch=...) with more slots"
                    )
                key, ref = next(iter(self.leases.items()))
                old = ref()
                if old is None:  # collected; its finalizer is returning the slots
                    self.leases.pop(key, None)
                    continue
                old._evicted = "its slots were given to a newer sequence (more live caches than max_batch)"
                old._finalizer()  # -> give_back
            cached = 0
            if prefix is not None and n == 1:  # the prompt cache: see prompt_cache.py
                from .prompt_cache import seat

                slot, cached = seat(self.decoder, prefix, list(self.free), range(self.max_batch))
                self.free.remove(slot)
                slots = [slot]
            else:
                slots, self.free = self.free[:n], self.free[n:]
                for s in slots:
                    self.decoder.truncate(s, 0)
            self.leases[id(cache)] = weakref.ref(cache)
            return slots, cached

    def touch(self, cache: KwkCache) -> None:
        with self.lock:
            if id(cache) in self.leases:
                self.leases.move_to_end(id(cache))

    def give_back(self, key: int, slots: list[int], generation: int) -> None:
        """A cache's finalizer: its slots are free again (slots of a decoder since rebuilt are not)."""
        with self.lock:
            self.leases.pop(key, None)
            if generation == self.generation:
                self.free.extend(slots)


class KwkCache:
    """Hugging Face's view of the decoder slots one batch of sequences holds (built by the first forward).
    ``get_seq_length()`` counts columns seen, padding included, as Hugging Face's own caches do."""

    def __init__(self, inst: _Installed, batch: int, prefix: torch.Tensor | None = None) -> None:
        self._inst = inst
        self._generation = inst.generation
        self._evicted: str | None = None
        self.slots, cached = inst.lease(self, batch, prefix)
        self.batch = batch
        self.seen = 0  # columns processed
        self.mask: torch.Tensor | None = None  # [batch, seen] bool: the columns that are tokens, not padding
        self.cached = cached  # prompt tokens the slot already held (prompt cache): not fed again
        slots, key, gen = list(self.slots), id(self), inst.generation
        self._finalizer = weakref.finalize(self, inst.give_back, key, slots, gen)

    # ---- what generate() asks of a cache
    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.seen

    def get_max_length(self) -> int:
        return self._inst.decoder.max_context

    def get_mask_sizes(self, query_length: int, layer_idx: int = 0) -> tuple[int, int]:
        return self.seen + query_length, 0

    @property
    def is_compileable(self) -> bool:
        return False

    @property
    def is_croppable(self) -> bool:
        return True

    def crop(self, tokens_to_remove: int) -> None:
        """Drops the last ``-tokens_to_remove`` columns (0 drops nothing), as Hugging Face's caches do;
        assisted generation and prompt lookup drop rejected draft tokens with it. A positive value is the
        older API's length to keep."""
        self.check()
        n = self.seen + tokens_to_remove if tokens_to_remove <= 0 else tokens_to_remove
        if n >= self.seen:
            return
        n = max(n, 0)
        self.cached = 0  # the prompt-cache skip applies to a sequence's first forward only
        with self._inst.lock:
            for i, slot in enumerate(self.slots):
                real = int(self.mask[i, :n].sum()) if self.mask is not None else n
                self._inst.decoder.truncate(slot, real)
            self.seen = n
            if self.mask is not None:
                self.mask = self.mask[:, :n]

    @property
    def is_linear(self) -> list[bool]:
        return [False]

    @property
    def is_sliding(self) -> list[bool]:
        return [False]

    @property
    def is_initialized(self) -> bool:
        return self.seen > 0

    def __len__(self) -> int:
        return self._inst.decoder.config.num_hidden_layers

    def reorder_cache(self, beam_idx: torch.Tensor) -> None:
        raise NotImplementedError(
            "kwker: beam search is not supported under decode.install(); use num_beams=1 or decode.uninstall(model)"
        )

    def batch_repeat_interleave(self, repeats: int) -> None:
        raise NotImplementedError(
            "kwker: expanding a cache after its prompt (num_return_sequences with a reused cache, beam search) is "
            "not supported under decode.install(); start generate() from the prompt without a cache"
        )

    batch_select_indices = batch_repeat_interleave

    def check(self) -> None:
        if self._evicted is not None:
            raise RuntimeError(f"kwker: this KwkCache can no longer be used: {self._evicted}")


def _new_cache_type() -> type:
    """KwkCache as a subclass of transformers' Cache, so generate()'s isinstance checks pass (KwkCache's
    methods come first in the method order)."""
    base = _cache_base()

    class _KwkCache(KwkCache, base):  # type: ignore[misc, valid-type]
        def __init__(self, inst: _Installed, batch: int, prefix: torch.Tensor | None = None) -> None:
            base.__init__(self, layers=[])
            KwkCache.__init__(self, inst, batch, prefix)

    _KwkCache.__name__ = _KwkCache.__qualname__ = "KwkCache"
    return _KwkCache


_CACHE_TYPE: list[type] = []


def _make_cache(inst: _Installed, batch: int, prefix: torch.Tensor | None = None) -> KwkCache:
    if not _CACHE_TYPE:
        _CACHE_TYPE.append(_new_cache_type())
    return _CACHE_TYPE[0](inst, batch, prefix)


def _fallback_reason(
    model: torch.nn.Module, cache: Any, kwargs: dict, input_ids: Any, inputs_embeds: Any
) -> str | None:
    if inputs_embeds is not None:
        return "a forward with inputs_embeds"
    if input_ids is None:
        return "a forward without input_ids"
    if kwargs.get("token_type_ids") is not None:
        return "a forward with token_type_ids"
    if kwargs.get("output_attentions") or kwargs.get("output_hidden_states"):
        return "output_attentions / output_hidden_states"
    if torch.is_grad_enabled() and any(p.requires_grad for p in model.parameters()):
        return "a forward with gradients enabled (KwkDecoder is inference-only; use torch.no_grad())"
    if cache is not None and not isinstance(cache, KwkCache) and cache.get_seq_length() > 0:
        return "a forward over a pre-filled Hugging Face cache"
    return None


def _row_runs(
    mask: torch.Tensor, position_ids: torch.Tensor | None, seen: int, t: int
) -> list[tuple[list[int], int | None]]:
    """Per row: the new columns to feed (mask 1) and the rotary position of the first of them."""
    runs = []
    cols = torch.arange(seen, seen + t)
    for b in range(mask.shape[0]):
        keep = (mask[b, -t:] != 0).nonzero().flatten().tolist()
        if not keep:
            runs.append((keep, None))
            continue
        pos = (position_ids[b, keep] if position_ids is not None else cols[keep]).tolist()
        if any(q - p != 1 for p, q in zip(pos, pos[1:], strict=False)):
            raise _Fallback("position ids that are not consecutive within a row (packed sequences or holes)")
        runs.append((keep, int(pos[0])))
    return runs


class _Fallback(Exception):
    pass


def _forward(model: torch.nn.Module, inst: _Installed, *args: Any, **kwargs: Any) -> Any:
    from transformers.modeling_outputs import CausalLMOutputWithPast

    for name, value in zip(inst.arg_names, args, strict=False):
        kwargs[name] = value
    input_ids = kwargs.pop("input_ids", None)
    attention_mask = kwargs.pop("attention_mask", None)
    position_ids = kwargs.pop("position_ids", None)
    cache = kwargs.pop("cache", None)
    if cache is None:
        cache = kwargs.pop("past_key_values", None)
    inputs_embeds = kwargs.pop("inputs_embeds", None)
    labels = kwargs.pop("labels", None)
    use_cache = kwargs.pop("use_cache", None)
    logits_to_keep = kwargs.pop("logits_to_keep", 0)
    return_dict = kwargs.pop("return_dict", None)
    kwargs.pop("cache_position", None)

    def fallback(reason: str) -> Any:
        if isinstance(cache, KwkCache):
            raise RuntimeError(f"kwker: cannot continue a KwkCache with {reason}; decode.uninstall(model) first")
        _log_once(f"{reason}: runs on the model's own forward")
        full = dict(kwargs, input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                    inputs_embeds=inputs_embeds, labels=labels, use_cache=use_cache, logits_to_keep=logits_to_keep)
        if cache is not None:
            full["cache"] = cache
        if return_dict is not None:
            full["return_dict"] = return_dict
        return inst.original(**full)  # fmt: skip

    reason = _fallback_reason(model, cache, kwargs, input_ids, inputs_embeds)
    if reason is not None:
        return fallback(reason)
    if input_ids.dim() != 2:
        raise ValueError(f"kwker: input_ids must be [batch, tokens], got shape {tuple(input_ids.shape)}")
    if input_ids.device.type != "cpu":
        raise ValueError(f"kwker: input_ids are on {input_ids.device}; KwkDecoder runs on the CPU")
    b, t = input_ids.shape
    use_cache = bool(getattr(model.config, "use_cache", True)) if use_cache is None else bool(use_cache)
    # One lock over leasing, the native step and the bookkeeping: another thread can neither evict these
    # slots nor rebuild the decoder while this step uses them (the decoder runs one step at a time anyway).
    with inst.lock:
        if isinstance(cache, KwkCache):
            cache.check()
            if cache.batch != b:
                raise ValueError(f"kwker: a KwkCache of {cache.batch} rows given input_ids of {b} rows")
            inst.touch(cache)
            kc = cache
        else:
            inst.refresh(model)
            kc = None
        seen = kc.seen if kc is not None else 0
        if attention_mask is None:
            mask = torch.ones(b, seen + t, dtype=torch.long)
        else:
            mask = attention_mask
            if mask.dim() != 2 or mask.shape[0] != b or mask.shape[1] != seen + t:
                shape = tuple(mask.shape)
                return fallback(f"an attention mask of shape {shape} (expected 2-D [batch, past + new])")
        last = isinstance(logits_to_keep, int) and logits_to_keep == 1  # generate(): only the next-token logits
        if kc is None:
            # The prompt cache: one unpadded row whose next-token logits are all that is asked may start
            # from a slot that holds the start of it (the previous turn of a chat), reading only the rest.
            plain = position_ids is None or bool((position_ids[0] == torch.arange(t)).all())
            reuse = inst.prompt_cache and use_cache and b == 1 and last and plain and bool((mask != 0).all())
            kc = _make_cache(inst, b, input_ids[0] if reuse else None)
            inst.sequences += 1
            inst.cached_tokens += kc.cached
        if position_ids is None and inst.positions_from_mask:
            # OPT numbers each row's tokens from its attention mask: cumsum(mask) - 1.
            position_ids = ((mask != 0).long().cumsum(-1) - 1)[:, -t:]
        try:
            runs = _row_runs(mask, position_ids, seen, t)
        except _Fallback as e:
            if seen == 0:
                kc._finalizer()
            return fallback(str(e))
        dec = kc._inst.decoder
        seqs, modes, rows = [], [], []
        for i, (keep, pos) in enumerate(runs):
            if not keep:
                continue
            slot = kc.slots[i]
            if dec.slot_len(slot) == 0:
                dec.set_position(slot, pos)  # type: ignore[arg-type]
            skip = kc.cached if seen == 0 else 0  # prompt tokens the slot already holds
            seqs.append((slot, input_ids[i, -t:][keep][skip:]))
            # A row whose last column is padding has no next-token logits (0, as for every padded position).
            modes.append(("last" if keep[-1] == t - 1 else "none") if last else "all")
            rows.append((i, keep))
        out = dec.step(seqs, logits=modes) if seqs else []
        kc.seen = seen + t
        kc.mask = mask != 0
        logits = torch.zeros(b, 1 if last else t, dec.vocab_size, dtype=torch.float32)
        for (i, keep), lg, m in zip(rows, out, modes, strict=True):
            if m == "last":
                logits[i, 0] = lg[0]
            elif m == "all":
                logits[i, keep] = lg
    if not (isinstance(logits_to_keep, int) and logits_to_keep in (0, 1)):
        logits = logits[:, -logits_to_keep:] if isinstance(logits_to_keep, int) else logits[:, logits_to_keep]
    loss = None
    if labels is not None:
        loss = model.loss_function(logits=logits, labels=labels, vocab_size=dec.vocab_size, **kwargs)
    if not use_cache:
        kc._finalizer()
    result = CausalLMOutputWithPast(loss=loss, logits=logits, cache=kc if use_cache else None)
    if return_dict is False:
        return result.to_tuple()
    return result


def install(
    model: torch.nn.Module,
    precision: str = "preserve",
    max_batch: int = 8,
    max_context: int | None = None,
    prompt_cache: bool = True,
    **build_kw: Any,
) -> torch.nn.Module:
    """Runs ``model``'s forward and ``generate()`` on a KwkDecoder built from its weights. ``max_batch``
    sequences (batch rows) can be in flight at once, each up to ``max_context`` tokens (default: the model's
    ``max_position_embeddings`` capped at 4096). ``precision`` and the keywords (``calib=``, ``tokenizer=``,
    ``formats=``, ``gptq=``, ``act_order=``, ``kv_cache=``) are ``KwkDecoder.from_hf``'s; ``gguf=FILE`` (a model
    loaded with ``from_pretrained(..., gguf_file=FILE)``) runs the file's own tensors as stored instead
    (``KwkDecoder.from_gguf``).
    ``prompt_cache``: a generate() whose prompt starts with what an idle slot holds (the previous turn of a
    chat) reads only the rest; the idle slots are the cache (least recently used reused first). Installing
    again rebuilds the decoder. Returns the model."""
    if getattr(model, ATTR, None) is not None:
        uninstall(model)
    from . import compiled

    if not families.maps(model) and compiled.is_causal_lm(model):
        return _install_compiled(model, precision, max_batch, max_context, build_kw)
    inst = _Installed(model, precision, max_batch, max_context, build_kw, prompt_cache)

    def forward(*args: Any, **kwargs: Any) -> Any:
        return _forward(model, inst, *args, **kwargs)

    forward.__doc__ = "kwker decode.install(): this model's forward runs on KwkDecoder."
    forward.__wrapped__ = inst.original  # type: ignore[attr-defined]  # generate() inspects the signature
    setattr(model, ATTR, inst)
    model.forward = forward  # type: ignore[method-assign]
    hf_lookup.hook(model, lambda gen: setattr(inst, "lookup", gen))
    return model


def _check_same_model(model: torch.nn.Module, dec: KwkDecoder, path: str) -> None:
    """The GGUF file given to install() holds this model's architecture (its values are the user's word)."""
    keys = ("model_type", "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
            "num_key_value_heads", "intermediate_size")  # fmt: skip
    ours = {k: getattr(model.config, k, None) for k in keys}
    file = {k: getattr(dec.config, k, None) for k in keys}
    if ours != file:
        diff = {k: (ours[k], file[k]) for k in keys if ours[k] != file[k]}
        raise ValueError(f"kwker decode.install(gguf={path!r}): the file is not this model ((model, file): {diff}); "
                         "pass the GGUF file the model was loaded from, or drop gguf=")  # fmt: skip


class _CompiledInstall:
    """What install() keeps on a model outside the recipe: its CompiledDecoder and the generation settings it
    changed (restored by uninstall)."""

    def __init__(self, decoder: Any, original: Any, restore: dict[str, Any]) -> None:
        self.decoder, self.original, self.restore = decoder, original, restore
        self.lock = threading.RLock()
        self.sequences = self.cached_tokens = 0


def _install_compiled(model: torch.nn.Module, precision: str, max_batch: int, max_context: int | None,
                      build_kw: dict) -> torch.nn.Module:  # fmt: skip
    """decode.install() of a causal LM no family maps: the compile backend's path (``compiled.py``)."""
    from . import compiled

    if precision != "preserve" or build_kw:
        raise compiled.refuse(model, f"precision={precision!r} (or calib=, formats=, kv_cache=)")
    if not compiled.compilable(model):
        _log_once(f"{compiled.describe(model)} is outside the recipe and transformers cannot run it on a static cache; "
                  "it keeps its own forward (kwker_torch.torch_ops.install() routes its linears to kwker)")  # fmt: skip
        return model
    dec = compiled.CompiledDecoder(model, max_batch, max_context)
    gc = model.generation_config
    restore = {"cache_implementation": gc.cache_implementation, "max_cache_len": getattr(gc, "max_cache_len", None)}
    gc.cache_implementation = "static"  # the executor writes K/V into Hugging Face's static cache in place
    if max_context:
        gc.max_cache_len = max_context
    inst = _CompiledInstall(dec, model.forward, restore)

    def forward(*args: Any, **kwargs: Any) -> Any:
        if torch.is_grad_enabled() and any(p.requires_grad for p in model.parameters()):
            _log_once("a forward that needs gradients runs on the model's own forward")
            return inst.original(*args, **kwargs)
        return dec.forward(*args, **kwargs)

    forward.__doc__ = "kwker decode.install(): this model's forward runs on the compile backend's native executor."
    forward.__wrapped__ = inst.original  # type: ignore[attr-defined]  # generate() inspects the signature
    setattr(model, ATTR, inst)
    model.forward = forward  # type: ignore[method-assign]
    return model


def uninstall(model: torch.nn.Module) -> torch.nn.Module:
    """Restores the model's own forward and frees its decoder."""
    inst = getattr(model, ATTR, None)
    if inst is None:
        return model
    if model.__dict__.get("forward") is not None:
        del model.forward
    hf_lookup.unhook(model)
    if isinstance(inst, _CompiledInstall):
        for k, v in inst.restore.items():
            setattr(model.generation_config, k, v)
    setattr(model, ATTR, None)
    return model


def is_installed(model: torch.nn.Module) -> bool:
    return getattr(model, ATTR, None) is not None


def decoder_of(model: torch.nn.Module) -> KwkDecoder:
    """The KwkDecoder an installed model runs on (for statistics and tests)."""
    inst = getattr(model, ATTR, None)
    if inst is None:
        raise ValueError("kwker: decode.install(model) was not called on this model")
    return inst.decoder


def stats(model: torch.nn.Module) -> dict[str, int]:
    """What an installed model's prompt cache did: sequence batches started, and prompt tokens read from
    the cache instead of again."""
    inst = getattr(model, ATTR, None)
    if inst is None:
        raise ValueError("kwker: decode.install(model) was not called on this model")
    with inst.lock:
        return {"sequences": inst.sequences, "cached_tokens": inst.cached_tokens}


__all__ = ["KwkCache", "decoder_of", "install", "is_installed", "stats", "uninstall"]
