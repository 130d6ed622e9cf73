"""Any causal LM outside KwkDecoder's recipe (``kwker_torch/decoder/compiled.py``): BLOOM (ALiBi), GPT-J
(interleaved rotary, parallel block) and CodeGen (its fused, permuted q/k/v) run through the compile backend's
native executor from ``KwkDecoder.from_hf`` and ``decode.install()``, with Hugging Face float32's greedy tokens
(float32 models: the executor computes as torch does, float32 sums); what needs the recipe is refused naming
the architecture; a model transformers cannot put on a static cache (MPT) keeps its own forward under
install(), logged once.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest
import torch

from kwker_torch import KwkDecoder, decode
from kwker_torch.decoder import compiled as compiled_path
from kwker_torch.decoder import install
from kwker_torch.decoder.compiled import CompiledDecoder

VOCAB = 1024
CONFIGS: dict[str, dict[str, Any]] = {
    "bloom": dict(hidden_size=128, n_layer=2, n_head=4, vocab_size=VOCAB),
    "gptj": dict(n_embd=128, n_layer=2, n_head=4, rotary_dim=16, vocab_size=VOCAB, n_positions=256),
    "codegen": dict(n_embd=128, n_layer=2, n_head=4, rotary_dim=16, vocab_size=VOCAB, n_positions=256, n_ctx=256),
}
IDS = dict(bos_token_id=1, eos_token_id=2, pad_token_id=0)


def tiny(kind: str, dtype: torch.dtype = torch.float32, **over: Any) -> torch.nn.Module:
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.for_model(kind, **{**CONFIGS.get(kind, {}), **IDS, **over})
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(cfg, dtype=dtype).eval()


def eager_greedy(model: torch.nn.Module, ids: torch.Tensor, n: int) -> list[int]:
    with torch.no_grad():
        out = model.generate(ids[None], max_new_tokens=n, min_new_tokens=n, do_sample=False,
                             attention_mask=torch.ones_like(ids[None]))  # fmt: skip
    return out[0, ids.numel() :].tolist()


def prompt(n: int = 11, seed: int = 0) -> torch.Tensor:
    return torch.randint(3, VOCAB, (n,), generator=torch.Generator().manual_seed(seed))


@pytest.fixture(autouse=True)
def _fresh_dynamo() -> Any:
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.mark.parametrize("kind", list(CONFIGS))
def test_from_hf_generates_hf_float32_tokens_on_the_native_executor(
    kind: str, caplog: Any, monkeypatch: Any
) -> None:
    # The path is logged once per process: forget what earlier tests (test_decoder's BLOOM) logged.
    monkeypatch.setattr(compiled_path, "_logged", set())
    model = tiny(kind)
    ids = prompt()
    want = eager_greedy(model, ids, 12)
    with caplog.at_level(logging.INFO, logger="kwker_torch"):
        dec = KwkDecoder.from_hf(model, max_context=64)
    assert isinstance(dec, CompiledDecoder) and dec.family == "compiled"
    assert "runs on the compile backend's path" in caplog.text
    out = dec.generate(ids, 12, stop_tokens=[])
    assert out.tokens == want and out.finish_reason == "length"
    # Several prompts (one after another), the same tokens each as alone.
    other = prompt(7, seed=1)
    both = dec.generate([ids, other], 12, stop_tokens=[])
    assert [c.tokens for c in both] == [want, eager_greedy(model, other, 12)]
    assert dec.native_steps >= 2 * 11  # decode steps ran as planned native programs
    assert any(p.native_calls >= 1 for p in dec.plans())
    # LayerNorm, GPT-J's stack / repeat_interleave rotary run natively; what stays on torch per step:
    on_torch = {op for p in dec.plans() for op in p.torch_ops}
    allowed = {"bloom": {"arange", "pow", "repeat", "le", "where", "baddbmm", "softmax", "bmm"}}.get(kind, {"getitem"})
    assert on_torch <= allowed, on_torch


class Ops(torch.nn.Module):
    """The ops the planner turns into native instructions for these architectures."""

    def __init__(self, dtype: torch.dtype) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(48, eps=1e-5, dtype=dtype)
        torch.nn.init.normal_(self.norm.weight)
        torch.nn.init.normal_(self.norm.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(x * 3.0 + 1.0)
        rot = torch.stack((-h[..., 1::2], h[..., ::2]), dim=-1).flatten(-2)
        return rot * torch.repeat_interleave(h[..., :24], 2, dim=-1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_layer_norm_stack_and_repeat_interleave_run_natively_close_to_torch(dtype: torch.dtype) -> None:
    from kwker_torch import compile_backend
    from kwker_torch.compile.executor import StepExecutor

    mod = Ops(dtype).eval()
    x = torch.randn(3, 5, 48, generator=torch.Generator().manual_seed(0)).to(dtype)
    fns: list[Any] = []

    def backend(gm: torch.fx.GraphModule, inputs: list) -> Any:
        fns.append(compile_backend.kwker_backend(gm, inputs))
        return fns[-1]

    compiled = torch.compile(mod, backend=backend)
    with torch.no_grad():
        want = mod(x).float()
        got = [compiled(x).float() for _ in range(3)][-1]  # FX, then planned, then the native plan
    plans = [p for f in fns if isinstance(ex := f.kwker_state.get("gm"), StepExecutor) for p in ex.plans.values() if p]
    assert plans and plans[0].runs >= 1 and not plans[0].torch_ops, [p.torch_ops for p in plans]
    # float32: summation order only (measured ~3e-7); bf16: the one output rounding, at most a bf16 step or two.
    tol = 2e-6 if dtype == torch.float32 else 2 * 2**-8
    assert ((got - want).abs() / want.abs().clamp_min(1.0)).max().item() <= tol


@pytest.mark.parametrize("kind", ["bloom", "gptj"])
def test_install_runs_hf_generate_on_the_compiled_forward(kind: str) -> None:
    model = tiny(kind)
    ids = prompt(9, seed=2)
    want = eager_greedy(model, ids, 10)
    decode.install(model, max_context=64)
    try:
        dec = decode.decoder_of(model)
        before = dec.native_steps
        assert eager_greedy(model, ids, 10) == want  # Hugging Face's generate(), unchanged call
        # A new input shape runs as FX once, is planned on its second call, then runs natively.
        assert dec.native_steps - before >= 10 - 3
        assert model.generation_config.cache_implementation == "static"
    finally:
        decode.uninstall(model)
    assert model.generation_config.cache_implementation is None and "forward" not in model.__dict__


def test_sampling_is_seeded_stops_and_callbacks_end_sequences() -> None:
    dec = KwkDecoder.from_hf(tiny("bloom"), max_context=64)
    ids = prompt()
    kw = dict(temperature=0.9, top_k=50, top_p=0.9, stop_tokens=[])
    a, b = dec.generate(ids, 10, seed=3, **kw), dec.generate(ids, 10, seed=3, **kw)
    assert a.tokens == b.tokens and a.tokens != dec.generate(ids, 10, seed=4, **kw).tokens
    greedy = dec.generate(ids, 10, stop_tokens=[])
    stop = greedy.tokens[4]
    cut = dec.generate(ids, 10, stop_tokens=[stop])
    assert cut.finish_reason == "stop" and cut.tokens == greedy.tokens[: greedy.tokens.index(stop) + 1]
    seen: list[tuple[int, int]] = []
    out = dec.generate(ids, 10, stop_tokens=[], callback=lambda i, t: seen.append((i, t)) or len(seen) < 3)
    assert out.finish_reason == "callback" and seen == [(0, t) for t in greedy.tokens[:3]]


def test_what_needs_the_recipe_is_refused_naming_the_architecture(tmp_path: Any) -> None:
    model = tiny("bloom")
    named = r"BloomForCausalLM \(model_type='bloom'\) is outside KwkDecoder's recipe"
    with pytest.raises(ValueError, match=named + ".*precision='int4'"):
        KwkDecoder.from_hf(model, "int4")
    with pytest.raises(ValueError, match=named + ".*precision='int8'"):
        decode.install(model, "int8")
    for build in (lambda: KwkDecoder.from_hf(model, kv_cache="q8"), lambda: decode.install(model, kv_cache="bf16")):
        with pytest.raises(ValueError, match=named + ".*kv_cache="):
            build()
    dec = KwkDecoder.from_hf(model)
    for call, what in ((lambda: dec.step([(0, [5])]), "step()"), (lambda: dec.save(tmp_path), "save()"),
                       (lambda: dec.generate(prompt(), 4, prompt_lookup=8), "prompt lookup")):  # fmt: skip
        with pytest.raises(ValueError, match=named + f".*{what}"):
            call()
    from kwker_torch.serve import ServeOptions, engine_for

    with pytest.raises(ValueError, match=named + ".*server"):
        engine_for(model, None, ServeOptions(slots=2, max_context=64, queue=2))


def test_a_model_without_a_static_cache_keeps_its_own_forward(caplog: Any, monkeypatch: Any) -> None:
    monkeypatch.setattr(install, "_logged", set())  # logged once per process
    model = tiny("mpt", d_model=128, n_layers=2, n_heads=4, vocab_size=VOCAB, max_seq_len=128)
    ids = prompt()
    want = eager_greedy(model, ids, 6)
    with caplog.at_level(logging.INFO, logger="kwker_torch"):
        decode.install(model)
    assert "cannot run it on a static cache" in caplog.text and "forward" not in model.__dict__
    assert eager_greedy(model, ids, 6) == want
    with pytest.raises(ValueError, match=r"MptForCausalLM \(model_type='mpt'\).*static cache"):
        KwkDecoder.from_hf(model)
