"""``python -m kwker_torch.serve``: runs the OpenAI-compatible server with uvicorn (see ``--help``).

SIGINT/SIGTERM stop it gracefully: no new connections, requests in flight finish for up to
``--shutdown-grace`` seconds, the rest end with an error.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import sys

from .options import ServeOptions


def parse(argv: list[str] | None = None) -> ServeOptions:
    ap = argparse.ArgumentParser(prog="python -m kwker_torch.serve", description=__doc__.splitlines()[0])
    defaults = ServeOptions()
    helps = {
        "model": "Hugging Face model folder or locally cached hub id (default: the real SmolLM2-135M-Instruct)",
        "precision": "preserve (the model's own weights), int8 (alias balanced) or int4",
        "slots": "sequences decoded together per step; each keeps its text for prefix reuse",
        "max_context": "tokens per request (prompt + completion)",
        "queue": "requests that may wait for a slot; beyond it, 429 with Retry-After",
        "prefill_chunk": "prompt tokens read per step while other requests are generating",
        "request_timeout": "seconds a request may take, waiting included (then 504)",
        "threads": "kernel threads (0: torch's intra-op threads)",
        "served_name": "model id clients pass as 'model' (default: the model folder's name)",
        "shutdown_grace": "seconds requests in flight may run on after SIGTERM/SIGINT",
    }
    for f in dataclasses.fields(ServeOptions):
        default = getattr(defaults, f.name)
        kind = {int: int, float: float}.get(type(default), str)
        ap.add_argument("--" + f.name.replace("_", "-"), type=kind, default=default, help=helps.get(f.name))
    ns = ap.parse_args(argv)
    try:
        return ServeOptions(**vars(ns)).check()
    except ValueError as e:
        ap.error(str(e))
        raise


def main(argv: list[str] | None = None) -> int:
    import uvicorn

    from .app import create_app

    opts = parse(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s: %(message)s")
    app = create_app(opts)
    grace = int(opts.shutdown_grace)
    uvicorn.run(app, host=opts.host, port=opts.port, log_level="info", timeout_graceful_shutdown=grace)
    return 0


if __name__ == "__main__":
    sys.exit(main())
