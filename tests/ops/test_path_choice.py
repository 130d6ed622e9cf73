"""install()'s per-shape choice between kwker and torch: each shape's first calls run both, timed, and it
stays on the faster (so a user who installs never loses); results are the same either way."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
import torch

from kwker_torch import torch_ops
from kwker_torch.ops.path_choice import KWKER, TORCH, PathChoice, rows_bucket


def test_decides_for_the_faster_path_after_its_trials() -> None:
    c = PathChoice()
    times = {("a",): {KWKER: 1.0, TORCH: 2.0}, ("b",): {KWKER: 2.0, TORCH: 1.0}, ("c",): {KWKER: 1.0, TORCH: 0.99}}
    for key, t in times.items():
        for _ in range(2 * (c.WARMUP + c.TRIALS)):
            assert c.pick(key) is None
            path = c.trial_path(key)
            c.record(key, path, t[path])
    assert c.pick(("a",)) == KWKER
    assert c.pick(("b",)) == TORCH
    assert c.pick(("c",)) == KWKER  # within the 3 % margin: kwker keeps it
    assert c.summary() == {KWKER: 2, TORCH: 1}


def test_rows_buckets() -> None:
    assert [rows_bucket(m) for m in (1, 2, 3, 4, 5, 8, 9, 100, 512, 4000)] == [1, 2, 3, 4, 8, 8, 16, 128, 512, 512]


def _slow(fn: Callable[..., Any], seconds: float) -> Callable[..., Any]:
    def slowed(*args: Any, **kwargs: Any) -> Any:
        time.sleep(seconds)
        return fn(*args, **kwargs)

    return slowed


@pytest.mark.parametrize("slow_side", [KWKER, TORCH])
def test_install_keeps_each_shape_on_the_faster_path(slow_side: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """One side made 2 ms slower per call: after its trials every call of the shape runs on the other
    side (counted in stats()), with the same result as stock torch."""
    lin = torch.nn.Linear(64, 48)
    x = torch.randn(1, 64)
    with torch.no_grad():
        want = lin(x)
        torch_ops.reset_choices()
        torch_ops.install()
        if slow_side == KWKER:
            monkeypatch.setattr(torch_ops, "_below_autograd", _slow(torch_ops._below_autograd, 2e-3))
        else:
            torch_ops._state["linear_forward"] = _slow(torch_ops._state["linear_forward"], 2e-3)
        trials = 2 * (PathChoice.WARMUP + PathChoice.TRIALS)
        for _ in range(trials):
            torch.testing.assert_close(lin(x), want, atol=1e-5, rtol=1e-5)
        assert torch_ops.choices() == ({KWKER: 0, TORCH: 1} if slow_side == KWKER else {KWKER: 1, TORCH: 0})
        torch_ops.reset_stats()
        for _ in range(10):
            torch.testing.assert_close(lin(x), want, atol=1e-5, rtol=1e-5)
        stats = torch_ops.stats()
    torch_ops.uninstall()
    torch_ops.reset_choices()
    assert stats["linear" if slow_side == TORCH else "linear_torch"] == 10, stats


def test_choose_kwker_always_runs_kwker() -> None:
    lin = torch.nn.Linear(32, 16)
    with torch.no_grad():
        torch_ops.install(choose="kwker")
        torch_ops.reset_stats()
        for _ in range(20):
            lin(torch.randn(1, 32))
        assert torch_ops.stats()["linear"] == 20
        with pytest.raises(ValueError, match="install\\(choose='fastest'\\); expected one of"):
            torch_ops.install(choose="fastest")
