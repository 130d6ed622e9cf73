"""The native step executor of the compile backend: runs a whole lowered FX graph (e.g. one decode step
of a Hugging Face model on a static cache) as one call into Rust, with the KV cache written in place.

The first call with a new input-shape signature runs the graph as FX; the second traces it once in torch
while ``planner.py`` plans every node (views, Rust instructions over preallocated buffers, torch steps for
unknown ops); later calls with that signature only pass the inputs' addresses to Rust (``kwker_plan_run``)
and run any torch steps in between. Buffers ("slots") are the graph's inputs (addresses taken every call),
constants (prepared weights) and intermediates (one arena).

Numerical contract: as the instructions' (``rust/src/exec.rs``): torch's CPU arithmetic, f32 compute and one
rounding to the output type; linear and attention sum in f32. Graphs that cannot be planned keep running
as FX, with one log line.
"""

from __future__ import annotations

import ctypes
import logging
import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import torch
import torch.fx as fx

from ..ops import native as _native
from .arena import pack_arena
from .descs import Desc, Dyn, TorchStep, Unsupported, esize
from .planner import Planner

log = logging.getLogger("kwker_torch")

# Intermediate buffers a plan may hold; bigger graphs (long prompts) stay on FX.
MAX_ARENA_BYTES = 256 << 20
ERR_LEN = 1024


class Plan:
    """A planned step: native programs and torch steps over one table of buffers."""

    def __init__(self, planner: Planner, gm: fx.GraphModule, args: Sequence[Any]) -> None:
        arena = pack_arena(planner.slots, planner.desc, gm, planner.temps)
        if arena > MAX_ARENA_BYTES:
            raise Unsupported(f"{arena >> 20} MB of intermediate buffers")
        self.slots = planner.slots
        self.desc = planner.desc
        self.arena = torch.empty(max(arena, 1), dtype=torch.uint8)
        for s in self.slots:
            if s.kind == "arena":
                s.tensor = self.arena[s.at : s.at + s.nbytes]
        self.addrs = (ctypes.c_size_t * len(self.slots))()
        # Every input's address is refreshed on every call, parameters included: `p.data = ...`,
        # `module.to()`, `load_state_dict(assign=True)` or `share_memory_()` give a parameter new storage,
        # and an address kept from planning time would then point at freed memory. Sizes are checked too
        # whenever an address changes (a plan's view offsets assume them).
        self.inputs: list[tuple[int, int, int]] = []  # (slot, arg index, bytes the plan reads from data_ptr)
        for i, s in enumerate(self.slots):
            if s.kind == "input":
                self.inputs.append((i, s.arg, s.nbytes))
            else:
                self.addrs[i] = s.tensor.data_ptr()  # type: ignore[union-attr]
        sizes = (ctypes.c_uint64 * len(self.slots))(*[s.nbytes for s in self.slots])
        self.steps: list[Any] = []
        err = ctypes.create_string_buffer(ERR_LEN)
        for step in planner.steps:
            if isinstance(step, list):
                words = (ctypes.c_int64 * len(step))(*step)
                handle = _native.LIB.kwker_plan_new(words, len(step), sizes, len(self.slots), err, ERR_LEN)
                if not handle:  # a planner bug: stay correct on FX and say so
                    log.warning("kwker backend: native step rejected (%s); please report it", err.value.decode())
                    raise Unsupported(err.value.decode())
                self.steps.append(_Handle(handle))
            else:
                self.steps.append(step)
        self.py_steps = planner.py_steps
        self.native_calls = sum(isinstance(x, _Handle) for x in self.steps)  # Rust calls per step
        self.output = next(n for n in gm.graph.nodes if n.op == "output")
        self.torch_ops = planner.torch_ops
        self.masked_attention = planner.masked_attention  # attention instructions applying a mask
        self.runs = 0  # native runs so far (tests prove the fast path ran with it)
        self.lock = threading.Lock()
        self.err = err
        self._views: dict[Desc, torch.Tensor] = {}

    def view(self, d: Desc, args: Sequence[Any]) -> torch.Tensor:
        s = self.slots[d.slot]
        if s.kind == "input":
            a = args[s.arg]
            es = a.element_size()
            if d.dtype != a.dtype:
                raise RuntimeError("kwker executor: a dtype-changing view of an input is not supported")
            return a.as_strided(d.shape, d.stride, a.storage_offset() + d.offset // es)
        v = self._views.get(d)
        if v is None:
            base = s.tensor.view(d.dtype) if s.kind == "arena" else s.tensor  # type: ignore[union-attr]
            off = base.storage_offset() + d.offset // esize(d.dtype)  # type: ignore[union-attr]
            v = base.as_strided(d.shape, d.stride, off)  # type: ignore[union-attr]
            self._views[d] = v
        return v

    def value(self, node_arg: Any, args: Sequence[Any], dyn: dict[fx.Node, Any]) -> Any:
        def get(n: fx.Node) -> Any:
            d = self.desc[n]
            if isinstance(d, Dyn):
                return args[d.arg] if d.arg >= 0 else dyn[n]
            if isinstance(d, Desc):
                return self.view(d, args)
            if isinstance(d, tuple):
                return tuple(self.view(e, args) if isinstance(e, Desc) else e for e in d)
            return d

        return fx.node.map_aggregate(node_arg, lambda a: get(a) if isinstance(a, fx.Node) else a)

    def run(self, args: Sequence[Any]) -> Any:
        with self.lock:
            addrs = self.addrs
            for slot, i, need in self.inputs:
                a = args[i]
                ptr = a.data_ptr()
                if ptr != addrs[slot]:  # new storage (or the first call): check it covers what the plan reads
                    if a.untyped_storage().nbytes() - a.storage_offset() * a.element_size() < need:
                        raise RuntimeError(
                            f"kwker executor: graph input {i} holds fewer bytes than its plan reads ({need}); "
                            "its storage was replaced by a smaller one. Call torch._dynamo.reset() and compile "
                            "again after changing the shapes of a model's tensors."
                        )
                    addrs[slot] = ptr  # descriptors' offsets are relative to the tensor's data_ptr
            self.runs += 1
            n = len(self.slots)
            dyn: dict[fx.Node, Any] = {}
            for py in self.py_steps:
                node = py.node
                dyn[node] = py.fn(*self.value(node.args, args, dyn), **self.value(node.kwargs, args, dyn))
            for step in self.steps:
                if isinstance(step, _Handle):
                    if _native.LIB.kwker_plan_run(step.ptr, addrs, n, self.err, ERR_LEN):
                        raise RuntimeError(f"kwker executor: {self.err.value.decode()}")
                else:
                    self.run_torch(step, args, dyn)
            return self.outputs(args, dyn)

    def run_torch(self, step: TorchStep, args: Sequence[Any], dyn: dict[fx.Node, Any]) -> None:
        result = step.fn(*self.value(step.args, args, dyn), **self.value(step.kwargs, args, dyn))
        if step.outs is None:
            return
        results = result if isinstance(result, (tuple, list)) else [result]
        for d, t in zip(step.outs, results, strict=True):
            self.view(d, args).copy_(t)

    def outputs(self, args: Sequence[Any], dyn: dict[fx.Node, Any]) -> Any:
        def get(n: fx.Node) -> Any:
            d = self.desc[n]
            if isinstance(d, Dyn):
                return args[d.arg] if d.arg >= 0 else dyn[n]
            if isinstance(d, Desc):
                s = self.slots[d.slot]
                if s.kind == "input":
                    a = args[s.arg]
                    if d.offset == 0 and d.shape == tuple(a.shape) and d.stride == tuple(a.stride()):
                        return a
                return self.view(d, args).clone()
            if isinstance(d, tuple):
                return tuple(self.view(e, args).clone() if isinstance(e, Desc) else e for e in d)
            return d

        return fx.node.map_aggregate(self.output.args[0], lambda a: get(a) if isinstance(a, fx.Node) else a)


class _Handle:
    """Owns a native program; freed with the plan."""

    def __init__(self, ptr: int) -> None:
        self.ptr = ctypes.c_void_p(ptr)

    def __del__(self) -> None:
        _native.LIB.kwker_plan_free(self.ptr)


def _setup_ctypes() -> None:
    lib = _native.LIB
    lib.kwker_plan_new.restype = ctypes.c_void_p
    lib.kwker_plan_new.argtypes = [
        ctypes.POINTER(ctypes.c_int64), ctypes.c_size_t, ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t,
        ctypes.c_char_p, ctypes.c_size_t,
    ]  # fmt: skip
    lib.kwker_plan_run.restype = ctypes.c_int32
    lib.kwker_plan_run.argtypes = [
        ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t), ctypes.c_size_t, ctypes.c_char_p, ctypes.c_size_t,
    ]  # fmt: skip
    lib.kwker_plan_free.argtypes = [ctypes.c_void_p]


_setup_ctypes()


class StepExecutor:
    """Runs a lowered GraphModule: natively per input-shape signature once that signature repeats (a
    decode step does, every token; a one-off prompt length does not and is not worth planning), else
    through FX. At most MAX_PLANS signatures keep a plan (least recently used are dropped)."""

    MAX_PLANS = 8

    def __init__(self, gm: fx.GraphModule) -> None:
        self.gm = gm
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        values = [n.meta.get("example_value", n.meta.get("val")) for n in placeholders]
        sizes = {str(d) for v in values if isinstance(v, torch.Tensor) for d in v.shape if not isinstance(d, int)}
        # Keyed: tensors with symbolic sizes, and int inputs that are such sizes. Other int inputs (e.g. a
        # sliding-window cache's length) are read per call; a plan never bakes them in.
        self.key_args = [
            i for i, v in enumerate(values)
            if (isinstance(v, torch.Tensor) and any(not isinstance(d, int) for d in v.shape))
            or (isinstance(v, torch.SymInt) and str(v) in sizes)
        ]  # fmt: skip
        self.plans: OrderedDict[tuple, Plan | None] = OrderedDict()
        self.seen: set[tuple] = set()
        self.logged = False
        self.lock = threading.Lock()

    def key(self, args: Sequence[Any]) -> tuple:
        return tuple(tuple(args[i].shape) if isinstance(args[i], torch.Tensor) else args[i] for i in self.key_args)

    def __call__(self, *args: Any) -> Any:
        key = self.key(args) if self.key_args else ()
        # The LRU and the seen-set are shared by every thread calling this graph: one lock around the
        # bookkeeping (and planning, rare) keeps a concurrent eviction from racing a lookup. Plans run
        # outside it; each plan has its own lock (its arena is shared).
        with self.lock:
            plan = self.plans.get(key, False)
            if plan is False:
                if key not in self.seen:  # first sighting: FX
                    self.seen.add(key)
                    plan = None
                else:
                    return self.plan_and_run(key, args)
            elif self.key_args:
                self.plans.move_to_end(key)
        if plan is None:
            return self.gm(*args)
        return plan.run(args)

    def plan_and_run(self, key: tuple, args: Sequence[Any]) -> Any:
        planner = Planner(self.gm, {i for i in self.key_args})
        with torch.no_grad():
            result = planner.run(*args)
        try:
            if planner.failed:
                raise Unsupported(planner.failed)
            plan: Plan | None = Plan(planner, self.gm, args)
        except Unsupported as e:
            plan = None
            if not self.logged:
                self.logged = True
                log.info("kwker backend: this graph runs through torch FX, not the native executor: %s", e)
        self.plans[key] = plan
        while len(self.plans) > self.MAX_PLANS:
            self.plans.popitem(last=False)
        if plan is not None and plan.torch_ops and not self.logged:
            self.logged = True
            log.info(
                "kwker backend: %d graph op(s) run through torch inside the native step, e.g. %s",
                len(plan.torch_ops), "; ".join(sorted(set(plan.torch_ops))[:5]),
            )  # fmt: skip
        return result
