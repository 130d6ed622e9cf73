"""Planning for the native step executor: runs a lowered FX graph once in torch (an ``fx.Interpreter``)
and writes, node by node, what the executor will do on later calls with the same input shapes.

  * results that share storage with an input are views: no work, just (buffer, offset, shape, strides);
  * known computations become instruction words for ``rust/src/exec`` (pointwise maps with broadcasting,
    mean/sum, linear, attention with its mask, ``index_copy_`` into the cache, embedding) writing into
    buffers laid out exactly like torch's results, so every later view stays valid;
  * anything else becomes a torch step run at that point of the step, its result copied into its buffer;
  * Python arithmetic on int inputs that change every call (not tensor sizes) is recomputed every call.
``arena.pack_arena`` then places the intermediates in one arena, reusing bytes by liveness.

Grouped-query attention: ``repeat_kv`` (expand + reshape of the cache) would copy the whole cache every
step; a reshape whose only users are attention calls is skipped and attention reads the cache directly.

Numerical contract: the instructions follow torch's CPU arithmetic (see ``rust/src/exec.rs``); planning
itself changes no value. Anything it cannot express raises ``Unsupported`` and the graph stays on FX.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any

import torch
import torch.fx as fx

from .descs import (
    BINARY,
    COPY_LIKE,
    DTYPES,
    EW,
    HELD,
    INPLACE,
    INT_OK,
    UNARY,
    Desc,
    Dyn,
    PyStep,
    Slot,
    TorchStep,
    Unsupported,
    _callable,
    _f64_word,
    _storage_ptr,
    op_name,
)
from .plan_ops import PlanOps


class Planner(PlanOps, fx.Interpreter):
    """Runs the graph once in torch while writing the plan for it."""

    def __init__(self, gm: fx.GraphModule, baked: set[int]) -> None:
        super().__init__(gm, garbage_collect_values=True)
        self.baked = baked  # int inputs whose value is part of the plan's key (tensor sizes)
        self.slots: list[Slot] = []
        self.desc: dict[fx.Node, Any] = {}  # Desc | tuple of Desc | Dyn | Python constant | "gqa"
        self.steps: list[list[int] | TorchStep] = []
        self.py_steps: list[PyStep] = []
        self.gqa: dict[fx.Node, Desc] = {}  # reshape(expand(cache)) nodes attention reads directly
        self.temps: list[tuple[fx.Node, int]] = []  # scratch slots alive only while one node runs
        self.torch_ops: list[str] = []
        self.masked_attention = 0  # attention instructions that apply a mask (padded batches, static caches)
        self.placeholder_index = 0
        self.failed: str | None = None  # why the graph cannot be planned; the trace still completes

    # ---- slots and descriptors
    def new_slot(self, slot: Slot) -> int:
        self.slots.append(slot)
        return len(self.slots) - 1

    def root_desc(self, t: torch.Tensor, kind: str, arg: int = -1) -> Desc:
        if (t.dtype not in DTYPES and t.dtype not in HELD) or t.device.type != "cpu":
            raise Unsupported(f"a {kind} tensor of dtype {t.dtype} on {t.device}")
        es = t.element_size()
        shape, stride = tuple(t.shape), tuple(t.stride())
        if kind == "arena":
            base, nbytes = 0, t.untyped_storage().nbytes()
            offset = t.storage_offset() * es
        else:
            base = t.storage_offset() * es
            nbytes = Desc(0, 0, t.dtype, shape, stride).end()
            offset = 0
        slot = self.new_slot(Slot(kind, nbytes, base, arg, t if kind == "const" else None))
        return Desc(slot, offset, t.dtype, shape, stride)

    def alias_desc(self, r: torch.Tensor, base: Desc) -> Desc:
        if r.dtype not in DTYPES and r.dtype not in HELD:
            raise Unsupported(f"a view of dtype {r.dtype}")
        slot = self.slots[base.slot]
        offset = r.storage_offset() * r.element_size() - slot.base
        d = Desc(base.slot, offset, r.dtype, tuple(r.shape), tuple(r.stride()))
        if d.offset < 0 or d.end() > slot.nbytes:
            raise Unsupported("a view reaches outside the tensor it views")
        return d

    def fresh(self, r: torch.Tensor) -> Desc:
        return self.root_desc(r, "arena")

    def emit(self, words: list[int]) -> None:
        if self.steps and isinstance(self.steps[-1], list):
            self.steps[-1].extend(words)
        else:
            self.steps.append(list(words))

    # ---- interpreter hooks
    def run_node(self, n: fx.Node) -> Any:
        if n.op == "output" or self.failed:
            return super().run_node(n)
        try:
            return self.plan_node(n)
        except Unsupported as e:
            self.failed = str(e)
            return self.env[n] if n in self.env else super().run_node(n)

    def plan_node(self, n: fx.Node) -> Any:
        if n.op == "placeholder":
            value = super().run_node(n)
            self.env[n] = value  # consumed from the arguments: never run twice
            i = self.placeholder_index
            self.placeholder_index += 1
            if isinstance(value, torch.Tensor):
                if value.numel() == 0:
                    raise Unsupported("an empty input tensor")
                self.desc[n] = self.root_desc(value, "input", i)
            elif i in self.baked:
                self.desc[n] = value  # a size: part of the plan's key
            else:
                self.desc[n] = Dyn(i)  # another int input: read from the arguments on every call
            return value
        args, kwargs = self.fetch_args_kwargs_from_env(n)
        result = super().run_node(n)
        self.env[n] = result  # so a planning failure below does not run the node twice
        if n.op == "get_attr":
            if isinstance(result, torch.Tensor):
                self.desc[n] = self.root_desc(result.detach(), "const")
            else:
                self.desc[n] = result
            return result
        self.plan(n, args, kwargs, result)
        return result

    # ---- planning of one call node
    def inputs_of(self, n: fx.Node) -> list[tuple[torch.Tensor, Desc]]:
        out = []
        for a in n.all_input_nodes:
            d, v = self.desc.get(a), self.env.get(a)
            if isinstance(d, Desc) and isinstance(v, torch.Tensor):
                out.append((v, d))
            elif isinstance(d, tuple) and isinstance(v, (tuple, list)):
                out += [(t, e) for t, e in zip(v, d, strict=False) if isinstance(e, Desc)]
        return out

    def find_alias(self, r: torch.Tensor, n: fx.Node) -> Desc | None:
        if r.numel() == 0:
            raise Unsupported(f"{n.format_node()} produced an empty tensor")
        ptr = _storage_ptr(r)
        for t, d in self.inputs_of(n):
            if _storage_ptr(t) == ptr:
                return self.alias_desc(r, d)
        return None

    def plan(self, n: fx.Node, args: tuple, kwargs: dict, result: Any) -> None:
        name = op_name(n)
        if any(isinstance(self.desc.get(a), Dyn) for a in n.all_input_nodes):
            tensors = bool(self.inputs_of(n)) or isinstance(result, (torch.Tensor, tuple, list))
            if tensors:
                raise Unsupported(f"{n.format_node()} depends on a Python int input that can change every call")
            self.py_steps.append(PyStep(n, _callable(n)))  # reads no tensor: run before the rest
            self.desc[n] = Dyn()
            return
        if n.target is torch._C._log_api_usage_once:
            self.desc[n] = None
            return
        if name == "getitem" and isinstance(self.desc.get(n.args[0]), tuple):  # type: ignore[arg-type]
            self.desc[n] = self.desc[n.args[0]][n.args[1]]  # type: ignore[index]
            return
        has_tensor_input = bool(self.inputs_of(n)) or any(
            isinstance(self.desc.get(a), (Desc, tuple)) for a in n.all_input_nodes
        )
        if n.target is operator.setitem:  # x[idx] = y: mutates x in place
            self.torch_steps_append(n, None)
            self.desc[n] = None
            return
        if not isinstance(result, (torch.Tensor, tuple, list)) or (
            isinstance(result, (tuple, list)) and not any(isinstance(x, torch.Tensor) for x in result)
        ):
            if has_tensor_input and not _shape_query(n):
                raise Unsupported(f"{n.format_node()} returns a Python value computed from tensor data")
            self.desc[n] = result
            return
        if not has_tensor_input and isinstance(result, torch.Tensor):
            # A factory (arange, zeros, ...): the same every step. Kept as a constant and copied into
            # a fresh buffer each step, since the graph may write into it or return it.
            const = self.root_desc(result.clone(), "const")
            if not self.emit_into(n, result, "copy", [const]):
                self.torch_step(n, result)
            return
        if isinstance(result, (tuple, list)):
            self.plan_multi(n, args, kwargs, result)
            return
        if _mutates(n, kwargs):
            self.plan_inplace(n, name or "", args, kwargs, result)
            return
        alias = self.find_alias(result, n)
        if alias is not None:
            self.desc[n] = alias
            return
        if not self.plan_compute(n, name, args, kwargs, result):
            self.torch_step(n, result)

    def plan_multi(self, n: fx.Node, args: tuple, kwargs: dict, result: Sequence[Any]) -> None:
        descs: list[Any] = []
        fresh: list[Desc] = []
        for r in result:
            if not isinstance(r, torch.Tensor):
                descs.append(r)
                continue
            alias = self.find_alias(r, n)
            if alias is None:
                alias = self.fresh(r)
                fresh.append(alias)
            descs.append(alias)
        if fresh:
            if len(fresh) != len(descs):
                raise Unsupported(f"{n.format_node()} returns a mix of views and new tensors")
            self.torch_steps_append(n, fresh)
        self.desc[n] = tuple(descs)

    def plan_inplace(self, n: fx.Node, name: str, args: tuple, kwargs: dict, result: Any) -> None:
        """A node that writes into an existing tensor (its first argument, or ``out=``)."""
        dst = self.desc.get(n.args[0]) if n.args and isinstance(n.args[0], fx.Node) else None
        if isinstance(dst, Desc) and self.slots[dst.slot].kind == "const":
            raise Unsupported(f"{n.format_node()} modifies a constant")
        if isinstance(result, torch.Tensor):
            alias = self.find_alias(result, n)
            if alias is None:
                raise Unsupported(f"{n.format_node()} mutates but returns a new tensor")
            self.desc[n] = alias
        else:
            self.desc[n] = result
        if isinstance(dst, Desc) and not kwargs:
            if name in INPLACE and len(n.args) == 2:
                if self.emit_ew(INPLACE[name], dst, [dst, self.operand(n.args[1], args[1])]):
                    return
            elif name == "index_copy_" and len(n.args) == 4:
                index, src = self.desc.get(n.args[2]), self.desc.get(n.args[3])  # type: ignore[arg-type]
                if isinstance(index, Desc) and isinstance(src, Desc) and index.dtype == torch.int64:
                    self.emit([5, args[1] % len(dst.shape), *dst.words(), *index.words(), *src.words()])
                    return
        self.torch_steps_append(n, None)

    def operand(self, node_arg: Any, value: Any) -> Desc | float:
        if isinstance(node_arg, fx.Node):
            d = self.desc.get(node_arg)
            if isinstance(d, Desc):
                return d
            value = d
        if isinstance(value, (bool, int, float)):
            return float(value)
        raise Unsupported(f"operand {node_arg!r}")

    def emit_ew(self, op: str, out: Desc, operands: list[Desc | float]) -> bool:
        """Emits out = op(operands) if every dtype and value is one the executor handles."""
        if out.dtype not in (torch.float32, torch.bfloat16, torch.int64):
            return False
        if out.dtype == torch.int64:
            if op not in INT_OK or any(isinstance(o, float) and not float(o).is_integer() for o in operands):
                return False
        words = [1, EW[op], *out.words(), len(operands)]
        for o in operands:
            if isinstance(o, Desc):
                if o.dtype not in DTYPES:
                    return False
                words += [0, *o.expand_to(out.shape).words()]
            else:
                words += [1, _f64_word(o)]
        self.emit(words)
        return True

    def plan_compute(self, n: fx.Node, name: str | None, args: tuple, kwargs: dict, r: torch.Tensor) -> bool:
        if r.dtype not in DTYPES:
            return False
        x = self.desc.get(n.args[0]) if n.args and isinstance(n.args[0], fx.Node) else None
        if name in UNARY or name in BINARY or name == "pow":
            if kwargs or len(n.args) != (1 if name in UNARY else 2):
                return False
            ops = [self.operand(a, v) for a, v in zip(n.args, args, strict=True)]
            if name == "pow" and ops[1] == 2.0:
                return self.emit_into(n, r, "square", ops[:1])
            if name == "pow" and ops[1] == 0.5:
                return self.emit_into(n, r, "sqrt", ops[:1])
            return self.emit_into(n, r, name, ops)
        if name == "gelu" and kwargs.get("approximate") == "tanh" and len(n.args) == 1:
            return self.emit_into(n, r, "gelu_tanh", [self.operand(n.args[0], args[0])])
        if name in COPY_LIKE and isinstance(x, Desc):
            return self.plan_copy(n, x, r)
        if name == "cat":
            return self.plan_cat(n, args, kwargs, r)
        if name in ("mean", "sum") and isinstance(x, Desc):
            return self.plan_reduce(n, name, x, args, kwargs, r)
        if name in ("linear", "kwker_linear"):
            return self.plan_linear(n, r)
        if name == "sdpa":
            return self.plan_sdpa(n, args, kwargs, r)
        if name == "layer_norm":
            return self.plan_layer_norm(n, args, kwargs, r)
        if name == "stack":
            return self.plan_stack(n, args, kwargs, r)
        if name == "repeat_interleave":
            return self.plan_repeat_interleave(n, args, kwargs, r)
        if name == "embedding":
            return self.plan_embedding(n, args, r)
        return False

    def emit_into(self, n: fx.Node, r: torch.Tensor, op: str, operands: list[Desc | float]) -> bool:
        out = self.fresh(r)
        if not self.emit_ew(op, out, operands):
            self.slots.pop()  # the slot was the last one created
            return False
        self.desc[n] = out
        return True


def _shape_query(n: fx.Node) -> bool:
    """Nodes whose Python result depends only on shapes, which the plan's key fixes."""
    return op_name(n) in ("size", "dim", "stride", "numel") or (n.op == "call_function" and n.target in (getattr, len))


def _mutates(n: fx.Node, kwargs: dict) -> bool:
    """In-place ops (``x.add_(y)``, ``x += y``, ``inplace=True``, ``out=``): they must run, not be
    mistaken for views of their input."""
    name = op_name(n) or getattr(n.target, "__name__", "")
    return (name.endswith("_") and not name.startswith("_")) or kwargs.get("inplace") is True or "out" in kwargs
