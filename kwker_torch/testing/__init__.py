"""Test and benchmark helpers: random models with the exact shapes of published configs
(``kwker_torch.testing.models``), plus the local-model loaders of ``kwker_torch.hf`` under the same roof."""

from __future__ import annotations

from ..hf import (  # noqa: F401
    SMOLLM2_GGUF,
    SMOLLM2_PACKAGE,
    chat_ids,
    generate_greedy,
    load_local,
    load_smollm2,
    qwen_tokenizer,
    smollm2_dir,
)
from .models import CONFIGS, make_config, random_model  # noqa: F401
