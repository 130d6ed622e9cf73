"""Hugging Face's own float32 reference for decoder tests: the logits of a prompt and of greedy steps over HF's
cache, as the tests compare each native step against them (no arithmetic of ours: HF's forward as it is)."""

from __future__ import annotations

import torch


def hf_steps(model: torch.nn.Module, ids: torch.Tensor, n: int,
             keep: int | None = None) -> tuple[list[torch.Tensor], list[int]]:  # fmt: skip
    """HF's float32 logits: the prompt's rows (its last ``keep`` only, when given: a long prompt's full logits
    would not fit), then one row per greedy step over its own cache; and the ``n`` greedy tokens."""
    from transformers import DynamicCache

    extra = {} if keep is None else {"logits_to_keep": keep}
    with torch.no_grad():
        out = model(ids[None], cache=DynamicCache(config=model.config), use_cache=True, **extra)
        rows, toks = [out.logits[0].float()], []
        for _ in range(n):
            toks.append(int(rows[-1][-1].argmax()))
            out = model(torch.tensor([[toks[-1]]]), cache=out.cache, use_cache=True)
            rows.append(out.logits[0].float())
    return rows, toks
