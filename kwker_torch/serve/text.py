"""Turning generated token ids into the text a client sees, as tokens arrive.

``Detokenizer``: the text of a growing list of ids, released a piece at a time. A token can end inside a
multi-byte character (byte-level BPE), and a tokenizer's cleanup can change how the last token reads once
the next one arrives, so the newest text is decoded from a few tokens back and held while it ends in an
incomplete character (U+FFFD); the concatenated pieces equal ``tokenizer.decode(all ids)`` for the
tokenizers served here (tested on SmolLM2).

``StopMatcher``: OpenAI ``stop`` strings, matched in the text, not in tokens, so a stop string that spans
token boundaries is found. Text that could still become the start of a stop string is held back until
it cannot; on a match the output ends just before the stop string (which is not returned).
"""

from __future__ import annotations

from typing import Any

# Tokens of left context decoded before the new ones (a tokenizer's spacing rules look back).
_CONTEXT = 5


class Detokenizer:
    def __init__(self, tokenizer: Any, prompt_tail: list[int] | None = None) -> None:
        self.tok = tokenizer
        self.ids: list[int] = list(prompt_tail or [])[-_CONTEXT:]
        self.prefix = 0  # ids[prefix:read]: context whose text was released (or is the prompt's)
        self.read = len(self.ids)

    def _decode(self, ids: list[int]) -> str:
        return self.tok.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)

    def push(self, token: int) -> str:
        """Adds a token; returns the text it completes ("" while a character is still incomplete)."""
        self.ids.append(token)
        before = self._decode(self.ids[self.prefix : self.read])
        after = self._decode(self.ids[self.prefix :])
        if len(after) <= len(before) or after.endswith("\ufffd"):
            return ""
        self.prefix, self.read = self.read, len(self.ids)
        return after[len(before) :]

    def flush(self) -> str:
        """At the end: text of the last tokens even if it ends in an incomplete character."""
        before = self._decode(self.ids[self.prefix : self.read])
        after = self._decode(self.ids[self.prefix :])
        self.prefix, self.read = self.read, len(self.ids)
        return after[len(before) :] if len(after) > len(before) else ""


class StopMatcher:
    def __init__(self, stops: list[str]) -> None:
        self.stops = [s for s in stops if s]
        self.text = ""  # everything generated so far
        self.released = 0  # characters of text handed out

    def feed(self, piece: str) -> tuple[str, bool]:
        """Adds generated text; returns (text now safe to release, whether a stop string was hit)."""
        start = self.released  # (no stop string starts in released text: its start would have been held)
        self.text += piece
        hit = min((p for p in (self.text.find(s, start) for s in self.stops) if p >= 0), default=-1)
        if hit >= 0:
            self.text = self.text[:hit]
            return self._release(len(self.text)), True
        hold = max((held_prefix(self.text, s) for s in self.stops), default=0)
        return self._release(len(self.text) - hold), False

    def flush(self) -> str:
        """At the end of generation (no stop string hit): whatever was held back."""
        return self._release(len(self.text))

    def _release(self, upto: int) -> str:
        upto = max(upto, self.released)
        out = self.text[self.released : upto]
        self.released = upto
        return out


def held_prefix(text: str, marker: str) -> int:
    """Length of the longest end of ``text`` that starts ``marker`` (held back: it may become the marker)."""
    for k in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:k]):
            return k
    return 0
