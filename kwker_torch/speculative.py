"""Speculative decoding with a draft model: a small ``KwkDecoder`` of the same tokenizer proposes tokens
one at a time, the target verifies them all in one multi-token step, and both slots are truncated to what
was kept (``KwkDecoder.generate(..., draft=other)``).

Contract: greedy output is exactly the target's greedy text (every kept token is the argmax of the
target's own logits for that position). With sampling, the standard rule (Leviathan et al. 2023, Chen et
al. 2023): a draft token x drawn from the draft's distribution q is kept with probability min(1, p(x)/q(x))
under the target's p, else a token is drawn from max(0, p - q) renormalised; so each token follows the
target's distribution. p and q are the same temperature / top-k / top-p warp as the native sampler
(``rust/src/decoder/sample.rs``), computed here in float64 from the float32 logits.

The number of drafts adapts as prompt lookup's does: all kept doubles it (up to ``max_draft``), else it
becomes what was kept plus one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from .decoder import KwkDecoder


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


def check_pair(target: KwkDecoder, draft: KwkDecoder) -> None:
    if draft is target:
        raise ValueError("kwker: the draft model is the target itself; give a smaller decoder (e.g. SmolLM2-135M)")
    if draft.vocab_size != target.vocab_size:
        raise ValueError(
            f"kwker: the draft model has a vocabulary of {draft.vocab_size} tokens and the target {target.vocab_size}; "
            "a draft must use the target's tokenizer (e.g. SmolLM2-135M for SmolLM2-360M/1.7B)"
        )
    names = ("bos_token_id", "eos_token_id", "pad_token_id")
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
    ctx = min(target.max_context, draft.max_context)
    stops = set(stop)

    def choose(lg: torch.Tensor) -> int:
        if greedy:
            return int(torch.argmax(lg))
        return int(torch.multinomial(warp(lg, temperature, top_k, top_p), 1, generator=gen))

    # Both slots end up holding the same text; bring the draft's to the target's prefix first.
    held_t = target.slot_tokens(slot)
    held_d = draft.slot_tokens(draft_slot)
    common = 0
    for a, b in zip(held_t, held_d, strict=False):
        if a != b:
            break
        common += 1
    draft.truncate(draft_slot, common)
    draft.step([(draft_slot, held_t[common:] + prompt.tolist())], logits="none")
    (logits,) = target.step([(slot, prompt)])
    out: list[int] = []
    drafted = kept_total = 0
    k = min(4, max_draft)
    pending = choose(logits[0])
    while True:
        # Emit `pending`: the first token of this round, chosen from the target's logits.
        out.append(pending)
        held = target.slot_len(slot)  # everything before `pending`
        if callback is not None and callback(0, pending) is False:
            return out, "callback", drafted, kept_total
        if pending in stops:
            return out, "stop", drafted, kept_total
        if len(out) >= max_new or held >= ctx:
            return out, "length", drafted, kept_total
        n = min(k, max_new - len(out) - 1, ctx - held - 1)
        drafts: list[int] = []
        qs: list[torch.Tensor] = []
        if n > 0:
            # The draft reads `pending` (its logits for the first draft) then each draft but the last.
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
        (rows,) = target.step([(slot, [pending, *drafts])], logits="all" if drafts else "last")
        accepted = 0
        nxt = None
        for j, d in enumerate(drafts):
            if greedy:
                t = int(torch.argmax(rows[j]))
                if t != d:
                    nxt = t
                    break
            else:
                p = warp(rows[j], temperature, top_k, top_p)
                q = qs[j]
                if float(torch.rand((), generator=gen, dtype=torch.float64)) * float(q[d]) >= float(p[d]):
                    residual = (p - q).clamp_min(0)
                    nxt = int(torch.multinomial(residual / residual.sum(), 1, generator=gen))
                    break
            # d is kept: emit it as the model's own token.
            accepted += 1
            out.append(d)
            if callback is not None and callback(0, d) is False:
                return _end(target, draft, slot, draft_slot, held + 1 + j, out, "callback", drafted + n,
                            kept_total + accepted)  # fmt: skip
            if d in stops:
                return _end(target, draft, slot, draft_slot, held + 1 + j, out, "stop", drafted + n,
                            kept_total + accepted)  # fmt: skip
            if len(out) >= max_new:
                return _end(target, draft, slot, draft_slot, held + 1 + j, out, "length", drafted + n,
                            kept_total + accepted)  # fmt: skip
        if nxt is None:  # every draft kept: the bonus token from the row after the last
            nxt = choose(rows[len(drafts)])
        drafted += n
        kept_total += accepted
        keep = held + 1 + accepted  # pending and the kept drafts
        target.truncate(slot, keep)
        draft.truncate(draft_slot, min(draft.slot_len(draft_slot), keep))
        if n:
            k = min(2 * k, max_draft) if accepted == n else max(1, accepted + 1)
        # The draft must hold exactly what the target holds before the next `pending`.
        missing = target.slot_tokens(slot)[draft.slot_len(draft_slot) :]
        if missing:
            draft.step([(draft_slot, missing)], logits="none")
        pending = nxt


def _end(target: KwkDecoder, draft: KwkDecoder, slot: int, draft_slot: int, keep: int, out: list[int], why: str,
         drafted: int, kept: int) -> tuple[list[int], str, int, int]:  # fmt: skip
    """Ends inside a run of kept drafts: both slots keep what precedes the last emitted token."""
    target.truncate(slot, keep)
    draft.truncate(draft_slot, min(draft.slot_len(draft_slot), keep))
    return out, why, drafted, kept

