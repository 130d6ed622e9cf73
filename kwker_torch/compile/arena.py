"""The executor's arena: every intermediate buffer of a planned step placed in one block of bytes,
reusing the bytes of buffers no later node reads (liveness over graph order). Placement only: no value
is computed or changed here."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch.fx as fx

from .descs import Desc, Slot


def pack_arena(slots: list[Slot], desc: dict[fx.Node, Any], gm: fx.GraphModule,
               temps: Sequence[tuple[fx.Node, int]] = ()) -> int:  # fmt: skip
    """Places every intermediate buffer in one arena, reusing the bytes of buffers no later node reads
    (liveness over graph order: a buffer lives from the node that creates it to the last user of any
    value stored in it, views and in-place results included; graph outputs live to the end; ``temps``, a
    node's scratch, only while that node runs). A node's
    output never shares bytes with its inputs: it is placed before the inputs that die at it are freed.
    Sets each arena slot's ``at``; returns the arena's size in bytes."""
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    end = len(order)
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    for n, d in desc.items():
        for e in d if isinstance(d, tuple) else (d,):
            if not isinstance(e, Desc) or slots[e.slot].kind != "arena":
                continue
            first[e.slot] = min(first.get(e.slot, end), order[n])
            uses = [end if u.op == "output" else order[u] for u in n.users]
            last[e.slot] = max([last.get(e.slot, order[n]), order[n], *uses])
    for n, sl in temps:  # scratch of one node (``Planner.temp``)
        first[sl] = last[sl] = order[n]
    for i, sl in enumerate(slots):  # a buffer no value refers to keeps its bytes for the whole step
        if sl.kind == "arena" and i not in first:
            first[i], last[i] = 0, end

    def padded(sl: int) -> int:  # 64-byte aligned size of a slot
        return -(-max(slots[sl].nbytes, 1) // 64) * 64

    free: list[tuple[int, int]] = []  # (offset, size) holes, sorted by offset
    top = 0
    born: dict[int, list[int]] = {}
    dies: dict[int, list[int]] = {}
    for sl, f in first.items():
        born.setdefault(f, []).append(sl)
        dies.setdefault(last[sl], []).append(sl)
    for pos in range(end + 1):
        for sl in born.get(pos, []):
            size = padded(sl)
            hole = next((i for i, (_, sz) in enumerate(free) if sz >= size), None)
            if hole is None:
                slots[sl].at, top = top, top + size
            else:
                off, sz = free.pop(hole)
                slots[sl].at = off
                if sz > size:
                    free.append((off + size, sz - size))
        if pos not in born and pos not in dies:
            continue  # the free list did not change
        for sl in dies.get(pos, []):
            free.append((slots[sl].at, padded(sl)))
        free.sort()
        merged: list[tuple[int, int]] = []
        for off, sz in free:
            if merged and merged[-1][0] + merged[-1][1] == off:
                merged[-1] = (merged[-1][0], merged[-1][1] + sz)
            else:
                merged.append((off, sz))
        free = merged
    return top
