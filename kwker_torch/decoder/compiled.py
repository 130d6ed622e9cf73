"""Any causal LM outside KwkDecoder's recipe, on the compile backend's native step executor.

``KwkDecoder.from_hf(model)`` and ``decode.install(model)`` on an architecture no family maps (BLOOM, GPT-J,
CodeGen, ALiBi Falcon, ...) build a ``CompiledDecoder`` instead of refusing, logged once: the model's own forward
under ``torch.compile(backend="kwker")`` (``compile/backend.py``: linears on prepared weights, and per input
shape one planned native program over preallocated buffers, ops it does not know run through torch inside
it) over Hugging Face's static cache, whose K/V the executor writes in place, driven by Hugging Face's own
``generate()`` loop. A decode step is one call into Rust plus the torch steps of unknown ops.

Scope: precision "preserve" (the checkpoint's own weights and dtype), ``decode.install()`` and
``generate()`` with the same arguments as ``KwkDecoder.generate`` (one prompt or several, run one after
another; greedy or seeded temperature / top-k / top-p sampling; stop tokens; a streaming callback). What
needs the recipe is refused with a ``ValueError`` naming the architecture: int8/int4, ``step``/``score``,
``save``/``load``, prompt lookup, draft models, the prompt cache and the server's continuous batching.
A model transformers cannot run on a static cache (``_can_compile_fullgraph`` false: each step would
recompile) keeps its own forward under ``decode.install()``, logged once.

Numerics: the compile backend's (torch's arithmetic op by op, float32 sums in linears and attention; a
float32 model gives Hugging Face float32's greedy tokens, a bf16 model rounds where torch rounds).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any

import torch

log = logging.getLogger("kwker_torch")
_logged: set[str] = set()


def _log_once(msg: str) -> None:
    if msg not in _logged:
        _logged.add(msg)
        log.info("kwker: %s (logged once)", msg)


def describe(model: torch.nn.Module) -> str:
    """``BloomForCausalLM (model_type='bloom')``: how errors name the architecture."""
    kind = getattr(getattr(model, "config", None), "model_type", None)
    return f"{type(model).__name__} (model_type={kind!r})"


def is_causal_lm(model: torch.nn.Module) -> bool:
    """A Hugging Face model that generates text: it has ``generate``, a config, and is not an encoder-decoder."""
    cfg = getattr(model, "config", None)
    return (callable(getattr(model, "generate", None)) and cfg is not None
            and not getattr(cfg, "is_encoder_decoder", False))  # fmt: skip


def compilable(model: torch.nn.Module) -> bool:
    """Whether transformers runs the model on a static cache under torch.compile (its own flag)."""
    return bool(getattr(model, "_can_compile_fullgraph", False))


def refuse(model: torch.nn.Module, what: str) -> ValueError:
    from .families import supported

    return ValueError(
        f"kwker: {describe(model)} is outside KwkDecoder's recipe and runs on the compile backend's path "
        f"(torch.compile(backend='kwker') over a static cache), which has generate() and decode.install() "
        f"with the checkpoint's own weights; {what} needs one of the families KwkDecoder runs: {supported()}"
    )


class _Streamer:
    """Hugging Face's streamer protocol turned into ``callback(i, token)`` calls; a False return ends the
    sequence (``_Stop`` reads ``stopped``)."""

    def __init__(self, index: int, callback: Callable[[int, int], bool | None] | None, skip: int) -> None:
        self.index, self.callback, self.skip = index, callback, skip
        self.stopped = False
        self.tokens: list[int] = []

    def put(self, value: torch.Tensor) -> None:
        if self.skip:  # generate() hands the prompt over first
            self.skip = 0
            return
        for tok in value.reshape(-1).tolist():
            self.tokens.append(int(tok))
            if self.callback is not None and not self.stopped and self.callback(self.index, int(tok)) is False:
                self.stopped = True

    def end(self) -> None:
        pass


class CompiledDecoder:
    """``KwkDecoder``'s ``generate()`` for a causal LM outside the recipe (see the module docstring)."""

    family = "compiled"

    def __init__(self, model: torch.nn.Module, max_batch: int = 1, max_context: int | None = None) -> None:
        if not is_causal_lm(model):
            raise ValueError(f"kwker: {describe(model)} is not a causal LM (it has no generate())")
        if not compilable(model):
            raise refuse(model, "a model transformers cannot run on a static cache (it is not marked compilable)")
        params = list(model.parameters())
        if any(p.device.type != "cpu" for p in params):
            raise ValueError(f"kwker: {describe(model)} has parameters off the CPU; move the model to the CPU first")
        self.model = model
        self.config = model.config
        self.architecture = describe(model)
        self.max_batch = max_batch
        self.max_context = max_context
        self.vocab_size = int(model.get_output_embeddings().weight.shape[0])
        dtypes = sorted({str(p.dtype).removeprefix("torch.") for p in params})
        self.info: dict[str, Any] = {"precision": "preserve", "path": "compile backend", "dtypes": dtypes}
        self._graphs: list[Any] = []  # what the kwker backend built for this model's compiled forward
        self._compiled = torch.compile(model.forward, backend=self._backend)
        self._lock = threading.RLock()
        _log_once(f"{self.architecture} runs on the compile backend's path (torch.compile(backend='kwker') over a "
                  "static cache), not KwkDecoder's recipe")  # fmt: skip

    def _backend(self, gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        from ..compile.backend import kwker_backend

        fn = kwker_backend(gm, example_inputs)
        self._graphs.append(fn)
        return fn

    def plans(self) -> list[Any]:
        """The native executor's plans of this model's graphs (``executor.Plan``: ``runs``, ``native_calls``,
        ``torch_ops``); empty while every graph runs as FX."""
        from ..compile.executor import StepExecutor

        out = []
        for fn in self._graphs:
            ex = getattr(fn, "kwker_state", {}).get("gm")
            if isinstance(ex, StepExecutor):
                out += [p for p in ex.plans.values() if p is not None]
        return out

    @property
    def native_steps(self) -> int:
        """Forward calls that ran as planned native programs (tests prove the fast path ran with it)."""
        return sum(p.runs for p in self.plans())

    @property
    def eos_ids(self) -> list[int]:
        eos = getattr(getattr(self.model, "generation_config", None), "eos_token_id", None)
        eos = getattr(self.config, "eos_token_id", None) if eos is None else eos
        return [int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos]) if e is not None]

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """The compiled forward (what ``decode.install()`` puts in place of the model's)."""
        return self._compiled(*args, **kwargs)

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
        prompt_lookup: int = 0,
        prompt_cache: bool = False,
        draft: Any = None,
    ) -> Any:
        """``KwkDecoder.generate``'s arguments and ``Completion`` results; several prompts run one after
        another (the compile backend's path has no slots to batch them in)."""
        from .common import Completion

        if prompt_lookup or prompt_cache or draft is not None:
            raise refuse(self.model, "prompt lookup, the prompt cache or a draft model")
        single = isinstance(prompts, torch.Tensor) and prompts.dim() == 1
        single = single or (len(prompts) > 0 and isinstance(prompts[0], int))  # type: ignore[index]
        plist = [prompts] if single else list(prompts)  # type: ignore[list-item]
        if not plist:
            raise ValueError("kwker: generate() needs at least one prompt")
        if not isinstance(max_new_tokens, int) or max_new_tokens < 0:
            raise ValueError(f"kwker: max_new_tokens must be an int >= 0, got {max_new_tokens!r}")
        if temperature < 0 or not isinstance(top_k, int) or top_k < 0 or not 0 < top_p <= 1:
            raise ValueError(f"kwker: expected temperature >= 0, an int top_k >= 0 and 0 < top_p <= 1; got "
                             f"{temperature!r}, {top_k!r}, {top_p!r}")  # fmt: skip
        stops = self.eos_ids if stop_tokens is None else [int(t) for t in stop_tokens]
        out = []
        with self._lock:
            for i, p in enumerate(plist):
                ids = torch.as_tensor(p, dtype=torch.long).reshape(1, -1)
                if ids.numel() == 0 or int(ids.min()) < 0 or int(ids.max()) >= self.vocab_size:
                    raise ValueError(f"kwker: prompt {i} must hold token ids in [0, {self.vocab_size})")
                out.append(self._one(ids, i, max_new_tokens, temperature, top_k, top_p, seed, stops, callback,
                                     Completion))  # fmt: skip
        return out[0] if single else out

    def _one(self, ids: torch.Tensor, index: int, n: int, temperature: float, top_k: int, top_p: float, seed: int,
             stops: list[int], callback: Any, completion: type) -> Any:  # fmt: skip
        from transformers import StoppingCriteria, StoppingCriteriaList

        if n == 0:
            return completion([], "length")
        streamer = _Streamer(index, callback, skip=1)

        class _Stop(StoppingCriteria):
            def __call__(self, input_ids: torch.Tensor, scores: Any, **kw: Any) -> torch.Tensor:
                return torch.full((input_ids.shape[0],), streamer.stopped, dtype=torch.bool)

        sample = temperature > 0
        kw: dict[str, Any] = dict(max_new_tokens=n, do_sample=sample, streamer=streamer, pad_token_id=stops[0] if stops
                                  else 0, eos_token_id=stops or None, stopping_criteria=StoppingCriteriaList([_Stop()]),
                                  cache_implementation="static", attention_mask=torch.ones_like(ids))  # fmt: skip
        if self.max_context:
            kw["max_cache_len"] = self.max_context
        if sample:
            kw.update(temperature=temperature, top_k=top_k or None, top_p=top_p)
        else:
            kw.update(temperature=None, top_k=None, top_p=None)
        model = self.model
        own = model.__dict__.get("forward")  # decode.install()'s wrapper, or None (the class's forward)
        model.forward = self._compiled  # type: ignore[method-assign]
        try:
            with torch.random.fork_rng(devices=[]), torch.no_grad():
                torch.manual_seed(seed)
                model.generate(ids, **kw)
        finally:
            if own is None:
                del model.forward
            else:
                model.forward = own  # type: ignore[method-assign]
        toks = streamer.tokens
        if streamer.stopped:
            reason = "callback"
        elif toks and toks[-1] in stops:
            reason = "stop"
        else:
            reason = "length"
        return completion(toks, reason)

    # ---- what needs the recipe
    def step(self, *args: Any, **kwargs: Any) -> Any:
        raise refuse(self.model, "step()")

    def score(self, *args: Any, **kwargs: Any) -> Any:
        raise refuse(self.model, "score()")

    def save(self, *args: Any, **kwargs: Any) -> Any:
        raise refuse(self.model, "save()")


__all__ = ["CompiledDecoder", "compilable", "describe", "is_causal_lm", "refuse"]
