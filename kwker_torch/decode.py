"""``kwker_torch.decode``: ``decode.install(model)`` and friends, under their documented name (they live in
``kwker_torch/decoder/install.py``)."""

from __future__ import annotations

from .decoder.install import KwkCache, decoder_of, install, is_installed, stats, uninstall

__all__ = ["KwkCache", "decoder_of", "install", "is_installed", "stats", "uninstall"]
