"""Every family KwkDecoder runs (``tests/fixtures/family_cases.py``: each published shape made small, plus variants for
the optional parts), with float32 and with bf16 weights, against Hugging Face's float32 forward of the same
model state (``copy.deepcopy(model).float()``, stepped with its own cache, so LongRoPE's switch and the
rotation cached keys keep are HF's): every step's logits within 1e-5 of the largest logit (measured
4e-7 to 1.3e-6: summation order, exp/tanh/erf within a few ulp), greedy tokens identical, one native call
per step. int8 and int4 run on each (quality on random weights means nothing; their bar is running, and
staying near the float32 logits). The config is read strictly: a field the recipe does not implement is
refused by name.
"""

from __future__ import annotations

import copy

import pytest
import torch
from fixtures.family_cases import CASES, tiny

from kwker_torch import KwkDecoder
from kwker_torch.testing.reference import hf_steps

TOL = 1e-5
STEPS = 10
# Family (KwkDecoder.family) each case's model maps to.
FAMILY_OF = {
    "llama": "Llama", "llama3-rope": "Llama", "mistral-window": "Mistral", "qwen2": "Qwen2",
    "qwen2-window-layers": "Qwen2", "qwen3": "Qwen3", "gemma2": "Gemma 2", "gemma2-tight-caps": "Gemma 2",
    "gemma3": "Gemma 3", "gemma3-270m": "Gemma 3", "phi4-mini-longrope": "Phi-3", "phi3-window": "Phi-3",
    "granite": "Granite", "stablelm": "StableLM", "stablelm-parallel-qknorm": "StableLM",
    "starcoder2": "StarCoder2", "olmo": "OLMo", "olmo-clip": "OLMo", "olmo2": "OLMo2", "pythia": "GPT-NeoX",
    "neox-sequential": "GPT-NeoX", "phi2": "Phi-2", "phi2-qk-layernorm": "Phi-2", "gpt2": "GPT-2",
    "gpt2-layer-scale": "GPT-2", "opt": "OPT", "opt-350m-post-norm": "OPT",
    "mixtral": "Mixtral", "mixtral-window": "Mixtral", "qwen3-moe": "Qwen3-MoE",
    "qwen3-moe-step2-unnormed": "Qwen3-MoE",
    "granite-moe": "Granite-MoE", "olmoe": "OLMoE", "olmoe-clip-normed": "OLMoE",
    "falcon-7b": "Falcon", "falcon-40b-new-arch": "Falcon", "falcon-new-arch-one-norm": "Falcon",
    "falcon-rw-rotary": "Falcon",
}  # fmt: skip


def rel(a: torch.Tensor, ref: torch.Tensor) -> float:
    return ((a - ref).abs().max() / ref.abs().max()).item()


def prompt(n: int = 13, seed: int = 1) -> torch.Tensor:
    return torch.randint(3, 1000, (n,), generator=torch.Generator().manual_seed(seed))


def test_every_case_is_mapped() -> None:
    assert set(FAMILY_OF) == set(CASES)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("case", list(CASES))
def test_every_step_within_1e5_of_hf_float32_and_greedy_tokens_identical(case: str, dtype: torch.dtype) -> None:
    model = tiny(case, dtype)
    ref = copy.deepcopy(model).float()  # a bf16 model's rounded buffers are part of the reference
    ids = prompt()
    rows, toks = hf_steps(ref, ids, STEPS)
    dec = KwkDecoder.from_hf(model, max_context=64)
    assert dec.family == FAMILY_OF[case]
    if dtype == torch.bfloat16:
        assert dec.info["f32_matrices"] == 0  # bf16 weights stay bf16
    before = dec.native_steps
    got = dec.step([(0, ids)], logits="all")[0]
    worst = rel(got, rows[0])
    for i, tok in enumerate(toks):
        assert int(got[-1].argmax()) == tok, f"step {i}: greedy token differs from HF float32's"
        got = dec.step([(0, [tok])])[0]
        worst = max(worst, rel(got, rows[i + 1]))
    assert worst <= TOL, worst
    assert dec.native_steps - before == STEPS + 1  # one native call per step: the fast path ran
    assert dec.generate(ids, STEPS, stop_tokens=[], prompt_cache=False).tokens == toks


# int8 / int4 on random weights: the logits stay near the float32 ones (measured 0.2-2.3 % of the largest
# logit for int8, 0.3-15 % for int4 on these tiny models; random weights are the worst case for a 4-bit grid).
LOOSE = {"int8": 0.05, "int4": 0.25}


@pytest.mark.parametrize("case", list(CASES))
def test_int8_and_int4_run_near_the_float32_logits(case: str) -> None:
    model = tiny(case, torch.bfloat16)
    ids = prompt()
    with torch.no_grad():
        ref = copy.deepcopy(model).float()(ids[None]).logits[0]
    for precision, fmt in (("int8", "q8_0"), ("int4", "q4k")):
        dec = KwkDecoder.from_hf(model, precision, max_context=64)
        sparse = sum(s["sparse"] for s in dec.describe()["recipe"]["layer_specs"])
        # Every matrix quantized but a mixture's routers, which stay as stored (plan.KEEP).
        assert dec.info[f"{fmt}_matrices"] > 0 and dec.info["bf16_matrices"] == sparse
        if precision == "int4":
            assert "q6k" in dec.info["plan"] and dec.info["formats"]["embed.0"] == "q6k"
        got = dec.score(ids)
        assert torch.isfinite(got).all()
        assert rel(got, ref) <= LOOSE[precision], (precision, rel(got, ref))
        out = dec.generate(ids, 6, stop_tokens=[])
        assert len(out.tokens) == 6


def test_gemma3_int4_keeps_its_measured_6_bit_matrices() -> None:
    """Gemma 3's int4 plan (chosen on the real 270M): q/k/v and gate/up at 6 bits in every layer, the ends'
    down projections too, o at 4; other families keep SmolLM2's rule (o and the middle layers' qkv at 4)."""
    dec = KwkDecoder.from_hf(tiny("gemma3-270m", torch.bfloat16), "int4", max_context=64)
    layers = dec.describe()["recipe"]["layers"]
    f = dec.info["formats"]
    assert all(f[f"qkv.{i}"] == f[f"up.{i}"] == "q6k" and f[f"o.{i}"] == "q4k" for i in range(layers))
    assert "real Gemma 3 270M" in dec.info["plan"]
    other = KwkDecoder.from_hf(tiny("qwen3", torch.bfloat16), "int4", max_context=64).info
    assert other["formats"]["up.0"] == "q4k" and "SmolLM2" in other["plan"]


@pytest.mark.parametrize(
    ("case", "field", "value", "message"),
    [
        ("gemma3", "use_bidirectional_attention", True, "use_bidirectional_attention=True"),
        ("gpt2", "add_cross_attention", True, "add_cross_attention=True (default False)"),
        ("llama", "hidden_act", "gelu_fast", "hidden_act='gelu_fast': activation 'gelu_fast' is not supported"),
        ("qwen3", "hidden_act", "tanh", "hidden_act='tanh'"),
        # A config that contradicts the modules built from it: named, not an AttributeError.
        ("phi2", "qk_layernorm", True, "the config asks for q/k norms but layer 0's attention has no q_layernorm"),
        ("falcon-rw-rotary", "alibi", True, "alibi=True: ALiBi positions are not in the recipe"),
    ],
)
def test_config_fields_the_recipe_lacks_are_refused_by_name(case: str, field: str, value: object,
                                                            message: str) -> None:  # fmt: skip
    model = tiny(case)
    setattr(model.config, field, value)
    with pytest.raises(ValueError, match="kwker: ") as e:
        KwkDecoder.from_hf(model, max_context=16)
    assert message in str(e.value), str(e.value)


def test_longrope_switches_as_hf_for_long_prompts_and_padded_batches() -> None:
    """LongRoPE (Phi-4-mini's shape, the switch at 16 positions): a 20-token prompt is rotated long as a whole
    (HF switches on the call's largest position); a left-padded batch of a long and a short row switches both
    rows together, as one HF forward does; every generated step's logits within 1e-5 of HF's."""
    from kwker_torch import decode

    model = tiny("phi4-mini-longrope")
    ref = copy.deepcopy(model)
    ids = prompt(20, seed=3)
    rows, toks = hf_steps(ref, ids, 4)
    dec = KwkDecoder.from_hf(model, max_context=64)
    got = [dec.step([(0, ids)], logits="all")[0]]
    for t in toks:
        got.append(dec.step([(0, [t])])[0])
    assert max(rel(g, r) for g, r in zip(got, rows, strict=True)) <= TOL
    long_a, short_b = prompt(18, seed=4), prompt(10, seed=5)
    batch = torch.stack([long_a, torch.cat([torch.zeros(8, dtype=torch.long), short_b])])
    mask = torch.ones_like(batch)
    mask[1, :8] = 0
    from kwker_torch.testing import generate_greedy

    want = generate_greedy(ref, batch, 6, attention_mask=mask, exact=True, output_logits=True,
                           return_dict_in_generate=True)  # fmt: skip
    decode.install(model, max_batch=2, max_context=64)
    try:
        out = generate_greedy(model, batch, 6, attention_mask=mask, exact=True, output_logits=True,
                              return_dict_in_generate=True)  # fmt: skip
    finally:
        decode.uninstall(model)
    assert torch.equal(out.sequences, want.sequences)
    worst = max(rel(a[i], b[i]) for a, b in zip(out.logits, want.logits, strict=True) for i in range(2))
    assert worst <= TOL, worst
