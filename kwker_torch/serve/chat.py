"""One chat choice's reply in OpenAI's shape: its text split, as it streams, into reasoning (reasoning.py),
content and tool calls (calls.py, under the request's ToolPlan from tools.py), and turned into the whole
``message`` or the stream's ``delta`` objects.

The order is the reply's: a thinking template's reasoning block comes first, and only the text after it is
content in which calls are parsed. A forced call's reply is the call (its marker was in the prompt), so it
has no reasoning.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .calls import gather
from .reasoning import ReasoningStream
from .tools import ToolPlan


@dataclass(frozen=True)
class ReplyPlan:
    """How a chat request's replies are split."""

    tools: ToolPlan | None
    thinks: bool = False  # the template thinks: reasoning_content is split out (and reported, even if none)
    inside: bool = False  # the prompt opened the reasoning: the reply starts inside it
    fragments: bool = True  # streamed calls in fragments (OpenAI's shape), else whole


class ChoiceSplit:
    """Splits one choice's text as it arrives; ``feed`` returns ("reasoning" | "content", text), ("call",
    call), ("call_start", call) and ("args", text) items in order. The whole reply fed at once (with
    ``fragments`` off) gives what the stream gives."""

    def __init__(self, plan: ReplyPlan, fragments: bool | None = None) -> None:
        tp = plan.tools
        self.think = ReasoningStream(plan.inside) if plan.thinks and not (tp and tp.forced) else None
        self.calls = tp.stream(plan.fragments if fragments is None else fragments) if tp is not None else None
        self.plan = plan
        self.offsets: list[int] = []  # where each token's text starts in the reply
        self.ncalls = 0  # calls started in deltas so far
        self._undecided: list[Any] = []  # tokens not yet known to be reasoning or answer (``answer_tokens``)

    def feed(self, text: str, offsets: Sequence[int] = (), end: bool = False) -> list[tuple[str, Any]]:
        self.offsets += offsets
        items: list[tuple[str, Any]] = []
        if self.think is not None:
            items = self.think.feed(text) + (self.think.flush() if end else [])
        elif text:
            items = [("content", text)]
        if self.calls is None:
            return items
        out: list[tuple[str, Any]] = []
        for kind, x in items:
            out += self.calls.feed(x) if kind == "content" else [(kind, x)]
        return out + (self.calls.flush() if end else [])

    def reasoning_tokens(self) -> int:
        return self.think.tokens(self.offsets) if self.think is not None else 0

    def answer_tokens(self, toks: Sequence[Any]) -> list[Any]:
        """Of ``toks`` (tokens with an ``offset`` in the reply, fed after their text) and those held before, the
        ones that wrote the answer rather than the reasoning, as soon as the reply tells which: while it may still
        open a ``<think>`` block they are held. Call once per token, in order."""
        self._undecided += toks
        th = self.think
        if th is not None and th.state == "start":
            return []
        out, self._undecided = self._undecided, []
        if th is None or not th.had:
            return out
        return [] if th.end is None else [t for t in out if t.offset >= th.end]

    def message(self, items: list[tuple[str, Any]]) -> dict[str, Any]:
        """The whole ``message`` of a reply's items (``tool_calls`` only when there are calls)."""
        reasoning = "".join(x for k, x in items if k == "reasoning")
        content: str | None
        content, calls = gather([(k, x) for k, x in items if k != "reasoning"])
        tp = self.plan.tools
        if calls:
            content = content.strip() or None
        elif (tp is not None and not tp.forced) or self.think is not None:
            content = content or None
        msg: dict[str, Any] = {"role": "assistant", "content": content, "refusal": None}
        if self.plan.thinks:
            msg["reasoning_content"] = reasoning or None
        if calls:
            msg["tool_calls"] = calls
        return msg

    def deltas(self, items: list[tuple[str, Any]]) -> list[dict[str, Any]]:
        """The stream's ``delta`` objects of some items, one each."""
        out: list[dict[str, Any]] = []
        for kind, x in items:
            if kind == "reasoning":
                out.append({"reasoning_content": x})
            elif kind == "content":
                out.append({"content": x})
            elif kind in ("call", "call_start"):
                out.append({"tool_calls": [{"index": self.ncalls, **x}]})
                self.ncalls += 1
            else:  # args: a fragment of the call started last
                out.append({"tool_calls": [{"index": self.ncalls - 1, "function": {"arguments": x}}]})
        return out


def usage(base: dict[str, Any], splits: Sequence[ChoiceSplit]) -> dict[str, Any]:
    """A chat request's usage: the engine's counts with the reasoning tokens among the completion's."""
    return {**base, "completion_tokens_details": {"reasoning_tokens": sum(s.reasoning_tokens() for s in splits)}}
