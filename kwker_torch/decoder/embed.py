"""Embeddings from a ``KwkDecoder``: each sequence's final normed hidden state (the lm_head's input, Hugging
Face's ``model.model(ids).last_hidden_state``, what sentence-transformers' Pooling module reads) pooled over its
tokens, optionally L2-normalized, and optionally cut to its first ``dimensions`` values (Matryoshka models).

Sequences are read several per native step (``KwkDecoder.step(..., output="hidden")``), one per slot, up to
``ROW_BUDGET`` tokens a step (a longer sequence goes alone); each slot is emptied before and after, so what it held
(a cached prompt) is gone. A LongRoPE model's sequences longer than its switch are read in other steps than the
shorter ones (``long_from``), so each gets the rotary set Hugging Face gives it alone. "last" pooling asks the step
for the last row of each sequence only, "mean" for every row. The server runs one group per engine loop
(``serve/embeddings.py``) through ``check``, ``order``, ``groups`` and ``run_group``; ``KwkDecoder.embed`` runs them
all.

Numerical contract: the hidden rows are the decoder's float32 forward (within 1e-5 of the largest value of
HF's float32 hidden states with unquantized weights, tests/decoder/test_embed.py); pooling is float32 as
sentence-transformers computes it: "mean" the sum of the rows divided by their count, "last" the last row;
normalizing divides by max(L2 norm, 1e-12) (``torch.nn.functional.normalize``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

POOLINGS = ("last", "mean")
# Tokens read per native step (several sequences) before the next group starts; beyond a few windows of
# rows (chunk_rows = 512) a step is bound by arithmetic, so larger groups gain nothing and hold more memory.
ROW_BUDGET = 4096


def as_batch(dec: Any, ids_or_batch: Any) -> tuple[list[torch.Tensor], bool]:
    """(sequences as 1-D int64 tensors, whether one sequence was given rather than a list)."""
    single = isinstance(ids_or_batch, torch.Tensor) and ids_or_batch.dim() == 1
    if not single and not isinstance(ids_or_batch, torch.Tensor):
        items = list(ids_or_batch)
        single = len(items) > 0 and isinstance(items[0], int)
        ids_or_batch = items
    seqs = [ids_or_batch] if single else list(ids_or_batch)
    if not seqs:
        raise ValueError("kwker: embed() needs at least one sequence of token ids")
    return [dec._tokens(s, f"sequence {i}") for i, s in enumerate(seqs)], single


def check(dec: Any, seqs: Sequence[torch.Tensor], pooling: str) -> None:
    """ValueError naming the first sequence that cannot be embedded (empty, an id outside the vocabulary,
    longer than a slot) or a pooling this module does not know."""
    if pooling not in POOLINGS:
        raise ValueError(f"kwker: pooling={pooling!r}; expected one of {list(POOLINGS)}")
    for i, t in enumerate(seqs):
        if len(t) == 0:
            raise ValueError(f"kwker: sequence {i} is empty; give at least one token id")
        lo, hi = int(t.min()), int(t.max())
        if lo < 0 or hi >= dec.vocab_size:
            bad = lo if lo < 0 else hi
            raise ValueError(f"kwker: sequence {i} has token id {bad}, outside the vocabulary [0, {dec.vocab_size})")
        if len(t) > dec.max_context:
            raise ValueError(f"kwker: sequence {i} has {len(t)} tokens; a slot holds at most max_context = "
                             f"{dec.max_context}")  # fmt: skip


def long_from(dec: Any) -> int | None:
    """LongRoPE's switch (a call whose sequence has more tokens than this rotates with the long set: Phi-3/4),
    or None. Hugging Face picks the set per call from its longest sequence, so a step must not mix sequences
    on both sides of it."""
    cached = getattr(dec, "_embed_long_from", False)
    if cached is False:
        pos = dec.describe()["recipe"]["positions"]
        ropes = pos.get("rotary", {}).get("ropes", []) if isinstance(pos, dict) else []
        lens = [int(r["long"]["from_len"]) for r in ropes if r.get("long")]
        cached = dec._embed_long_from = min(lens) if lens else None
    return cached


def order(lengths: Sequence[int], switch: int | None) -> list[int]:
    """The order sequences are read in: as given, those up to ``switch`` tokens before longer ones."""
    return sorted(range(len(lengths)), key=lambda i: switch is not None and lengths[i] > switch)


def groups(lengths: Sequence[int], slots: int, budget: int = ROW_BUDGET, switch: int | None = None) -> list[range]:
    """Consecutive runs of sequences read in one step each: at most ``slots`` sequences and ``budget`` tokens
    (a sequence longer than the budget alone), not mixing sequences on both sides of ``switch`` tokens."""
    out, start, tokens = [], 0, 0
    side = [switch is not None and n > switch for n in lengths]
    for i, n in enumerate(lengths):
        if i > start and (i - start == slots or tokens + n > budget or side[i] != side[start]):
            out.append(range(start, i))
            start, tokens = i, 0
        tokens += n
    if lengths:
        out.append(range(start, len(lengths)))
    return out


def run_group(dec: Any, seqs: Sequence[torch.Tensor], slots: Sequence[int], pooling: str) -> torch.Tensor:
    """The pooled (not normalized) hidden states [len(seqs), hidden_size] of sequences read in one native
    step, sequence i in slot ``slots[i]``; the slots are emptied before and after. The caller holds the
    slots (``check`` passed)."""
    used = list(slots[: len(seqs)])
    if len(used) < len(seqs):
        raise ValueError(f"kwker: {len(seqs)} sequences for {len(used)} slots")
    for s in used:
        dec.truncate(s, 0)
    try:
        mode = "last" if pooling == "last" else "all"
        rows = dec.step(list(zip(used, seqs, strict=True)), logits=mode, output="hidden")
    finally:
        for s in used:
            dec.truncate(s, 0)
    if pooling == "last":
        return torch.cat(rows)
    return torch.stack([r.sum(0) / r.shape[0] for r in rows])


def finish(pooled: torch.Tensor, normalize: bool, dimensions: int | None = None) -> torch.Tensor:
    """Cut to the first ``dimensions`` values (Matryoshka), then L2-normalized when ``normalize``."""
    if dimensions is not None:
        pooled = pooled[..., :dimensions]
    if normalize:
        pooled = torch.nn.functional.normalize(pooled, p=2.0, dim=-1)
    return pooled.contiguous()


def embed(dec: Any, ids_or_batch: Any, pooling: str, normalize: bool, slots: Sequence[int] | None) -> torch.Tensor:
    """``KwkDecoder.embed`` (see there)."""
    seqs, single = as_batch(dec, ids_or_batch)
    check(dec, seqs, pooling)
    use = list(range(dec.max_batch)) if slots is None else [int(s) for s in slots]
    if not use or len(set(use)) != len(use) or not all(0 <= s < dec.max_batch for s in use):
        raise ValueError(f"kwker: slots={list(slots or [])}: give distinct slots of this decoder "
                         f"(0..{dec.max_batch - 1})")  # fmt: skip
    dec._check_reentry()
    switch = long_from(dec)
    idx = order([len(t) for t in seqs], switch)
    seqs = [seqs[i] for i in idx]
    with dec._gen_lock:  # (generate() picks slots under the same lock)
        parts = [run_group(dec, seqs[g.start : g.stop], use, pooling)
                 for g in groups([len(t) for t in seqs], len(use), switch=switch)]  # fmt: skip
    pooled = torch.empty(len(idx), dec.hidden_size)
    pooled[idx] = torch.cat(parts)
    out = finish(pooled, normalize)
    return out[0] if single else out
