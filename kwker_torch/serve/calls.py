"""Tool calls parsed out of a model's reply as it streams (tools.py decides what a request asks for).

``CallStream`` splits text, as it arrives, into content and calls, in one of two shapes:
- whole calls (``fragments=False``): ("call", call) once a call's block has closed (the reply's end for
  Llama 3 JSON replies), its arguments complete;
- fragments (``fragments=True``, OpenAI's own streaming shape): ("call_start", call) as soon as the call's
  head ``{"name": "<a declared function>", "arguments": {`` is written (the call's id, type and name, with
  empty arguments), then ("args", text) pieces of the arguments object as the model writes them, which
  concatenate to exactly the ``arguments`` of the whole call. A block whose head is another shape (keys in
  another order, arguments written as a JSON string) is held and sent whole. Once a call has started, its
  arguments are sent as written: a model that then writes broken JSON leaves a call whose arguments do not
  parse (the whole-call shape keeps such a block as text), as vLLM and llama-server stream them.

The whole reply fed at once gives what a stream gives (non-streamed replies are parsed this way). A call's
``arguments`` are the model's own text of the arguments object (it parses to the same JSON value).
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from .text import held_prefix

# A call's head, up to its arguments object's opening brace (function names: OpenAI's 64-character rule).
HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*"([a-zA-Z0-9_-]{1,64})"\s*,\s*"(?:arguments|parameters)"\s*:\s*(?=\{)')
HEAD_MAX = 256  # a block still without a head after this many characters is held and sent whole


@dataclass(frozen=True)
class CallSyntax:
    """How one chat template's replies mark a call."""

    name: str
    open: str  # text that starts a call ("": the whole reply is the call)
    close: str
    args_key: str  # the key of the arguments inside the call's JSON object


HERMES = CallSyntax("hermes", "<tool_call>", "</tool_call>", "arguments")
LLAMA3_JSON = CallSyntax("llama3-json", "", "", "parameters")


def new_call(name: str, arguments: Any) -> dict[str, Any]:
    args = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
    return {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function", "function": {"name": name, "arguments": args}}


class _Object:
    """Finds where a JSON object written from ``start`` ends, scanning only the characters not yet seen."""

    def __init__(self, start: int) -> None:
        self.at = start
        self.depth = 0
        self.in_str = self.esc = False
        self.end = -1  # index just after the object's closing brace, once written

    def scan(self, text: str) -> int:
        """How far the object reaches in ``text`` so far."""
        while self.end < 0 and self.at < len(text):
            c = text[self.at]
            self.at += 1
            if self.in_str:
                self.esc, self.in_str = (False, True) if self.esc else (c == "\\", c != '"')
            elif c == '"':
                self.in_str = True
            elif c in "{[":
                self.depth += 1
            elif c in "}]":
                self.depth -= 1
                if self.depth == 0:
                    self.end = self.at
        return self.end if self.end >= 0 else len(text)


def _raw_arguments(text: str, args: dict[str, Any]) -> str:
    """The model's own text of a call's arguments object (``args`` re-serialised when it cannot be found)."""
    m = HEAD.match(text)
    if m is not None:
        obj = _Object(m.end())
        end = obj.scan(text)
        if obj.end >= 0:
            try:
                if json.loads(text[m.end() : end]) == args:
                    return text[m.end() : end]
            except ValueError:
                pass
    return json.dumps(args, ensure_ascii=False)


def call_of(text: str, syntax: CallSyntax, names: Collection[str] | None = None) -> dict[str, Any] | None:
    """The call a JSON object makes, or None when the text is not a call: not a JSON object, a ``name``
    that is not one of ``names`` (a JSON answer that happens to have a name is an answer), or arguments
    that are not an object (Llama 3 replies must carry their ``parameters``)."""
    try:
        obj = json.loads(text)
    except ValueError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    if names is not None and obj["name"] not in names:
        return None
    key = syntax.args_key if syntax.args_key in obj else "arguments" if "arguments" in obj else None
    if key is None and not syntax.open:
        return None
    args = obj.get(key, {}) if key else {}
    raw = isinstance(args, dict)
    if isinstance(args, str):  # (arguments written as a JSON string, as OpenAI sends them)
        try:
            args = json.loads(args)
        except ValueError:
            return None
    if not isinstance(args, dict):
        return None
    return new_call(obj["name"], _raw_arguments(text, args) if raw else args)


class CallStream:
    """Splits generated text, as it arrives, into content and calls (see the module doc). ``feed`` and
    ``flush`` return ("content", text), ("call", call), ("call_start", call) and ("args", text) items in
    order. ``inside``: the reply starts inside a call's block (a forced call's opening marker was in the
    prompt)."""

    def __init__(self, syntax: CallSyntax, parallel: bool = True, names: Collection[str] | None = None,
                 fragments: bool = False, inside: bool = False) -> None:  # fmt: skip
        self.s = syntax
        self.parallel = parallel
        self.names = names  # the functions a call may name (None: any)
        self.fragments = fragments
        self.buf = ""
        self.inside = inside  # within a call block (hermes), or holding a JSON reply (llama3)
        self.opened = "" if inside else syntax.open  # the current block's marker, as the reply wrote it
        self.started = False  # (llama3) some non-space text was seen
        self.space = ""  # the space before the current block (content again if the block is not a call)
        self.calls = 0
        self._new_block()

    def _new_block(self) -> None:
        self.whole = not self.fragments  # this block is held and sent whole
        self.head = False  # its head was sent (fragments)
        self.obj: _Object | None = None
        self.sent = 0  # end of the arguments text already sent, in buf

    def feed(self, piece: str) -> list[tuple[str, Any]]:
        self.buf += piece
        return self._scan(False)

    def flush(self) -> list[tuple[str, Any]]:
        return self._scan(True)

    def _call(self, body: str, raw: str) -> list[tuple[str, Any]]:
        call = call_of(body.strip(), self.s, self.names)
        if call is None:
            return [("content", self.space + raw)] if raw else []
        self.calls += 1
        return [("call", call)] if self.parallel or self.calls == 1 else []

    def _stream(self, body: str, final: bool) -> list[tuple[str, Any]]:
        """Fragments of the block whose text so far is ``body`` (a prefix of buf)."""
        if self.whole:
            return []
        out: list[tuple[str, Any]] = []
        if not self.head:
            m = HEAD.match(body)
            if m is None:
                self.whole = final or len(body) > HEAD_MAX
                return out
            name = m.group(1)
            if (self.names is not None and name not in self.names) or (not self.parallel and self.calls):
                self.whole = True
                return out
            self.head, self.obj, self.sent = True, _Object(m.end()), m.end()
            self.calls += 1
            out.append(("call_start", new_call(name, "")))
        assert self.obj is not None
        upto = self.obj.scan(body)
        if upto > self.sent:
            out.append(("args", body[self.sent : upto]))
            self.sent = upto
        return out

    def _end_block(self, body: str, raw: str) -> list[tuple[str, Any]]:
        out = self._stream(body, True)
        if not self.head:
            out += self._call(body, raw)
        self.space = ""
        self._new_block()
        return out

    def _scan(self, end: bool) -> list[tuple[str, Any]]:
        out: list[tuple[str, Any]] = []
        if not self.s.open:  # the whole reply is one JSON call, or text
            if not self.started:
                head = self.buf.lstrip()
                if not head:
                    return out
                self.started, self.inside = True, head.startswith("{")
            if not self.inside:
                out.append(("content", self.buf))
                self.buf = ""
            elif end:
                out += self._end_block(self.buf, self.buf)
                self.buf = ""
            else:
                out += self._stream(self.buf, False)
            return out
        while True:
            if self.inside:
                j = self.buf.find(self.s.close)
                if j < 0:
                    if end:
                        out += self._end_block(self.buf, self.opened + self.buf)
                        self.buf = ""
                    else:
                        out += self._stream(self.buf[: len(self.buf) - held_prefix(self.buf, self.s.close)], False)
                    return out
                before = self.calls
                out += self._end_block(self.buf[:j], self.opened + self.buf[: j + len(self.s.close)])
                self.buf = self.buf[j + len(self.s.close) :]
                if self.calls > before:  # (the newline templates put between calls is not content)
                    self.buf = self.buf.lstrip("\n")
                self.inside = False
                continue
            i = self.buf.find(self.s.open)
            if i >= 0:
                head = self.buf[:i]
                text = head.rstrip()
                if text:  # (space before or between calls is not content)
                    out.append(("content", text))
                self.space = head[len(text) :]
                self.buf, self.inside, self.opened = self.buf[i + len(self.s.open) :], True, self.s.open
                continue
            hold = 0 if end else held_prefix(self.buf, self.s.open)
            release = self.buf[: len(self.buf) - hold]
            if not end:  # (space is held until text follows: before a call it is not content)
                release = release.rstrip()
            if not release.strip():  # space: content only if text follows, or the reply ends without calls
                if end:
                    if release and not self.calls:
                        out.append(("content", release))
                    self.buf = ""
                return out
            if release:
                out.append(("content", release))
                self.buf = self.buf[len(release) :]
            return out


def gather(items: list[tuple[str, Any]]) -> tuple[str, list[dict[str, Any]]]:
    """(content, whole calls) of a CallStream's items (fragments joined into their calls)."""
    calls: list[dict[str, Any]] = []
    content = []
    for kind, x in items:
        if kind == "content":
            content.append(x)
        elif kind in ("call", "call_start"):
            calls.append({**x, "function": dict(x["function"])})
        elif kind == "args":
            calls[-1]["function"]["arguments"] += x
    return "".join(content), calls


def split_reply(text: str, syntax: CallSyntax, parallel: bool = True, names: Collection[str] | None = None,
                inside: bool = False) -> tuple[str | None, list[dict[str, Any]]]:  # fmt: skip
    """(content, calls) of a whole reply; content is None when only calls remain."""
    cs = CallStream(syntax, parallel, names, inside=inside)
    content, calls = gather(cs.feed(text) + cs.flush())
    if calls:
        content = content.strip()
    return content or None, calls
