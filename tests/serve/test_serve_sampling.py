"""The server's sampler against references computed from the logits by the definitions it states
(``kwker_torch/serve/sampling.py``): OpenAI's frequency / presence penalties, Hugging Face's repetition
penalty, logit_bias, and the top_k / top_p / min_p cuts of a sampled token. No model: fixed logit rows."""

from __future__ import annotations

from collections import Counter

import torch

from kwker_torch.serve.sampling import Sampler, SamplingParams

V = 64


def row(seed: int) -> torch.Tensor:
    return torch.randn(V, generator=torch.Generator().manual_seed(seed), dtype=torch.float32) * 3


def adjusted(x: torch.Tensor, prompt: list[int], out: list[int], freq: float, pres: float, rep: float,
             bias: dict[int, float]) -> torch.Tensor:  # fmt: skip
    """The definitions, written out token by token in float64."""
    y = x.double().clone()
    for t in set(prompt) | set(out):
        y[t] = y[t] / rep if y[t] > 0 else y[t] * rep
    for t, c in Counter(out).items():
        y[t] -= freq * c + pres
    for t, b in bias.items():
        y[t] += b
    return y


def test_greedy_penalties_and_bias_follow_their_definitions() -> None:
    prompt = [3, 5, 5, 9]
    for freq, pres, rep, bias in [(0.8, 0.0, 1.0, {}), (0.0, 1.5, 1.0, {}), (0.0, 0.0, 4.0, {}),
                                  (0.5, 0.3, 1.2, {7: 4.0, 11: -100.0}), (-0.5, -0.2, 0.8, {})]:  # fmt: skip
        sp = SamplingParams(max_tokens=40, temperature=0.0, presence_penalty=pres, frequency_penalty=freq,
                            repetition_penalty=rep, logit_bias=bias, logprobs=True)  # fmt: skip
        s = Sampler(sp, prompt=prompt)
        out: list[int] = []
        plain: list[int] = []
        for step in range(40):
            x = row(step % 5)  # rows repeat: without penalties the same tokens come back
            tok, lp, _ = s.choose(x)
            assert tok == int(torch.argmax(adjusted(x, prompt, out, freq, pres, rep, bias)))
            assert abs(lp - float(torch.log_softmax(x, 0)[tok])) < 1e-6  # the model's own logprob
            out.append(tok)
            plain.append(int(torch.argmax(x)))
        assert (out != plain) == (freq > 0 or pres > 0 or rep > 1)  # (negative ones favour the same tokens)


def reference_probs(x: torch.Tensor, t: float, top_k: int, top_p: float, min_p: float) -> torch.Tensor:
    """Hugging Face's warpers in their order: temperature, top-k, top-p, min-p."""
    y = x.double() / t
    if top_k:
        y[y < torch.topk(y, top_k).values[-1]] = float("-inf")
    p = torch.softmax(y, 0)
    if top_p < 1.0:
        order = torch.argsort(p, descending=True)
        before = torch.cumsum(p[order], 0) - p[order]
        p[order[before >= top_p]] = 0
        p = p / p.sum()
    if min_p:
        p[p < min_p * p.max()] = 0
        p = p / p.sum()
    return p


def test_sampled_tokens_follow_top_k_top_p_min_p() -> None:
    x = row(1)
    draws = 6000
    for t, k, top_p, mp in [(0.8, 6, 1.0, 0.0), (1.0, 0, 1.0, 0.1), (1.3, 10, 0.9, 0.05), (0.7, 0, 0.8, 0.0)]:
        s = Sampler(SamplingParams(max_tokens=1, temperature=t, top_k=k, top_p=top_p, min_p=mp, seed=123))
        got = torch.bincount(torch.tensor([s.choose(x)[0] for _ in range(draws)]), minlength=V).double() / draws
        want = reference_probs(x, t, k, top_p, mp)
        assert torch.all(got[want == 0] == 0), "a token outside the cut was drawn"
        sigma = (want * (1 - want) / draws).sqrt()
        assert torch.all((got - want).abs() <= 5 * sigma + 1e-3), (got - want).abs().max()
    # Seeded: the same draws again.
    a = Sampler(SamplingParams(max_tokens=1, temperature=1.0, top_k=5, min_p=0.05, seed=7))
    b = Sampler(SamplingParams(max_tokens=1, temperature=1.0, top_k=5, min_p=0.05, seed=7))
    assert [a.choose(x)[0] for _ in range(50)] == [b.choose(x)[0] for _ in range(50)]


def test_sampled_frequency_penalty_moves_the_distribution_as_defined() -> None:
    x = row(2)
    s = Sampler(SamplingParams(max_tokens=1, temperature=1.0, frequency_penalty=2.0, seed=5))
    first = s.choose(x)[0]
    # After one draw, the penalised token's probability is that of the adjusted logits.
    want = torch.softmax(adjusted(x, [], [first], 2.0, 0.0, 1.0, {}), 0)
    assert torch.allclose(torch.softmax(s.adjust(x).double(), 0), want, atol=1e-6)


def test_the_server_samples_with_the_native_sampler() -> None:
    """One rule per step of sampling: the server's choices are ``sample.rs``'s (through ``decoder.sampling``) on
    the same logits and seed, greedy and drawn, and its cuts are those of ``distribution``."""
    from kwker_torch.decoder.sampling import Rng, Warp, distribution, sample

    for temp, k, top_p, mp in [(0.0, 0, 1.0, 0.0), (0.8, 0, 1.0, 0.0), (1.3, 7, 0.9, 0.0), (1.0, 0, 0.8, 0.1)]:
        s = Sampler(SamplingParams(max_tokens=1, temperature=temp, top_k=k, top_p=top_p, min_p=mp, seed=11))
        rng, warp = Rng(11), Warp(temp, k, top_p, mp)
        for i in range(40):
            x = row(100 + i)
            assert s.choose(x)[0] == sample(x, warp, rng), (temp, k, top_p, mp, i)
    x = row(3)
    p = distribution(x, Warp(1.0, 0, 1.0, 0.2))
    full = torch.softmax(x.double(), 0)
    keep = full >= 0.2 * full.max()  # min-p: the tokens at least 0.2 of the most likely one
    assert torch.equal(p > 0, keep) and torch.allclose(p[keep], full[keep] / full[keep].sum())
    p = distribution(x, Warp(0.5, 5, 1.0, 0.0))  # temperature, then top-k
    top = torch.topk(x, 5).indices
    assert set((p > 0).nonzero().flatten().tolist()) == set(top.tolist())
    assert torch.allclose(p[top], torch.softmax(x[top].double() / 0.5, 0))
    assert distribution(x, Warp(0.0)).argmax() == x.argmax() and distribution(x, Warp(0.0)).sum() == 1


def test_the_draft_policy_is_the_native_loops() -> None:
    """``lookup.rs``'s rules through ``decoder.lookup`` (the server, Hugging Face's prompt lookup and draft-model
    speculation size drafts with it): the proposal, the cap that doubles and falls, and the pauses."""
    from kwker_torch.decoder.lookup import DraftPolicy, propose

    assert propose([1, 2, 3, 4, 9, 2, 3], 3) == [4, 9, 2]  # what followed the latest earlier "2 3"
    assert propose([5, 6, 7, 8, 0, 6, 7, 1, 5, 6, 7], 2) == [8, 0]  # the 3-gram wins over a later 2-gram
    assert propose([1, 2, 3, 4, 5], 4) == [] and propose([1, 2, 1, 2], 0) == []
    h = list(range(40)) + list(range(20))  # "18 19" repeats: 20 tokens follow
    pol = DraftPolicy(8)
    assert len(pol.next(h, 100)) == 4  # a fresh sequence tries 4
    pol.update(4, 4)  # all kept: the cap doubles (and rows cost nothing measured yet beyond the prior)
    pol.record(1, 1e-3)
    for rows in range(2, 10):
        pol.record(rows, 1e-3)  # extra rows free: the whole cap pays
    assert len(pol.next(h, 100)) == 8 and len(pol.next(h, 3)) == 3  # the limit bounds it
    pol.update(8, 0)  # nothing kept: pause one step, then try 1
    assert pol.next(h, 100) == [] and len(pol.next(h, 100)) == 1
    assert pol.counts == (12, 4)
    assert DraftPolicy(8, pauses=False).size(5) == 4 and DraftPolicy(0).next(h, 100) == []
    slow = DraftPolicy(8)
    slow.record(1, 1e-3, draft_secs=1.0)  # a draft model that takes 1000 steps per token: drafting never pays
    assert sum(slow.size(8) for _ in range(8)) == 1  # (it looks again every 8th step)
