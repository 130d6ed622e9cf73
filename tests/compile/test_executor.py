"""The native step executor behind backend="kwker": a decode step of a static-cache Hugging Face model
runs as one Rust call (no torch ops inside), with the KV cache written in place, and gives the eager
model's tokens; graphs with ops it does not know run those ops through torch and still match; bad
inputs raise clear errors. Measured max |logit error| against eager float32: ~1e-5 (summation order)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import pytest
import torch

from kwker_torch import compile_backend
from kwker_torch.compile.executor import Plan, StepExecutor
from kwker_torch.testing import generate_greedy, random_model


class Capture:
    """A backend that records every StepExecutor the kwker backend builds."""

    def __init__(self) -> None:
        self.runs: list = []

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list) -> object:
        fn = compile_backend.kwker_backend(gm, example_inputs)
        self.runs.append(fn)
        return fn

    def plans(self) -> list[Plan]:
        out = []
        for fn in self.runs:
            ex = getattr(fn, "kwker_state", {}).get("gm")
            if isinstance(ex, StepExecutor):
                out += [p for p in ex.plans.values() if p is not None]
        return out


def static_generate(model: torch.nn.Module, ids: torch.Tensor, new: int, **kw: object) -> torch.Tensor:
    return generate_greedy(model, ids, new, exact=True, inference=False, cache_implementation="static", **kw)


def with_logits(model: torch.nn.Module, ids: torch.Tensor, new: int, **kw: object) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy static-cache generation: (tokens, logits of every step [new, B, V])."""
    out = static_generate(model, ids, new, output_logits=True, return_dict_in_generate=True, **kw)
    return out.sequences, torch.stack(list(out.logits)).float()


def compiled_tokens(
    model: torch.nn.Module, ids: torch.Tensor, new: int, gen: Callable[..., object] = static_generate, **kw: object
) -> tuple[Any, Capture]:
    cap = Capture()
    original = model.forward
    torch._dynamo.reset()
    try:
        model.forward = torch.compile(original, backend=cap)
        out = gen(model, ids, new, **kw)
    finally:
        model.forward = original
        torch._dynamo.reset()
    return out, cap


@pytest.mark.parametrize("name", ["SmolLM2-360M", "Qwen2.5-0.5B", "Mistral-7B-v0.1", "Llama-3.2-1B"])
def test_decode_step_is_one_native_call_and_tokens_match_eager(name: str) -> None:
    """Llama, Qwen2 (q/k/v bias), Mistral (sliding-window cache) and Llama-3.2 shapes: tokens equal eager,
    logits within 1e-4 relative of eager float32 every step (measured ~1e-6: summation order only)."""
    model = random_model(name, torch.bfloat16, num_hidden_layers=2).float()  # bf16 checkpoint as f32
    ids = torch.randint(3, 1000, (1, 12), generator=torch.Generator().manual_seed(0))
    expected, ref = with_logits(model, ids, 10)
    (got, logits), cap = compiled_tokens(model, ids, 10, gen=with_logits)
    assert torch.equal(got, expected)
    assert (logits - ref).abs().max().item() <= 1e-4 * ref.abs().max().item()
    plans = cap.plans()
    assert plans, "no graph was planned for the native executor"
    decode = [p for p in plans if not p.torch_ops]
    assert decode, [p.torch_ops for p in plans]
    assert all(p.native_calls == 1 for p in decode)  # the whole step is a single Rust program


def test_bf16_model_logits_close_to_float32() -> None:
    """bf16 weights and activations, the decode step on the native executor (checked: its plan ran, with
    no torch op inside): every step's logits are as close to a float32 forward as torch's own bf16 eager
    logits are (both round every op to bf16). A random model's top logits are nearly flat, so greedy
    paths may part at a near-tie: steps are compared up to there, and the parting must be a tie within
    bf16's own error."""
    model = random_model("Qwen2.5-0.5B", torch.bfloat16, num_hidden_layers=2)
    ids = torch.randint(3, 1000, (1, 8), generator=torch.Generator().manual_seed(3))
    n = ids.shape[1]

    def logits(m: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
        out = m.generate(ids, max_new_tokens=6, do_sample=False, output_logits=True, return_dict_in_generate=True,
                         cache_implementation="static")  # fmt: skip
        return out.sequences[0, n:], torch.stack([x[0].float() for x in out.logits])

    eager_tok, eager = logits(model)
    f32_tok, f32 = logits(model.float())
    model.bfloat16()
    (tok, ours), cap = compiled_tokens(model, ids, 6, gen=lambda m, i, k: logits(m))
    native = [p for p in cap.plans() if not p.torch_ops and p.runs > 0]
    assert native, "the decode step did not run on the native executor"
    same = int((tok != eager_tok).nonzero()[0, 0]) if not torch.equal(tok, eager_tok) else len(tok)
    assert same >= 3, (tok, eager_tok)  # prompt step + at least two native decode steps compared
    for t in range(same):
        err_ours = (ours[t] - f32[t]).abs().max().item()
        err_torch = (eager[t] - f32[t]).abs().max().item()
        # Measured here: both ~0.8 % of the largest logit (bf16 rounding of every op), ratio 0.85-1.1.
        assert err_ours <= 1.25 * err_torch, (t, err_ours, err_torch)
    if same < len(tok):
        gap = (f32[same, eager_tok[same]] - f32[same, tok[same]]).abs().item()
        assert gap <= 2 * (eager[same] - f32[same]).abs().max().item(), (same, gap)


def test_gpt2_runs_unknown_ops_through_torch_inside_the_step(caplog: pytest.LogCaptureFixture) -> None:
    """GPT-2's Conv1D (addmm) is not an executor op: those nodes run through torch between native
    programs, logged once, and tokens still equal eager."""
    model = random_model("GPT-2", torch.float32, num_hidden_layers=2)
    ids = torch.randint(3, 1000, (1, 7), generator=torch.Generator().manual_seed(1))
    expected, ref = with_logits(model, ids, 6)
    with caplog.at_level(logging.INFO, logger="kwker_torch"):
        (got, logits), cap = compiled_tokens(model, ids, 6, gen=with_logits)
    assert torch.equal(got, expected)
    assert (logits - ref).abs().max().item() <= 1e-4 * ref.abs().max().item()
    assert any(p.torch_ops for p in cap.plans())
    assert "run through torch inside the native step" in caplog.text


def test_left_padded_batch_uses_exact_masked_attention() -> None:
    """A left-padded batch gives masks that are not a plain prefix: the decode steps run on a native plan
    whose attention applies the mask (no torch op inside), and the tokens equal eager's."""
    model = random_model("SmolLM2-360M", torch.bfloat16, num_hidden_layers=2).float()
    ids = torch.randint(3, 1000, (2, 9), generator=torch.Generator().manual_seed(2))
    mask = torch.ones_like(ids)
    mask[1, :4] = 0  # row 1 is left-padded
    new = 8
    expected = static_generate(model, ids, new, attention_mask=mask, pad_token_id=0)
    got, cap = compiled_tokens(model, ids, new, attention_mask=mask, pad_token_id=0)
    assert torch.equal(got, expected)
    masked = [p for p in cap.plans() if p.masked_attention and not p.torch_ops]
    assert masked, [(p.masked_attention, p.torch_ops) for p in cap.plans()]
    # Decode steps 1 and 2 run through FX (first sighting, then planning); every later one is native.
    assert sum(p.runs for p in masked) >= new - 3, [p.runs for p in masked]
    assert all(p.masked_attention == 2 for p in masked)  # one masked attention per layer


class _Toy(torch.nn.Module):
    """Embedding + linear + an op the executor does not know (cumsum) + a cache write."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(50, 16)
        self.lin = torch.nn.Linear(16, 16)
        self.register_buffer("cache", torch.zeros(4, 16))

    def forward(self, ids: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        x = self.lin(self.emb(ids)).cumsum(-1)
        self.cache.index_copy_(0, pos, x)
        return torch.nn.functional.silu(x) * 2.0 + self.cache.sum(0)


def test_toy_graph_partitioned_and_bad_inputs_raise_clear_errors() -> None:
    torch.manual_seed(0)
    toy, ref = _Toy().eval(), _Toy().eval()
    ref.load_state_dict(toy.state_dict())
    torch._dynamo.reset()
    compiled = torch.compile(toy, backend="kwker")
    with torch.no_grad():
        for step in range(3):
            ids, pos = torch.tensor([step + 3]), torch.tensor([step])
            torch.testing.assert_close(compiled(ids, pos), ref(ids, pos), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(toy.cache, ref.cache, atol=1e-5, rtol=1e-5)
        with pytest.raises(RuntimeError, match="token id 99 is out of range for a vocabulary of 50"):
            compiled(torch.tensor([99]), torch.tensor([0]))
        with pytest.raises(RuntimeError, match="index 7 is out of range"):
            compiled(torch.tensor([1]), torch.tensor([7]))
    torch._dynamo.reset()


def test_every_tier_gives_eager_tokens(tier: str) -> None:
    """The planned step calls the tier chosen at run time (KWKER_ISA / set_isa) for its linears and
    attention; every tier this CPU runs gives eager's greedy tokens on a float32 model."""
    model = random_model("Qwen2.5-0.5B", torch.bfloat16, num_hidden_layers=1).float()
    ids = torch.randint(3, 1000, (1, 5), generator=torch.Generator().manual_seed(4))
    expected = static_generate(model, ids, 6)
    got, cap = compiled_tokens(model, ids, 6)
    assert torch.equal(got, expected), tier
    assert cap.plans()


def test_sdpa_without_mask_and_arena_reuse() -> None:
    """A prompt without a padding mask (is_causal attention over the whole sequence) and a multi-token
    output layout run natively; intermediate buffers share one arena smaller than their sum."""
    model = random_model("SmolLM2-360M", torch.bfloat16, num_hidden_layers=2).float().eval()
    ids = torch.randint(3, 1000, (1, 16), generator=torch.Generator().manual_seed(5))
    cap = Capture()
    torch._dynamo.reset()
    compiled = torch.compile(model, backend=cap)
    with torch.no_grad():
        ref = model(ids).logits
        for _ in range(3):  # planned on the second call, native on the third
            torch.testing.assert_close(compiled(ids).logits, ref, atol=1e-4, rtol=1e-4)
    torch._dynamo.reset()
    (plan,) = cap.plans()
    assert not plan.torch_ops
    total = sum(s.nbytes for s in plan.slots if s.kind == "arena")
    # The returned logits (3.1 MB) and cache tensors live to the end; everything else shares ~1 MB.
    assert plan.arena.numel() < total / 1.5, (plan.arena.numel(), total)


def test_dynamic_prompt_lengths_recompile_once_and_plan_repeated_lengths() -> None:
    """A second prompt length recompiles once with a dynamic length (dynamo's own rule, as for Inductor);
    that graph then serves every length: a length seen twice gets a native plan keyed by it, one-off
    lengths run the lowered graph as FX; all match eager."""
    model = random_model("SmolLM2-360M", torch.bfloat16, num_hidden_layers=1).float().eval()
    cap = Capture()
    torch._dynamo.reset()
    compiled = torch.compile(model, backend=cap)
    gen = torch.Generator().manual_seed(6)
    with torch.no_grad():
        for length in (5, 9, 13, 9, 9):
            ids = torch.randint(3, 1000, (1, length), generator=gen)
            torch.testing.assert_close(compiled(ids).logits, model(ids).logits, atol=1e-4, rtol=1e-4)
    torch._dynamo.reset()
    assert len(cap.runs) == 2  # length 5 (static), then one dynamic-length graph for all others
    ex = cap.runs[1].kwker_state["gm"]
    planned = [k for k, p in ex.plans.items() if p is not None]
    assert len(planned) == 1 and 9 in planned[0], ex.plans
