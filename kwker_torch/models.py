"""The old name of the model helpers: ``kwker_torch.hf`` (local and real models) and ``kwker_torch.testing``
(random models of published configs), kept working for scripts and notebooks. Product modules import
``kwker_torch.hf``."""

from __future__ import annotations

from .hf import *  # noqa: F403
from .hf import SMOLLM2_GGUF, SMOLLM2_PACKAGE  # noqa: F401
from .testing.models import *  # noqa: F403
from .testing.models import CONFIGS  # noqa: F401
