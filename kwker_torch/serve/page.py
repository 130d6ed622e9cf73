"""The chat page at ``/``: open ``http://127.0.0.1:8000/`` after ``python -m kwker_torch.serve`` to talk to the
model in a browser.

``add_page(app)`` registers ``GET /``, which returns ``static/chat.html`` (read once, when the app is built).
The page is one self-contained file, inline CSS and JS with no framework, no build step and nothing fetched
from elsewhere: it reads the model id from ``GET /v1/models``, keeps a multi-turn conversation, streams each
answer from ``POST /v1/chat/completions`` (SSE, ``stream_options.include_usage``), shows the time to first
token and tokens/s, shows the server's errors with their status, shows a thinking model's reasoning folded
above its answer and its tool calls as cards, and lets the user set the system prompt, temperature, max
tokens and tools, and stop an answer. It is served from the package (``pyproject.toml`` ships
``static/`` in the wheel); ``tests/serve/test_serve_page.py`` drives it in a headless Chromium.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import HTMLResponse

PAGE = Path(__file__).resolve().parent / "static" / "chat.html"


def add_page(app: FastAPI) -> None:
    """Serves the chat page at ``GET /`` of ``app`` (not listed in the OpenAPI schema)."""
    html = PAGE.read_text(encoding="utf-8")

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    async def chat_page() -> HTMLResponse:
        return HTMLResponse(html)
