"""torch.compile(model, backend="kwker"): linears fused and lowered to kwker::linear, bf16-valued
float32 weights read as bf16, logits against eager. Measured max |logit error| vs the float32 eager
forward: ~3e-6 on logits of magnitude ~3 (same products, f32 sums in another order)."""

from __future__ import annotations

import pytest
import torch

from kwker_torch import compile_backend
from kwker_torch.testing import generate_greedy, random_model


def compiled_graphs(model: torch.nn.Module, *inputs: torch.Tensor) -> tuple[torch.Tensor, list[torch.fx.GraphModule]]:
    """Runs model compiled with the kwker backend, returning its logits and the lowered graphs."""
    graphs: list[torch.fx.GraphModule] = []

    def backend(gm: torch.fx.GraphModule, example_inputs: list) -> object:
        fn = compile_backend.kwker_backend(gm, example_inputs)
        graphs.append(gm)
        return fn

    torch._dynamo.reset()
    with torch.no_grad():
        out = torch.compile(model, backend=backend, fullgraph=True)(*inputs).logits
    return out, graphs


def count(gm: torch.fx.GraphModule, target: object) -> int:
    return sum(1 for n in gm.graph.nodes if n.op == "call_function" and n.target == target)


@pytest.mark.parametrize("name", ["SmolLM2-360M", "Qwen2.5-0.5B", "Mistral-7B-v0.1"])
def test_fused_and_lowered_linears_match_eager(name: str) -> None:
    layers = 2 if name != "Mistral-7B-v0.1" else 1
    model = random_model(name, torch.bfloat16, num_hidden_layers=layers).float()  # a bf16 checkpoint as f32
    ids = torch.randint(0, 1000, (1, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref = model(ids).logits
    out, graphs = compiled_graphs(model, ids)
    assert len(graphs) == 1
    gm = graphs[0]
    # Per layer: one fused q/k/v, o_proj, one fused gate/up, down_proj; plus lm_head.
    assert count(gm, torch.ops.kwker.linear.default) == 4 * layers + 1
    assert count(gm, torch.split) == 2 * layers
    assert count(gm, torch._C._nn.linear) == 0
    kwker_weights = [b for n, b in gm.named_buffers() if n.startswith("_kwker_w")]
    assert kwker_weights and all(w.dtype == torch.bfloat16 for w in kwker_weights)  # exact bf16 values
    err = (out - ref).abs().max().item()
    assert err <= 1e-4 * ref.abs().max().item(), err


def test_float32_weights_that_are_not_bf16_stay_float32() -> None:
    model = random_model("SmolLM2-360M", torch.float32, num_hidden_layers=1)
    ids = torch.randint(0, 1000, (1, 5))
    out, graphs = compiled_graphs(model, ids)
    weights = [b for n, b in graphs[0].named_buffers() if n.startswith("_kwker_w")]
    assert weights and all(w.dtype == torch.float32 for w in weights)
    with torch.no_grad():
        torch.testing.assert_close(out, model(ids).logits, atol=1e-4, rtol=1e-4)


def test_backend_name_works_without_import_and_weight_updates_are_seen() -> None:
    """`backend="kwker"` resolves through the torch_dynamo_backends entry point; an in-place weight
    change after compiling rebuilds the snapshot instead of serving stale weights."""
    model = random_model("SmolLM2-360M", torch.bfloat16, num_hidden_layers=1).float()
    ids = torch.randint(0, 1000, (1, 6))
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="kwker", fullgraph=True)
    with torch.no_grad():
        torch.testing.assert_close(compiled(ids).logits, model(ids).logits, atol=1e-4, rtol=1e-4)
        model.model.layers[0].mlp.down_proj.weight.mul_(2.0)
        torch.testing.assert_close(compiled(ids).logits, model(ids).logits, atol=1e-4, rtol=1e-4)


def test_gpt2_conv1d_graph_still_compiles() -> None:
    """GPT-2's Conv1D layers are addmm, not linear: they stay on torch; lm_head goes to kwker."""
    model = random_model("GPT-2", torch.float32, num_hidden_layers=2)
    ids = torch.randint(0, 1000, (1, 7))
    out, graphs = compiled_graphs(model, ids)
    assert count(graphs[0], torch.ops.kwker.linear.default) == 1
    with torch.no_grad():
        torch.testing.assert_close(out, model(ids).logits, atol=1e-4, rtol=1e-4)


def test_training_graph_is_left_to_torch() -> None:
    """A graph that needs gradients runs on torch: loss and every gradient equal eager's exactly."""
    torch.manual_seed(0)
    model = random_model("SmolLM2-360M", torch.float32, num_hidden_layers=1)
    ids = torch.randint(0, 1000, (2, 6), generator=torch.Generator().manual_seed(3))
    loss = model(ids, labels=ids).loss
    loss.backward()
    want = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="kwker")
    got_loss = compiled(ids, labels=ids).loss
    got_loss.backward()
    torch._dynamo.reset()
    torch.testing.assert_close(got_loss, loss, atol=0, rtol=0)
    for n, p in model.named_parameters():
        torch.testing.assert_close(p.grad, want[n], atol=1e-6, rtol=1e-5, msg=n)


@pytest.mark.slow
def test_generate_with_static_cache_matches_eager(smollm2_f32: tuple) -> None:
    """HF generate() with a static KV cache, the decode graph compiled by backend="kwker" (both as
    model.forward = torch.compile(...) and through CompileConfig): the model's own greedy tokens."""
    from transformers import CompileConfig

    from kwker_torch.testing import chat_ids

    model, tok = smollm2_f32
    ids = chat_ids(tok, "Explain to a child why the sky is blue.")

    def generate(**kw: object) -> torch.Tensor:
        out = generate_greedy(model, ids, 24, inference=False, cache_implementation="static", **kw)
        return out[0, ids.shape[1] :]

    expected = generate()
    original = model.forward
    try:
        torch._dynamo.reset()
        model.forward = torch.compile(original, backend="kwker")
        assert torch.equal(generate(), expected)
        model.forward = original
        torch._dynamo.reset()
        assert torch.equal(generate(compile_config=CompileConfig(backend="kwker")), expected)
    finally:
        model.forward = original
        torch._dynamo.reset()


def test_recompiles_stay_bounded_and_new_shapes_compile_cleanly() -> None:
    """A 200-token static-cache generation compiles a bounded number of graphs (prefill and decode, plus
    at most one dynamic-shape recompile), and a new batch size or cache length compiles and still
    matches eager."""
    model = random_model("SmolLM2-360M", torch.bfloat16, num_hidden_layers=1).float()
    calls: list[int] = []

    def backend(gm: torch.fx.GraphModule, example_inputs: list) -> object:
        calls.append(1)
        return compile_backend.kwker_backend(gm, example_inputs)

    def generate(ids: torch.Tensor, new: int) -> torch.Tensor:
        return generate_greedy(model, ids, new, exact=True, inference=False, cache_implementation="static")

    ids = torch.randint(3, 1000, (1, 8), generator=torch.Generator().manual_seed(1))
    expected = generate(ids, 200)
    original = model.forward
    try:
        torch._dynamo.reset()
        model.forward = torch.compile(original, backend=backend)
        assert torch.equal(generate(ids, 200), expected)
        assert len(calls) <= 4, f"{len(calls)} graphs compiled for one 200-token generation"
        before = len(calls)
        batch = torch.randint(3, 1000, (2, 8), generator=torch.Generator().manual_seed(2))
        got = generate(batch, 20)  # new batch size, and a shorter static cache (8 + 20 slots)
        model.forward = original
        assert torch.equal(got, generate(batch, 20))
        assert len(calls) > before
    finally:
        model.forward = original
        torch._dynamo.reset()
