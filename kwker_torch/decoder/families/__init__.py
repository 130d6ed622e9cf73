"""The families KwkDecoder runs, each a mapping from a Hugging Face config and module tree to the native
decoder's recipe and tensor names (``base.py``); a new family is a mapping here plus its tests, with no new
Rust unless it brings a new part (mixtures of experts: ``moe.py``).

``read(model)`` returns the family and the recipe, or raises a ValueError that names the model type or the
config field that is not supported and what to use instead.
"""

from __future__ import annotations

from typing import Any

import torch

from . import falcon, gemma, learned, llama, moe, neox, phi
from .base import Family, Source
from .fields import Fields, has_field

FAMILIES: tuple[Family, ...] = (
    *llama.FAMILIES, *moe.FAMILIES, *gemma.FAMILIES, *phi.FAMILIES, *neox.FAMILIES, *learned.FAMILIES,
    *falcon.FAMILIES,
)
BY_TYPE: dict[str, Family] = {t: fam for fam in FAMILIES for t in fam.model_types}
# The position-limit field of each config (all but GPT-2's are max_position_embeddings).
MAX_POSITIONS = ("max_position_embeddings", "n_positions")


def supported() -> str:
    return ", ".join(f"{fam.name} ({'/'.join(fam.model_types)})" for fam in FAMILIES)


def maps(model: torch.nn.Module) -> bool:
    """Whether a family maps ``model`` (else ``family_of`` refuses it and the compile backend's path runs it)."""
    kind = getattr(getattr(model, "config", None), "model_type", None)
    return isinstance(kind, str) and kind in BY_TYPE and hasattr(model, "lm_head")


def family_of(model: torch.nn.Module) -> Family:
    cfg = getattr(model, "config", None)
    kind = getattr(cfg, "model_type", None)
    fam = BY_TYPE.get(kind) if isinstance(kind, str) else None
    if fam is None or not hasattr(model, "lm_head"):
        what = f"{type(model).__name__} (model_type={kind!r})"
        raise ValueError(
            f"kwker: KwkDecoder does not run {what}; it runs the causal LMs of {supported()}. "
            "torch.compile(model, backend='kwker') runs any causal LM, and kwker_torch.torch_ops.install() "
            "speeds up its linears in place"
        )
    return fam


def read(model: torch.nn.Module) -> tuple[Family, dict[str, Any]]:
    """The model's family and recipe (the JSON of rust/src/decoder/recipe.rs, without the limits)."""
    fam = family_of(model)
    if getattr(model.config, "num_hidden_layers", None) == 0:  # GPT-2's n_layer maps to it too
        raise ValueError(f"kwker: this {fam.name} model has no layers (num_hidden_layers=0); KwkDecoder needs one")
    f = Fields(model.config, fam.name, fam.inert())
    recipe = fam.recipe(model, f)
    f["vocab_size"], f["tie_word_embeddings"]  # the embedding's shape and tying are read from the modules
    for name in MAX_POSITIONS:
        if has_field(f.cfg, name):
            f[name]
    f.done()
    if f.cfg.is_encoder_decoder:
        raise ValueError(f"kwker: {fam.name} as an encoder-decoder model is not a causal LM KwkDecoder runs")
    return fam, recipe


__all__ = ["BY_TYPE", "FAMILIES", "Family", "Source", "family_of", "maps", "read", "supported"]
