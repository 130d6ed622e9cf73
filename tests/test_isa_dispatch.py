"""Run-time ISA dispatch: the tiers the CPU has are found and can be forced, KWKER_ISA is honoured,
and KWKER_NUM_THREADS caps the threads."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import kwker_torch


def _cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def test_detected_tiers_match_cpu_flags() -> None:
    flags = _cpu_flags()
    tiers = kwker_torch.supported_isas()
    assert tiers[0] == "generic"
    assert ("avx2" in tiers) == ({"avx2", "fma"} <= flags)
    assert ("avx512" in tiers) == ({"avx512f", "avx512bw", "avx512vl", "avx512dq", "fma"} <= flags)
    assert kwker_torch.isa() == tiers[-1]  # default: the best tier


def test_unknown_or_unsupported_tier_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown instruction-set tier 'sse9'"):
        kwker_torch.set_isa("sse9")


@pytest.mark.parametrize("tier", kwker_torch.supported_isas())
def test_env_forces_tier(tier: str) -> None:
    code = "import torch, kwker_torch; print(kwker_torch.isa(), kwker_torch.num_threads())"
    env = dict(os.environ, KWKER_ISA=tier, KWKER_NUM_THREADS="1")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == [tier, "1"]
