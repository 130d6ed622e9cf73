"""``max_context="auto"`` (the server's default, ``--max-context 0``): the model's whole trained context where the
slots' KV cache fits in half of the memory available, else the longest context that does (in steps of 256), said
in the log; sliding-window layers count only what they hold.
"""

from __future__ import annotations

import logging

import pytest
import torch

from kwker_torch import KwkDecoder
from kwker_torch.decoder import build
from kwker_torch.decoder.common import kv_cache_bytes
from kwker_torch.serve.options import ServeOptions
from kwker_torch.testing import random_model

GLOBAL = {"kv_heads": 2, "head_dim": 64, "layer_specs": [{"window": None}] * 2}
WINDOWED = {**GLOBAL, "layer_specs": [{"window": 512}, {"window": None}]}


def test_auto_takes_the_trained_context_when_it_fits(caplog: pytest.LogCaptureFixture) -> None:
    model = random_model("SmolLM2-360M", torch.float32, num_hidden_layers=2, max_position_embeddings=8192)
    with caplog.at_level(logging.INFO, logger="kwker_torch"):
        dec = KwkDecoder.from_hf(model, max_batch=2, max_context="auto")
    assert dec.max_context == 8192
    assert "max_context auto = 8192 tokens per slot (the model's trained context)" in caplog.text
    assert dec.info["kv_bytes"] == 2 * dec.info["kv_bytes_per_slot"]


def test_auto_takes_the_longest_context_that_fits(monkeypatch: pytest.MonkeyPatch,
                                                   caplog: pytest.LogCaptureFixture) -> None:  # fmt: skip
    # Memory for 4 slots of 1,000 tokens in half of what is available: 768 tokens (a multiple of 256 below).
    monkeypatch.setattr(build, "mem_available", lambda: 2 * 4 * kv_cache_bytes(GLOBAL, 1000))
    with caplog.at_level(logging.INFO, logger="kwker_torch"):
        assert build.context_that_fits(GLOBAL, 32768, 4) == 768
    assert "trained for 32768" in caplog.text and "lower the slots" in caplog.text
    # A windowed layer holds its window (511 + 64 + 2 x 512 positions) whatever the context: memory for 8,000
    # positions a slot (two global layers of 4,000) holds 6,401 in the global layer beside it.
    monkeypatch.setattr(build, "mem_available", lambda: 2 * 4 * kv_cache_bytes(GLOBAL, 4000))
    assert build.context_that_fits(GLOBAL, 32768, 4) == 3840
    assert build.context_that_fits(WINDOWED, 32768, 4) == 6400
    # Too little memory for even 256 tokens still gives a usable context (the build's own check decides).
    monkeypatch.setattr(build, "mem_available", lambda: 1)
    assert build.context_that_fits(GLOBAL, 32768, 4) == 256


def test_the_server_flag_takes_zero_for_auto() -> None:
    assert ServeOptions().max_context == 0 and ServeOptions().check().max_context == 0
    with pytest.raises(ValueError, match=r"--max-context must be an integer >= 0 \(0: as long as memory allows\)"):
        ServeOptions(max_context=-1).check()
    with pytest.raises(ValueError, match='max_context must be a positive int or "auto"'):
        KwkDecoder.from_hf(random_model("SmolLM2-360M", torch.float32, num_hidden_layers=1), max_context="all")
