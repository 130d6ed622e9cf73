"""A Responses API reply's output items and stream events, built from one chat reply's split items (chat.py's
``ChoiceSplit``: reasoning, content, calls whole or in fragments), and the responses kept for
``previous_response_id`` (``Kept``).

``Output`` turns the items, as they arrive, into OpenAI's output items in the reply's order: a ``reasoning``
item (its text as ``content`` ``reasoning_text``, ``summary`` empty: the model's own reasoning, not a summary),
``message`` items (one ``output_text`` part) and ``function_call`` items; and into the stream's events, each
with its ``sequence_number``: ``response.output_item.added``, ``response.content_part.added``, the deltas
(``response.reasoning_text.delta``, ``response.output_text.delta``, ``response.function_call_arguments.delta``),
their ``.done`` events, ``response.content_part.done`` and ``response.output_item.done``. A whole call
(``tool_call_stream`` "whole" shape) streams as one arguments delta. The whole reply fed at once gives the
items a stream gives (only their ids differ). Logprobs (``include`` "message.output_text.logprobs"), given per
token of the answer by ``logprobs`` before the items its text made, ride on the next ``output_text.delta`` and
collect in the part's ``logprobs`` (the ``.done`` event carries them all); those of tokens that wrote a call
instead are dropped. A reply cut by ``max_output_tokens`` leaves its last item
``incomplete``; a finished reply without a message or a call gets an empty message.

``Kept``: responses in memory (at most ``keep``, each for ``ttl`` seconds, the least recently used evicted
first), under a lock: any thread may use it.
"""

from __future__ import annotations

import copy
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any


def item_id(prefix: str) -> str:
    """An id in OpenAI's shape: ``resp_…``, ``msg_…``, ``fc_…``, ``rs_…``."""
    return f"{prefix}_{uuid.uuid4().hex}"


class Output:
    """One reply's output items and stream events (see the module doc). ``seq`` numbers the events; the
    events made since the last ``drain`` are returned by it."""

    def __init__(self) -> None:
        self.items: list[dict[str, Any]] = []
        self.open: dict[str, Any] | None = None  # the item being written (the last of items)
        self.seq = 0
        self._events: list[dict[str, Any]] = []
        self._logprobs: list[dict[str, Any]] = []  # the answer's tokens not yet on a delta

    def event(self, kind: str, **fields: Any) -> dict[str, Any]:
        """Records an event (its fields copied: items change after it is made)."""
        ev = {"type": kind, "sequence_number": self.seq, **copy.deepcopy(fields)}
        self.seq += 1
        self._events.append(ev)
        return ev

    def drain(self) -> list[dict[str, Any]]:
        out, self._events = self._events, []
        return out

    def logprobs(self, entries: list[dict[str, Any]]) -> None:
        """The logprobs of answer tokens (OpenAI's entries: token, logprob, bytes, top_logprobs), for the next
        text delta."""
        self._logprobs += entries

    def feed(self, items: Iterable[tuple[str, Any]]) -> None:
        for kind, x in items:
            if kind in ("reasoning", "content"):
                self._text("reasoning" if kind == "reasoning" else "message", x)
            elif kind == "call_start":
                self._call(x["id"], x["function"]["name"])
            elif kind == "args":
                self._args(x)
            elif kind == "call":  # (a whole call: one delta of its arguments)
                self._call(x["id"], x["function"]["name"])
                self._args(x["function"]["arguments"])
                self._close()

    def finish(self, cut: bool) -> None:
        """The reply ended (``cut``: by max_output_tokens, its last item is incomplete)."""
        if not cut and not any(it["type"] in ("message", "function_call") for it in self.items):
            self._text("message", "")
        self._close("incomplete" if cut else "completed")

    # ---- items
    def _add(self, item: dict[str, Any]) -> dict[str, Any]:
        self._close()
        self.items.append(item)
        self.open = item
        self.event("response.output_item.added", output_index=len(self.items) - 1, item=item)
        return item

    def _where(self) -> dict[str, Any]:
        assert self.open is not None
        return {"item_id": self.open["id"], "output_index": len(self.items) - 1}

    def _text(self, kind: str, text: str) -> None:
        it = self.open
        if it is None or it["type"] != kind:
            it = self._add({"type": "reasoning", "id": item_id("rs"), "summary": [], "content": [],
                            "status": "in_progress"} if kind == "reasoning" else
                           {"type": "message", "id": item_id("msg"), "status": "in_progress", "role": "assistant",
                            "content": []})  # fmt: skip
            part: dict[str, Any] = ({"type": "reasoning_text", "text": ""} if kind == "reasoning" else
                                    {"type": "output_text", "text": "", "annotations": [], "logprobs": []})  # fmt: skip
            self.event("response.content_part.added", **self._where(), content_index=0, part=part)
            it["content"].append(part)
        if not text:
            return
        it["content"][0]["text"] += text
        if kind == "reasoning":
            self.event("response.reasoning_text.delta", **self._where(), content_index=0, delta=text)
        else:
            lp, self._logprobs = self._logprobs, []
            it["content"][0]["logprobs"] += lp
            self.event("response.output_text.delta", **self._where(), content_index=0, delta=text, logprobs=lp)

    def _call(self, call_id: str, name: str) -> None:
        self._logprobs = []  # (held tokens that wrote this call, not the answer's text)
        self._add({"type": "function_call", "id": item_id("fc"), "call_id": call_id, "name": name, "arguments": "",
                   "status": "in_progress"})  # fmt: skip

    def _args(self, text: str) -> None:
        it = self.open
        if it is None or it["type"] != "function_call" or not text:
            return
        it["arguments"] += text
        self.event("response.function_call_arguments.delta", **self._where(), delta=text)

    def _close(self, status: str = "completed") -> None:
        it = self.open
        if it is None:
            return
        where = self._where()
        if it["type"] == "function_call":
            self.event("response.function_call_arguments.done", **where, name=it["name"], arguments=it["arguments"])
        else:
            part = it["content"][0]
            done = "response.reasoning_text.done" if it["type"] == "reasoning" else "response.output_text.done"
            if it["type"] == "message":  # (tokens whose text was held to the end: the end tag's)
                part["logprobs"] += self._logprobs
                self._logprobs = []
            extra = {} if it["type"] == "reasoning" else {"logprobs": part["logprobs"]}
            self.event(done, **where, content_index=0, text=part["text"], **extra)
            self.event("response.content_part.done", **where, content_index=0, part=part)
        it["status"] = status
        self.event("response.output_item.done", output_index=where["output_index"], item=it)
        self.open = None


@dataclass
class Entry:
    """A kept response: its object (GET) and the conversation after it, as chat messages (instructions not
    included: a follow-up's own instructions replace them, as OpenAI's)."""

    response: dict[str, Any]
    messages: list[dict[str, Any]]
    at: float
    #: The request's own input as Responses items, each with an id (``GET .../input_items``).
    items: list[dict[str, Any]] = field(default_factory=list)


class Kept:
    """Responses kept in memory (see the module doc)."""

    def __init__(self, keep: int, ttl: float) -> None:
        self.keep, self.ttl = keep, ttl
        self._lock = threading.Lock()
        self._d: OrderedDict[str, Entry] = OrderedDict()

    def _expire(self, now: float) -> None:
        for k in [k for k, v in self._d.items() if now - v.at > self.ttl]:
            del self._d[k]
        while len(self._d) > self.keep:
            self._d.popitem(last=False)

    def put(self, rid: str, response: dict[str, Any], messages: list[dict[str, Any]],
            items: list[dict[str, Any]] | None = None) -> None:  # fmt: skip
        if self.keep < 1:
            return
        now = time.monotonic()
        with self._lock:
            self._d[rid] = Entry(response, messages, now, items or [])
            self._d.move_to_end(rid)
            self._expire(now)

    def get(self, rid: str) -> Entry | None:
        now = time.monotonic()
        with self._lock:
            self._expire(now)
            e = self._d.get(rid)
            if e is not None:
                self._d.move_to_end(rid)
            return e

    def delete(self, rid: str) -> bool:
        with self._lock:
            return self._d.pop(rid, None) is not None

    def __len__(self) -> int:
        with self._lock:
            return len(self._d)
