"""One HTTP request in flight: its choices submitted to the engine, their events gathered on the event
loop (whole, ``outcome``, which gives up when the client leaves; or as they come, ``events``), and the
pieces every endpoint builds its OpenAI JSON from (logprobs, ids, SSE lines, a streamed response that frees
the choices' slots however it ends).

The engine thread hands events over with ``loop.call_soon_threadsafe``; nothing here blocks the loop.
Choice ``index`` is ``prompt_index * n + j`` (OpenAI's numbering for several prompts and ``n``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from fastapi import Request as HttpRequest
from fastapi.responses import StreamingResponse

from .engine import Engine, Event, Request
from .sampling import Sampler, SamplingParams, TokenOut
from .text import Detokenizer


class Flight:
    def __init__(self, engine: Engine, prompts: list[list[int]], params: SamplingParams, n: int,
                 matchers: list[Any] | None, deadline: float | None) -> None:  # fmt: skip
        self.engine = engine
        self.queue: asyncio.Queue[tuple[int, Event]] = asyncio.Queue()
        self.loop = asyncio.get_running_loop()
        self.created = int(time.time())
        self.reqs: list[Request] = []
        for p, prompt in enumerate(prompts):
            leader: Request | None = None
            for j in range(n):
                idx = p * n + j
                seed = None if params.seed is None else params.seed + j
                sp = dataclasses.replace(params, seed=seed)
                sampler = Sampler(sp, matchers[idx] if matchers else None, prompt)
                req = Request(prompt, sp, sampler, functools.partial(self._emit, idx), Detokenizer(engine.tok, prompt),
                              after=leader, deadline=deadline)  # fmt: skip
                leader = leader or req
                self.reqs.append(req)
        engine.submit(self.reqs)

    def _emit(self, idx: int, ev: Event) -> None:  # engine thread
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, (idx, ev))
        except RuntimeError:  # the event loop is gone (server shut down): nobody is listening
            pass

    async def events(self) -> AsyncIterator[tuple[int, Event]]:
        """Every choice's events, until each has finished or failed."""
        left = len(self.reqs)
        while left:
            idx, ev = await self.queue.get()
            if ev.finish is not None or ev.error is not None:
                left -= 1
            yield idx, ev

    async def gather(self) -> Gathered:
        """Every choice's whole text, tokens and finish reason (stops at the first error)."""
        n = len(self.reqs)
        texts: list[list[str]] = [[] for _ in range(n)]
        toks: list[list[TokenOut]] = [[] for _ in range(n)]
        finish: list[str | None] = [None] * n
        async for i, ev in self.events():
            if ev.error is not None:
                self.cancel()
                return Gathered([], [], [], ev)
            texts[i].append(ev.text)
            toks[i].extend(ev.tokens)
            finish[i] = ev.finish or finish[i]
        return Gathered(["".join(t) for t in texts], toks, finish, None)

    def cancel(self) -> None:
        for r in self.reqs:
            if not r.done:
                self.engine.cancel(r)

    def usage(self) -> dict[str, Any]:
        leaders = [r for r in self.reqs if r.after is None]  # choice 0 of each prompt: a prompt counts once
        prompt = sum(len(r.prompt) for r in leaders)
        cached = sum(r.cached for r in leaders)
        done = sum(r.n_generated for r in self.reqs)
        return {"prompt_tokens": prompt, "completion_tokens": done, "total_tokens": prompt + done,
                "prompt_tokens_details": {"cached_tokens": cached}}  # fmt: skip


@dataclass
class Gathered:
    """A flight's choices whole: ``failed`` is the error event that ended it early (then the lists are empty)."""

    texts: list[str]
    toks: list[list[TokenOut]]
    finish: list[str | None]
    failed: Event | None


async def outcome(request: HttpRequest, flight: Flight) -> Gathered | None:
    """The flight's choices whole, or None when the client left first (its slots are freed then)."""
    collect = asyncio.ensure_future(flight.gather())
    gone = asyncio.ensure_future(disconnected(request))
    try:
        await asyncio.wait({collect, gone}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:  # (uvicorn gave up on the request at shutdown)
        flight.cancel()
        collect.cancel()
        raise
    finally:
        gone.cancel()
    if not collect.done():  # the client left: free its slots
        flight.cancel()
        collect.cancel()
        return None
    return collect.result()


async def disconnected(request: HttpRequest) -> None:
    """Returns when the client closes the connection (the body has been read by then)."""
    while True:
        msg = await request.receive()
        if msg["type"] == "http.disconnect":
            return


class Stream(StreamingResponse):
    """A streamed response that cancels its choices however it ends (the client left, the server gave up)."""

    def __init__(self, flight: Flight, content: Any, **kw: Any) -> None:
        super().__init__(content, **kw)
        self.flight = flight

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.flight.cancel()


def sse(obj: Any, event: str | None = None) -> str:
    """One server-sent event of a JSON object (with its ``event:`` line when named, as the Responses API's)."""
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {json.dumps(obj, ensure_ascii=False)}\n\n"


@functools.lru_cache(maxsize=65536)
def _token_text(tok: Any, token: int) -> str:
    return tok.decode([token], skip_special_tokens=False, clean_up_tokenization_spaces=False)


@functools.lru_cache(maxsize=1)
def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level BPE alphabet (printable stand-ins for the 256 bytes), inverted."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = list(keep), 0
    for b in range(256):
        if b not in keep:
            keep.append(b)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(keep, chars, strict=True)}


@functools.lru_cache(maxsize=65536)
def _token_bytes(tok: Any, token: int) -> list[int]:
    """The token's own bytes (a token may hold part of a UTF-8 character, which its text cannot show)."""
    piece = tok.convert_ids_to_tokens(token)
    table = _byte_decoder()
    if isinstance(piece, str) and piece and all(ch in table for ch in piece):
        return [table[ch] for ch in piece]
    return list(_token_text(tok, token).encode())


def chat_logprobs(tok: Any, toks: list[TokenOut]) -> dict[str, Any]:
    def entry(t: int, lp: float) -> dict[str, Any]:
        return {"token": _token_text(tok, t), "logprob": lp, "bytes": _token_bytes(tok, t)}

    return {"content": [{**entry(t.id, t.logprob), "top_logprobs": [entry(i, v) for i, v in t.top]} for t in toks],
            "refusal": None}  # fmt: skip


def text_logprobs(tok: Any, toks: list[TokenOut], base: int = 0) -> dict[str, Any]:
    return {
        "tokens": [_token_text(tok, t.id) for t in toks],
        "token_logprobs": [t.logprob for t in toks],
        "top_logprobs": [{_token_text(tok, i): v for i, v in t.top} for t in toks],
        "text_offset": [base + t.offset for t in toks],
    }


def new_id(kind: str) -> str:
    return f"{kind}-{uuid.uuid4().hex[:24]}"
