"""Serving an app from a background thread of this process (uvicorn on a free 127.0.0.1 port): for the
demo, tests and notebooks. ``python -m kwker_torch.serve`` is the way to run a server for clients.
"""

from __future__ import annotations

import socket
import threading
import time
from typing import Any


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Background:
    """``app`` served by uvicorn in a daemon thread until ``stop()``; ``url`` is its base URL."""

    def __init__(self, app: Any, port: int | None = None, start_timeout: float = 120.0) -> None:
        import uvicorn

        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cfg = uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning", timeout_graceful_shutdown=5)
        self.server = uvicorn.Server(cfg)
        self.thread = threading.Thread(target=self.server.run, name="kwker-serve", daemon=True)
        self.thread.start()
        deadline = time.monotonic() + start_timeout
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"kwker: the server on port {self.port} did not start (is the port in use?)")
            time.sleep(0.05)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=60)

    def __enter__(self) -> Background:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
