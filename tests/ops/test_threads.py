"""Entry points called from several Python threads at once (as a server does) give the same results as
the same calls made one after another: install()'s mask verdicts, the compile backend's plan cache,
generate() under install(), and the tier probe (which must not switch the tier other threads run on).
The GIL's switch interval is cut to 1 us so that threads interleave between almost every bytecode."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch

import kwker_torch
from kwker_torch import torch_ops
from kwker_torch.compile.executor import StepExecutor
from kwker_torch.testing import generate_greedy, random_model


@pytest.fixture(autouse=True)
def _fast_switching() -> Iterator[None]:
    previous = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(previous)


def run_threads(fns: list[Callable[[], Any]]) -> list[Any]:
    """Runs every fn in its own thread, started together; returns their results, re-raising errors."""
    results: list[Any] = [None] * len(fns)
    errors: list[BaseException] = []
    start = threading.Barrier(len(fns))

    def body(i: int) -> None:
        try:
            start.wait()
            results[i] = fns[i]()
        except BaseException as e:  # noqa: BLE001  (re-raised in the main thread)
            errors.append(e)

    threads = [threading.Thread(target=body, args=(i,)) for i in range(len(fns))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return results


def test_mask_verdicts_are_per_thread() -> None:
    """One thread's all-visible mask and another's padding mask, checked in turn, layer after layer: each
    thread always gets its own mask's verdict (a shared (mask, verdict) cache handed them across)."""
    visible = torch.zeros(2, 1, 1, 9)
    padded = torch.zeros(2, 1, 1, 9)
    padded[1, 0, 0, :3] = float("-inf")

    def check(mask: torch.Tensor, want: bool) -> int:
        wrong = 0
        for _ in range(20000):
            wrong += torch_ops._mask_is_all_visible(mask, 1) != want
            mask = mask.clone() if _ % 30 == 0 else mask  # a new forward: a new mask object
        return wrong

    wrong = run_threads([lambda: check(visible, True), lambda: check(padded, False)])
    assert wrong == [0, 0]
    # The verdict is kept per thread: another thread's check neither replaces nor reads this one's. (On
    # CPython with the GIL the old shared pair could not interleave between its two stores, but a
    # free-threaded build can; this is the property that rules it out.)
    assert torch_ops._mask_is_all_visible(visible, 1)
    other = run_threads([lambda: (torch_ops._mask_is_all_visible(padded, 1), torch_ops._mask_cache.last)])[0]
    assert other[0] is False and other[1][0] is padded
    assert torch_ops._mask_cache.last[0] is visible and torch_ops._mask_cache.last[1] is True


def test_generate_in_two_threads_equals_serial() -> None:
    """Two threads generate under install() at once, one a left-padded batch and one not: each gets the
    tokens it gets alone (float32 model; the measured per-shape choice is shared and locked)."""
    model = random_model("SmolLM2-360M", torch.bfloat16, num_hidden_layers=2).float()
    g = torch.Generator().manual_seed(0)
    plain = torch.randint(3, 1000, (1, 9), generator=g)
    batch = torch.randint(3, 1000, (2, 9), generator=g)
    mask = torch.ones_like(batch)
    mask[1, :4] = 0

    def gen_plain() -> torch.Tensor:
        return generate_greedy(model, plain, 12, exact=True)

    def gen_padded() -> torch.Tensor:
        return generate_greedy(model, batch, 12, exact=True, attention_mask=mask, pad_token_id=0)

    torch_ops.install()
    serial = [gen_plain(), gen_padded()]
    for _ in range(2):
        together = run_threads([gen_plain, gen_padded])
        assert torch.equal(together[0], serial[0])
        assert torch.equal(together[1], serial[1])
    torch_ops.uninstall()
    assert torch.equal(serial[0], generate_greedy(model, plain, 12, exact=True))


def test_step_executor_plan_cache_under_threads() -> None:
    """Threads calling one compiled graph with many input shapes and an LRU of 2 plans: concurrent
    lookups and evictions neither raise (a KeyError from move_to_end after another thread's eviction)
    nor mix up results."""
    torch.manual_seed(0)
    lin = _Mlp().eval()
    gm = torch.fx.symbolic_trace(lin)
    ex = StepExecutor(gm)
    ex.key_args = [0]  # plan per input shape, as for a graph with a dynamic length
    ex.MAX_PLANS = 2
    inputs = [torch.randn(m, 16) for m in (1, 2, 3, 4, 5)]
    with torch.no_grad():
        want = [lin(x) for x in inputs]

        def hammer(offset: int) -> bool:
            for i in range(150):
                j = (i + offset) % len(inputs)
                torch.testing.assert_close(ex(inputs[j]), want[j], atol=1e-5, rtol=1e-5)
            return True

        assert run_threads([lambda o=o: hammer(o) for o in range(4)]) == [True] * 4
    assert len(ex.plans) <= 2
    with torch.no_grad():  # the native path still works after the contention (planned, then run)
        for _ in range(3):
            torch.testing.assert_close(ex(inputs[0]), want[0], atol=1e-5, rtol=1e-5)
    plan = ex.plans[(tuple(inputs[0].shape),)]
    assert plan is not None and plan.runs >= 1


class _Mlp(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w1 = torch.nn.Parameter(torch.randn(32, 16))
        self.w2 = torch.nn.Parameter(torch.randn(8, 32))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.linear(torch.nn.functional.silu(torch.nn.functional.linear(x, self.w1)), self.w2)


def test_tier_probe_does_not_switch_the_tier_in_use() -> None:
    """supported_isas() asks without switching: a thread watching isa() while another probes in a loop
    never sees the tier change (the probe used to set each tier in turn, process-wide)."""
    current = kwker_torch.isa()
    stop = threading.Event()
    probed = [0]

    def probe() -> int:
        while not stop.is_set():
            kwker_torch.supported_isas()
            probed[0] += 1
        return probed[0]

    def watch() -> set[str]:
        # Watch until the prober has really run alongside: under the GIL the watcher may otherwise finish
        # its reads before the prober is first scheduled (CI saw 0 probes). Bounded so it cannot hang.
        seen = set()
        reads = 0
        deadline = time.monotonic() + 30.0
        while (reads < 20000 or probed[0] < 200) and time.monotonic() < deadline:
            seen.add(kwker_torch.isa())
            reads += 1
        stop.set()
        return seen

    probes, seen = run_threads([probe, watch])
    assert probes >= 200, f"the prober ran {probes} times alongside the watcher"
    assert seen == {current}
