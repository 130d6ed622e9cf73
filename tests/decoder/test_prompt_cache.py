"""The prompt cache: a slot that holds the start of a new prompt (the previous chat turn) reads only the
rest, in ``KwkDecoder.generate`` and under ``decode.install()``: tokens equal a fresh start's, the cached
length is exactly the shared prefix (also when the prompt diverges in the middle of it), prompts go to the
slot holding their prefix, and the least recently used slot is the one given to a new conversation."""

from __future__ import annotations

import copy

import pytest
import torch

from kwker_torch import KwkDecoder, decode
from kwker_torch.testing import chat_ids, generate_greedy


@pytest.fixture(scope="module")
def dec(smollm2: tuple) -> KwkDecoder:
    return KwkDecoder.from_hf(smollm2[0], max_batch=3, max_context=1024)


def turns(tok: object) -> tuple[torch.Tensor, list[str]]:
    system = "You are a careful assistant who answers questions about English novels in two sentences."
    ids = chat_ids(tok, system + " Who wrote Persuasion?")[0]
    return ids, ["And when was it published?", "Name its heroine.", "Who is Captain Wentworth?"]


def extend(tok: object, ids: list[int], answer: list[int], user: str) -> torch.Tensor:
    more = tok.apply_chat_template([{"role": "user", "content": user}], add_generation_prompt=True, tokenize=True)
    more = more if isinstance(more, list) else more["input_ids"]
    return torch.tensor(ids + answer + list(more))


def test_chat_turns_read_only_what_is_new_and_equal_a_fresh_start(dec: KwkDecoder, smollm2: tuple) -> None:
    tok = smollm2[1]
    ids, users = turns(tok)
    c = dec.generate(ids, 24)
    prompt = ids
    for user in users:
        held = len(prompt) + len(c.tokens) - 1  # the previous prompt and answer but its last token (never fed)
        prompt = extend(tok, prompt.tolist(), c.tokens, user)
        cached = dec.generate(prompt, 24)
        assert cached.slot == c.slot and cached.cached == held
        fresh = dec.generate(prompt, 24, prompt_cache=False, slots=[(cached.slot + 1) % 3])
        assert cached.tokens == fresh.tokens, (tok.decode(cached.tokens), tok.decode(fresh.tokens))
        assert fresh.cached == 0
        c = cached


def test_cached_length_is_the_shared_prefix_also_when_the_prompt_diverges(dec: KwkDecoder, smollm2: tuple) -> None:
    tok = smollm2[1]
    ids, _ = turns(tok)
    dec.reset()  # only what this test puts in the slots (a longer match held elsewhere would be copied in)
    first = dec.generate(ids, 16, slots=[0])
    grown = torch.cat([ids, torch.tensor(first.tokens), torch.tensor([504, 2744, 30])])
    c = dec.generate(grown, 16, slots=[0])
    assert c.cached == len(ids) + len(first.tokens) - 1  # the answer's last token was never fed
    assert c.tokens == dec.generate(grown, 16, slots=[1], prompt_cache=False).tokens
    cut = len(ids) - 5
    diverged = torch.cat([ids[:cut], torch.tensor([1759, 314, 260, 1345, 30])])
    c = dec.generate(diverged, 16, slots=[0])
    assert c.cached == cut
    assert c.tokens == dec.generate(diverged, 16, slots=[1], prompt_cache=False).tokens
    same = dec.generate(diverged, 16, slots=[0])  # the whole prompt held: its last token is read again
    assert same.cached == len(diverged) - 1 and same.tokens == c.tokens


def test_prompts_find_their_slot_and_the_least_recently_used_is_evicted(dec: KwkDecoder, smollm2: tuple) -> None:
    tok = smollm2[1]
    dec.reset()
    convs = [chat_ids(tok, f"Tell me about the number {n}.")[0] for n in (3, 7, 11, 19)]
    slots = [dec.generate(p, 8).slot for p in convs[:3]]
    assert sorted(slots) == [0, 1, 2]
    again = dec.generate(torch.cat([convs[1], torch.tensor([198])]), 8)
    assert again.slot == slots[1] and again.cached == len(convs[1])
    new = dec.generate(convs[3], 8)  # evicts conversation 0, the least recently used
    assert new.slot == slots[0]
    assert dec.generate(torch.cat([convs[2], torch.tensor([198])]), 8).slot == slots[2]


def test_hf_generate_second_turn_reuses_the_first(smollm2: tuple) -> None:
    model, tok = smollm2
    model = copy.deepcopy(model).float()
    ids, users = turns(tok)
    first = generate_greedy(model, ids[None], 20)
    second_in = extend(tok, first[0].tolist(), [], users[0])[None]
    want = generate_greedy(model, second_in, 20)
    decode.install(model, max_batch=2, max_context=1024)
    try:
        assert torch.equal(generate_greedy(model, ids[None], 20), first)
        before = decode.stats(model)
        got = generate_greedy(model, second_in, 20)
        after = decode.stats(model)
    finally:
        decode.uninstall(model)
    assert torch.equal(got, want), tok.decode(got[0, second_in.shape[1] :])
    # The whole first sequence but its last token (generated, never fed) was in the slot.
    assert after["cached_tokens"] - before["cached_tokens"] == first.shape[1] - 1
    assert after["sequences"] - before["sequences"] == 1


@pytest.mark.parametrize(("name", "precision"), [("Qwen2.5-0.5B", "int8"), ("SmolLM2-360M", "int4"),
                                                 ("Mistral-7B-v0.1", "preserve")])  # fmt: skip
def test_families_and_precisions_cached_turn_equals_fresh(name: str, precision: str) -> None:
    from kwker_torch.testing import random_model

    over = {"sliding_window": 16} if name.startswith("Mistral") else {}
    model = random_model(name, torch.bfloat16, num_hidden_layers=2, **over)
    dec = KwkDecoder.from_hf(model, precision=precision, max_batch=2, max_context=256)
    first = torch.randint(5, 3000, (40,), generator=torch.Generator().manual_seed(2))
    a = dec.generate(first, 12, stop_tokens=[])
    second = torch.cat([first, torch.tensor(a.tokens), torch.tensor([11, 12, 13])])
    cached = dec.generate(second, 12, stop_tokens=[])
    fresh = dec.generate(second, 12, stop_tokens=[], prompt_cache=False, slots=[1 - cached.slot])
    assert cached.cached == len(first) + len(a.tokens) - 1 and fresh.cached == 0
    assert cached.tokens == fresh.tokens


def test_a_cache_larger_than_memory_is_refused(smollm2: tuple) -> None:
    with pytest.raises(ValueError, match="more than this machine's memory allows.*lower max_batch or max_context"):
        KwkDecoder.from_hf(smollm2[0], max_batch=4096, max_context=8192)


def test_a_slot_started_at_another_position_is_emptied_not_continued(dec: KwkDecoder, smollm2: tuple) -> None:
    tok = smollm2[1]
    ids, _ = turns(tok)
    want = dec.generate(ids, 12, slots=[1], prompt_cache=False).tokens
    dec.reset()  # no other slot holds the prompt (it would be copied in)
    dec.set_position(0, 5)  # as a left-padded row under decode.install()
    dec.step([(0, ids[:20])], logits="none")
    c = dec.generate(ids, 12, slots=[0])
    assert c.cached == 0 and c.tokens == want
    assert dec.slot_tokens(0) == ids.tolist() + c.tokens[:-1]
