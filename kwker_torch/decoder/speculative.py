"""Speculative decoding with a draft model: a small ``KwkDecoder`` of the same tokenizer proposes tokens
one at a time, the target verifies them all in one multi-token step, and both slots are truncated to what
was kept (``KwkDecoder.generate(..., draft=other)``).

Contract: greedy output is exactly the target's greedy text (every kept token is the argmax of the
target's own logits for that position). With sampling, the standard rule (Leviathan et al. 2023, Chen et
al. 2023): a draft token x drawn from the draft's distribution q is kept with probability min(1, p(x)/q(x))
under the target's p, else a token is drawn from max(0, p - q) renormalised; so each token follows the
target's distribution. p and q, the draws and the generator are the project's one sampler
(``rust/src/decoder/sample.rs`` through ``sampling.py``: temperature, top-k, top-p, min-p in float64 from the
float32 logits). The sampled text for a seed depends on how many drafts each step tried (chosen from
measured timings), so it is not reproducible draw for draw; its distribution is the target's.

How many drafts: the project's one draft policy (``rust/src/decoder/lookup.rs`` through
``lookup.DraftPolicy``): the k that maximises expected tokens per second, E(k) / (k t_draft + t(k + 1)),
with E(k) = (1 - a^(k+1)) / (1 - a) for the acceptance rate a (kept / (kept + rejections), decayed), the
draft's time per token and the target's time per verified rows measured as it runs (a verify step of many
rows costs more than one row on a CPU: measured 1.8x for 9 rows on SmolLM2-135M), under a cap that doubles
after fully kept drafts; k = 0 when drafting does not pay, retried every 8 steps; drafts of which nothing
was kept pause drafting for 1, 2, 4 .. 16 steps.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import torch

from .lookup import DraftPolicy
from .prompt_cache import shared_start
from .sampling import Rng, Warp, distribution, draw, sample

if TYPE_CHECKING:
    from .runtime import KwkDecoder


def verify_sampled(p: torch.Tensor, q: torch.Tensor, d: int, rng: Rng) -> tuple[int, bool]:
    """The draft token ``d`` (drawn from ``q``) kept with probability min(1, p(d) / q(d)), else a token
    drawn from max(0, p - q) renormalised: the result is distributed as ``p``. Returns (token, kept)."""
    if rng.uniform() * float(q[d]) < float(p[d]):
        return d, True
    return draw((p - q).clamp_min(0), rng), False


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
    min_p: float,
    seed: int,
    stop: Sequence[int],
    callback: Callable[[int, int], bool | None] | None,
) -> tuple[list[int], str, int, int]:
    """One sequence: ``prompt`` follows what ``slot`` (target) and ``draft_slot`` hold. Returns the new
    tokens, the finish reason, and the drafts proposed and kept."""
    warp = Warp(temperature, top_k, top_p, min_p)
    greedy = warp.greedy
    rng = Rng(seed)
    ctx = target.max_context  # the draft's own context only limits how far it drafts
    stops = set(stop)

    def choose(lg: torch.Tensor) -> int:
        return sample(lg, warp, rng)

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
    plan = DraftPolicy(max_draft)
    pending = choose(logits[0])
    while True:
        # Emit `pending`: the first token of this round, chosen from the target's logits.
        out.append(pending)
        held = target.slot_len(slot)  # everything before `pending`
        why = ended(pending, held)
        if why is not None:
            return out, why, drafted, kept_total
        n = plan.size(min(max_new - len(out) - 1, ctx - held - 1, draft.max_context - held - 1))
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
                    d = sample(lg, warp, rng)
                else:
                    q = distribution(lg, warp)
                    d = draw(q, rng)
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
                t = sample(rows[j], warp, rng)
                if t != d:
                    nxt = t
                    break
            else:
                t, kept = verify_sampled(distribution(rows[j], warp), qs[j], d, rng)
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
        plan.update(n, accepted)
        plan.record(n + 1, t_verify, (t1 - t0) / n if n else 0.0)
        keep = held + 1 + accepted  # pending and the kept drafts
        target.truncate(slot, keep)
        draft.truncate(draft_slot, min(draft.slot_len(draft_slot), keep))
        pending = nxt

