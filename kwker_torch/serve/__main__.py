"""``python -m kwker_torch.serve``: runs the OpenAI-compatible server with uvicorn (see ``--help``).

SIGINT/SIGTERM stop it gracefully: no new connections, requests in flight finish for up to
``--shutdown-grace`` seconds, the rest end with an error.
"""

from __future__ import annotations

import argparse
import logging
import sys

from .options import ServeOptions, add_flags, from_flags


def parse(argv: list[str] | None = None, prog: str = "python -m kwker_torch.serve") -> ServeOptions:
    ap = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    add_flags(ap)
    try:
        return from_flags(ap.parse_args(argv))
    except ValueError as e:
        ap.error(str(e))
        raise


# Seconds uvicorn waits for connections beyond the grace period: the engine ends what still runs at the
# grace period's end, and the streams need a moment to send that error and [DONE] before uvicorn cancels them.
FLUSH_MARGIN = 5


def main(argv: list[str] | None = None, prog: str = "python -m kwker_torch.serve") -> int:
    import uvicorn

    from .app import create_app

    opts = parse(argv, prog)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s: %(message)s")
    app = create_app(opts)

    class Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: object) -> None:
            # The engine's grace period starts with the signal (not after uvicorn's own wait for the
            # connections, when it would cancel the streams before they could say why they end).
            app.state.drain()
            super().handle_exit(sig, frame)  # type: ignore[arg-type]

    grace = int(opts.shutdown_grace) + FLUSH_MARGIN
    config = uvicorn.Config(app, host=opts.host, port=opts.port, log_level="info", timeout_graceful_shutdown=grace)
    Server(config).run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
