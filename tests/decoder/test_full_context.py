"""Every family at its full trained context under ``max_context=`` (issue 33 item 4): Qwen3 (Qwen3-0.6B's published
40,960), Gemma 3 (32,768, local layers with the published 512-token window beside a global one), Phi-4-mini (131,072,
LongRoPE's long table past original_max_position_embeddings = 4,096; head_dim 128 with partial rotary 0.75 and the
published long_factor) and Llama 3.2 (131,072, llama3 rope scaling from an original 8,192), each a published config
made tiny (a hidden of 128-256, two heads, one or two layers; what sets the positions kept).

Each decoder is built with ``max_context`` = the trained context (its rotary tables cover 2x that), and ``"auto"``
picks the same. A prompt of ``n - 4`` random tokens is prefilled, then 4 greedy steps fill the context to ``n``; the
last 4 prompt rows and every step's logits are compared with Hugging Face's own float32 forward (sdpa attention,
stepped with its own cache) of the same ids: within 1e-5 of the largest logit, greedy tokens identical.

``n`` is the full trained context for Qwen3 and Gemma 3. For the two 131,072-token families the default stops at a few
thousand tokens that still pass what changes with depth: Phi-4-mini's 4,094-token prompt and first two steps use
LongRoPE's short table, its last two steps (sequences of 4,097 and 4,098 tokens) the long one (HF switches on the
call's largest position; the cached keys keep their short rotation),
Llama 3.2 runs past its original 8,192. ``KWKER_FULL_CONTEXT=1`` runs both at 131,072.

Measured (2 shared Zen 4 cores; worst row / largest logit, HF's time, kwker's):
  - qwen3 at 40,960: 9.0e-7; HF 12.6 s, kwker 17.6 s (34 s with the model and "auto")
  - gemma3 at 32,768: 2.5e-6; HF 28.8 s, kwker 11.9 s (41 s; HF's sliding-window mask is a full 32k x 32k
    one: 6.2 GB peak)
  - phi4-mini at 4,098: 5.3e-7 (1.3 s); llama3.2 at 8,704: 3.1e-7 (0.7 s)
  - with KWKER_FULL_CONTEXT=1: phi4-mini at 131,072: 3.4e-7, HF 58.9 s, kwker 102.4 s; llama3.2 at 131,072: 6.6e-7,
    HF 35.5 s, kwker 50.2 s (4 min 11 s for the two, 2.5 GB peak)
"""

from __future__ import annotations

import os
import time
from typing import Any

import pytest
import torch

from kwker_torch import KwkDecoder
from kwker_torch.testing import random_model
from kwker_torch.testing.models import PHI4_MINI_LONG_FACTOR
from kwker_torch.testing.reference import hf_steps

TOL = 1e-5
STEPS = 4  # greedy steps that end the context, and prompt rows compared before them
FULL = os.environ.get("KWKER_FULL_CONTEXT") == "1"
VOCAB = 2048
SMALL = {"intermediate_size": 512, "num_attention_heads": 2, "num_key_value_heads": 1, "vocab_size": VOCAB,
         "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0}  # fmt: skip

# case -> (published config, layers, overrides, trained context, tokens run by default)
CASES: dict[str, tuple[str, int, dict[str, Any], int, int]] = {
    "qwen3": ("Qwen3-0.6B", 2, dict(SMALL, hidden_size=256, head_dim=128), 40960, 40960),
    "gemma3": ("Gemma-3-1B", 2, dict(SMALL, hidden_size=256, head_dim=256,
                                     layer_types=["sliding_attention", "full_attention"]), 32768, 32768),
    # hidden 256 over 2 heads: head_dim 128, 96 rotated (48 frequencies, the published long_factor).
    "phi4-mini": ("Phi-4-mini", 1, dict(SMALL, hidden_size=256, rope_scaling=dict(
        type="longrope", short_factor=[1.0] * 48, long_factor=PHI4_MINI_LONG_FACTOR)), 131072, 4096 + 2),
    "llama3.2": ("Llama-3.2-1B", 1, dict(SMALL, hidden_size=128, head_dim=64), 131072, 8192 + 512),
}  # fmt: skip


@pytest.mark.parametrize("case", list(CASES))
def test_the_end_of_the_trained_context_within_1e5_of_hf_float32(case: str) -> None:
    name, layers, over, trained, default = CASES[case]
    model = random_model(name, torch.float32, num_hidden_layers=layers, **over)
    model.config._attn_implementation = "sdpa"
    assert model.config.max_position_embeddings == trained  # the published context, not an override
    n = trained if FULL else default
    ids = torch.randint(3, VOCAB, (n - STEPS,), generator=torch.Generator().manual_seed(1))
    t0 = time.perf_counter()
    rows, toks = hf_steps(model, ids, STEPS, keep=STEPS)
    t1 = time.perf_counter()
    dec = KwkDecoder.from_hf(model, max_context=trained)
    assert dec.max_context == trained
    dec.step([(0, ids[:-STEPS])])
    got = [dec.step([(0, ids[-STEPS:])], logits="all")[0]]
    for i, tok in enumerate(toks):
        assert int(got[-1][-1].argmax()) == tok, f"step {i}: greedy token differs from HF float32's"
        got.append(dec.step([(0, [tok])])[0])
    worst = max(((g - r).abs().max() / r.abs().max()).item() for g, r in zip(got, rows, strict=True))
    print(f"{case} at {n} of {trained} tokens: worst row {worst:.2e} of the largest logit; HF {t1 - t0:.1f} s, "
          f"kwker {time.perf_counter() - t1:.1f} s")  # fmt: skip
    assert worst <= TOL, worst
    del dec
    assert KwkDecoder.from_hf(model, max_context="auto").max_context == trained  # the whole context fits here
