"""The whole-model decoder's Python side (``rust/src/decoder/`` is the native side):

| module | what |
|---|---|
| ``runtime`` | ``KwkDecoder``: slots, steps, the native generation loop |
| ``build`` | ``KwkDecoder.from_hf``: a Hugging Face model in, by its family's mapping |
| ``families/`` | one mapping per model family: config -> recipe, modules -> tensor names |
| ``native`` | the C entry points and every code that crosses them (read from the library) |
| ``plan`` | the quantization plan and calibration statistics |
| ``io`` | ``save`` / ``load`` |
| ``install`` | ``decode.install(model)``: Hugging Face's forward and ``generate()`` on the decoder |
| ``prompt_cache`` | which slot a prompt takes and what it reuses |
| ``speculative`` | a draft model's proposals verified by the decoder |
| ``compiled`` | ``CompiledDecoder``: a causal LM no family maps, on the compile backend's native executor |
"""

from __future__ import annotations

from .build import bf16_exact, check_model
from .native import DecoderError
from .runtime import PRECISIONS, PROMPT_LOOKUP, Completion, KwkDecoder, eos_ids, pool_stalls

__all__ = [
    "PRECISIONS", "PROMPT_LOOKUP", "Completion", "DecoderError", "KwkDecoder", "bf16_exact", "check_model", "eos_ids",
    "pool_stalls",
]  # fmt: skip
