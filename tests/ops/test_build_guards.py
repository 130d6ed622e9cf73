"""The native library refuses to build in a way that would break its error contract: with
``panic = "abort"`` a Rust panic could not be caught and turned into a Python error, so the shim crate
stops the build with a message saying why (a compile-time guard, ``csrc-shim/src/lib.rs``)."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository


@pytest.mark.skipif(shutil.which("cargo") is None, reason="needs the Rust toolchain that builds kwker")
def test_abort_on_panic_build_is_refused() -> None:
    env = dict(
        os.environ,
        RUSTFLAGS="-C panic=abort",
        CARGO_TARGET_DIR=os.path.join(ROOT, "target", "panic-abort-check"),  # keeps the real build's cache
        KWKER_TORCH_DIR=os.path.dirname(torch.__file__),
    )
    out = subprocess.run(
        ["cargo", "check", "-q", "-p", "kwker-shim"], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert out.returncode != 0
    assert "error: kwker-shim must be built with panic = \"unwind\"" in out.stderr, out.stderr[-2000:]
