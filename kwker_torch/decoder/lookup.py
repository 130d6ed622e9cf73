"""The project's one draft policy (``rust/src/decoder/lookup.rs``) for the Python callers: the server's
prompt lookup, Hugging Face's ``prompt_lookup_num_tokens`` under ``decode.install()`` and draft-model
speculation.

Prompt lookup proposes the tokens that followed the latest earlier occurrence of the history's last 3, then
2 tokens. How many drafts a step tries: the count that maximises expected tokens per second from the
sequence's measured acceptance rate and the measured time of a step by its rows (plus, for a draft model,
its time per draft token), capped by a size that doubles after a fully kept draft and falls to what was
kept plus one otherwise; drafts of which nothing was kept pause drafting 1, 2, 4 .. 16 steps. Nothing here
decides what is emitted: the caller keeps a draft only where the model itself chooses it.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Sequence

import torch

from . import native


def _ids(history: Sequence[int]) -> torch.Tensor:
    return torch.tensor(list(history), dtype=torch.int64)


def propose(history: Sequence[int], k: int) -> list[int]:
    """Up to ``k`` tokens that followed the latest earlier occurrence of the history's last tokens."""
    if k <= 0:
        return []
    h, out, n, err = _ids(history), torch.empty(k, dtype=torch.int64), ctypes.c_int64(), native.err_buf()
    rc = native.LIB.kwker_lookup_propose(native.ptr(h, ctypes.c_int64), h.numel(), k, native.ptr(out, ctypes.c_int64),
                                         ctypes.byref(n), err, native.ERR_LEN)  # fmt: skip
    native.check(rc, err, ValueError)
    return out[: n.value].tolist()


class DraftPolicy:
    """One sequence's draft sizing (``lookup.rs``'s ``Lookup`` and its measured step times)."""

    def __init__(self, max_draft: int, pauses: bool = True) -> None:
        self.max_draft = max(int(max_draft), 0)
        self._h = native.LIB.kwker_lookup_new(self.max_draft, int(pauses))
        self._lock = threading.Lock()  # the handle's calls are short; this keeps free() after the last one

    def next(self, history: Sequence[int], limit: int, batch: int = 1, rows: int = 1) -> list[int]:
        """Prompt-lookup drafts for the next step: at most ``limit``, in a step of ``batch`` sequences that has
        ``rows`` rows without them."""
        if limit <= 0 or self.max_draft == 0:
            return []
        h, out, n, err = _ids(history), torch.empty(limit, dtype=torch.int64), ctypes.c_int64(), native.err_buf()
        with self._lock:
            rc = native.LIB.kwker_lookup_next(self._h, native.ptr(h, ctypes.c_int64), h.numel(), limit, batch, rows,
                                              native.ptr(out, ctypes.c_int64), ctypes.byref(n), err,
                                              native.ERR_LEN)  # fmt: skip
        native.check(rc, err, ValueError)
        return out[: n.value].tolist()

    def size(self, limit: int, batch: int = 1, rows: int = 1) -> int:
        """How many tokens a draft model should make for the next step (at most ``limit``)."""
        with self._lock:
            return max(int(native.LIB.kwker_lookup_size(self._h, max(limit, 0), batch, rows)), 0)

    def update(self, proposed: int, accepted: int) -> None:
        """Records a verification: ``proposed`` drafts, ``accepted`` of them kept."""
        with self._lock:
            native.LIB.kwker_lookup_update(self._h, proposed, accepted)

    def record(self, rows: int, secs: float, draft_secs: float = 0.0) -> None:
        """Records a step of ``rows`` rows that took ``secs`` (and a draft token that took ``draft_secs``)."""
        with self._lock:
            native.LIB.kwker_lookup_record(self._h, rows, float(secs), float(draft_secs))

    @property
    def counts(self) -> tuple[int, int]:
        """(drafts proposed, drafts accepted) so far."""
        out = (ctypes.c_int64 * 2)()
        with self._lock:
            native.LIB.kwker_lookup_counts(self._h, out)
        return int(out[0]), int(out[1])

    def __del__(self) -> None:
        h, self._h = getattr(self, "_h", None), None
        if h:
            native.LIB.kwker_lookup_free(h)
