"""``kwker``: the short name of ``kwker_torch`` (``import kwker``; ``from kwker.decode import install``).

Everything lives in ``kwker_torch``; these modules re-export it so both names refer to the same objects.
"""

from __future__ import annotations

from kwker_torch import *  # noqa: F403
from kwker_torch import KwkDecoder, __version__, isa, num_threads, set_isa, set_num_threads, supported_isas

__all__ = ["KwkDecoder", "__version__", "isa", "num_threads", "set_isa", "set_num_threads", "supported_isas"]
