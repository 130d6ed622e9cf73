"""A decoder that writes what a test scripts, for server tests on random weights (which write noise).

``Scripted(dec, eos)`` runs the real decoder (its slots, KV cache and step: prompts are read, the prompt
cache works, tokens are fed back) and only lifts, in the rows that choose a token, the scripted token's
logit far above the others: while ``reply`` is set, each new reply writes those tokens one by one and then
``eos``, whatever the weights say. The server's sampler still applies everything it applies to real logits
(a grammar's mask, stop strings, ``max_tokens``): a scripted token that a grammar refuses is not written,
the model's own choice among the tokens it allows is, and the rest of that reply is the model's own.

A row continues a reply when its slot holds exactly one token more than after the step that chose the
reply's last token; any other row starts a reply. Serve with ``prompt_lookup=0``: draft rows are not
scripted.
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
        # slot -> (its length after the reply's last step, scripted tokens written; -1: the script was left)
        self._at: dict[int, tuple[int, int]] = {}

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
                if held != n - 1:
                    k = 0  # a new reply
                elif k < 0 or k > len(script) or [int(t) for t in toks] != [script[k - 1]]:
                    self._at[slot] = (n, -1)  # (a grammar refused the script: the model's own from here)
                    out.append(row)
                    continue
                nxt = script[k] if k < len(script) else self.eos
                row = row.clone()
                row[-1, nxt] = row[-1].max() + 1000.0
                self._at[slot] = (n, k + 1)
            out.append(row)
        return out
