"""``python -m kwker_torch.serve``: runs the OpenAI-compatible server with uvicorn (see ``--help``).

SIGINT/SIGTERM stop it gracefully: no new connections, requests in flight finish for up to
``--shutdown-grace`` seconds, the rest end with an error.
"""

from __future__ import annotations

import argparse
import logging
import sys

from .options import ServeOptions, add_flags, from_flags


def parse(argv: list[str] | None = None) -> ServeOptions:
    ap = argparse.ArgumentParser(prog="python -m kwker_torch.serve", description=__doc__.splitlines()[0])
    add_flags(ap)
    try:
        return from_flags(ap.parse_args(argv))
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
