"""Prompt lookup (speculative decoding from the prompt's own text) in ``KwkDecoder.generate`` and under
``decode.install()`` with Hugging Face's ``prompt_lookup_num_tokens=`` / ``assistant_model=``: greedy tokens
identical with and without it, on the real SmolLM2-135M (preserve and int4) and other families, single and
batched; drafts proposed and accepted (the fast path ran); budgets, stop tokens and slot contents as
without it; sampling stays seeded; bad settings are named."""

from __future__ import annotations

import pytest
import torch

from kwker_torch import KwkDecoder, decode, texts
from kwker_torch.testing import chat_ids, generate_greedy, random_model


def passage(words: int = 120) -> str:
    return texts.passage(words)  # the project's own sample story (kwker_torch/texts)


def quoting_prompt(tok: object) -> torch.Tensor:
    return chat_ids(tok, "Repeat the following passage exactly, word for word:\n\n" + passage())[0]


@pytest.fixture(scope="module")
def real_decoders(smollm2: tuple) -> dict[str, KwkDecoder]:
    model, _ = smollm2
    return {p: KwkDecoder.from_hf(model, precision=p, max_batch=3, max_context=1024) for p in ("preserve", "int4")}


@pytest.mark.parametrize("precision", ["preserve", "int4"])
def test_real_smollm2_lookup_gives_the_same_greedy_text_and_drafts_are_accepted(
    real_decoders: dict, smollm2: tuple, precision: str
) -> None:
    dec, (_, tok) = real_decoders[precision], smollm2
    ids = quoting_prompt(tok)
    plain = dec.generate(ids, 96, prompt_lookup=0, prompt_cache=False)
    fast = dec.generate(ids, 96, prompt_lookup=8, prompt_cache=False)
    assert fast.tokens == plain.tokens, (tok.decode(fast.tokens), tok.decode(plain.tokens))
    assert plain.drafted == plain.accepted == 0
    # The passage is quoted, so most of the answer is drafted and kept.
    assert fast.accepted >= len(fast.tokens) // 2, (fast.drafted, fast.accepted, len(fast.tokens))
    # Slot contents as without drafts: the prompt and every new token but the last.
    assert dec.slot_tokens(fast.slot) == ids.tolist() + fast.tokens[:-1]


@pytest.mark.parametrize("name", ["SmolLM2-360M", "Qwen2.5-0.5B", "Mistral-7B-v0.1"])
def test_families_batched_lookup_equals_each_plain(name: str) -> None:
    over = {"sliding_window": 7} if name.startswith("Mistral") else {}
    model = random_model(name, torch.bfloat16, num_hidden_layers=2, **over)
    dec = KwkDecoder.from_hf(model, max_batch=3, max_context=256)
    g = torch.Generator().manual_seed(1)
    base = torch.randint(5, 2000, (12,), generator=g)
    prompts = [torch.cat([base, base, base[:5]]), torch.randint(5, 2000, (9,), generator=g), base[:7]]
    alone = [dec.generate(p, 40, stop_tokens=[], prompt_lookup=0, prompt_cache=False).tokens for p in prompts]
    together = dec.generate(prompts, 40, stop_tokens=[], prompt_cache=False)
    assert [c.tokens for c in together] == alone
    if not name.startswith("Mistral"):  # these random models fall into loops, which lookup drafts and keeps
        assert sum(c.drafted for c in together) > 0 and sum(c.accepted for c in together) > 0


def test_budget_stop_tokens_and_callback_end_inside_drafts(real_decoders: dict, smollm2: tuple) -> None:
    dec, (_, tok) = real_decoders["preserve"], smollm2
    ids = quoting_prompt(tok)
    ref = dec.generate(ids, 60, prompt_lookup=0, stop_tokens=[], prompt_cache=False).tokens
    for n in (1, 2, 7, 33):  # budgets that end inside a verified run of drafts
        c = dec.generate(ids, n, stop_tokens=[], prompt_cache=False)
        assert c.tokens == ref[:n] and c.finish_reason == "length"
        assert dec.slot_len(c.slot) == len(ids) + n - 1
    stop = ref[20]  # a token deep inside the quoted text
    c = dec.generate(ids, 60, stop_tokens=[stop], prompt_cache=False)
    assert c.tokens == ref[: ref.index(stop) + 1] and c.finish_reason == "stop"
    assert dec.slot_tokens(c.slot) == ids.tolist() + c.tokens[:-1]
    seen: list[int] = []
    c = dec.generate(ids, 60, stop_tokens=[], callback=lambda i, t: seen.append(t) or len(seen) < 15,
                     prompt_cache=False)  # fmt: skip
    assert c.tokens == seen == ref[:15] and c.finish_reason == "callback"


def test_sampling_with_lookup_is_seeded_and_drafts_run(real_decoders: dict, smollm2: tuple) -> None:
    dec, (_, tok) = real_decoders["preserve"], smollm2
    ids = quoting_prompt(tok)
    kw = {"temperature": 0.3, "top_p": 0.9, "seed": 5, "prompt_cache": False}
    a, b = dec.generate(ids, 48, **kw), dec.generate(ids, 48, **kw)
    assert a.tokens == b.tokens and a.accepted > 0  # at low temperature the quote is kept
    assert all(0 <= t < dec.vocab_size for t in a.tokens)


def test_bad_lookup_settings_are_named(real_decoders: dict) -> None:
    dec = real_decoders["preserve"]
    for bad in (-1, 2.5, True):
        with pytest.raises(ValueError, match="prompt_lookup is the most draft tokens per step"):
            dec.generate([1, 2, 3], 4, prompt_lookup=bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="name a slot twice"):
        dec.generate([[1, 2], [3, 4]], 4, slots=[1, 1])


def test_hf_prompt_lookup_and_assistant_model_equal_plain_greedy(smollm2: tuple) -> None:
    import copy

    model, tok = smollm2
    model = copy.deepcopy(model).float()
    ids = quoting_prompt(tok)[None]
    want = generate_greedy(model, ids, 48)
    ref_model = copy.deepcopy(model)
    draft = copy.deepcopy(model)
    decode.install(model, max_batch=2, max_context=1024)
    decode.install(draft, precision="int4", max_batch=2, max_context=1024)
    try:
        dec = decode.decoder_of(model)
        before = dec.native_steps
        got = generate_greedy(model, ids, 48, prompt_lookup_num_tokens=8)
        lookup_steps = dec.native_steps - before
        assert torch.equal(got, want), tok.decode(got[0, ids.shape[1] :])
        assert lookup_steps < 48 // 2  # several tokens per native step: drafts were verified and kept
        lk = model._kwker_decode.lookup  # Hugging Face's loop asked the installed model's candidate generator
        assert type(lk).__name__ == "AdaptiveLookup" and lk.kept > 0 and lk.proposed <= 8 * lookup_steps
        # A prompt that does not quote: the same text, and drafting backs off (HF's own would propose up to 8
        # tokens at every step whose last 2 tokens occurred before).
        story = chat_ids(tok, "Write a short story about a dragon who learns to bake bread.")
        want_story = generate_greedy(ref_model, story, 48)
        assert torch.equal(generate_greedy(model, story, 48, prompt_lookup_num_tokens=8), want_story)
        lk = model._kwker_decode.lookup
        assert lk.proposed - lk.kept < 48  # rejected drafts: fewer than one per step
        before = dec.native_steps
        got = generate_greedy(model, ids, 48, assistant_model=draft)
        assert torch.equal(got, want), tok.decode(got[0, ids.shape[1] :])
        assert dec.native_steps - before < 48  # the int4 assistant's drafts were kept
    finally:
        decode.uninstall(model)
        decode.uninstall(draft)
    assert "_get_candidate_generator" not in model.__dict__  # uninstall restores Hugging Face's own


def test_draft_model_gives_the_targets_greedy_text(real_decoders: dict, smollm2: tuple) -> None:
    target, draft, tok = real_decoders["preserve"], real_decoders["int4"], smollm2[1]
    ids = chat_ids(tok, "Write a short story about a lighthouse keeper.")[0]
    plain = target.generate(ids, 64, prompt_lookup=0, prompt_cache=False)
    got = target.generate(ids, 64, draft=draft, prompt_cache=False)
    assert got.tokens == plain.tokens, (tok.decode(got.tokens), tok.decode(plain.tokens))
    # How many drafts the planner tries follows the step times it measures (a loaded machine drafts less);
    # what it keeps does not: int4 of the same model agrees on most of its drafts.
    assert got.drafted > 0 and got.accepted >= 0.6 * got.drafted, (got.drafted, got.accepted)
    assert target.slot_tokens(got.slot) == ids.tolist() + got.tokens[:-1]
    for n in (1, 3, 10):
        assert target.generate(ids, n, draft=draft, prompt_cache=False).tokens == plain.tokens[:n]
    # The sampling path (warp, acceptance rule, residual draws) at a temperature that leaves one likely token.
    cold = target.generate(ids, 32, draft=draft, temperature=1e-4, prompt_cache=False)
    assert cold.tokens == plain.tokens[:32] and cold.accepted > 0


def test_draft_acceptance_rule_keeps_the_target_distribution() -> None:
    from kwker_torch.decoder.sampling import Rng, draw
    from kwker_torch.decoder.speculative import verify_sampled

    p = torch.tensor([0.1, 0.6, 0.3, 0.0], dtype=torch.float64)
    q = torch.tensor([0.5, 0.2, 0.1, 0.2], dtype=torch.float64)
    rng = Rng(0)
    n, counts, kept = 40000, torch.zeros(4), 0
    for d in [draw(q, rng) for _ in range(n)]:
        tok, ok = verify_sampled(p, q, d, rng)
        counts[tok] += 1
        kept += ok
    assert (counts / n - p.float()).abs().max() < 0.01, counts / n
    assert abs(kept / n - float(torch.minimum(p, q).sum())) < 0.01  # P(keep) = sum min(p, q)


def test_bad_draft_models_are_refused(real_decoders: dict) -> None:
    target = real_decoders["preserve"]
    other = KwkDecoder.from_hf(random_model("Qwen2.5-0.5B", torch.bfloat16, num_hidden_layers=1), max_batch=1,
                               max_context=64)  # fmt: skip
    with pytest.raises(ValueError, match="vocabulary of 151936 tokens and the target 49152"):
        target.generate([1, 2, 3], 4, draft=other)
    with pytest.raises(ValueError, match="draft model is the target itself"):
        target.generate([1, 2, 3], 4, draft=target)
    with pytest.raises(ValueError, match="draft_tokens must be an int >= 1"):
        target.generate([1, 2, 3], 4, draft=real_decoders["int4"], draft_tokens=0)
    with pytest.raises(ValueError, match="one prompt at a time"):
        target.generate([[1, 2], [3]], 4, draft=real_decoders["int4"])
    with pytest.raises(TypeError, match="draft must be a KwkDecoder"):
        target.generate([1, 2, 3], 4, draft="SmolLM2-135M")  # type: ignore[arg-type]


@pytest.mark.parametrize("precision", ["preserve", "int4"])
def test_verified_rows_equal_one_token_steps_to_summation_order(real_decoders: dict, smollm2: tuple,
                                                                precision: str) -> None:  # fmt: skip
    """What verification relies on: a row of a multi-token step has the logits of a one-token step at the
    same position (measured: identical to ~1e-6 of the largest logit, from summing k in blocks)."""
    dec, tok = real_decoders[precision], smollm2[1]
    ids = quoting_prompt(tok)
    extra = dec.generate(ids, 9, stop_tokens=[], prompt_lookup=0, prompt_cache=False, slots=[0]).tokens
    dec.truncate(0, len(ids))
    (multi,) = dec.step([(0, extra)], logits="all")
    dec.truncate(0, len(ids))
    single = torch.cat([dec.step([(0, [t])])[0] for t in extra])
    err = ((multi - single).abs().max() / single.abs().max()).item()
    assert err <= 1e-5, err
    assert torch.equal(multi.argmax(-1), single.argmax(-1))
