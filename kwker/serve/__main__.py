"""``python -m kwker.serve``: the OpenAI-compatible server (``kwker_torch.serve``; see ``--help``)."""

from __future__ import annotations

import sys

from kwker_torch.serve.__main__ import main

if __name__ == "__main__":
    sys.exit(main(prog="python -m kwker.serve"))
