"""A faster ``gguf.GGUFReader``: the same fields and tensors, read in about a tenth of the time.

The ``gguf`` package's reader slices its ``np.memmap`` once per array element of the metadata, and a memmap
slice costs microseconds: a 262,144-token vocabulary (Gemma 3's tokens, scores and types) took 9 s to open,
and transformers opens a file two or three times to load one model. ``FastReader`` slices a plain ndarray
view of the same map and reads numeric arrays as one block, so its fields (``parts``, ``data``, ``types``)
and tensors are what ``GGUFReader`` builds, element for element (tested).

``reading(path)``: within it, ``gguf.GGUFReader(path)`` (which transformers calls when it reads a
config or tokenizer from a GGUF file) returns one shared ``FastReader`` of that file; other paths get a
fresh ``FastReader``; and transformers' ``load_gguf_checkpoint(path)`` (metadata only), which parses every
field again on each call (2 s for Gemma 3's vocabulary) for the config, the tokenizer and the weights' names,
is parsed once and handed out as copies. A lock keeps concurrent loads from undoing each other's patches.
"""

from __future__ import annotations

import contextlib
import copy
import os
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
from gguf import GGUFReader, GGUFValueType

_LOCK = threading.RLock()


class FastReader(GGUFReader):
    """``GGUFReader`` with cheap slices (a plain ndarray over the same memory map)."""

    def _get(self, offset: int, dtype: Any, count: int = 1, override_order: Any = None) -> np.ndarray:
        plain = self.__dict__.get("_plain")
        if plain is None:
            plain = self._plain = self.data.view(np.ndarray)
        count = int(count)
        itemsize = np.dtype(dtype).itemsize
        arr = plain[offset : offset + itemsize * count].view(dtype=dtype)[:count]
        order = self.byte_order if override_order is None else override_order
        return arr if order == "I" else arr.view(arr.dtype.newbyteorder(order))

    def _get_field_parts(self, orig_offs: int, raw_type: int) -> tuple[int, list[Any], list[int], list[Any]]:
        if GGUFValueType(raw_type) != GGUFValueType.ARRAY:
            return super()._get_field_parts(orig_offs, raw_type)
        raw_itype = self._get(orig_offs, np.uint32)
        alen = self._get(orig_offs + 4, np.uint64)
        itype, n = GGUFValueType(raw_itype[0]), int(alen[0])
        offs = orig_offs + 12
        parts: list[Any] = [raw_itype, alen]
        types: list[Any] = [GGUFValueType.ARRAY] + ([itype] if n else [])
        nptype = self.gguf_scalar_to_np.get(itype)
        if nptype is not None:
            arr = self._get(offs, nptype, n)
            parts += [arr[i : i + 1] for i in range(n)]
            return 12 + int(arr.nbytes), parts, list(range(2, 2 + n)), types
        if itype != GGUFValueType.STRING:
            return super()._get_field_parts(orig_offs, raw_type)
        idxs = []
        for _ in range(n):
            slen = self._get(offs, np.uint64)
            size = int(slen[0])
            parts += [slen, self._get(offs + 8, np.uint8, size)]
            idxs.append(len(parts) - 1)
            offs += 8 + size
        return offs - orig_offs, parts, idxs, types


@contextlib.contextmanager
def reading(path: str) -> Iterator[FastReader]:
    """``gguf.GGUFReader`` returns the shared ``FastReader`` of ``path`` (others: a fresh one) within."""
    import gguf
    from transformers import modeling_gguf_pytorch_utils as hf_gguf

    path = os.path.realpath(path)
    with _LOCK:
        shared = FastReader(path)
        original, original_load = gguf.GGUFReader, hf_gguf.load_gguf_checkpoint
        parsed: dict[str, Any] = {}

        def open_reader(p: Any, mode: str = "r") -> GGUFReader:
            return shared if os.path.realpath(p) == path and mode == "r" else FastReader(p, mode)  # type: ignore[arg-type]

        def load_checkpoint(p: Any, return_tensors: bool = False, **kw: Any) -> dict[str, Any]:
            if return_tensors or kw.get("model_to_load") is not None or os.path.realpath(p) != path:
                return original_load(p, return_tensors=return_tensors, **kw)
            if not parsed:
                parsed.update(original_load(p, return_tensors=False))
            # Each caller gets its own dicts (the config is edited by its readers); the long lists inside
            # (tokens, merges) are shared, read only.
            return {k: copy.deepcopy(v) if k == "config" else dict(v) if isinstance(v, dict) else v
                    for k, v in parsed.items()}  # fmt: skip

        gguf.GGUFReader = open_reader  # type: ignore[assignment,misc]
        hf_gguf.load_gguf_checkpoint = load_checkpoint
        try:
            yield shared
        finally:
            gguf.GGUFReader = original  # type: ignore[misc]
            hf_gguf.load_gguf_checkpoint = original_load
