"""Speculative decoding with a draft model: a small ``KwkDecoder`` of the same tokenizer proposes tokens
one at a time, the target verifies them all in one multi-token step, and both slots are truncated to what
was kept (``KwkDecoder.generate(..., draft=other)``).

Contract: greedy output is exactly the target's greedy text (every kept token is the argmax of the
target's own logits for that position). With sampling, the standard rule (Leviathan et al. 2023, Chen et
al. 2023): a draft token x drawn from the draft's distribution q is kept with probability min(1, p(x)/q(x))
under the target's p, else a token is drawn from max(0, p - q) renormalised; so each token follows the
target's distribution. p and q are the same temperature / top-k / top-p warp as the native sampler
(``rust/src/decoder/sample.rs``), computed here in float64 from the float32 logits. The sampled text for
a seed depends on how many drafts each step tried (chosen from measured timings), so it is not
reproducible draw for draw; its distribution is the target's.

How many drafts: the k that maximises expected tokens per second, E(k) / (k t_draft + t_verify(k + 1)),
with E(k) = (1 - a^(k+1)) / (1 - a) for the acceptance rate a (kept / (kept + rejections), decayed), and
the draft's step time and the target's time per verified row count measured as it runs (a verify step of
many rows costs more than one row on a CPU: the rows' arithmetic is not free, measured 1.8x for 9 rows on
SmolLM2-135M). k = 0 (no drafting) when drafting does not pay, retried every 8 steps; drafts of which
nothing was kept pause drafting for 1, 2, 4 .. 16 steps.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import torch

from .prompt_cache import shared_start

if TYPE_CHECKING:
    from .runtime import KwkDecoder


def warp(logits: torch.Tensor, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    """float64 probabilities after temperature, then top-k, then top-p (ties broken by index)."""
    x = logits.double() / temperature
    if top_k > 0 or top_p < 1.0:
        order = torch.sort(x, descending=True, stable=True).indices
        keep = order[:top_k] if top_k > 0 else order
        p = torch.softmax(x[keep], 0)
        if top_p < 1.0:
            over = (torch.cumsum(p, 0) >= top_p).nonzero()
            n = int(over[0]) + 1 if len(over) else len(p)
            keep = keep[:n]
        out = torch.zeros_like(x)
        out[keep] = torch.softmax(x[keep], 0)
        return out
    return torch.softmax(x, 0)


def verify_sampled(p: torch.Tensor, q: torch.Tensor, d: int, gen: torch.Generator) -> tuple[int, bool]:
    """The draft token ``d`` (drawn from ``q``) kept with probability min(1, p(d) / q(d)), else a token
    drawn from max(0, p - q) renormalised: the result is distributed as ``p``. Returns (token, kept)."""
    if float(torch.rand((), generator=gen, dtype=torch.float64)) * float(q[d]) < float(p[d]):
        return d, True
    residual = (p - q).clamp_min(0)
    return int(torch.multinomial(residual / residual.sum(), 1, generator=gen)), False


class Planner:
    """Chooses the number of drafts from the measured acceptance rate and step times."""

    def __init__(self, max_draft: int, pauses: bool = True) -> None:
        self.max_draft = max_draft
        self.pauses = pauses  # pause after drafts that all failed (off where the rate alone decides)
        self.kept, self.rejected = 4.0, 1.0  # prior: a = 0.8
        self.t_draft: float | None = None
        self.t_verify: dict[int, float] = {}  # rows -> seconds (decayed mean)
        self.idle = 0
        self.pause, self.next_pause = 0, 1  # steps without drafting after drafts that all failed

    def verify_time(self, rows: int) -> float:
        if rows in self.t_verify:
            return self.t_verify[rows]
        one = self.t_verify.get(1) or min((t / (1 + 0.15 * (m - 1)) for m, t in self.t_verify.items()), default=1.0)
        return one * (1 + 0.15 * (rows - 1))  # prior until measured: 15 % per extra row

    def choose(self, limit: int) -> int:
        if limit <= 0:
            return 0
        if self.pause > 0:
            self.pause -= 1
            return 0
        if self.t_draft is None:
            return min(4, limit, self.max_draft)
        a = min(self.kept / (self.kept + self.rejected), 0.99)
        best, best_rate = 0, 1.0 / self.verify_time(1)
        for k in range(1, min(limit, self.max_draft) + 1):
            rate = (1 - a ** (k + 1)) / (1 - a) / (k * self.t_draft + self.verify_time(k + 1))
            if rate > best_rate:
                best, best_rate = k, rate
        if best == 0:
            self.idle += 1
            if self.idle % 8 == 0:
                return 1  # look again: the text may have become predictable
        return best

    def record(self, drafted: int, kept: int, t_draft: float | None, rows: int, t_verify: float) -> None:
        ema = lambda old, new: new if old is None else 0.7 * old + 0.3 * new  # noqa: E731
        self.t_verify[rows] = ema(self.t_verify.get(rows), t_verify)
        if drafted:
            self.t_draft = ema(self.t_draft, t_draft / drafted) if t_draft is not None else self.t_draft
            self.kept = 0.9 * self.kept + kept
            self.rejected = 0.9 * self.rejected + (kept < drafted)
            # As prompt lookup: a draft of which nothing was kept pauses drafting 1, 2, 4 .. 16 steps.
            if kept == 0 and self.pauses:
                self.pause, self.next_pause = self.next_pause, min(2 * self.next_pause, 16)
            else:
                self.next_pause = 1


def check_pair(target: KwkDecoder, draft: KwkDecoder) -> None:
    if draft is target:
        raise ValueError("kwker: the draft model is the target itself; give a smaller decoder (e.g. SmolLM2-135M)")
    if draft.vocab_size != target.vocab_size:
        raise ValueError(
            f"kwker: the draft model has a vocabulary of {draft.vocab_size} tokens and the target {target.vocab_size}; "
            "a draft must use the target's tokenizer (e.g. SmolLM2-135M for SmolLM2-360M/1.7B)"
        )
    names = ("bos_token_id", "eos_token_id")  # pad ids differ between configs of one tokenizer
    a = {n: getattr(target.config, n, None) for n in names}
    b = {n: getattr(draft.config, n, None) for n in names}
    if a != b:
        raise ValueError(f"kwker: the draft model's special tokens {b} differ from the target's {a}: another tokenizer")


def generate(
    target: KwkDecoder,
    draft: KwkDecoder,
    slot: int,
    draft_slot: int,
    prompt: torch.Tensor,
    max_new: int,
    *,
    max_draft: int,
    temperature: float,
    top_k: int,
    top_p: float,
    seed: int,
    stop: Sequence[int],
    callback: Callable[[int, int], bool | None] | None,
) -> tuple[list[int], str, int, int]:
    """One sequence: ``prompt`` follows what ``slot`` (target) and ``draft_slot`` hold. Returns the new
    tokens, the finish reason, and the drafts proposed and kept."""
    greedy = temperature == 0.0 or top_k == 1
    gen = torch.Generator().manual_seed(seed & (2**63 - 1))
    ctx = target.max_context  # the draft's own context only limits how far it drafts
    stops = set(stop)

    def choose(lg: torch.Tensor) -> int:
        if greedy:
            return int(torch.argmax(lg))
        return int(torch.multinomial(warp(lg, temperature, top_k, top_p), 1, generator=gen))

    def ended(tok: int, before: int) -> str | None:
        """Why the sequence ends at ``tok`` (emitted; the slot holds ``before`` tokens ahead of it)."""
        if callback is not None and callback(0, tok) is False:
            return "callback"
        if tok in stops:
            return "stop"
        if len(out) >= max_new or before >= ctx:
            return "length"
        return None

    # Both slots end up holding the same text; bring the draft's to the target's prefix first.
    common = shared_start(target.slot_tokens(slot), draft.slot_tokens(draft_slot))
    draft.truncate(draft_slot, common)  # a start of the target's text: it catches up when it drafts
    (logits,) = target.step([(slot, prompt)])
    out: list[int] = []
    drafted = kept_total = 0
    plan = Planner(max_draft)
    pending = choose(logits[0])
    while True:
        # Emit `pending`: the first token of this round, chosen from the target's logits.
        out.append(pending)
        held = target.slot_len(slot)  # everything before `pending`
        why = ended(pending, held)
        if why is not None:
            return out, why, drafted, kept_total
        n = plan.choose(min(max_new - len(out) - 1, ctx - held - 1, draft.max_context - held - 1))
        drafts: list[int] = []
        qs: list[torch.Tensor] = []
        t0 = time.perf_counter()
        if n > 0:
            # The draft catches up with what the target holds (it is not fed while nothing is drafted),
            # reads `pending` (its logits give the first draft), then each draft but the last.
            behind = target.slot_tokens(slot)[draft.slot_len(draft_slot) :]
            if behind:
                draft.step([(draft_slot, behind)], logits="none")
                t0 = time.perf_counter()  # the draft's time per token excludes catching up
            (row,) = draft.step([(draft_slot, [pending])])
            for j in range(n):
                lg = row[0]
                if greedy:
                    d = int(torch.argmax(lg))
                else:
                    q = warp(lg, temperature, top_k, top_p)
                    d = int(torch.multinomial(q, 1, generator=gen))
                    qs.append(q)
                drafts.append(d)
                if j + 1 < n:
                    (row,) = draft.step([(draft_slot, [d])])
        t1 = time.perf_counter()
        (rows,) = target.step([(slot, [pending, *drafts])], logits="all" if drafts else "last")
        t_verify = time.perf_counter() - t1
        accepted = 0
        nxt = None
        for j, d in enumerate(drafts):
            if greedy:
                t = int(torch.argmax(rows[j]))
                if t != d:
                    nxt = t
                    break
            else:
                t, kept = verify_sampled(warp(rows[j], temperature, top_k, top_p), qs[j], d, gen)
                if not kept:
                    nxt = t
                    break
            # d is kept: emit it as the model's own token.
            accepted += 1
            out.append(d)
            why = ended(d, held + 1 + j)
            if why is not None:  # inside a run of kept drafts: both slots keep what precedes d
                target.truncate(slot, held + 1 + j)
                draft.truncate(draft_slot, min(draft.slot_len(draft_slot), held + 1 + j))
                return out, why, drafted + n, kept_total + accepted
        if nxt is None:  # every draft kept: the bonus token from the row after the last
            nxt = choose(rows[len(drafts)])
        drafted += n
        kept_total += accepted
        plan.record(n, accepted, t1 - t0 if n else None, n + 1, t_verify)
        keep = held + 1 + accepted  # pending and the kept drafts
        target.truncate(slot, keep)
        draft.truncate(draft_slot, min(draft.slot_len(draft_slot), keep))
        pending = nxt

