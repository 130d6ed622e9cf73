"""The planner's per-op plans (a mixin of ``Planner``): copies, cat / stack / repeat_interleave, reductions,
LayerNorm, linear, attention and embedding, each written as executor instructions into the result's buffer,
or ``False`` when the op's form is not one the executor runs (it then becomes a torch step).
Numerical contract: ``planner.py``'s (the instructions follow torch's CPU arithmetic).
"""

from __future__ import annotations

import math

import torch
import torch.fx as fx

from .descs import (
    Desc,
    TorchStep,
    Unsupported,
    _callable,
    _contiguous_strides,
    _drop_dim2,
    _f64_word,
    _rows,
    op_name,
)


class PlanOps:
    """Per-op plans; ``Planner`` provides ``emit``, ``emit_into``, ``new_slot``, ``fresh`` and the graph state."""

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
