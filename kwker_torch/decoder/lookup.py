"""Prompt lookup in Python (the server's engine, Hugging Face's ``prompt_lookup_num_tokens`` under
``decode.install()``): draft tokens copied from the text a sequence has already seen.

The proposal is the same as the native loop's (``rust/src/decoder/lookup.rs``): the last ``NGRAM_MAX`` (then
down to ``NGRAM_MIN``) tokens of the history are looked up at their most recent earlier occurrence, and
the tokens that followed it are the drafts. Nothing here decides what is emitted: the caller keeps a
draft only where the model itself chooses it.
"""

from __future__ import annotations

NGRAM_MAX = 3
NGRAM_MIN = 2


def propose(history: list[int], k: int) -> list[int]:
    """Up to ``k`` tokens that followed the latest earlier occurrence of the history's last tokens."""
    n_all = len(history)
    for n in range(NGRAM_MAX, NGRAM_MIN - 1, -1):
        if n_all <= n:
            continue
        tail = history[-n:]
        first = tail[0]
        for i in range(n_all - n - 1, -1, -1):  # most recent first; the suffix itself is not a match
            if history[i] == first and history[i : i + n] == tail:
                return history[i + n : i + n + k]
    return []
