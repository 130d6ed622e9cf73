"""Sliding-window layers keep only their window (``rust/src/decoder/cache.rs``): on tiny Gemma 2, Gemma 3 (one local
and one global layer) and Mistral configs with windows of 5-7 keys and 1,300 tokens of context, a windowed layer
holds about 1,100 positions (its window, 64 older keys, two prompt chunks) and moves its keys twice; the logits
stay within 1e-5 of the largest of Hugging Face's float32 forward over the whole text (no cache: HF masks the
window itself), after a truncate back across the window's edge too; ``dec.info`` states the smaller cache, a
truncate further back than the kept keys is refused by name, and the prompt cache does not offer a start the
window no longer holds (the answer stays HF's greedy one).
"""

from __future__ import annotations

import pytest
import torch
from fixtures.family_cases import CASES

from kwker_torch import KwkDecoder
from kwker_torch.decoder.common import kv_cache_bytes
from kwker_torch.decoder.runtime import DecoderError
from kwker_torch.testing import generate_greedy, random_model

TOL = 1e-5
CONTEXT, TEXT = 1400, 1300


def rel(a: torch.Tensor, ref: torch.Tensor) -> float:
    return ((a - ref).abs().max() / ref.abs().max()).item()


@pytest.mark.parametrize("case", ["gemma2", "gemma3", "mistral-window"])
def test_a_window_kept_alone_gives_hfs_logits_past_it(case: str) -> None:
    base, over = CASES[case]
    model = random_model(base, torch.float32, num_hidden_layers=2, seed=3, **dict(over, max_position_embeddings=1536))
    window = model.config.sliding_window
    ids = torch.randint(3, 2000, (TEXT,), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        ref = model(ids[None]).logits[0].float()
    dec = KwkDecoder.from_hf(model, precision="preserve", max_batch=2, max_context=CONTEXT)

    # The cache as built: windowed layers hold their window, 64 older keys and two chunks of 512 rows.
    kinds = getattr(model.config, "layer_types", None) or ["sliding_attention"] * 2
    per_position = 2 * model.config.num_key_value_heads * model.config.head_dim * 4
    want = sum(CONTEXT if k == "full_attention" else window - 1 + 64 + 1024 for k in kinds) * per_position
    assert dec.info["kv_bytes_per_slot"] == want < 2 * CONTEXT * per_position
    assert dec.info["kv_bytes_per_token"] == kinds.count("full_attention") * per_position
    assert dec.info["kv_bytes"] == 2 * want
    recipe = {"kv_heads": model.config.num_key_value_heads, "head_dim": model.config.head_dim,
              "layer_specs": [{"window": None if k == "full_attention" else window} for k in kinds]}  # fmt: skip
    assert kv_cache_bytes(recipe, CONTEXT) == want  # the build's memory estimate is the native figure

    (got,) = dec.step([(0, ids[:1200])], logits="all")  # three prompt chunks; the window's keys move
    assert rel(got, ref[:1200]) <= TOL
    least = dec.slot_min_len(0)
    assert 0 < least <= 1200 - 64

    # Back 50 tokens (across the window's edge, inside what is kept), then on in steps of 1 and 3 tokens.
    dec.truncate(0, 1150)
    rows = [dec.step([(0, ids[i : i + n])], logits="all")[0] for i, n in [(1150, 1), (1151, 3), (1154, 146)]]
    assert rel(torch.cat(rows), ref[1150:]) <= TOL

    least = dec.slot_min_len(0)
    with pytest.raises(DecoderError, match="sliding-window layers no longer hold"):
        dec.truncate(0, least - 1)
    assert dec.slot_len(0) == TEXT

    # A prompt sharing only its first 100 tokens with slot 0: the window no longer holds that start, so the
    # prompt cache reads it whole (nothing reused) and the answer is HF's.
    prompt = torch.cat([ids[:100], torch.randint(3, 2000, (20,), generator=torch.Generator().manual_seed(9))])
    want_toks = generate_greedy(model, prompt[None], 6, exact=True)[0, len(prompt) :].tolist()
    done = dec.generate(prompt, 6, slots=[0], prompt_lookup=0)
    assert done.cached == 0 and done.tokens == want_toks
