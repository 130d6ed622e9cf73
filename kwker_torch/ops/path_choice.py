"""Per-shape choice between a kwker op and torch's own kernel, measured where it matters: inside the
user's workload, with the weights as cold or warm as they really are.

Why: kwker is not faster for every call on every CPU (float32 GEMV on Intel CPUs is at MKL's speed, and
install()'s wrapper costs a few microseconds more than torch's), and a user who installs must never lose.
So the first calls of each shape alternate between the two paths, timing each; after ``TRIALS`` timed
calls of each (the first ``WARMUP`` of each are not counted), the shape stays on the path with the lower
median, for the life of the process. Calls of different shapes are measured separately; shapes whose
size grows every step (an attention's key count) are keyed by size bucket.

Numerics: both paths compute the same function (f32 sums, one rounding to the output type); they differ
in summation order only, so a choice never changes what is computed beyond float rounding.

Thread safety: decisions are read without a lock (a dict lookup); trials are recorded under one lock.
"""

from __future__ import annotations

import statistics
import threading
from collections.abc import Hashable

KWKER, TORCH = "kwker", "torch"


class PathChoice:
    """Decides, per key, which path runs; ``pick`` says which to run now, ``record`` takes its time."""

    WARMUP = 2  # first calls of each path, not counted (allocation, first-touch, oneDNN set-up)
    TRIALS = 5  # timed calls of each path before deciding
    MARGIN = 0.97  # torch must be at least 3 % faster to take a shape from kwker (measurement noise)

    def __init__(self) -> None:
        self.decided: dict[Hashable, str] = {}
        self._times: dict[Hashable, dict[str, list[float]]] = {}
        self._lock = threading.Lock()

    def pick(self, key: Hashable) -> str | None:
        """The decided path for ``key``, or None while it is on trial (then call ``trial_path``)."""
        return self.decided.get(key)

    def trial_path(self, key: Hashable) -> str:
        """The path the next trial call of ``key`` runs: the one with fewer samples so far."""
        with self._lock:
            t = self._times.setdefault(key, {KWKER: [], TORCH: []})
            return KWKER if len(t[KWKER]) <= len(t[TORCH]) else TORCH

    def record(self, key: Hashable, path: str, seconds: float) -> None:
        with self._lock:
            if key in self.decided:
                return
            t = self._times.setdefault(key, {KWKER: [], TORCH: []})
            t[path].append(seconds)
            need = self.WARMUP + self.TRIALS
            if len(t[KWKER]) >= need and len(t[TORCH]) >= need:
                kw = statistics.median(t[KWKER][self.WARMUP :])
                th = statistics.median(t[TORCH][self.WARMUP :])
                self.decided[key] = TORCH if th < self.MARGIN * kw else KWKER
                del self._times[key]

    def summary(self) -> dict[str, int]:
        """How many decided shapes went to each path."""
        paths = list(self.decided.values())
        return {KWKER: paths.count(KWKER), TORCH: paths.count(TORCH)}

    def clear(self) -> None:
        with self._lock:
            self.decided.clear()
            self._times.clear()


def rows_bucket(rows: int) -> int:
    """Rows of a linear call, bucketed: exact up to 4 (decode batches), then powers of two up to 512."""
    if rows <= 4:
        return rows
    return min(1 << (rows - 1).bit_length(), 512)
