"""Reasoning ("thinking") replies in OpenAI's shape as vLLM and llama-server return them: the text a thinking
chat template's model writes inside ``<think>…</think>`` goes to ``message.reasoning_content`` (streamed as
``delta.reasoning_content``), the rest to ``content`` (where tool calls are parsed as without reasoning).

Which templates think: those whose source writes ``<think>`` (Qwen 3, DeepSeek-R1 distills, SmolLM3).
A template with a switch (``enable_thinking`` in its source, as Qwen 3) is told by the request:
``chat_template_kwargs`` (an object whose keys reach ``apply_chat_template`` as template variables) or
``reasoning_effort`` (``"none"`` and ``"minimal"`` turn thinking off, ``"low"`` … ``"xhigh"`` on). A
``reasoning_effort`` for a template without a switch is a 400: the server could not honour it.

Where a reply starts: a template's generation prompt may open ``<think>`` itself (DeepSeek-R1 distills,
Qwen3 thinking-2507): the reply then starts inside its reasoning with no opening tag (``opens_inside``
reads the prompt's end); otherwise reasoning is a ``<think>`` block at the start of the reply (space before
it allowed). A reply cut by ``max_tokens`` inside its reasoning has only reasoning. The newlines templates
put after ``<think>``, before ``</think>`` and after it are not part of either text.

``max_tokens`` counts reasoning tokens, as OpenAI does; ``usage.completion_tokens_details.reasoning_tokens``
reports them: the tokens whose text starts before the end of ``</think>`` (all of them if it never came).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .schema import FieldError
from .text import held_prefix
from .tools import template_source

OPEN, CLOSE = "<think>", "</think>"
SWITCH = "enable_thinking"
EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh")  # OpenAI's values
EFFORT_OFF = ("none", "minimal")
# apply_chat_template's own arguments: not template variables a request may set.
RESERVED = ("conversation", "messages", "tools", "documents", "chat_template", "add_generation_prompt",
            "continue_final_message", "tokenize", "padding", "truncation", "max_length", "return_tensors",
            "return_dict", "return_assistant_tokens_mask", "tokenizer_kwargs")  # fmt: skip


class ReasoningError(FieldError):
    """A reasoning request this server cannot honour for this model; ``param`` names the field."""


@dataclass(frozen=True)
class Thinking:
    """What a chat template does with reasoning."""

    thinks: bool  # its replies may hold a <think> block
    switch: str | None  # the template variable that turns thinking on and off, or None


def thinking_of(tok: Any) -> Thinking:
    src = template_source(tok)
    thinks = OPEN in src
    return Thinking(thinks, SWITCH if thinks and SWITCH in src else None)


def template_kwargs(body: Any, th: Thinking) -> dict[str, Any]:
    """The template variables of a chat request: its ``chat_template_kwargs`` with ``reasoning_effort``
    mapped onto the template's switch. Raises ReasoningError naming the field at fault."""
    kw = body.chat_template_kwargs
    if kw is None:
        kw = {}
    if not isinstance(kw, dict):
        raise ReasoningError(f"chat_template_kwargs must be a JSON object of template variables (e.g. "
                             f'{{"{SWITCH}": false}}), got {type(kw).__name__}', "chat_template_kwargs")  # fmt: skip
    bad = [k for k in kw if k in RESERVED]
    if bad:
        raise ReasoningError(f"chat_template_kwargs cannot set {', '.join(bad)}: the server sets "
                             f"{'it' if len(bad) == 1 else 'them'} from the request; send the other template "
                             "variables only", "chat_template_kwargs")  # fmt: skip
    kw = dict(kw)
    effort = body.reasoning_effort
    if effort is None:
        return kw
    if not isinstance(effort, str) or effort not in EFFORTS:
        raise ReasoningError(f"reasoning_effort must be one of {', '.join(EFFORTS)}; got {effort!r}",
                             "reasoning_effort")  # fmt: skip
    if th.switch is None:
        what = "always thinks" if th.thinks else "does not think"
        raise ReasoningError(f"reasoning_effort: this model's chat template {what} and has no switch for "
                             f"thinking ({SWITCH}), so the effort cannot be honoured; leave reasoning_effort out",
                             "reasoning_effort")  # fmt: skip
    on = effort not in EFFORT_OFF
    if th.switch in kw and kw[th.switch] is not on:
        raise ReasoningError(f"reasoning_effort {effort!r} turns thinking {'on' if on else 'off'} but "
                             f"chat_template_kwargs sets {th.switch} to {kw[th.switch]!r}; send one of the two",
                             "reasoning_effort")  # fmt: skip
    kw[th.switch] = on
    return kw


def opens_inside(prompt_text: str) -> bool:
    """The prompt's end leaves a ``<think>`` open (the template opened the reasoning for the model)."""
    i = prompt_text.rfind(OPEN)
    return i >= 0 and prompt_text.find(CLOSE, i) < 0 and not prompt_text[i + len(OPEN) :].strip(" \n")


class ReasoningStream:
    """Splits a reply's text, as it arrives, into ("reasoning", text) and ("content", text) items; the
    whole reply fed at once gives what a stream gives. ``end``: the character offset in the reply where its
    reasoning ended (after ``</think>``), None while it has not."""

    def __init__(self, inside: bool = False) -> None:
        self.state = "inside" if inside else "start"  # start -> inside -> after (or start -> after)
        self.buf = ""
        self.base = 0  # offset of buf[0] in the reply
        self.fresh = True  # nothing released since entering this state (leading newlines are dropped)
        self.had = inside  # the reply had a reasoning block
        self.end: int | None = None

    def feed(self, piece: str) -> list[tuple[str, str]]:
        self.buf += piece
        return self._scan(False)

    def flush(self) -> list[tuple[str, str]]:
        return self._scan(True)

    def _take(self, n: int) -> str:
        out, self.buf, self.base = self.buf[:n], self.buf[n:], self.base + n
        return out

    def _scan(self, end: bool) -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = []
        while True:
            if self.state == "start":
                head = self.buf.lstrip()
                if head.startswith(OPEN):
                    self._take(len(self.buf) - len(head) + len(OPEN))
                    self.state, self.fresh, self.had = "inside", True, True
                    continue
                if not end and (not head or OPEN.startswith(head)):
                    return out  # (may still become the opening tag)
                self.state, self.fresh = "after", False
                continue
            if self.fresh:  # (the newline after a tag is the template's, not the text's)
                stripped = self.buf.lstrip("\n")
                self._take(len(self.buf) - len(stripped))
                if not self.buf and not end:
                    return out
            if self.state == "after":
                if self.buf:
                    out.append(("content", self._take(len(self.buf))))
                    self.fresh = False
                return out
            j = self.buf.find(CLOSE)
            if j >= 0:
                text = self._take(j).rstrip("\n")
                self._take(len(CLOSE))
                if text:
                    out.append(("reasoning", text))
                self.end = self.base
                self.state, self.fresh = "after", True
                continue
            keep = 0 if end else held_prefix(self.buf, CLOSE)
            release = self.buf[: len(self.buf) - keep]
            if not end:
                release = release.rstrip("\n")  # (newlines before </think> are held until text follows)
            if release:
                out.append(("reasoning", self._take(len(release))))
                self.fresh = False
            elif end:
                self._take(len(self.buf))
            return out

    def tokens(self, offsets: Sequence[int]) -> int:
        """How many of the reply's tokens (given by the offsets where their text starts) are reasoning."""
        if not self.had:
            return 0
        if self.end is None:
            return len(offsets)
        return sum(1 for o in offsets if o < self.end)
