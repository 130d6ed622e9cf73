"""Shared fixtures: the ISA tiers this host supports, and the real SmolLM2-135M (loaded once)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

import kwker_torch
from kwker_torch import torch_ops


@pytest.fixture(params=kwker_torch.supported_isas())
def tier(request: pytest.FixtureRequest) -> Iterator[str]:
    """Runs a test once per tier the host supports, restoring the default tier afterwards."""
    previous = kwker_torch.isa()
    kwker_torch.set_isa(request.param)
    assert kwker_torch.isa() == request.param
    yield request.param
    kwker_torch.set_isa(previous)


@pytest.fixture(scope="session")
def smollm2() -> tuple[torch.nn.Module, object]:
    from kwker_torch.testing import load_smollm2

    return load_smollm2(torch.bfloat16)


@pytest.fixture(scope="session")
def smollm2_f32() -> tuple[torch.nn.Module, object]:
    from kwker_torch.testing import load_smollm2

    return load_smollm2(torch.float32)


@pytest.fixture(autouse=True)
def _never_leave_installed() -> Iterator[None]:
    yield
    torch_ops.uninstall()
