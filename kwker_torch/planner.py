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

import math
import operator
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx as fx

DTYPES = {torch.float32: 0, torch.bfloat16: 1, torch.int64: 2, torch.bool: 3}
# Dtypes a buffer may hold for the torch steps between native programs (BLOOM's ALiBi powers are int32, say);
# no native instruction reads or writes them (``Desc.words`` refuses, and the emitters check DTYPES first).
HELD = {torch.int32, torch.int16, torch.int8, torch.uint8, torch.float16, torch.float64}
EW_OPS = [
    "copy", "add", "sub", "mul", "div", "neg", "rsqrt", "sqrt", "silu", "cos", "sin", "exp", "pow",
    "sigmoid", "tanh", "relu", "gelu_tanh", "square",
]  # fmt: skip
EW = {name: i for i, name in enumerate(EW_OPS)}
INT_OK = {"copy", "add", "sub", "mul", "neg", "square"}
UNARY = {"neg", "rsqrt", "sqrt", "silu", "cos", "sin", "exp", "sigmoid", "tanh", "relu"}
BINARY = {"add", "sub", "mul", "div", "pow"}
INPLACE = {"add_": "add", "sub_": "sub", "mul_": "mul", "div_": "div", "copy_": "copy"}
COPY_LIKE = {"to", "float", "bfloat16", "type_as", "contiguous", "clone", "reshape", "flatten", "view"}
SDPA = {torch._C._nn.scaled_dot_product_attention, torch.nn.functional.scaled_dot_product_attention}

_OPERATORS: dict[Any, str] = {
    operator.add: "add", operator.sub: "sub", operator.mul: "mul", operator.truediv: "div",
    operator.neg: "neg", operator.iadd: "add_", operator.isub: "sub_", operator.imul: "mul_",
    operator.itruediv: "div_", operator.getitem: "getitem",
    torch.ops.kwker.linear.default: "kwker_linear",
}  # fmt: skip
_TORCH_NAMES = (
    "add sub mul div neg rsqrt sqrt cos sin exp sigmoid tanh relu silu gelu pow cat mean sum linear "
    "embedding index_copy split chunk layer_norm stack repeat_interleave"
).split()


def _name_table() -> dict[Any, str]:
    table = dict(_OPERATORS)
    for ns in (torch, torch.nn.functional, torch._C._nn, torch.special):
        for name in _TORCH_NAMES:
            obj = getattr(ns, name, None)
            if obj is not None:
                table.setdefault(obj, name)
    for f in SDPA:
        table[f] = "sdpa"
    return table


_NAMES = _name_table()


def op_name(node: fx.Node) -> str | None:
    """A short name for what a call node does (method name, or our name for a known function)."""
    if node.op == "call_method":
        return str(node.target)
    if node.op == "call_function":
        try:
            return _NAMES.get(node.target)
        except TypeError:  # unhashable target
            return None
    return None


class Unsupported(Exception):
    """The graph (at this shape signature) cannot run on the executor; it stays on FX."""


@dataclass(frozen=True)
class Desc:
    """A tensor value: ``shape``/``stride`` elements of ``dtype`` at byte ``offset`` of slot ``slot``."""

    slot: int
    offset: int
    dtype: torch.dtype
    shape: tuple[int, ...]
    stride: tuple[int, ...]

    def words(self) -> list[int]:
        if self.dtype not in DTYPES:
            raise Unsupported(f"a native instruction on a {self.dtype} tensor")
        return [self.slot, self.offset, DTYPES[self.dtype], len(self.shape), *self.shape, *self.stride]

    def end(self) -> int:
        if 0 in self.shape:
            return self.offset
        last = sum((d - 1) * s for d, s in zip(self.shape, self.stride, strict=True))
        return self.offset + (last + 1) * esize(self.dtype)

    def expand_to(self, shape: Sequence[int]) -> Desc:
        """Broadcast view (stride 0 on new and size-1 dims)."""
        pad = len(shape) - len(self.shape)
        if pad < 0:
            raise Unsupported("cannot broadcast to fewer dims")
        dims, strides = (1,) * pad + self.shape, (0,) * pad + self.stride
        out = []
        for d, s, t in zip(dims, strides, shape, strict=True):
            if d == t:
                out.append(s if d != 1 else 0)
            elif d == 1:
                out.append(0)
            else:
                raise Unsupported(f"cannot broadcast {self.shape} to {tuple(shape)}")
        return Desc(self.slot, self.offset, self.dtype, tuple(shape), tuple(out))

    def with_layout(self, shape: Sequence[int], stride: Sequence[int]) -> Desc:
        return Desc(self.slot, self.offset, self.dtype, tuple(shape), tuple(stride))

    def narrow(self, dim: int, start: int, length: int) -> Desc:
        shape = list(self.shape)
        shape[dim] = length
        off = self.offset + start * self.stride[dim] * esize(self.dtype)
        return Desc(self.slot, off, self.dtype, tuple(shape), self.stride)


def esize(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def _contiguous_strides(shape: Sequence[int]) -> tuple[int, ...]:
    out, acc = [], 1
    for d in reversed(shape):
        out.append(acc)
        acc *= max(d, 1)
    return tuple(reversed(out))


def _f64_word(x: float) -> int:
    return struct.unpack("<q", struct.pack("<d", float(x)))[0]


def _storage_ptr(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


@dataclass
class Slot:
    kind: str  # "input" (graph argument i), "const" (a tensor we keep), "arena" (allocated)
    nbytes: int
    base: int  # byte offset of the slot's start within its torch storage
    arg: int = -1
    tensor: torch.Tensor | None = None
    at: int = 0  # arena slots: byte offset inside the shared arena buffer


@dataclass(frozen=True)
class Dyn:
    """A Python value that changes from call to call (an int graph input such as a sliding-window cache's
    length, or arithmetic on it): recomputed every call, never baked into the plan."""

    arg: int = -1  # graph argument index for a placeholder


@dataclass
class PyStep:
    """A node computing a Python value from Dyn values, run every call."""

    node: fx.Node
    fn: Callable[..., Any]


@dataclass
class TorchStep:
    """A node run through torch during a step: target, arg templates, where its outputs go."""

    node: fx.Node
    fn: Callable[..., Any]
    args: Any
    kwargs: Any
    outs: list[Desc] | None  # None: in-place on its first argument, nothing to copy


class Planner(fx.Interpreter):
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

    def plan_copy(self, n: fx.Node, x: Desc, r: torch.Tensor) -> bool:
        if tuple(r.shape) == x.shape:
            return self.emit_into(n, r, "copy", [x])
        if not r.is_contiguous():
            return False
        # A reshape that copies: torch wrote x's elements in row-major order into a contiguous r.
        users = list(n.users)
        kv_of = [u.args[1:3] + tuple(u.kwargs.get(k) for k in ("key", "value")) for u in users]
        if (
            len(x.shape) == 5 and x.stride[2] == 0 and len(r.shape) == 4 and users
            and all(op_name(u) == "sdpa" and n in kv for u, kv in zip(users, kv_of, strict=True))
        ):  # fmt: skip
            self.gqa[n] = x
            self.desc[n] = "gqa"
            return True
        out = self.fresh(r)
        if not self.emit_ew("copy", out.with_layout(x.shape, _contiguous_strides(x.shape)), [x]):
            self.slots.pop()
            return False
        self.desc[n] = out
        return True

    def plan_cat(self, n: fx.Node, args: tuple, kwargs: dict, r: torch.Tensor) -> bool:
        parts = n.args[0] if n.args else kwargs.get("tensors")
        dim = args[1] if len(args) > 1 else kwargs.get("dim", 0)
        if not isinstance(parts, (list, tuple)):
            return False
        descs = [self.desc.get(p) if isinstance(p, fx.Node) else None for p in parts]
        # torch.cat skips empty inputs (even 1-D ones, e.g. a dynamic cache's initial torch.tensor([])).
        descs = [d for d in descs if not (isinstance(d, Desc) and 0 in d.shape)]
        if not all(isinstance(d, Desc) and len(d.shape) == r.dim() for d in descs):
            return False
        if r.dtype not in (torch.float32, torch.bfloat16, torch.int64):
            return False
        dim = dim % r.dim()
        out = self.fresh(r)
        start = 0
        for d in descs:
            size = d.shape[dim]  # type: ignore[union-attr]
            self.emit_ew("copy", out.narrow(dim, start, size), [d])  # type: ignore[list-item]
            start += size
        self.desc[n] = out
        return True

    def plan_stack(self, n: fx.Node, args: tuple, kwargs: dict, r: torch.Tensor) -> bool:
        """``torch.stack(parts, dim)``: each part copied into its index of the new dim (GPT-J's rotary)."""
        parts = n.args[0] if n.args else kwargs.get("tensors")
        dim = args[1] if len(args) > 1 else kwargs.get("dim", 0)
        if set(kwargs) - {"tensors", "dim"} or not isinstance(parts, (list, tuple)) or not isinstance(dim, int):
            return False
        descs = [self.desc.get(p) if isinstance(p, fx.Node) else None for p in parts]
        if r.dtype not in (torch.float32, torch.bfloat16, torch.int64):
            return False
        if not all(isinstance(d, Desc) and len(d.shape) == r.dim() - 1 for d in descs):
            return False
        dim = dim % r.dim()
        out = self.fresh(r)
        shape = out.shape[:dim] + out.shape[dim + 1 :]
        stride = out.stride[:dim] + out.stride[dim + 1 :]
        for i, d in enumerate(descs):
            at = out.narrow(dim, i, 1).with_layout(shape, stride)
            if not self.emit_ew("copy", at, [d]):  # type: ignore[list-item]
                raise Unsupported(f"{n.format_node()}: stack could not be planned")
        self.desc[n] = out
        return True

    def plan_repeat_interleave(self, n: fx.Node, args: tuple, kwargs: dict, r: torch.Tensor) -> bool:
        """``torch.repeat_interleave(x, k, dim)`` with an int ``k``: one broadcasting copy (GPT-J's sin/cos)."""
        x = self.desc.get(n.args[0]) if n.args and isinstance(n.args[0], fx.Node) else None
        reps = args[1] if len(args) > 1 else kwargs.get("repeats")
        dim = args[2] if len(args) > 2 else kwargs.get("dim")
        if set(kwargs) - {"repeats", "dim"} or not isinstance(x, Desc) or not isinstance(reps, int):
            return False
        if not isinstance(dim, int) or r.dtype not in (torch.float32, torch.bfloat16, torch.int64):
            return False
        dim = dim % len(x.shape)
        out = self.fresh(r)
        # out viewed as [..., x.shape[dim], reps, ...]; x broadcast over the reps axis.
        shape = (*x.shape[: dim + 1], reps, *x.shape[dim + 1 :])
        stride = (*out.stride[:dim], out.stride[dim] * reps, out.stride[dim], *out.stride[dim + 1 :])
        src = x.with_layout((*x.shape[: dim + 1], 1, *x.shape[dim + 1 :]),
                            (*x.stride[: dim + 1], 0, *x.stride[dim + 1 :]))  # fmt: skip
        if not self.emit_ew("copy", out.with_layout(shape, stride), [src]):
            raise Unsupported(f"{n.format_node()}: repeat_interleave could not be planned")
        self.desc[n] = out
        return True

    def plan_reduce(self, n: fx.Node, name: str, x: Desc, args: tuple, kwargs: dict, r: torch.Tensor) -> bool:
        dims = args[1] if len(args) > 1 else kwargs.get("dim")
        keepdim = args[2] if len(args) > 2 else kwargs.get("keepdim", False)
        floats = (torch.float32, torch.bfloat16)
        if set(kwargs) - {"dim", "keepdim"} or dims is None or r.dtype not in floats or x.dtype not in floats:
            return False
        nd = len(x.shape)
        red = sorted({d % nd for d in ([dims] if isinstance(dims, int) else dims)})
        kept = [d for d in range(nd) if d not in red]
        out = self.fresh(r)
        if keepdim:
            o_shape = [out.shape[d] for d in kept]
            o_stride = [out.stride[d] for d in kept]
        else:
            o_shape, o_stride = list(out.shape), list(out.stride)
        inp = x.with_layout([x.shape[d] for d in kept + red], [x.stride[d] for d in kept + red])
        self.emit([2, int(name == "mean"), *out.with_layout(o_shape, o_stride).words(), *inp.words()])
        self.desc[n] = out
        return True

    def temp(self, n: fx.Node, shape: tuple[int, ...]) -> Desc:
        """A float32 scratch buffer of ``shape`` that lives only while node ``n`` runs."""
        d = self.fresh(torch.empty(shape, dtype=torch.float32))
        self.temps.append((n, d.slot))
        return d

    def plan_layer_norm(self, n: fx.Node, args: tuple, kwargs: dict, r: torch.Tensor) -> bool:
        """``F.layer_norm`` over the last dim as native instructions, all in float32 and rounded once to the
        output dtype (as torch's CPU kernel computes a bf16 input): mean; d = x - mean; var = mean(d * d);
        y = d * rsqrt(var + eps) (* weight) (+ bias). Two passes, as torch's; its summation order differs
        (~1e-7 relative)."""
        names = ("input", "normalized_shape", "weight", "bias", "eps")
        node_of = {k: (n.args[i] if i < len(n.args) else n.kwargs.get(k)) for i, k in enumerate(names)}
        value = {k: (args[i] if i < len(args) else kwargs.get(k)) for i, k in enumerate(names)}
        x = self.desc.get(node_of["input"]) if isinstance(node_of["input"], fx.Node) else None
        floats = (torch.float32, torch.bfloat16)
        shape = value["normalized_shape"]
        if set(kwargs) - set(names) or not isinstance(x, Desc) or x.dtype not in floats or r.dtype not in floats:
            return False
        if not isinstance(shape, (list, tuple)) or len(shape) != 1 or tuple(shape) != x.shape[-1:]:
            return False
        params = []
        for k in ("weight", "bias"):
            d = self.desc.get(node_of[k]) if isinstance(node_of[k], fx.Node) else None
            if node_of[k] is not None and not (isinstance(d, Desc) and d.shape == x.shape[-1:] and d.dtype in floats):
                return False
            params.append(d)
        eps = float(value["eps"]) if value["eps"] is not None else 1e-5
        stat = (*x.shape[:-1], 1)
        flat = list(x.shape[:-1])
        mean, var, rstd = self.temp(n, stat), self.temp(n, stat), self.temp(n, stat)
        d, t = self.temp(n, x.shape), self.temp(n, x.shape)
        self.emit([2, 1, *mean.with_layout(flat, list(mean.stride[:-1])).words(), *x.words()])
        ok = self.emit_ew("sub", d, [x, mean]) and self.emit_ew("square", t, [d])
        self.emit([2, 1, *var.with_layout(flat, list(var.stride[:-1])).words(), *t.words()])
        ok = ok and self.emit_ew("add", rstd, [var, eps]) and self.emit_ew("rsqrt", rstd, [rstd])
        out = self.fresh(r)
        w, b = params
        steps: list[tuple[str, Desc]] = [("mul", rstd)] + ([("mul", w)] if w else []) + ([("add", b)] if b else [])
        src: Desc = d
        for i, (op, operand) in enumerate(steps):
            dst = out if i == len(steps) - 1 else t
            ok = ok and self.emit_ew(op, dst, [src, operand])
            src = dst
        if not ok:  # every dtype here is native: an emitter refusing would be a planner bug
            raise Unsupported(f"{n.format_node()}: layer_norm could not be planned")
        self.desc[n] = out
        return True

    def plan_linear(self, n: fx.Node, r: torch.Tensor) -> bool:
        a = list(n.args) + [None] * (3 - len(n.args))
        x, w = self.desc.get(a[0]), self.desc.get(a[1])
        b = self.desc.get(a[2]) if a[2] is not None else None
        if n.kwargs or not (isinstance(x, Desc) and isinstance(w, Desc)):
            return False
        floats = (torch.float32, torch.bfloat16)
        if a[2] is not None and not (isinstance(b, Desc) and len(b.shape) == 1 and b.dtype in floats):
            return False
        if len(w.shape) != 2 or w.dtype not in floats or w.stride != _contiguous_strides(w.shape):
            return False
        if x.dtype not in floats or r.dtype not in floats:
            return False
        out = self.fresh(r)
        x2, o2 = _rows(x), _rows(out)
        if x2 is None or o2 is None:
            self.slots.pop()
            return False
        words = [3, *x2.words(), *w.words(), int(b is not None)]
        if b is not None:
            words += b.words()
        self.emit(words + o2.words())
        self.desc[n] = out
        return True

    def plan_sdpa(self, n: fx.Node, args: tuple, kwargs: dict, r: torch.Tensor) -> bool:
        names = ["query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa"]
        call = dict(zip(names, n.args, strict=False)) | dict(n.kwargs)
        vals = dict(zip(names, args, strict=False)) | dict(kwargs)
        if vals.get("dropout_p", 0.0) != 0.0 or r.dim() != 4:
            return False
        q = self.desc.get(call["query"])
        kv = []
        for key in ("key", "value"):
            node = call[key]
            kv.append(_drop_dim2(self.gqa[node]) if node in self.gqa else self.desc.get(node))
        k, v = kv
        if not all(isinstance(d, Desc) and len(d.shape) == 4 for d in (q, k, v)):
            return False
        if not (q.dtype == k.dtype == v.dtype == r.dtype and r.dtype in (torch.float32, torch.bfloat16)):  # type: ignore[union-attr]
            return False
        if any(d.stride[3] != 1 and d.shape[3] > 1 for d in (q, k, v)):  # type: ignore[union-attr]
            return False
        b, hq, t, dh = q.shape  # type: ignore[union-attr]
        s = k.shape[2]  # type: ignore[union-attr]
        mask_node = call.get("attn_mask")
        mask = None
        if mask_node is not None:
            m = self.desc.get(mask_node)
            if not isinstance(m, Desc):
                return False
            try:
                mask = m.expand_to((b, hq, t, s))
            except Unsupported:
                return False
            if hq > 1 and mask.stride[1] != 0:
                return False
        causal = bool(vals.get("is_causal", False))
        if causal and (mask is not None or t != s):
            return False
        scale = vals.get("scale")
        scale = 1.0 / math.sqrt(dh) if scale is None else float(scale)
        out = self.fresh(r)
        words = [4, *q.words(), *k.words(), *v.words(), int(mask is not None)]  # type: ignore[union-attr]
        if mask is not None:
            words += mask.words()
            self.masked_attention += 1
        self.emit(words + [int(causal), _f64_word(scale), *out.words()])
        self.desc[n] = out
        return True

    def plan_embedding(self, n: fx.Node, args: tuple, r: torch.Tensor) -> bool:
        ids, w = self.desc.get(n.args[0]), self.desc.get(n.args[1])  # type: ignore[arg-type]
        if n.kwargs or (len(args) > 3 and args[3] is not None) or not (isinstance(ids, Desc) and isinstance(w, Desc)):
            return False
        if ids.dtype != torch.int64 or w.dtype != r.dtype or len(w.shape) != 2:
            return False
        out = self.fresh(r)
        self.emit([6, *ids.words(), *w.words(), *out.words()])
        self.desc[n] = out
        return True

    # ---- nodes left to torch
    def torch_step(self, n: fx.Node, r: torch.Tensor) -> None:
        out = self.fresh(r)
        self.torch_steps_append(n, [out])
        self.desc[n] = out

    def torch_steps_append(self, n: fx.Node, outs: list[Desc] | None) -> None:
        for a in n.all_input_nodes:
            d = self.desc.get(a)
            if d == "gqa":
                raise Unsupported("a skipped repeat_kv copy is needed by a torch op")
            if isinstance(self.env.get(a), torch.Tensor) and not isinstance(d, Desc):
                raise Unsupported(f"{a.format_node()} has no planned buffer")
        self.steps.append(TorchStep(n, _callable(n), n.args, n.kwargs, outs))
        self.torch_ops.append(op_name(n) or getattr(n.target, "__name__", str(n.target)))


def _shape_query(n: fx.Node) -> bool:
    """Nodes whose Python result depends only on shapes, which the plan's key fixes."""
    return op_name(n) in ("size", "dim", "stride", "numel") or (n.op == "call_function" and n.target in (getattr, len))


def _mutates(n: fx.Node, kwargs: dict) -> bool:
    """In-place ops (``x.add_(y)``, ``x += y``, ``inplace=True``, ``out=``): they must run, not be
    mistaken for views of their input."""
    name = op_name(n) or getattr(n.target, "__name__", "")
    return (name.endswith("_") and not name.startswith("_")) or kwargs.get("inplace") is True or "out" in kwargs


def _rows(d: Desc) -> Desc | None:
    """A tensor [..., k] with dense rows seen as 2-D [rows, k], if its leading dims merge."""
    if len(d.shape) == 0:
        return None
    k = d.shape[-1]
    lead = [(s, st) for s, st in zip(d.shape[:-1], d.stride[:-1], strict=True) if s != 1]
    m = math.prod(s for s, _ in lead)
    if not lead:
        row_stride = k
    else:
        for (_, st0), (s1, st1) in zip(lead, lead[1:], strict=False):
            if st0 != s1 * st1:
                return None
        row_stride = lead[-1][1]
    if k > 1 and d.stride[-1] != 1:
        return None
    return d.with_layout((m, k), (row_stride, 1))


def _drop_dim2(d: Desc) -> Desc:
    return d.with_layout(d.shape[:2] + d.shape[3:], d.stride[:2] + d.stride[3:])


def _callable(n: fx.Node) -> Callable[..., Any]:
    if n.op == "call_method":
        name = str(n.target)
        return lambda self, *a, **k: getattr(self, name)(*a, **k)
    return n.target  # type: ignore[return-value]
