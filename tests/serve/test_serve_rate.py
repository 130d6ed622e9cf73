"""The engine's tokens/s gauge (``kwker_tokens_per_second``): tokens made over the last 5 seconds of steps,
kept as a running sum; checked against the sum recomputed from the window, as steps come and old ones leave."""

from __future__ import annotations

import collections

import pytest

from kwker_torch.serve import engine as engine_mod
from kwker_torch.serve.engine import Engine
from kwker_torch.serve.metrics import Metrics


def test_the_rate_gauge_is_the_windows_tokens_over_its_span(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [100.0]
    monkeypatch.setattr(engine_mod.time, "monotonic", lambda: now[0])
    # Only what _count_rate touches: no decoder is needed to count.
    e = Engine.__new__(Engine)
    e._rate, e._rate_tokens, e.metrics = collections.deque(), 0, Metrics()
    steps = [(0.0, 8), (0.5, 8), (1.0, 3), (2.5, 8), (4.0, 1), (5.2, 8), (6.1, 5), (9.0, 2), (20.0, 7), (20.4, 4)]
    for t, made in steps:
        now[0] = 100.0 + t
        e._count_rate(made)
        window = [(s, n) for s, n in steps if 100.0 + s >= now[0] - 5.0 and s <= t]
        assert e._rate_tokens == sum(n for _, n in window)
        if len(window) > 1:
            span = now[0] - (100.0 + window[0][0])
            got = e.metrics.registry.get_sample_value("kwker_tokens_per_second")
            assert got == pytest.approx(sum(n for _, n in window) / span, rel=1e-12)
