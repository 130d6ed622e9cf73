"""``kwker_torch.serve``: an OpenAI-compatible HTTP server over KwkDecoder, with continuous batching and
per-slot prefix reuse.

    python -m kwker_torch.serve [--model PATH_OR_ID] [--precision int4] [--slots 8] [--port 8000]

then any OpenAI client: ``OpenAI(base_url="http://127.0.0.1:8000/v1", api_key="none")``. In Python:
``create_app(ServeOptions(...))`` is the ASGI app (run it with uvicorn); ``kwker_torch.serve.ray`` runs it as
replicas on Ray Serve. How requests share decoder steps: engine.py; the HTTP side: app.py.
"""

from .app import build_engine, create_app, engine_for
from .engine import Engine
from .options import ServeOptions

__all__ = ["Engine", "ServeOptions", "build_engine", "create_app", "engine_for"]
