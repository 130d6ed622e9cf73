"""``torch.compile(model, backend="kwker")``: an FX backend for CPU inference of causal LMs.

What it does to the graph dynamo hands it (parameters arrive as placeholders whose example inputs are
the real ``nn.Parameter`` objects):
  1. ``fuse_linears``: linears that read the same input with known weights become one linear on the
     concatenated weight, split afterwards (q/k/v, gate/up).
  2. ``lower_linears``: every linear with a known weight becomes ``kwker::linear`` on a weight prepared
     once: float32 weights whose values are all exactly bf16 (a bf16 checkpoint loaded as float32) are
     stored as bf16 -- the same numbers in half the bytes -- other float32 weights stay float32.
  3. The lowered graph runs on the native step executor (``executor.py``): per input-shape signature,
     one traced run plans the whole graph as Rust instructions over preallocated buffers (the KV
     cache's ``index_copy_`` writes straight into the cache), so a decode step is one call into Rust.
     Ops the executor does not know run through torch between native programs. ``KWKER_EXECUTOR=0``
     runs the lowered graph as FX instead.
Numerics: identical products and float32 sums; the only change from the float32 model is the summation
order (and, in bf16 models, one rounding per op exactly where torch rounds). Memory: fused groups and
bf16 copies of float32 weights are new tensors held by the compiled graph (the model keeps its own);
other weights are shared. Weights are snapshots: if a parameter is modified in place later (its version
counter moves) or gets new storage (``p.data = ...``, ``module.to()``, ``load_state_dict(assign=True)``,
``share_memory_()``), the graph is rebuilt on the next call; the executor also re-reads every input's
address on every call, so nothing it reads can be freed memory. Graphs that need gradients are left to torch
(eager FX), logged.
"""

from __future__ import annotations

import logging
import operator
import os
import threading
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.fx as fx

from ..ops import native as _native  # noqa: F401  (registers the ops)
from .executor import StepExecutor

log = logging.getLogger("kwker_torch")

_LINEAR_TARGETS = {torch._C._nn.linear, torch.nn.functional.linear}


def _is_linear(node: fx.Node) -> bool:
    return node.op == "call_function" and node.target in _LINEAR_TARGETS and not node.kwargs


def _linear_args(node: fx.Node) -> tuple[fx.Node, fx.Node, fx.Node | None]:
    x, w = node.args[0], node.args[1]
    b = node.args[2] if len(node.args) > 2 else None
    return x, w, b  # type: ignore[return-value]


def bf16_exact(w: torch.Tensor) -> bool:
    """True when every value of a float32 tensor is exactly representable in bfloat16."""
    return w.dtype == torch.float32 and torch.equal(w, w.to(torch.bfloat16).to(torch.float32))


def prepared_weight(ws: list[torch.Tensor]) -> torch.Tensor:
    """The (concatenated) weight a kwker linear reads: bf16 when every value is bf16, else as given.
    A single weight already in its final dtype is shared with the model, not copied."""
    w = (ws[0] if len(ws) == 1 else torch.cat(ws, 0)).detach()
    if w.dtype == torch.float32 and bf16_exact(w):
        return w.to(torch.bfloat16)
    return w.contiguous()


class _Lowering:
    """Rewrites one GraphModule in place; ``params`` maps placeholder nodes to their real tensors."""

    def __init__(self, gm: fx.GraphModule, params: dict[fx.Node, torch.Tensor]) -> None:
        self.gm, self.params, self.count = gm, params, 0

    def constant(self, t: torch.Tensor, hint: str) -> fx.Node:
        name = f"_kwker_{hint}_{self.count}"
        self.count += 1
        self.gm.register_buffer(name, t)
        return self.gm.graph.get_attr(name)

    def known(self, node: fx.Node | None) -> bool:
        return node is None or node in self.params

    def fuse_linears(self) -> int:
        """Predicate: >= 2 linears on the same input node, all with known weights (and biases) of one
        dtype and K. Rewrite:

            before:  q = linear(x, Wq); k = linear(x, Wk); v = linear(x, Wv)
            after:   qkv = kwker.linear(x, cat[Wq; Wk; Wv], cat[bq; bk; bv])
                     q, k, v = split(qkv, [Nq, Nk, Nv], dim=-1)

        Missing biases of a group with some biases are zeros (adding 0.0 is exact). Returns the number
        of fused groups."""
        groups: dict[tuple[fx.Node, torch.dtype], list[fx.Node]] = {}
        for node in self.gm.graph.nodes:
            if _is_linear(node):
                x, w, b = _linear_args(node)
                if self.known(w) and self.known(b) and isinstance(x, fx.Node):
                    groups.setdefault((x, self.params[w].dtype), []).append(node)
        fused = 0
        for (x, _), nodes in groups.items():
            ks = {self.params[_linear_args(n)[1]].shape[1] for n in nodes}
            if len(nodes) < 2 or len(ks) != 1:
                continue
            ws = [self.params[_linear_args(n)[1]] for n in nodes]
            sizes = [w.shape[0] for w in ws]
            biases = [_linear_args(n)[2] for n in nodes]
            bias = None
            if any(b is not None for b in biases):
                parts = [
                    self.params[b] if b is not None else torch.zeros(s, dtype=w.dtype)
                    for b, s, w in zip(biases, sizes, ws, strict=True)
                ]
                bias = torch.cat([p.detach() for p in parts])
            first = min(nodes, key=lambda n: list(self.gm.graph.nodes).index(n))
            with self.gm.graph.inserting_before(first):
                w_node = self.constant(prepared_weight(ws), "w")
                b_node = self.constant(bias, "b") if bias is not None else None
                out = self.gm.graph.call_function(torch.ops.kwker.linear.default, (x, w_node, b_node))
                parts_node = self.gm.graph.call_function(torch.split, (out, sizes, -1))
                for i, n in enumerate(nodes):
                    item = self.gm.graph.call_function(operator.getitem, (parts_node, i))
                    n.replace_all_uses_with(item)
            for n in nodes:
                self.gm.graph.erase_node(n)
            fused += 1
        return fused

    def lower_linears(self) -> int:
        """Every remaining linear with a known weight -> kwker.linear on its prepared weight."""
        lowered = 0
        for node in list(self.gm.graph.nodes):
            if not _is_linear(node):
                continue
            x, w, b = _linear_args(node)
            if not (self.known(w) and self.known(b)):
                continue
            with self.gm.graph.inserting_before(node):
                w_node = self.constant(prepared_weight([self.params[w]]), "w")
                b_node = self.constant(self.params[b].detach().clone(), "b") if b is not None else None
                new = self.gm.graph.call_function(torch.ops.kwker.linear.default, (x, w_node, b_node))
            node.replace_all_uses_with(new)
            self.gm.graph.erase_node(node)
            lowered += 1
        return lowered


def lower(gm: fx.GraphModule, example_inputs: list[Any]) -> tuple[int, int]:
    """Applies the passes to ``gm`` in place; returns (fused groups, lowered single linears)."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    params = {
        n: t
        for n, t in zip(placeholders, example_inputs, strict=False)
        if isinstance(t, torch.nn.Parameter) and t.dtype in (torch.float32, torch.bfloat16) and t.device.type == "cpu"
    }
    pass_ = _Lowering(gm, params)
    fused = pass_.fuse_linears()
    lowered = pass_.lower_linears()
    # No eliminate_dead_code(): it would drop in-place cache writes (index_copy_) whose results are unused.
    gm.graph.lint()
    gm.recompile()
    return fused, lowered


def _snapshot(args: Sequence[Any]) -> list[tuple[int, torch.Tensor, int, int]]:
    """What the prepared weights were made from: (argument index, parameter, version, data pointer)."""
    return [(i, t, t._version, t.data_ptr()) for i, t in enumerate(args) if isinstance(t, torch.nn.Parameter)]


def _changed(snapshot: list[tuple[int, torch.Tensor, int, int]], args: Sequence[Any]) -> bool:
    """Whether any parameter is another object, was modified in place, or got new storage since the
    snapshot (``p.data = ...``, ``module.to()`` with a copy, ``load_state_dict(assign=True)``,
    ``share_memory_()``): the prepared weights would then be stale. ~0.3 us per parameter."""
    for i, t, v, ptr in snapshot:
        a = args[i]
        if a is not t or a._version != v or a.data_ptr() != ptr:
            return True
    return False


def kwker_backend(gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
    """The ``backend="kwker"`` entry point (registered under ``torch_dynamo_backends``)."""
    if torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad for t in example_inputs):
        log.info("kwker backend: graph needs gradients; left to torch (kwker is inference-only)")
        return gm.forward
    pristine = fx.GraphModule(gm, gm.graph.__deepcopy__())  # to rebuild from if weights change
    versions = _snapshot(example_inputs)
    fused, lowered = lower(gm, example_inputs)
    log.info("kwker backend: %d fused linear groups, %d single linears on kwker::linear", fused, lowered)
    native = os.environ.get("KWKER_EXECUTOR", "1") != "0"

    def runner(g: fx.GraphModule) -> Callable[..., Any]:
        return StepExecutor(g) if native else g

    state: dict[str, Any] = {"gm": runner(gm), "rebuilds": 0}
    lock = threading.Lock()

    def run(*args: Any) -> Any:
        with lock:  # several threads may call one compiled model; one of them rebuilds
            if _changed(versions, args):
                rebuilt = fx.GraphModule(pristine, pristine.graph.__deepcopy__())
                lower(rebuilt, list(args))
                versions[:] = _snapshot(args)
                state["gm"] = runner(rebuilt)
                state["rebuilds"] += 1
            current = state["gm"]
        return current(*args)

    run.kwker_state = state  # type: ignore[attr-defined]  # for tests and debugging: the current executor
    return run
