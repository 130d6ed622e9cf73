"""``kwker.decode``: ``kwker_torch.decode`` under the short package name."""

from __future__ import annotations

from kwker_torch.decode import KwkCache, decoder_of, install, is_installed, uninstall

__all__ = ["KwkCache", "decoder_of", "install", "is_installed", "uninstall"]
