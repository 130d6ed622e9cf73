"""backend="kwker" after a model's parameters get new storage: every way a user can do that (``p.data =``,
``module.to()`` with a copy, ``load_state_dict(assign=True)``, ``share_memory_()``) gives eager's logits
on the next calls, and every address the native executor hands to Rust is a tensor's current one (before
the fix the executor kept planning-time addresses: NaN logits, or reads of freed memory)."""

from __future__ import annotations

import gc
from collections.abc import Callable

import pytest
import torch

from kwker_torch import compile_backend
from kwker_torch.compile.executor import StepExecutor
from kwker_torch.testing import random_model


def _data_swap(m: torch.nn.Module) -> None:
    for p in m.parameters():
        p.data = p.data.clone() * 1.5


def _to_with_copy(m: torch.nn.Module) -> None:
    m.double()  # new storage for every parameter ...
    with torch.no_grad():
        for p in m.parameters():
            p.mul_(1.5)
    m.float()  # ... and again, back in float32


def _load_assign(m: torch.nn.Module) -> None:
    sd = {k: v.clone() * 1.5 for k, v in m.state_dict().items()}
    m.load_state_dict(sd, assign=True)


def _share_memory(m: torch.nn.Module) -> None:
    m.share_memory()  # moves every storage into shared memory (same values, new addresses)


SWAPS: dict[str, Callable[[torch.nn.Module], None]] = {
    "p.data=": _data_swap,
    "module.to": _to_with_copy,
    "load_state_dict(assign=True)": _load_assign,
    "share_memory_": _share_memory,
}


@pytest.mark.parametrize("swap", list(SWAPS))
def test_new_parameter_storage_is_seen(swap: str) -> None:
    model = random_model("SmolLM2-360M", torch.bfloat16, num_hidden_layers=2).float().eval()
    ids = torch.randint(3, 1000, (1, 7), generator=torch.Generator().manual_seed(0))
    runs: list = []

    def backend(gm: torch.fx.GraphModule, example_inputs: list) -> object:
        fn = compile_backend.kwker_backend(gm, example_inputs)
        runs.append(fn)
        return fn

    torch._dynamo.reset()
    compiled = torch.compile(model, backend=backend)
    try:
        with torch.no_grad():
            for _ in range(3):  # FX, then planned, then native
                torch.testing.assert_close(compiled(ids).logits, model(ids).logits, atol=1e-4, rtol=1e-4)
            SWAPS[swap](model)
            gc.collect()
            garbage = [torch.full((1 << 16,), float("nan")) for _ in range(64)]  # reuse freed memory
            ref = model(ids).logits
            for _ in range(3):
                got = compiled(ids).logits
                assert torch.isfinite(got).all(), swap
                torch.testing.assert_close(got, ref, atol=1e-4 * ref.abs().max().item(), rtol=1e-4)
        del garbage
        # The native executor ran after the swap, and every input address it passed is a live tensor's.
        live = {ids.data_ptr()} | {t.data_ptr() for t in [*model.parameters(), *model.buffers()]}
        ex = runs[-1].kwker_state["gm"]
        assert isinstance(ex, StepExecutor)
        plans = [p for p in ex.plans.values() if p is not None]
        assert plans and all(p.runs >= 1 for p in plans)
        for p in plans:
            stale = [slot for slot, _, _ in p.inputs if p.addrs[slot] not in live]
            assert not stale, f"{swap}: executor slots {stale} point at memory no tensor owns"
    finally:
        torch._dynamo.reset()
