"""``install()``: put an unchanged Hugging Face model's linears and each new token's attention on the
kwker ops; ``uninstall()`` restores stock behaviour.

How it hooks in (no model argument needed; models loaded before or after are covered):
  - ``torch.nn.Linear.forward`` is replaced by a forward that calls ``torch.ops.kwker.linear`` when the
    call is one the op computes exactly like ``F.linear`` would (CPU, float32/bfloat16, one dtype for
    input, weight and bias, no autograd needed); anything else runs the original forward.
  - transformers' ``"sdpa"`` attention (the default implementation) is wrapped: attention of a few new
    tokens against the cache with no mask to apply goes to ``torch.ops.kwker.decode_attention``; prompts,
    padded batches, masks, sliding windows, soft-capping, sinks and dropout stay on torch.
  - Of the calls kwker can compute, each shape runs where it is faster on this machine: its first calls
    alternate between kwker and torch, timed, then it stays on the winner (``path_choice.py``;
    ``install(choose="kwker")`` skips the measuring). So float32 models, where kwker's GEMV is only at
    MKL's speed on some Intel CPUs, never run slower than stock.
Every reason for leaving a call on torch is logged once (logger ``kwker_torch``). All of this state is
safe to use from several threads at once (per-thread mask verdicts, locked counters and decisions).

Numerics: the ops sum in float32 and round once to the input dtype, as torch's CPU kernels do, so the
greedy tokens are the model's own (checked in tests on the real SmolLM2-135M).
"""

from __future__ import annotations

import functools
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

import torch

from . import native as _native  # registers the ops; the tier in use
from .path_choice import KWKER, PathChoice, rows_bucket

log = logging.getLogger("kwker_torch")

_FLOATS = (torch.float32, torch.bfloat16)
# Longest query (new tokens per step) sent to the kwker attention; longer prompts stay on torch's
# flash-style SDPA, which is the better kernel for T x S prefill.
MAX_DECODE_TOKENS = 8

# bf16 linears with more rows than this go to torch when torch has AMX (oneDNN's AMX GEMM reaches
# ~1.2-2 TFLOP/s here against ~250 GFLOP/s for kwker's AVX-512 GEMM); decode rows stay on kwker.
AMX_MIN_ROWS = 16

_state: dict[str, Any] = {}
_logged: set[str] = set()
_counts = {"linear": 0, "linear_torch": 0, "attention": 0, "attention_torch": 0}
_counts_lock = threading.Lock()  # generate() may run in several threads at once
_choice = PathChoice()  # per-shape kwker-or-torch decisions (choose="measure")
CHOOSE_MODES = ("measure", "kwker")


def _count(what: str) -> None:
    with _counts_lock:
        _counts[what] += 1


def _run_chosen(key: Any, kwker: Callable[[], torch.Tensor], stock: Callable[[], Any], what: str) -> Any:
    """Runs the call on the path chosen for ``key`` (measuring both while the shape is on trial)."""
    path = _choice.decided.get(key) if _state["choose"] == "measure" else KWKER
    if path is None:
        path = _choice.trial_path(key)
        t0 = time.perf_counter()
        out = kwker() if path == KWKER else stock()
        _choice.record(key, path, time.perf_counter() - t0)
    else:
        out = kwker() if path == KWKER else stock()
    _count(what if path == KWKER else what + "_torch")
    return out


def _log_once(reason: str) -> None:
    if reason not in _logged:
        _logged.add(reason)
        log.info("kwker: left on torch: %s (logged once)", reason)


def _linear_reason(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> str | None:
    """Why kwker::linear cannot stand in for F.linear here, or None when it can."""
    if x.device.type != "cpu" or w.device.type != "cpu":
        return f"Linear on device {x.device}"
    if x.dtype not in _FLOATS or w.dtype != x.dtype or (b is not None and b.dtype != x.dtype):
        return f"Linear with dtypes x={x.dtype}, weight={w.dtype}" + (f", bias={b.dtype}" if b is not None else "")
    if torch.is_grad_enabled() and (x.requires_grad or w.requires_grad or (b is not None and b.requires_grad)):
        return "Linear that needs gradients (kwker ops are inference-only)"
    if type(w) is not torch.nn.Parameter and type(w) is not torch.Tensor:
        return f"Linear with a {type(w).__name__} weight"
    if x.dim() == 0:
        return "Linear on a 0-d input"
    return None


def _below_autograd(op: Callable[..., torch.Tensor], *args: Any) -> torch.Tensor:
    """Calls ``op`` below the autograd key. Only for calls that need no gradient (the callers check):
    it skips the op's Python autograd rule, ~5 µs a call under ``torch.no_grad()``. Under
    ``torch.compile`` the call is traced plainly."""
    if torch.compiler.is_compiling():
        return op(*args)
    with torch._C._AutoDispatchBelowAutograd():
        return op(*args)


_PLAIN = (torch.nn.Parameter, torch.Tensor)
_AMX_REASON = (
    "bf16 prompt GEMMs on a CPU with AMX while kwker runs without its amx tier (torch's oneDNN AMX GEMM is "
    "faster than kwker's AVX-512 one)"
)


def _fast_path_ok(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> bool:
    """The common decode case in a few attribute reads (~0.5 µs): same float dtype on the CPU, plain
    tensors, no gradient needed, not a prompt left to AMX. Anything else takes the slow path, which
    finds and logs the reason."""
    dt = x.dtype
    return (
        dt is w.dtype
        and (b is None or b.dtype is dt)
        and dt in _FLOATS
        and type(w) in _PLAIN
        and x.is_cpu
        and w.is_cpu
        and x.dim() > 0
        and not (
            torch.is_grad_enabled() and (x.requires_grad or w.requires_grad or (b is not None and b.requires_grad))
        )
        and not (dt is torch.bfloat16 and prompt_on_torch(x.numel() // max(x.shape[-1], 1)))
    )


def _linear_forward(self: torch.nn.Linear, input: torch.Tensor) -> torch.Tensor:
    w, b = self.weight, self.bias
    if _fast_path_ok(input, w, b):
        key = ("linear", input.dtype, rows_bucket(input.numel() // input.shape[-1]), w.shape, b is not None)
        path = _choice.decided.get(key) if _state["choose"] == "measure" else KWKER
        if path == KWKER:  # the decided cases inline: this runs ~200 times per token
            _count("linear")
            return _below_autograd(torch.ops.kwker.linear.default, input, w, b)
        if path is not None:
            _count("linear_torch")
            return _state["linear_forward"](self, input)
        return _run_chosen(
            key,
            lambda: _below_autograd(torch.ops.kwker.linear.default, input, w, b),
            lambda: _state["linear_forward"](self, input),
            "linear",
        )
    reason = _linear_reason(input, w, b) or _AMX_REASON
    _log_once(reason)
    _count("linear_torch")
    return _state["linear_forward"](self, input)


def _attention_reason(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float,
    kwargs: dict[str, Any],
) -> str | None:
    """Why kwker::decode_attention cannot stand in for transformers' sdpa here, or None when it can."""
    if query.shape[2] > MAX_DECODE_TOKENS:
        return "prompt"  # the expected case: not worth a log line
    if query.device.type != "cpu" or query.dtype not in _FLOATS or key.dtype != query.dtype:
        return f"attention on {query.device} with dtype {query.dtype}"
    if attention_mask is not None and not _mask_is_all_visible(attention_mask, query.shape[2]):
        return "attention with a mask (padding or a static cache)"
    if dropout:
        return "attention with dropout (training)"
    if torch.is_grad_enabled() and (query.requires_grad or key.requires_grad):
        return "attention that needs gradients (kwker ops are inference-only)"
    for name in ("softcap", "sliding_window", "s_aux", "position_bias"):
        if kwargs.get(name) is not None:
            if name == "sliding_window" and key.shape[2] <= kwargs[name]:
                continue
            return f"attention with {name}"
    if kwargs.get("output_attentions"):
        return "attention with output_attentions=True"
    if not getattr(module, "is_causal", True) and query.shape[2] > 1:
        return "non-causal attention"
    return None


class _MaskVerdict(threading.local):
    """The last mask checked and its verdict, per thread: two threads generating at once (one padded
    batch, one not) must never take each other's verdict. One (mask, verdict) pair, replaced whole."""

    last: tuple[torch.Tensor, bool] | None = None


_mask_cache = _MaskVerdict()


def _mask_is_all_visible(mask: torch.Tensor, q_len: int) -> bool:
    """True when a mask hides nothing a causal-from-the-end rule would not hide (one query token and an
    all-visible row). The same mask object is passed to every layer of a forward: check it once."""
    last = _mask_cache.last
    if last is not None and last[0] is mask:
        return last[1]
    visible = False
    if q_len == 1 and mask.dim() == 4 and mask.shape[2] == 1:
        visible = bool(mask.all()) if mask.dtype == torch.bool else bool((mask == 0).all())
    _mask_cache.last = (mask, visible)
    return visible


def _make_attention(original: Callable[..., Any]) -> Callable[..., Any]:
    def kwker_sdpa_attention_forward(
        module: torch.nn.Module,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: torch.Tensor | None,
        dropout: float = 0.0,
        scaling: float | None = None,
        is_causal: bool | None = None,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, None]:
        reason = _attention_reason(module, query, key, attention_mask, dropout, kwargs)

        def stock() -> tuple[torch.Tensor, None]:
            return original(
                module, query, key, value, attention_mask,
                dropout=dropout, scaling=scaling, is_causal=is_causal, **kwargs,
            )  # fmt: skip

        if reason is None and key.shape[2] >= query.shape[2]:
            scale = scaling if scaling is not None else query.shape[-1] ** -0.5

            def ours() -> tuple[torch.Tensor, None]:
                out = _below_autograd(torch.ops.kwker.decode_attention, query, key, value, float(scale))
                return out.transpose(1, 2), None  # transformers expects [B, T, H, D]

            # Keys grow every step: one decision per power-of-two key count.
            shape = (*query.shape[:3], key.shape[1], query.shape[3], rows_bucket(key.shape[2]))
            return _run_chosen(("attention", query.dtype, shape), ours, stock, "attention")
        if reason is not None and reason != "prompt":
            _log_once(reason)
        _count("attention_torch")
        return stock()

    return kwker_sdpa_attention_forward


def install(model: torch.nn.Module | None = None, *, choose: str = "measure") -> None:
    """Route linears and decode attention through the kwker ops, for every model in the process.

    ``choose="measure"`` (the default): the first calls of each shape run on both kwker and torch,
    timed, and the shape then stays on the faster (``choices()`` tells what was decided), so installing
    never makes a call slower. ``choose="kwker"``: every call kwker computes exactly goes to kwker.
    ``model`` is optional: when given, it is only checked for modules that will stay on torch (logged).
    Calling ``install()`` twice is harmless (the second call may change ``choose``).
    """
    if choose not in CHOOSE_MODES:
        raise ValueError(f"kwker: install(choose={choose!r}); expected one of {CHOOSE_MODES}")
    if _state:
        _state["choose"] = choose
    else:
        _state["choose"] = choose
        _state["linear_forward"] = torch.nn.Linear.forward
        torch.nn.Linear.forward = _linear_forward  # type: ignore[method-assign]
        try:
            from transformers.modeling_utils import AttentionInterface
        except ImportError:  # transformers absent: only the linears are routed
            log.info("kwker: transformers not found; only nn.Linear is routed to kwker")
        else:
            original = AttentionInterface._global_mapping["sdpa"]
            _state["sdpa"] = original
            AttentionInterface._global_mapping["sdpa"] = _make_attention(original)
    if model is not None:
        _report_model(model)


def uninstall() -> None:
    """Restore stock torch/transformers behaviour."""
    if not _state:
        return
    torch.nn.Linear.forward = _state.pop("linear_forward")  # type: ignore[method-assign]
    if "sdpa" in _state:
        from transformers.modeling_utils import AttentionInterface

        AttentionInterface._global_mapping["sdpa"] = _state.pop("sdpa")
    _state.clear()
    _mask_cache.last = None


def is_installed() -> bool:
    return bool(_state)


def stats() -> dict[str, int]:
    """Calls routed to kwker and left on torch since the last ``reset_stats()``."""
    return dict(_counts)


def reset_stats() -> None:
    with _counts_lock:
        for k in _counts:
            _counts[k] = 0


def choices() -> dict[str, int]:
    """How many call shapes the measured choice has put on each path so far: {"kwker": n, "torch": m}."""
    return _choice.summary()


def reset_choices() -> None:
    """Forget every measured decision (the next calls of each shape are measured again)."""
    _choice.clear()


@functools.cache
def _torch_uses_amx() -> bool:
    """Whether torch's bf16 GEMM runs on AMX tiles here (oneDNN; KWKER_PROMPT_ON_TORCH=0 disables)."""
    if os.environ.get("KWKER_PROMPT_ON_TORCH", "1") == "0":
        return False
    amx = getattr(torch.cpu, "_is_amx_tile_supported", None)
    return bool(amx and amx() and torch.backends.mkldnn.is_available())


def prompt_on_torch(rows: int) -> bool:
    """Whether install() leaves a bf16 linear over ``rows`` rows on torch: prompt-sized, on a CPU where
    torch's GEMM has AMX tiles and kwker's tier does not (``KWKER_ISA=avx512`` on an AMX CPU, say). With
    kwker's own ``amx`` tier such calls take the measured choice like any other (``choose="measure"``)."""
    return rows > AMX_MIN_ROWS and _torch_uses_amx() and _native.isa() != "amx"


def _report_model(model: torch.nn.Module) -> None:
    impl = getattr(getattr(model, "config", None), "_attn_implementation", None)
    if impl not in (None, "sdpa"):
        _log_once(f"attention implementation {impl!r} (kwker hooks transformers' 'sdpa')")
    for name, mod in model.named_modules():
        if isinstance(mod, torch.nn.Linear) and mod.weight.dtype not in _FLOATS:
            _log_once(f"Linear {name} with weight dtype {mod.weight.dtype}")
