"""Strict reading of a Hugging Face config: a family mapping reads every architecture field it relies on
through ``Fields`` (so the field is known to be implemented), names the fields that cannot change the
forward (``inert``), and ``done()`` refuses any other field of the config class whose value is not the
class default, naming it. So a config that asks for something the recipe lacks (a new field in a newer
transformers, ``use_bidirectional_attention=True``, ``add_cross_attention=True``, ...) is an error, never
silently run as something else. There is no ``getattr(cfg, name, default)`` here: a missing field is a
bug in the mapping and says so.
"""

from __future__ import annotations

import dataclasses
from typing import Any

# Fields of every PretrainedConfig that do not change a causal LM's forward.
BASE_INERT = frozenset({
    "transformers_version", "architectures", "output_hidden_states", "return_dict", "dtype",
    "chunk_size_feed_forward", "id2label", "label2id", "problem_type",
    # Ids and bookkeeping: the forward never reads them.
    "initializer_range", "init_std", "use_cache", "pad_token_id", "bos_token_id", "eos_token_id",
})  # fmt: skip
# Dropout rates: zero effect in eval mode, which is the only mode the decoder stands in for.
DROPOUTS = frozenset({
    "attention_dropout", "hidden_dropout", "resid_pdrop", "embd_pdrop", "attn_pdrop", "dropout", "layerdrop",
    "residual_dropout", "embedding_dropout", "classifier_dropout", "summary_first_dropout",
})  # fmt: skip


def _default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        return f.default_factory()  # type: ignore[misc]
    return dataclasses.MISSING


def has_field(cfg: Any, name: str) -> bool:
    """Whether the config class declares ``name`` (not merely an attribute some code set)."""
    return dataclasses.is_dataclass(cfg) and name in {f.name for f in dataclasses.fields(cfg)}


class Fields:
    """Reads ``cfg`` for family ``family``; ``inert`` names fields that do not change its forward."""

    def __init__(self, cfg: Any, family: str, inert: frozenset[str] | set[str] = frozenset()) -> None:
        self.cfg, self.family = cfg, family
        self.inert = BASE_INERT | DROPOUTS | frozenset(inert)
        self.read: set[str] = set()

    def __getitem__(self, name: str) -> Any:
        if not hasattr(self.cfg, name):
            raise ValueError(
                f"kwker: the {self.family} config has no field {name!r}, which KwkDecoder's mapping reads; "
                "this transformers version may have renamed it (please report it)"
            )
        self.read.add(name)
        return getattr(self.cfg, name)

    def refuse(self, name: str, why: str) -> ValueError:
        """An error naming config field ``name`` and its value."""
        value = getattr(self.cfg, name, None)
        return ValueError(f"kwker: {self.family} with {name}={value!r}: {why}")

    def done(self) -> None:
        """Refuses every field of the config class neither read, inert nor at its class default."""
        if not dataclasses.is_dataclass(self.cfg):
            return
        odd = []
        for f in dataclasses.fields(self.cfg):
            if f.name in self.read or f.name in self.inert:
                continue
            default = _default(f)
            value = getattr(self.cfg, f.name, default)
            if default is dataclasses.MISSING or value != default:
                odd.append(f"{f.name}={value!r} (default {default!r})")
        if odd:
            raise ValueError(
                f"kwker: this {self.family} config sets {', '.join(odd)}, which KwkDecoder does not implement "
                "(it runs these fields only at their defaults). Use torch.compile(model, backend='kwker') or "
                "kwker_torch.torch_ops.install() for this model"
            )
