"""A decoder that writes what a test scripts, for server tests on random weights (which write noise).

``Scripted(dec, eos)`` runs the real decoder (its slots, KV cache and step: prompts are read, the prompt
cache works, tokens are fed back) and only replaces the logits of the rows that choose a token: while
``reply`` is set, each new reply writes those tokens one by one and then ``eos``, whatever the weights say.
The server's sampler still applies everything it applies to real logits (a grammar's mask, stop strings,
``max_tokens``), so a scripted token a grammar refuses fails the request, as it should.

A row continues a reply when its slot holds exactly one token more than after the step that wrote the
reply's last token and that token is it; any other row starts a reply. Serve with ``prompt_lookup=0``:
draft rows are not scripted.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch


class Scripted:
    def __init__(self, dec: Any, eos: int) -> None:
        self._dec = dec
        self.eos = eos
        self.reply: list[int] | None = None  # the tokens every new reply writes; None: the model's own
        self._at: dict[int, tuple[int, int]] = {}  # slot -> (its length after the last scripted step, tokens written)

    def __getattr__(self, name: str) -> Any:  # everything else is the real decoder's
        return getattr(self._dec, name)

    def say(self, tok: Any, text: str | None) -> None:
        """Scripts the replies to be ``text`` (tokenized as the tokenizer does; None: the model's own)."""
        self.reply = None if text is None else list(tok.encode(text, add_special_tokens=False))

    def step(self, seqs: Sequence[tuple[int, Sequence[int] | torch.Tensor]],
             logits: str | Sequence[str] = "last") -> list[torch.Tensor]:  # fmt: skip
        rows = self._dec.step(seqs, logits=logits)
        script = self.reply
        if script is None:
            return rows
        modes = [logits] * len(seqs) if isinstance(logits, str) else list(logits)
        out = []
        for (slot, toks), mode, row in zip(seqs, modes, rows, strict=True):
            if mode == "all":
                raise RuntimeError("Scripted: draft rows are not scripted; serve with prompt_lookup=0")
            if mode == "last":
                n = self._dec.slot_len(slot)
                held, k = self._at.get(slot, (-1, 0))
                fed = [int(t) for t in toks]
                if not (held == n - 1 and k > 0 and fed == [script[k - 1]]):
                    k = 0  # a new reply
                nxt = script[k] if k < len(script) else self.eos
                row = torch.full_like(row, float("-inf"))
                row[-1, nxt] = 0.0
                self._at[slot] = (n, k + 1)
            out.append(row)
        return out
