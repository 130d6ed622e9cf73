"""Hugging Face's ``generate(..., prompt_lookup_num_tokens=N)`` under ``decode.install()``, sized as the
decoder's own prompt lookup is, so that it is never much slower than plain decoding.

Hugging Face's ``PromptLookupCandidateGenerator`` always proposes up to N tokens whenever the last 2 tokens
occurred before, and every rejected candidate is a row paid for in the verify step; on text that does not
quote its prompt most are rejected (measured: 0.83x plain decoding). Installed models answer
``_get_candidate_generator`` with ``AdaptiveLookup`` instead: drafts come from ``lookup.propose`` (the
native loop's rule: the latest earlier occurrence of the last 3, then 2 tokens), and their number from
``lookup.DraftPolicy``, the native loop's own sizing (measured acceptance and step times; N is the most it
proposes, 0 when drafting does not pay). Other candidate generators (``assistant_model=``, early exit) are
Hugging Face's own.

Exactness: unchanged. Candidates only decide which rows a verify step computes; Hugging Face keeps a
candidate only where it equals the token the target itself selects (greedy) or samples, so greedy text is
that of plain decoding. A candidate after an end-of-sequence token is never proposed.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from .lookup import DraftPolicy


def _candidate_base() -> type:
    from transformers.generation.candidate_generator import CandidateGenerator

    return CandidateGenerator


class AdaptiveLookup:
    """A Hugging Face CandidateGenerator (built by ``adaptive_lookup``, which makes it a subclass)."""

    def __init__(self, max_draft: int, max_length: int, eos: torch.Tensor | None) -> None:
        # No pauses after failed drafts: a verify step here is Hugging Face's Python loop around a native step,
        # so extra rows cost little and the measured rate alone decides (pauses cost a partly quoting summary
        # a quarter of its speed-up).
        self.policy = DraftPolicy(max_draft, pauses=False)
        self.max_length = max_length
        self.eos = set() if eos is None else {int(t) for t in eos.flatten().tolist()}
        self.drafted = 0
        self._t0: float | None = None
        self._calls = 0  # the first verify step also reads the prompt: its time says nothing of drafts
        self.proposed = self.kept = 0  # totals (tests and benchmarks read them)

    def get_candidates(self, input_ids: torch.LongTensor, **_: Any) -> tuple[torch.LongTensor, None]:
        n = input_ids.shape[1]
        limit = self.max_length - n - 1
        drafts = self.policy.next(input_ids[0].tolist(), limit) if limit > 0 and input_ids.shape[0] == 1 else []
        for i, t in enumerate(drafts):
            if t in self.eos:  # (the target could accept an end token and go on past it)
                drafts = drafts[:i]
                break
        self.drafted = len(drafts)
        self._t0 = time.perf_counter()
        if not drafts:
            return input_ids, None
        extra = torch.tensor([drafts], dtype=input_ids.dtype, device=input_ids.device)
        return torch.cat((input_ids, extra), dim=1), None

    def update_candidate_strategy(self, input_ids: torch.LongTensor, scores: torch.FloatTensor,
                                  num_matches: int) -> None:  # fmt: skip
        took = time.perf_counter() - self._t0 if self._t0 is not None else 0.0
        kept = min(int(num_matches), self.drafted)
        self._calls += 1
        if self._calls > 1:
            self.policy.update(self.drafted, kept)
            self.policy.record(self.drafted + 1, took)
        self.proposed += self.drafted
        self.kept += kept


def adaptive_lookup(max_draft: int, max_length: int, eos: torch.Tensor | None) -> Any:
    """An AdaptiveLookup that Hugging Face's assisted-generation loop accepts as its CandidateGenerator."""
    cls = type("AdaptiveLookup", (AdaptiveLookup, _candidate_base()), {})
    return cls(max_draft, max_length, eos)


def hook(model: torch.nn.Module, on_make: Any = None) -> None:
    """Makes ``model.generate(prompt_lookup_num_tokens=N)`` use AdaptiveLookup (an instance attribute:
    other models are untouched; ``unhook`` removes it). ``on_make(generator)`` sees each one made."""
    original = type(model)._get_candidate_generator.__get__(model)

    def _get_candidate_generator(generation_config: Any, *args: Any, **kwargs: Any) -> Any:
        assistant = kwargs.get("assistant_model")
        if (generation_config.prompt_lookup_num_tokens is not None and assistant is None
                and getattr(generation_config, "assistant_early_exit", None) is None):  # fmt: skip
            gen = adaptive_lookup(int(generation_config.prompt_lookup_num_tokens), int(generation_config.max_length),
                                  generation_config._eos_token_tensor)  # fmt: skip
            if on_make is not None:
                on_make(gen)
            return gen
        return original(generation_config, *args, **kwargs)

    model._get_candidate_generator = _get_candidate_generator  # type: ignore[method-assign]


def unhook(model: torch.nn.Module) -> None:
    model.__dict__.pop("_get_candidate_generator", None)
