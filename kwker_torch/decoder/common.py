"""What the decoder package's modules share without importing each other: the precisions, the prompt chunk,
the default prompt-lookup depth, what ``generate`` returns (``Completion``), the model's EOS ids, and the
machine's memory (for budgets). ``runtime.py`` re-exports the public ones.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

PRECISIONS = ("preserve", "balanced", "int8", "int4")
# Rows (tokens) per pass over the weights: prompts longer than this are read in chunks.
CHUNK_ROWS = 512

# Tokens older than its window that a sliding-window layer keeps (rust/src/decoder/cache.rs KEEP): how far back
# a slot can be truncated past its window.
WINDOW_KEEP = 64


# KV cache formats (``kv_cache=``): float32 (the 1e-5 contract), bf16, int8 codes with a scale per head and position.
KV_CACHES = ("f32", "bf16", "q8")

# The cache a precision gets when ``kv_cache`` is not given, chosen by measured quality at 4,096 tokens of context
# (real SmolLM2-135M, Q4_1 source; docs/quantization.md): preserve keeps float32 (its 1e-5 contract); int8 takes
# bf16, which left its perplexity where f32 does (+0.175 against +0.176 %) where q8 moved it to +0.297 %; int4
# takes q8, which moved its +2.0 % by +0.03 points at half bf16's bytes and decodes fastest at depth.
DEFAULT_KV_CACHE = {"preserve": "f32", "balanced": "bf16", "int8": "bf16", "int4": "q8"}


def kv_cache_for(precision: str, kv_cache: str | None) -> str:
    """``kv_cache`` as given, else ``precision``'s default (``DEFAULT_KV_CACHE``); an unknown name raises."""
    if kv_cache is None:
        return DEFAULT_KV_CACHE.get(precision, "f32")
    if kv_cache not in KV_CACHES:
        raise ValueError(f"kwker: kv_cache={kv_cache!r}; expected one of {', '.join(KV_CACHES)} (or None: "
                         "the precision's default)")  # fmt: skip
    return kv_cache


def kv_row_bytes(kv_cache: str, head_dim: int) -> int:
    """Bytes one head's K (or V) row takes in the cache format (``recipe.rs`` ``KvFormat::row_bytes``)."""
    if kv_cache not in KV_CACHES:
        raise ValueError(f"kwker: kv_cache={kv_cache!r}; expected one of {', '.join(KV_CACHES)}")
    return {"f32": 4 * head_dim, "bf16": 2 * head_dim, "q8": head_dim + 4}[kv_cache]


def kv_cache_bytes(recipe: dict, max_context: int, kv_cache: str = "f32") -> int:
    """Bytes of one slot's KV cache at ``max_context``, as the native cache allocates it: a global layer holds every
    position, a sliding-window layer its window, ``WINDOW_KEEP`` older keys and two chunks of rows (``cache.rs``
    ``window_capacity``; ``dec.info["kv_bytes_per_slot"]`` is the native figure, tested equal)."""
    per_position = 2 * recipe["kv_heads"] * kv_row_bytes(kv_cache, recipe["head_dim"])
    positions = 0
    for spec in recipe["layer_specs"]:
        w = spec.get("window")
        positions += max_context if w is None else min(max_context, w - 1 + WINDOW_KEEP + 2 * CHUNK_ROWS)
    return positions * per_position


# Most draft tokens per speculative step that generate() proposes by default (prompt lookup).
PROMPT_LOOKUP = 8


@dataclass
class Completion:
    """What ``generate`` returns per prompt: the new tokens and why it stopped ("stop": a stop token,
    the last of ``tokens``; "length": ``max_new_tokens`` or the slot's ``max_context``; "callback"); the
    slot it ran in, how many prompt tokens that slot already held (``cached``: not read again), and the
    prompt-lookup drafts proposed and accepted."""

    tokens: list[int]
    finish_reason: str
    slot: int = 0
    cached: int = 0
    drafted: int = 0
    accepted: int = 0


def eos_ids(model: torch.nn.Module) -> list[int]:
    """The model's end-of-sequence ids (generation config first, then the model config)."""
    for src in (getattr(model, "generation_config", None), getattr(model, "config", None)):
        eos = getattr(src, "eos_token_id", None)
        if eos is not None:
            return [int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos])]
    return []


def meminfo(field: str) -> int | None:
    """Bytes Linux's /proc/meminfo gives for ``field`` ("MemTotal", "MemAvailable"), or None where it cannot be read."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def mem_total() -> int | None:
    """Bytes of RAM this machine has (MemTotal), or None where it cannot be read."""
    return meminfo("MemTotal")
