"""GPTQ (``kwker_torch/decoder/gptq.py``, ``calib=..., gptq=True``):

- with an identity Hessian nothing is carried between columns, so GPTQ stores exactly what plain quantization
  (with the same importance) stores: the same grid, the same codes;
- on correlated inputs it lowers the output error ‖X Wᵀ − X Qᵀ‖ against calibrated quantization alone, for
  q4k, q4 and q6k (and with act-order);
- ``from_hf(..., gptq=True)`` stores GPTQ's codes under the grid it chose (the decoder's dequantized matrix
  equals GPTQ's values), experts included, keeps them through save/load, and stays near HF's float32 logits;
- bad input gets clear errors (gptq without calib, act_order without gptq, codes out of range).
"""

from __future__ import annotations

import pytest
import torch
from fixtures.family_cases import tiny
from test_decoder import family_model, hf_logits
from test_quant import BOUND, kl

from kwker_torch import KwkDecoder, decode
from kwker_torch.decoder import gptq, native


def grid_values(fmt: str, fit: torch.Tensor, codes: torch.Tensor, imp: torch.Tensor | None) -> torch.Tensor:
    """The values ``codes`` stand for under the grid ``fmt`` fits to ``fit`` (as the builder fits it)."""
    _, step, offset, _ = native.quant_grid(fmt, fit, imp)
    return step.repeat_interleave(32, 1) * codes.float() + offset.repeat_interleave(32, 1)


def correlated(tokens: int, cols: int, seed: int) -> torch.Tensor:
    """Inputs with correlated columns and a few loud channels, as a transformer's activations."""
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(tokens, cols // 4, generator=g)
    mix = torch.randn(cols // 4, cols, generator=g) / (cols // 4) ** 0.5
    x = z @ mix + 0.3 * torch.randn(tokens, cols, generator=g)
    x[:, torch.randperm(cols, generator=g)[:4]] *= 8.0
    return x


@pytest.mark.parametrize("fmt", ["q4k", "q4", "q6k", "q8_0", "q4_0", "q5_0"])
def test_identity_hessian_stores_plain_quantization(fmt: str) -> None:
    rows, cols = 24, 576  # 576 = two super-blocks of 256 and a short one of 64
    w = torch.randn(rows, cols, generator=torch.Generator().manual_seed(1)) * 0.05
    n = 100
    h = torch.eye(cols) * n
    fit, codes = gptq.quantize(w, h, n, fmt)
    plain_codes, *_ = native.quant_grid(fmt, w, torch.ones(cols))
    assert torch.equal(fit, w)  # nothing carried: every unit fitted to the original values
    assert torch.equal(codes, plain_codes)


@pytest.mark.parametrize("act_order", [False, True])
@pytest.mark.parametrize("fmt", ["q4k", "q4", "q6k", "q4_0"])
def test_gptq_lowers_the_output_error_on_correlated_inputs(fmt: str, act_order: bool) -> None:
    rows, cols, tokens = 64, 512, 2048
    x = correlated(tokens, cols, seed=2)
    w = torch.randn(rows, cols, generator=torch.Generator().manual_seed(3)) * 0.05
    h = x.T @ x
    imp = torch.diagonal(h) / tokens
    fit, codes = gptq.quantize(w, h, tokens, fmt, act_order=act_order)
    q = grid_values(fmt, fit, codes, imp)
    c, *_ = native.quant_grid(fmt, w, imp)
    plain = grid_values(fmt, w, c, imp)
    err = ((x @ (w - q).T) ** 2).sum().item()
    base = ((x @ (w - plain).T) ** 2).sum().item()
    assert err < 0.75 * base, (err, base)


def capture(monkeypatch: pytest.MonkeyPatch) -> dict:
    """Records what GPTQ hands the builder, keyed (name, layer, expert)."""
    seen: dict = {}
    original = native.Builder.set_coded

    def spy(self, name, layer, fmt, fit, codes, importance=None, expert=0):  # noqa: ANN001, ANN202
        seen[(name, layer, expert)] = (fmt, fit.clone(), codes.clone(), importance)
        return original(self, name, layer, fmt, fit, codes, importance, expert)

    monkeypatch.setattr(native.Builder, "set_coded", spy)
    return seen


def test_from_hf_stores_gptq_codes_and_saved_folders_keep_them(monkeypatch: pytest.MonkeyPatch,
                                                                tmp_path: object) -> None:  # fmt: skip
    model = family_model("SmolLM2-360M")  # tied embedding: GPTQ'd as the lm_head it also is
    calib = torch.randint(3, 1000, (600,), generator=torch.Generator().manual_seed(3))
    seen = capture(monkeypatch)
    dec = KwkDecoder.from_hf(model, precision="int4", max_context=64, calib=calib, gptq=True)
    quantized = [k for k, f in dec.info["formats"].items() if f != "bf16" and f != "f32"]
    assert dec.info["gptq"] == len(seen) == len(quantized) and dec.info["calibrated"]
    assert ("embed", 0, 0) in seen
    for (name, layer, expert), (fmt, fit, codes, imp) in seen.items():
        assert torch.equal(dec.weight(name, layer, expert), grid_values(fmt, fit, codes, imp)), name
    plain = KwkDecoder.from_hf(model, precision="int4", max_context=64, calib=calib)
    assert dec.export("down", 1) != plain.export("down", 1)
    ids = torch.arange(3, 40)
    ref = hf_logits(model, ids)
    assert kl(ref, dec.score(ids)) <= BOUND["int4"][1]
    dec.save(tmp_path)
    back = KwkDecoder.load(tmp_path)
    assert torch.equal(back.score(ids), dec.score(ids))


def test_experts_are_gptqd_on_the_tokens_routed_to_them(monkeypatch: pytest.MonkeyPatch) -> None:
    model = tiny("mixtral")  # 8 experts, 2 per token
    calib = torch.randint(3, 1000, (300,), generator=torch.Generator().manual_seed(5))
    seen = capture(monkeypatch)
    dec = KwkDecoder.from_hf(model, "int4", max_context=64, calib=calib, gptq=True)
    experts = [k for k in seen if k[0].startswith("expert_")]
    assert experts and dec.info["gptq"] == len(seen)
    for name, layer, expert in experts:
        fmt, fit, codes, imp = seen[(name, layer, expert)]
        assert torch.equal(dec.weight(name, layer, expert), grid_values(fmt, fit, codes, imp))


def test_hessians_in_groups_under_a_memory_budget_give_the_same_codes() -> None:
    """A budget smaller than the model's Hessians runs one forward per group; every matrix comes out the same."""
    from kwker_torch.decoder import families, plan

    model = family_model("SmolLM2-360M")
    ids = torch.randint(3, 1000, (300,), generator=torch.Generator().manual_seed(8))
    fam, recipe = families.read(model)
    sources = {s.key: s for s in fam.tensors(model, recipe)}
    jobs = [(k, k, s.module, s.rows, s.value, "q4k") for k, s in sources.items()
            if s.module is not None and k[0] in plan.KINDS]  # fmt: skip
    runs = []
    total = sum(j[4].shape[1] ** 2 * 4 for j in jobs)
    for budget in (1 << 40, total // 2):  # one group, then two or three
        got: dict = {}
        done = gptq.run(model, ids, jobs, lambda k, f, fit, c, w, got=got: got.__setitem__(k, c), budget=budget)
        assert sorted(done) == sorted(j[0] for j in jobs)
        runs.append(got)
    assert all(torch.equal(runs[0][k], runs[1][k]) for k in runs[0])


def test_install_takes_gptq_and_act_order() -> None:
    model = family_model("SmolLM2-360M", layers=1)
    calib = torch.randint(3, 1000, (300,), generator=torch.Generator().manual_seed(6))
    decode.install(model, "int4", max_batch=1, max_context=64, calib=calib, gptq=True, act_order=True)
    try:
        info = decode.decoder_of(model).info
        assert info["gptq"] == info["q6k_matrices"] + info["q4k_matrices"] > 0
        out = model.generate(torch.arange(3, 10)[None], max_new_tokens=4, do_sample=False)
        assert out.shape == (1, 11)
    finally:
        decode.uninstall(model)


def test_bad_gptq_inputs_get_clear_errors() -> None:
    model = family_model("SmolLM2-360M", layers=1)
    with pytest.raises(ValueError, match="gptq=True needs calibration text: pass calib="):
        KwkDecoder.from_hf(model, precision="int4", gptq=True)
    with pytest.raises(ValueError, match="act_order=True is a GPTQ option; pass gptq=True"):
        KwkDecoder.from_hf(model, precision="int4", calib=torch.arange(3, 300), act_order=True)
    with pytest.raises(ValueError, match=r"unknown quantized format \"q3\""):
        native.quant_grid("q3", torch.zeros(2, 64))
    with pytest.raises(ValueError, match="not a multiple of 32"):
        native.quant_grid("q4", torch.zeros(2, 40))
    fam_recipe = KwkDecoder.from_hf(model, precision="int4", max_context=8).describe()["recipe"]
    b = native.Builder(fam_recipe, 1, 8, 64)
    cols = model.config.hidden_size
    rows = next(t["rows"] for t in native.recipe_tensors(fam_recipe) if t["name"] == "o")
    codes = torch.full((rows, cols), 16, dtype=torch.uint8)
    with pytest.raises(ValueError, match="outside q4k's range 0..=15"):
        b.set_coded("o", 0, "q4k", torch.zeros(rows, cols), codes)
