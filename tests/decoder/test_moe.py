"""Mixtures of experts (Mixtral, Qwen3-MoE, Granite-MoE, OLMoE) beyond the per-family exactness test
(``test_families.py`` runs every MoE case there, f32 and bf16, step by step against HF float32):

- the margin the exactness test relies on: in every routed row of those runs, the k-th and (k+1)-th router
  logits stand at least ``MARGIN`` of the row's largest logit apart (a softmax keeps the logits' order, so that
  is the margin of every router kind), 100 times the ~1e-6 by which summation order moves a float32 dot
  product of these widths (measured: 1.0e-3 to 1.2e-2 over the cases);
- 8 sequences at different positions decoded together each get the tokens they get alone (preserve), and
  quantized rows are bit-identical to the same rows alone (each row's experts, sums and weighted adds are its
  own);
- ``calib=`` weights each expert by the tokens the router sent to it (checked against the router computed
  in torch), and an expert no token chose is quantized unweighted;
- bytes per token and bits per weight count the active experts (the router and k of each sparse layer's).
"""

from __future__ import annotations

import copy

import pytest
import torch
from fixtures.family_cases import CASES, routers, tiny

from kwker_torch import KwkDecoder
from kwker_torch.decoder import families, plan
from kwker_torch.decoder.plan import row_bits

MOE_CASES = [c for c, (base, _) in CASES.items() if base in
             ("Mixtral-8x7B", "Qwen3-30B-A3B", "Granite-3.1-1B-A400M", "OLMoE-1B-7B")]  # fmt: skip
ONE_PER_FAMILY = ["mixtral", "qwen3-moe", "granite-moe", "olmoe"]
MARGIN = 1e-4
STEPS = 10  # as test_families.py


def top_k(model: torch.nn.Module) -> int:
    return int(model.config.num_experts_per_tok)


def router_logits(model: torch.nn.Module, ids: torch.Tensor, steps: int) -> list[torch.Tensor]:
    """Every router's logits over the prompt and ``steps`` greedy tokens, as test_families.py runs them."""
    from transformers import DynamicCache

    seen: list[torch.Tensor] = []
    hooks = [r.register_forward_hook(lambda _m, _a, out: seen.append(out[0].detach().float())) for r in routers(model)]
    try:
        with torch.no_grad():
            out = model(ids[None], cache=DynamicCache(config=model.config), use_cache=True)
            for _ in range(steps):
                tok = out.logits[0, -1].argmax().view(1, 1)
                out = model(tok, cache=out.cache, use_cache=True)
    finally:
        for h in hooks:
            h.remove()
    return seen


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("case", MOE_CASES)
def test_the_routers_pick_their_experts_with_a_margin(case: str, dtype: torch.dtype) -> None:
    model = copy.deepcopy(tiny(case, dtype)).float()
    ids = torch.randint(3, 1000, (13,), generator=torch.Generator().manual_seed(1))  # test_families' prompt
    logits = torch.cat(router_logits(model, ids, STEPS))
    assert logits.shape[0] > 0
    k = top_k(model)
    if k == logits.shape[1]:
        return  # every expert runs: nothing to pick
    top = logits.sort(dim=-1, descending=True).values
    gap = ((top[:, k - 1] - top[:, k]) / logits.abs().max(-1).values).min().item()
    assert gap >= MARGIN, f"{case}: the k-th and (k+1)-th router logits are only {gap:.2e} of the largest apart"


def prompts(n: int, seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, 1000, (3 + 2 * i,), generator=g) for i in range(n)]


@pytest.mark.parametrize("case", ONE_PER_FAMILY)
def test_eight_sequences_together_get_their_alone_tokens(case: str) -> None:
    model = tiny(case)
    dec = KwkDecoder.from_hf(model, max_batch=8, max_context=64)
    ps = prompts(8, seed=3)  # 3 .. 17 tokens: every decode step holds 8 rows at 8 different positions
    alone = [dec.generate(p, 8, stop_tokens=[], prompt_cache=False, prompt_lookup=0).tokens for p in ps]
    before = dec.native_steps
    together = dec.generate(ps, 8, stop_tokens=[], prompt_cache=False, prompt_lookup=0)
    assert [c.tokens for c in together] == alone
    assert dec.native_steps - before <= 1 + 8  # the prompts, then one native step per token for all 8


@pytest.mark.parametrize("precision", ["int8", "int4"])
def test_quantized_rows_are_bit_identical_to_the_same_rows_alone(precision: str) -> None:
    model = tiny("qwen3-moe", torch.bfloat16)
    dec = KwkDecoder.from_hf(model, precision=precision, max_batch=3, max_context=64)
    a, b, c = prompts(3, seed=4)
    alone = [dec.step([(0, x)], logits="all")[0] for x in (a, b, c) if not dec.reset(0)]
    dec.reset()
    together = dec.step([(0, a), (1, b), (2, c)], logits="all")
    for x, y in zip(alone, together, strict=True):
        assert torch.equal(x, y)


def routed_mean_squares(model: torch.nn.Module, ids: torch.Tensor, layer: int) -> dict[int, torch.Tensor | None]:
    """Per expert of ``layer``: the mean square of each input column over the tokens its router sent to it,
    computed from the router's own logits in torch (None for an expert no token chose)."""
    block = model.model.layers[layer].mlp
    got: dict[str, torch.Tensor] = {}
    h = block.register_forward_pre_hook(lambda _m, args: got.__setitem__("x", args[0].detach().float()))
    try:
        with torch.no_grad():
            model(ids[None])
    finally:
        h.remove()
    x = got["x"].reshape(-1, got["x"].shape[-1])
    index = torch.topk(torch.nn.functional.linear(x, block.gate.weight.float()), top_k(model), dim=-1).indices
    out: dict[int, torch.Tensor | None] = {}
    for e in range(block.gate.weight.shape[0]):
        rows = x[(index == e).any(-1)]
        out[e] = (rows * rows).mean(0) if rows.shape[0] else None
    return out


def test_calibration_weights_each_expert_by_the_tokens_routed_to_it() -> None:
    model = tiny("mixtral")  # 8 experts, 2 per token
    ids = torch.randint(3, 1000, (200,), generator=torch.Generator().manual_seed(5))
    fam, recipe = families.read(model)
    sources = {s.key: s for s in fam.tensors(model, recipe)}
    modules = {k: (s.module, s.rows) for k, s in sources.items() if s.module is not None}
    imp = plan.importance(model, ids, modules)
    want = routed_mean_squares(model, ids, layer=1)
    assert any(v is not None for v in want.values())
    for e, ref in want.items():
        got = imp.get(("expert_up", 1, e))
        if ref is None:
            assert got is None  # quantized unweighted
        else:
            assert got is not None and torch.allclose(got, ref, rtol=1e-5, atol=1e-7), e
    # Its down projection's importance is over the same tokens' intermediate activations.
    assert ("expert_down", 1, next(e for e, v in want.items() if v is not None)) in imp
    plain = KwkDecoder.from_hf(model, "int4", max_context=64)
    fitted = KwkDecoder.from_hf(model, "int4", max_context=64, calib=ids)
    assert fitted.info["calibrated"]
    routed = next(e for e, v in want.items() if v is not None)
    assert plain.export("expert_up", 1, routed) != fitted.export("expert_up", 1, routed)


@pytest.mark.parametrize("precision", ["preserve", "int8", "int4"])
def test_bytes_per_token_and_bits_count_the_active_experts(precision: str) -> None:
    model = tiny("qwen3-moe", torch.bfloat16)  # layer 1 dense, layers 0 and 2 sparse; 16 experts, 4 per token
    dec = KwkDecoder.from_hf(model, precision, max_context=64)
    k, experts = top_k(model), int(model.config.num_experts)
    desc = dec.describe()
    nbytes = {(t["name"], t["layer"], t["expert"]): len(dec.export(t["name"], t["layer"], t["expert"])[3])
              for t in desc["tensors"] if t["format"] != "vector"}  # fmt: skip
    # The embedding is a lookup, not read whole, unless it is also the lm_head.
    skip = () if desc["recipe"]["tied_embeddings"] else ("embed",)
    dense = sum(n for (name, _, _), n in nbytes.items() if not name.startswith("expert_") and name not in skip)
    experts_all = sum(n for (name, _, _), n in nbytes.items() if name.startswith("expert_"))
    assert dec.info["weight_bytes_per_token"] == dense + experts_all * k // experts
    # Weights: every expert once in total_weights, k of them in the active count bits_per_weight is over.
    numel = sum(t["rows"] * t["cols"] for t in desc["tensors"] if t["format"] != "vector")
    active = sum(t["rows"] * t["cols"] * (k / experts if t["name"].startswith("expert_") else 1)
                 for t in desc["tensors"] if t["format"] != "vector")  # fmt: skip
    assert dec.info["total_weights"] == numel
    assert dec.info["active_weights"] == round(active)
    assert dec.info["total_weights"] > dec.info["active_weights"]
    bits = sum(row_bits(t["format"], t["cols"]) * t["rows"] * t["cols"]
               * (k / experts if t["name"].startswith("expert_") else 1)
               for t in desc["tensors"] if t["format"] != "vector")  # fmt: skip
    assert dec.info["bits_per_weight"] == pytest.approx(bits / active, rel=1e-12)


def test_bad_mixture_configs_are_refused_by_name() -> None:
    model = tiny("mixtral")
    model.config.num_experts_per_tok = 9
    with pytest.raises(ValueError, match=r"Mixtral with num_experts_per_tok=9: expected 1 ..= num_experts \(8\)"):
        KwkDecoder.from_hf(model)
    model = tiny("qwen3-moe")
    model.config.decoder_sparse_step = 0
    with pytest.raises(ValueError, match="Qwen3-MoE with decoder_sparse_step=0: expected a positive step"):
        KwkDecoder.from_hf(model)
    # Training-only router settings do not change the forward: accepted.
    model = tiny("mixtral")
    model.config.router_jitter_noise, model.config.output_router_logits = 0.1, True
    assert KwkDecoder.from_hf(model, max_context=32).family == "Mixtral"
