"""Run-time ISA dispatch: the tiers the CPU has are found and can be forced, KWKER_ISA is honoured,
and KWKER_NUM_THREADS caps the threads."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import kwker_torch
from kwker_torch.ops.native import TIERS
from kwker_torch.peer.build import cpu_flags as _cpu_flags


def test_detected_tiers_match_cpu_flags() -> None:
    flags = _cpu_flags()
    tiers = kwker_torch.supported_isas()
    assert tiers[0] == "generic"
    assert ("avx2" in tiers) == ({"avx2", "fma"} <= flags)
    assert ("avx512" in tiers) == ({"avx512f", "avx512bw", "avx512vl", "avx512dq", "fma"} <= flags)
    assert ("avxvnni" in tiers) == ({"avx2", "fma", "f16c", "avx_vnni"} <= flags)  # /proc/cpuinfo's name
    # Linux lists amx_* only where it also saves tile state and grants it (arch_prctl) on request.
    assert ("amx" in tiers) == ("avx512" in tiers and {"amx_tile", "amx_bf16"} <= flags)
    assert kwker_torch.isa() == tiers[-1]  # default: the best tier


def test_unknown_tier_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown instruction-set tier 'sse9'"):
        kwker_torch.set_isa("sse9")
    assert kwker_torch.isa() == kwker_torch.supported_isas()[-1]


@pytest.mark.parametrize("tier", [t for t in TIERS if t not in kwker_torch.supported_isas()])
def test_tier_this_cpu_lacks_is_refused(tier: str) -> None:
    """Only where the CPU really lacks a tier (an AVX2 machine: avx512); the test below covers it anywhere."""
    with pytest.raises(ValueError, match=f"this CPU cannot run the '{tier}' tier"):
        kwker_torch.set_isa(tier)


def test_missing_tiers_are_refused_as_on_a_smaller_cpu() -> None:
    """KWKER_ISA_MAX=generic makes this CPU look like one without AVX2 or AVX-512: set_isa of either
    raises a clear error, KWKER_ISA=avx512 falls back to the best remaining tier with one warning, and
    the ops still compute on the generic tier."""
    code = (
        "import torch, kwker_torch\n"
        "print(kwker_torch.isa(), ','.join(kwker_torch.supported_isas()))\n"
        "for t in ('avx2', 'avx512'):\n"
        "    try:\n"
        "        kwker_torch.set_isa(t)\n"
        "    except ValueError as e:\n"
        "        print('refused', e)\n"
        "x, w = torch.randn(3, 70), torch.randn(5, 70)\n"
        "print(torch.allclose(torch.ops.kwker.linear(x, w), x @ w.T, atol=1e-5))\n"
    )
    env = dict(os.environ, KWKER_ISA_MAX="generic", KWKER_ISA="avx512")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    lines = out.stdout.splitlines()
    assert lines[0] == "generic generic"
    assert lines[1] == "refused kwker: this CPU cannot run the 'avx2' tier; it supports ['generic']"
    assert lines[2] == "refused kwker: this CPU cannot run the 'avx512' tier; it supports ['generic']"
    assert lines[3] == "True"
    assert "KWKER_ISA=avx512 asks for avx512 which this CPU does not support; using generic" in out.stderr


@pytest.mark.parametrize("tier", kwker_torch.supported_isas())
def test_env_forces_tier(tier: str) -> None:
    code = "import torch, kwker_torch; print(kwker_torch.isa(), kwker_torch.num_threads())"
    env = dict(os.environ, KWKER_ISA=tier, KWKER_NUM_THREADS="1")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == [tier, "1"]
