"""What the planner and the executor share: the op tables, buffer descriptors (``Desc``: buffer, offset,
shape, strides), the buffers (``Slot``), values recomputed every call (``Dyn``) and steps that run in Python or
torch (``PyStep``, ``TorchStep``). Numerical contract: none of this computes; it describes.
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
