"""Choosing each request's next token from the float32 logits of its row, as OpenAI's parameters ask.

Contract: ``temperature == 0`` is greedy, ``argmax`` of the logits (the first index among equal maxima,
as the native decoder picks), so a served greedy completion has the tokens ``KwkDecoder.generate`` gives
for the same prompt. Else the logits are divided by the temperature, cut to the smallest set of tokens
whose probability reaches ``top_p``, and drawn from a generator seeded by ``seed`` (per choice: ``seed +
index``), so a seeded request is reproducible. A grammar (``response_format``) masks the tokens it does
not allow before either rule. Reported logprobs are the model's own (log-softmax of the unmasked,
untempered logits), as OpenAI reports them.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class SamplingParams:
    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    logprobs: bool = False
    top_logprobs: int = 0
    grammar: str | None = None  # an llguidance grammar (see grammar.py)
    ignore_eos: bool = False  # end-of-sequence tokens do not end generation (benchmarks)


@dataclass
class TokenOut:
    """One generated token as a client sees it."""

    id: int
    text: str
    offset: int  # where its text starts in the completion's text
    logprob: float = 0.0
    top: list[tuple[int, float]] = field(default_factory=list)  # (token id, logprob), most likely first


class Sampler:
    def __init__(self, params: SamplingParams, matcher: Any | None = None) -> None:
        self.p = params
        self.matcher = matcher  # an llguidance LLMatcher, or None
        self.gen: torch.Generator | None = None
        if params.temperature > 0:
            seed = params.seed if params.seed is not None else random.getrandbits(63)
            self.gen = torch.Generator().manual_seed(int(seed) & (2**63 - 1))
        self._mask: torch.Tensor | None = None

    def choose(self, logits: torch.Tensor) -> tuple[int, float, list[tuple[int, float]]]:
        """(token, its logprob, top alternatives) from a [vocab] float32 row."""
        row = logits
        if self.matcher is not None:
            from llguidance.torch import allocate_token_bitmask, apply_token_bitmask_inplace, fill_next_token_bitmask

            if self._mask is None:
                self._mask = allocate_token_bitmask(1, logits.numel())
            fill_next_token_bitmask(self.matcher, self._mask, 0)
            row = logits.clone().unsqueeze(0)
            apply_token_bitmask_inplace(row, self._mask)
            row = row[0]
        if self.gen is None:
            tok = int(torch.argmax(row))
        else:
            probs = torch.softmax(row / self.p.temperature, dim=-1)
            if self.p.top_p < 1.0:
                sorted_p, idx = torch.sort(probs, descending=True)
                keep = torch.cumsum(sorted_p, 0) - sorted_p < self.p.top_p  # (the top token is always kept)
                probs = torch.zeros_like(probs).scatter_(0, idx[keep], sorted_p[keep])
            tok = int(torch.multinomial(probs, 1, generator=self.gen))
        if self.matcher is not None:
            self.matcher.consume_token(tok)
        if not self.p.logprobs:
            return tok, 0.0, []
        lsm = torch.log_softmax(logits, dim=-1)
        top: list[tuple[int, float]] = []
        if self.p.top_logprobs:
            v, i = torch.topk(lsm, self.p.top_logprobs)
            top = list(zip(i.tolist(), v.tolist(), strict=True))
        return tok, float(lsm[tok]), top

    @property
    def grammar_done(self) -> bool:
        """The grammar allows nothing more (e.g. the JSON object is closed)."""
        return self.matcher is not None and bool(self.matcher.is_stopped())
