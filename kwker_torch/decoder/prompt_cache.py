"""The prompt cache: decoder slots keep the text they have read, and a new prompt starts from the longest
start of it that a slot holds, reading only the rest (``KwkDecoder.generate`` and ``decode.install()``).

Which slot a prompt takes: a slot it continues (the slot holds a start of the prompt, or the prompt is a
start of what the slot holds), the one holding the most; else the least recently used slot (so another
conversation's cache is evicted last), into which the longest matching start held by any slot is copied
(``copy_prefix``: K/V copied, not recomputed; a shared system prompt is read once). The memory is the
slots' KV (``max_batch`` x ``max_context``, allocated when touched); eviction is least recently used.

Exactness: a reused K/V is the one computed when the slot read those tokens, from the same weights and
positions; a slot whose text starts at another rotary position (``set_position``) offers nothing, nor does a
start that a model's sliding-window layers no longer hold (``dec.slot_min_len``: they keep their window and 64
older tokens).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from .runtime import KwkDecoder


def shared_start(a: Sequence[int] | torch.Tensor, b: Sequence[int] | torch.Tensor) -> int:
    """How many leading tokens ``a`` and ``b`` have in common."""
    m = min(len(a), len(b))
    if m == 0:
        return 0
    diff = (torch.as_tensor(a[:m]) != torch.as_tensor(b[:m])).nonzero()
    return int(diff[0]) if len(diff) else m


def common(held: list[int], prompt: torch.Tensor) -> int:
    """Cacheable start: what ``held`` and ``prompt`` share, leaving at least one prompt token to read
    (the next token's logits come from it)."""
    return shared_start(held, prompt[: max(len(prompt) - 1, 0)])


def held(dec: KwkDecoder, slot: int) -> list[int]:
    return [] if dec.start_position(slot) else dec.slot_tokens(slot)


def keepable(dec: KwkDecoder, slot: int, have: int, n: int) -> int:
    """``n`` if the slot can keep (or lend) its first ``n`` of ``have`` tokens, else 0: a model's sliding-window
    layers hold only their window and a few older tokens, so a start much shorter than what the slot has read
    since is gone from them (``dec.slot_min_len``)."""
    return n if n in (0, have) or n >= dec.slot_min_len(slot) else 0


def seat(dec: KwkDecoder, prompt: torch.Tensor, candidates: Sequence[int], sources: Sequence[int]) -> tuple[int, int]:
    """Picks a slot among ``candidates`` (least recently used first) for ``prompt`` and makes it hold the
    longest start of the prompt that it or one of ``sources`` holds. Returns (slot, tokens held)."""
    texts = {s: held(dec, s) for s in {*candidates, *sources}}
    com = {s: keepable(dec, s, len(t), common(t, prompt)) for s, t in texts.items()}
    full = len(prompt) - 1
    cont = [s for s in candidates if com[s] > 0 and com[s] in (len(texts[s]), full)]
    slot = max(cont, key=lambda s: (com[s], -list(candidates).index(s))) if cont else candidates[0]
    src = max(sources, key=lambda s: com[s], default=slot)
    if com.get(src, 0) > com[slot]:
        dec.copy_prefix(src, slot, com[src])
        return slot, com[src]
    if com[slot] != dec.slot_len(slot):  # (a positioned slot offers nothing but holds tokens: emptied)
        dec.truncate(slot, com[slot])
    return slot, com[slot]


def place(
    dec: KwkDecoder, toks: list[torch.Tensor], slots: Sequence[int] | None, keep: bool, reuse: bool
) -> tuple[list[int], list[int], list[torch.Tensor]]:
    """``generate``'s slots for its prompts, how many tokens of each its slot holds, and the tokens to feed
    (the caller holds the decoder's generate lock)."""
    n = dec.max_batch
    if slots is not None:
        chosen = [int(s) for s in slots]
        if len(set(chosen)) != len(chosen):
            raise ValueError(f"kwker: slots {chosen} name a slot twice; each prompt needs its own slot")
        for s in chosen:
            if not 0 <= s < n:
                raise ValueError(f"kwker: slot {s} does not exist (this decoder has {n} slots)")
    elif keep or not reuse:
        chosen = list(range(len(toks)))
    else:
        chosen = []
    cached, feed = [], []
    for i, t in enumerate(toks):
        if keep:
            s, c = chosen[i], 0
        elif not reuse:
            s, c = chosen[i], 0
            dec.truncate(s, 0)
        elif slots is not None:
            s, c = seat(dec, t, [chosen[i]], range(n))
        else:
            free = dec.lru_order([s for s in range(n) if s not in chosen])
            s, c = seat(dec, t, free, range(n))
            chosen.append(s)
        dec.mark_used(s)
        cached.append(c)
        feed.append(t[c:])
    return chosen, cached, feed
