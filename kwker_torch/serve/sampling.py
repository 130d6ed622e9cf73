"""Choosing each request's next token from the float32 logits of its row, as OpenAI's parameters ask.

Contract: the logits are first adjusted, in this order (each only when asked for):
1. ``repetition_penalty`` r (Hugging Face's): every token id that occurs in the prompt or the output so
   far has its logit divided by r where positive, multiplied by r where negative;
2. ``frequency_penalty`` f and ``presence_penalty`` p (OpenAI's, applied as vLLM does, over the tokens
   generated so far): ``logit[t] -= f * count[t] + p * (count[t] > 0)``;
3. ``logit_bias``: the given value added to each listed token's logit;
4. a grammar (``response_format``, forced tool calls) masks the tokens it does not allow.
Then the token is chosen by the project's one sampler (``rust/src/decoder/sample.rs``, through
``decoder/sampling.py``), the native loop's own: ``temperature == 0`` is greedy, the argmax of the adjusted
logits (the first index among equal maxima); else the logits are divided by the temperature, then (as Hugging
Face's warpers, in their order) cut to the ``top_k`` largest, to the smallest set whose probability reaches
``top_p``, and to tokens of probability at least ``min_p`` times the largest, and drawn from the native
generator seeded by ``seed`` (per choice: ``seed + index``). So a served completion without adjustments has
the tokens ``KwkDecoder.generate`` gives for the same prompt and parameters, greedy or seeded, and a seeded
request is reproducible.
Reported logprobs are the model's own (log-softmax of the unadjusted, untempered logits), as OpenAI reports them.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

import torch

from ..decoder.sampling import Rng, Warp, sample


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
    top_k: int = 0  # 0: off
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: dict[int, float] = field(default_factory=dict)

    @property
    def adjusts(self) -> bool:
        """Whether the logits are changed before a token is chosen (not counting a grammar)."""
        return bool(self.presence_penalty or self.frequency_penalty or self.repetition_penalty != 1.0
                    or self.logit_bias)  # fmt: skip


@dataclass
class TokenOut:
    """One generated token as a client sees it."""

    id: int
    text: str
    offset: int  # where its text starts in the completion's text
    logprob: float = 0.0
    top: list[tuple[int, float]] = field(default_factory=list)  # (token id, logprob), most likely first


class Sampler:
    def __init__(self, params: SamplingParams, matcher: Any | None = None, prompt: list[int] | None = None) -> None:
        self.p = params
        self.matcher = matcher  # an llguidance LLMatcher, or None
        self.warp = Warp(params.temperature if params.temperature > 0 else 0.0, max(params.top_k, 0), params.top_p,
                         params.min_p)  # fmt: skip
        self.rng: Rng | None = None  # None: greedy
        if not self.warp.greedy:
            seed = params.seed if params.seed is not None else random.getrandbits(64)
            self.rng = Rng(int(seed) & (2**64 - 1))
        self._stream = self.rng if self.rng is not None else Rng(0)  # (greedy choices draw nothing from it)
        self._mask: torch.Tensor | None = None
        self._prompt = list(prompt or [])
        self._counts: torch.Tensor | None = None  # [vocab] float32: times each token was generated
        self._seen: torch.Tensor | None = None  # [vocab] bool: in the prompt or generated (repetition_penalty)

    def adjust(self, logits: torch.Tensor) -> torch.Tensor:
        """The logits after the penalties and biases (the input itself when none is asked for)."""
        p = self.p
        if not p.adjusts:
            return logits
        row = logits.clone()
        vocab = row.numel()
        if self._counts is None:
            self._counts = torch.zeros(vocab, dtype=torch.float32)
            self._seen = torch.zeros(vocab, dtype=torch.bool)
            ids = torch.tensor([t for t in self._prompt if 0 <= t < vocab], dtype=torch.int64)
            self._seen[ids] = True
        if p.repetition_penalty != 1.0:
            assert self._seen is not None
            v = row[self._seen]
            row[self._seen] = torch.where(v > 0, v / p.repetition_penalty, v * p.repetition_penalty)
        if p.frequency_penalty:
            row -= p.frequency_penalty * self._counts
        if p.presence_penalty:
            row -= p.presence_penalty * (self._counts > 0).to(torch.float32)
        for tok, bias in p.logit_bias.items():
            row[tok] += bias
        return row

    def _chosen(self, tok: int) -> None:
        if self._counts is not None and self._seen is not None and 0 <= tok < self._counts.numel():
            self._counts[tok] += 1
            self._seen[tok] = True

    def choose(self, logits: torch.Tensor) -> tuple[int, float, list[tuple[int, float]]]:
        """(token, its logprob, top alternatives) from a [vocab] float32 row."""
        row = self.adjust(logits)
        if self.matcher is not None:
            from llguidance.torch import allocate_token_bitmask, apply_token_bitmask_inplace, fill_next_token_bitmask

            if self._mask is None:
                self._mask = allocate_token_bitmask(1, logits.numel())
            fill_next_token_bitmask(self.matcher, self._mask, 0)
            row = (row.clone() if row is logits else row).unsqueeze(0)
            apply_token_bitmask_inplace(row, self._mask)
            row = row[0]
        tok = sample(row, self.warp, self._stream)
        self._chosen(tok)
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
