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
