"""KV cache formats (``kv_cache=``, ``rust/src/decoder/kv_store.rs``): bf16 and int8 (a scale per head and position)
on tiny Llama, Gemma 3 (a window) and Qwen3 configs: logits near Hugging Face's float32 forward (the error stated
below, measured), the bytes each format says, and every slot verb on the stored values: speculation's rejected drafts
truncated off (prompt lookup gives the greedy text of a plain loop in the same format), a prompt cache that reads
only the new tokens, ``copy_prefix`` (the copied slot's logits are the source's bits), save / load with a format of
its own; an unknown format is refused by name.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from fixtures.family_cases import tiny

from kwker_torch import KwkDecoder
from kwker_torch.serve.options import ServeOptions

# Measured largest |logit - HF float32| / largest |logit| over a 48-token prompt: bf16 1.2e-3 to 3.1e-3, q8 5.1e-3
# to 1.3e-2 (random tiny models; rounding K and V is the only change).
TOL = {"bf16": 1e-2, "q8": 3e-2}
CASE_NAMES = ["llama", "gemma3", "qwen3"]


def hf_rows(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(ids[None]).logits[0].float()


def rel(a: torch.Tensor, ref: torch.Tensor) -> float:
    return ((a - ref).abs().max() / ref.abs().max()).item()


@pytest.mark.parametrize("kv", ["bf16", "q8"])
@pytest.mark.parametrize("case", CASE_NAMES)
def test_formats_stay_near_float32_and_say_their_bytes(case: str, kv: str) -> None:
    model = tiny(case)
    ids = torch.randint(3, 2000, (48,), generator=torch.Generator().manual_seed(2))
    dec = KwkDecoder.from_hf(model, max_batch=2, max_context=128, kv_cache=kv)
    full = KwkDecoder.from_hf(model, max_batch=2, max_context=128)
    assert dec.info["kv_cache"] == kv and full.info["kv_cache"] == "f32"
    d = model.config.head_dim
    ratio = {"bf16": 0.5, "q8": (d + 4) / (4 * d)}[kv]
    assert dec.info["kv_bytes_per_slot"] == ratio * full.info["kv_bytes_per_slot"]
    assert dec.info["kv_bytes_per_token"] == ratio * full.info["kv_bytes_per_token"]
    got = dec.score(ids)
    assert rel(got, hf_rows(model, ids)) <= TOL[kv]
    assert rel(full.score(ids), hf_rows(model, ids)) <= 1e-5  # the f32 cache keeps its contract


@pytest.mark.parametrize("kv", ["bf16", "q8"])
def test_slot_verbs_work_on_the_stored_values(kv: str, tmp_path: Path) -> None:
    model = tiny("qwen3")
    dec = KwkDecoder.from_hf(model, max_batch=3, max_context=256, kv_cache=kv)
    # A quoting prompt (its text repeats), so prompt lookup drafts, and some drafts are rejected.
    phrase = torch.randint(3, 2000, (12,), generator=torch.Generator().manual_seed(4))
    prompt = torch.cat([phrase, phrase, phrase[:5]])
    plain = dec.generate(prompt, 32, prompt_lookup=0, prompt_cache=False, stop_tokens=[])
    drafted = dec.generate(prompt, 32, prompt_lookup=8, prompt_cache=False, stop_tokens=[])
    assert drafted.drafted > 0 and drafted.tokens == plain.tokens

    # The prompt cache: a next turn that continues the slot reads only its new tokens, with the same answer.
    turn2 = torch.cat([prompt, torch.tensor(plain.tokens), phrase[:6]])
    fresh = KwkDecoder.from_hf(model, max_batch=1, max_context=256, kv_cache=kv)
    want = fresh.generate(turn2, 8, prompt_lookup=0, stop_tokens=[]).tokens
    dec.reset()
    dec.generate(prompt, 32, prompt_lookup=0, stop_tokens=[])
    again = dec.generate(turn2, 8, prompt_lookup=0, stop_tokens=[])
    assert again.cached > 0 and again.tokens == want

    # copy_prefix: the copy holds the source's stored bits, so what follows is the same to the bit.
    dec.reset()
    dec.step([(0, turn2)], logits="none")
    dec.copy_prefix(0, 1, 30)
    (a,) = dec.step([(1, turn2[30:40])], logits="all")
    dec.truncate(0, 30)
    (b,) = dec.step([(0, turn2[30:40])], logits="all")
    assert torch.equal(a, b)

    # Saved and loaded: the saved format by default, another on request.
    dec.save(tmp_path / "d")
    assert KwkDecoder.load(tmp_path / "d").info["kv_cache"] == kv
    other = KwkDecoder.load(tmp_path / "d", kv_cache="f32")
    assert other.info["kv_cache"] == "f32" and rel(other.score(turn2[:40]), hf_rows(model, turn2[:40])) <= 1e-5


def test_an_unknown_format_is_refused_by_name() -> None:
    model = tiny("llama")
    with pytest.raises(ValueError, match=r"kv_cache='fp8'; expected one of f32, bf16, q8"):
        KwkDecoder.from_hf(model, max_batch=1, max_context=64, kv_cache="fp8")
    with pytest.raises(ValueError, match=r"--kv-cache 'fp8': expected one of f32, bf16, q8"):
        ServeOptions(kv_cache="fp8").check()


def test_the_default_follows_the_precision() -> None:
    """preserve keeps f32 (its 1e-5 contract); int8 takes bf16 and int4 q8 (``common.DEFAULT_KV_CACHE``), the
    same decoder as asking for that format; an explicit format wins."""
    model = tiny("llama")
    ids = torch.randint(3, 2000, (24,), generator=torch.Generator().manual_seed(5))
    assert KwkDecoder.from_hf(model, max_batch=1, max_context=64).info["kv_cache"] == "f32"
    for precision, default in (("int8", "bf16"), ("int4", "q8")):
        dec = KwkDecoder.from_hf(model, precision, max_batch=1, max_context=64)
        asked = KwkDecoder.from_hf(model, precision, max_batch=1, max_context=64, kv_cache=default)
        assert dec.info["kv_cache"] == default and dec.info["kv_bytes"] == asked.info["kv_bytes"]
        assert torch.equal(dec.score(ids), asked.score(ids))
        f32 = KwkDecoder.from_hf(model, precision, max_batch=1, max_context=64, kv_cache="f32")
        assert f32.info["kv_cache"] == "f32" and not torch.equal(f32.score(ids), dec.score(ids))
    assert ServeOptions().kv_cache is None and ServeOptions().check().kv_cache is None
