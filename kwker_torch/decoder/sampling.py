"""The project's one sampler (``rust/src/decoder/sample.rs``) for the Python callers that choose tokens
outside the native loop: the server's per-request sampler and draft-model speculation.

Contract: exactly the native loop's rule and random stream. Temperature 0 (or ``top_k == 1``) is greedy,
the first index among equal maxima; else temperature, top-k, top-p, then min-p, as Hugging Face's warpers
in that order, probabilities in float64, drawn from xoshiro256** seeded as ``KwkDecoder.generate`` seeds its
first sequence, so ``sample`` over the same logits with ``Rng(seed)`` gives the tokens ``generate(seed=seed)``
gives. An ``Rng`` is four integers the caller keeps (one per request): it is not shared between threads.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import torch

from . import native


class Rng:
    """A seeded generator whose state lives here and advances with every draw made with it."""

    def __init__(self, seed: int) -> None:
        self.state = (ctypes.c_uint64 * 4)()
        native.LIB.kwker_rng_seed(int(seed) & (2**64 - 1), self.state)

    def uniform(self) -> float:
        """A float64 uniform in [0, 1)."""
        return float(native.LIB.kwker_rng_uniform(self.state))


@dataclass(frozen=True)
class Warp:
    """How logits become the distribution a token is drawn from (temperature 0: greedy)."""

    temperature: float = 1.0
    top_k: int = 0  # 0: off
    top_p: float = 1.0
    min_p: float = 0.0

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0 or self.top_k == 1

    def _args(self) -> native.SampleArgs:
        return native.SampleArgs(float(self.temperature), int(self.top_k), float(self.top_p), float(self.min_p))


def _row(logits: torch.Tensor) -> torch.Tensor:
    if logits.dim() != 1 or logits.numel() == 0:
        raise ValueError(f"kwker: sampling takes one row of logits (1-D, non-empty), got shape {tuple(logits.shape)}")
    return logits.detach().to("cpu", torch.float32).contiguous()


def sample(logits: torch.Tensor, warp: Warp, rng: Rng) -> int:
    """The next token from a row of logits (``sample.rs``'s ``sample``)."""
    row, out, err = _row(logits), ctypes.c_int64(), native.err_buf()
    rc = native.LIB.kwker_sample(native.ptr(row, ctypes.c_float), row.numel(), ctypes.byref(warp._args()), rng.state,
                                 ctypes.byref(out), err, native.ERR_LEN)  # fmt: skip
    native.check(rc, err, ValueError)
    return int(out.value)


def distribution(logits: torch.Tensor, warp: Warp) -> torch.Tensor:
    """The float64 distribution ``sample`` draws from (zero where the cuts remove a token)."""
    row, err = _row(logits), native.err_buf()
    out = torch.empty(row.numel(), dtype=torch.float64)
    rc = native.LIB.kwker_sample_distribution(native.ptr(row, ctypes.c_float), row.numel(), ctypes.byref(warp._args()),
                                              out.data_ptr(), err, native.ERR_LEN)  # fmt: skip
    native.check(rc, err, ValueError)
    return out


def draw(weights: torch.Tensor, rng: Rng) -> int:
    """A token drawn from non-negative weights over the vocabulary (normalised or not)."""
    w = weights.detach().to("cpu", torch.float64).contiguous()
    out, err = ctypes.c_int64(), native.err_buf()
    rc = native.LIB.kwker_sample_draw(w.data_ptr(), w.numel(), rng.state, ctypes.byref(out), err, native.ERR_LEN)
    native.check(rc, err, ValueError)
    return int(out.value)
