"""The server's text release: incremental detokenization equals decoding all ids at once (real SmolLM2
tokenizer, multi-byte characters included), and stop strings are found across piece boundaries with the
text after them dropped and no text released that could start a stop string."""

from __future__ import annotations

from typing import Any

import pytest

from kwker_torch.serve.text import Detokenizer, StopMatcher


@pytest.mark.parametrize("text", ["Hello, world! The café serves crème brûlée.", "日本語のテキスト 🐈‍⬛ emoji 👩‍🚀 mix",
                                  "  spaces\n\nand\ttabs  ", "naïve façade — “quotes” ‘single’ …"])  # fmt: skip
def test_detokenizer_pieces_join_to_the_whole_decode(smollm2: Any, text: str) -> None:
    tok = smollm2[1]
    prompt = tok("Prompt before:")["input_ids"]
    ids = tok(text)["input_ids"]
    d = Detokenizer(tok, prompt)
    pieces = [d.push(t) for t in ids]
    assert "".join(pieces) + d.flush() == tok.decode(ids)
    assert all("\ufffd" not in p for p in pieces)  # no half characters released


def test_detokenizer_flushes_an_incomplete_character(smollm2: Any) -> None:
    tok = smollm2[1]
    ids = tok("🐈")["input_ids"]
    assert len(ids) > 1  # a byte-level character split over tokens
    d = Detokenizer(tok)
    assert d.push(ids[0]) == ""
    assert d.flush() == tok.decode(ids[:1])


def feed_all(stops: list[str], pieces: list[str]) -> tuple[str, bool, list[str]]:
    m = StopMatcher(stops)
    out, released = [], []
    for p in pieces:
        text, hit = m.feed(p)
        released.append(text)
        out.append(text)
        if hit:
            return "".join(out), True, released
    out.append(m.flush())
    return "".join(out), False, released


def test_stop_string_across_pieces() -> None:
    assert feed_all(["END"], ["abc E", "N", "D tail"]) == ("abc ", True, ["abc ", "", ""])
    assert feed_all(["\n\n", "###"], ["one\n", "\ntwo"])[:2] == ("one", True)
    assert feed_all(["xyz"], ["ab", "x", "y", "q"]) == ("abxyq", False, ["ab", "", "", "xyq"])
    assert feed_all(["stop"], ["no stop here"])[:2] == ("no ", True)
    assert feed_all([], ["a", "b"])[:2] == ("ab", False)
    # A held start that turns out not to be a stop string is released, in order.
    assert feed_all(["abc"], ["xa", "b", "d"]) == ("xabd", False, ["x", "", "abd"])
    # The earliest of several matches wins.
    assert feed_all(["cd", "bcd"], ["abcde"])[:2] == ("a", True)
