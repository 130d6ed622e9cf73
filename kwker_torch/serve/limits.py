"""Bounds on what one request may cost before the engine sees it, so that one careless or hostile client
cannot stall the others: the body's size (``BodyLimit``, an ASGI middleware: 413 past ``--max-body``),
and the most text a context could hold (``text_fits``: a character count, checked before any tokenizing).

Why a character count is safe: a token never decodes to more characters than its vocabulary string has
(byte-level BPE writes one character per byte, SentencePiece's byte tokens are ``<0x..>``, WordPiece drops
its ``##``), so a text of C characters needs at least C / L tokens, L the longest vocabulary string.
Normalisers may compose characters (e + combining accent -> é), so the bound allows twice that: a text
refused here could never have fit, whatever the template adds.
"""

from __future__ import annotations

import json
from typing import Any

from .schema import error_body


class BodyLimit:
    """ASGI middleware: a request body of more than ``max_bytes`` gets a 413 in OpenAI's error shape before
    the app reads or parses any of it (a declared Content-Length is refused at once, a chunked body as soon
    as it passes the limit); smaller bodies are read whole and handed to the app unchanged."""

    def __init__(self, app: Any, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope.get("method") not in ("POST", "PUT", "PATCH"):
            return await self.app(scope, receive, send)
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            return await self._too_large(send, int(declared))
        chunks, size = [], 0
        while True:
            msg = await receive()
            if msg["type"] == "http.disconnect":
                return None
            chunk = msg.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                return await self._too_large(send, None)
            chunks.append(chunk)
            if not msg.get("more_body", False):
                break
        body, replayed = b"".join(chunks), False

        async def replay() -> Any:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # (what follows the body: the client's disconnect)

        return await self.app(scope, replay, send)

    async def _too_large(self, send: Any, size: int | None) -> None:
        what = f"{size} bytes" if size is not None else "more bytes"
        message = (f"the request body has {what}, more than this server takes ({self.max_bytes} bytes, "
                   "--max-body); send a shorter request")  # fmt: skip
        payload = json.dumps(error_body(message, "invalid_request_error", "body", "request_too_large")).encode()
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"), (b"connection", b"close")]})  # fmt: skip
        await send({"type": "http.response.body", "body": payload})


def longest_token(tok: Any) -> int:
    """Characters of the tokenizer's longest vocabulary string (computed once per tokenizer)."""
    cached = getattr(tok, "_kwker_longest_token", None)
    if cached is None:
        strings = tok.convert_ids_to_tokens(list(range(len(tok))))
        cached = max((len(s) for s in strings if isinstance(s, str)), default=1)
        try:
            tok._kwker_longest_token = cached
        except AttributeError:  # (a tokenizer that refuses attributes: computed again next time)
            pass
    return int(cached)


def text_fits(chars: int, context: int, tok: Any) -> bool:
    """Whether ``chars`` characters of text could fit in ``context`` tokens (see the module's header)."""
    return chars <= 2 * longest_token(tok) * context
