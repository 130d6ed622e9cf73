"""The decoder's C entry points (``csrc-shim/src/decoder_*_ffi.rs``) through ctypes, which releases the GIL
for each call, and every code that crosses that boundary, read from the library itself
(``kwker_decoder_abi``): tensor names, dtypes, storage formats, logits modes, step outputs and finish reasons
are defined once, in Rust, and nowhere here.

Calls that return JSON or bytes use a two-call protocol (ask with a buffer, learn the size needed, ask
again); every call reports failures as a message that ``check`` raises.
"""

from __future__ import annotations

import ctypes
import json
from collections.abc import Callable
from typing import Any

import torch

from ..ops import native as _native

ABI_VERSION = 10
ERR_LEN = 2048

LIB = _native.LIB
P, I64, I32, SZ = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int32, ctypes.c_size_t
STR = ctypes.c_char_p
i64p, i32p, f32p = ctypes.POINTER(ctypes.c_int64), ctypes.POINTER(ctypes.c_int32), ctypes.POINTER(ctypes.c_float)
SZP = ctypes.POINTER(ctypes.c_size_t)


class GenParams(ctypes.Structure):
    """= ``KwkGenParams`` in decoder_step_ffi.rs."""

    _fields_ = [
        ("max_new", ctypes.c_int64), ("temperature", ctypes.c_double), ("top_k", ctypes.c_int64),
        ("top_p", ctypes.c_double), ("seed", ctypes.c_uint64), ("max_draft", ctypes.c_int64),
        ("min_p", ctypes.c_double),
    ]  # fmt: skip


class SampleArgs(ctypes.Structure):
    """= ``KwkSampleParams`` in sample_ffi.rs."""

    _fields_ = [("temperature", ctypes.c_double), ("top_k", ctypes.c_int64), ("top_p", ctypes.c_double),
                ("min_p", ctypes.c_double)]  # fmt: skip


CALLBACK = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p)

_SIGS: dict[str, tuple[Any, list[Any]]] = {
    "kwker_decoder_abi": (I32, [P, SZ, SZP, STR, SZ]),
    "kwker_recipe_tensors": (I32, [STR, P, SZ, SZP, STR, SZ]),
    "kwker_decoder_builder": (P, [STR, I64, I64, I64, STR, STR, SZ]),
    "kwker_decoder_set": (I32, [P, STR, I64, I64, STR, P, I64, I64, STR, P, STR, SZ]),
    "kwker_decoder_set_packed": (I32, [P, STR, I64, I64, STR, P, SZ, I64, I64, STR, SZ]),
    "kwker_decoder_set_coded": (I32, [P, STR, I64, I64, STR, P, P, I64, I64, P, STR, SZ]),
    "kwker_quant_grid": (I32, [STR, P, I64, I64, P, P, P, P, P, STR, SZ]),
    "kwker_decoder_set_gguf": (
        I32, [P, STR, I64, I64, ctypes.POINTER(ctypes.c_uint32), i64p, SZ, P, SZ, I64, STR, i32p, STR, SZ],
    ),
    "kwker_decoder_build": (P, [P, STR, SZ]),
    "kwker_decoder_builder_free": (None, [P]),
    "kwker_decoder_free": (None, [P]),
    "kwker_decoder_describe": (I32, [P, P, SZ, SZP, STR, SZ]),
    "kwker_decoder_export": (I32, [P, STR, I64, I64, STR, i64p, i64p, P, SZ, SZP, STR, SZ]),
    "kwker_decoder_export_values": (I32, [P, STR, I64, I64, STR, i64p, i64p, P, SZ, SZP, STR, SZ]),
    "kwker_decoder_weight_bytes": (I64, [P]),
    "kwker_decoder_step": (I32, [P, I64, i64p, i64p, i64p, i32p, I32, f32p, I64, STR, SZ]),
    "kwker_decoder_slot_len": (I64, [P, I64]),
    "kwker_decoder_slot_min_len": (I64, [P, I64]),
    "kwker_decoder_kv_bytes": (I64, [P, I32]),
    "kwker_decoder_slot_tokens": (I32, [P, I64, i64p, I64, STR, SZ]),
    "kwker_decoder_truncate": (I32, [P, I64, I64, STR, SZ]),
    "kwker_decoder_copy_prefix": (I32, [P, I64, I64, I64, STR, SZ]),
    "kwker_decoder_set_position": (I32, [P, I64, I64, STR, SZ]),
    "kwker_decoder_pool_stalls": (I64, []),
    "kwker_rng_seed": (None, [ctypes.c_uint64, P]),
    "kwker_rng_uniform": (ctypes.c_double, [P]),
    "kwker_sample": (I32, [f32p, I64, ctypes.POINTER(SampleArgs), P, i64p, STR, SZ]),
    "kwker_sample_distribution": (I32, [f32p, I64, ctypes.POINTER(SampleArgs), P, STR, SZ]),
    "kwker_sample_draw": (I32, [P, I64, P, i64p, STR, SZ]),
    "kwker_lookup_propose": (I32, [i64p, I64, I64, i64p, i64p, STR, SZ]),
    "kwker_lookup_new": (P, [I64, I32]),
    "kwker_lookup_free": (None, [P]),
    "kwker_lookup_next": (I32, [P, i64p, I64, I64, I64, I64, i64p, i64p, STR, SZ]),
    "kwker_lookup_size": (I64, [P, I64, I64, I64]),
    "kwker_lookup_update": (None, [P, I64, I64]),
    "kwker_lookup_record": (None, [P, I64, ctypes.c_double, ctypes.c_double]),
    "kwker_lookup_counts": (None, [P, i64p]),
    "kwker_decoder_generate": (
        I32,
        [P, I64, i64p, i64p, i64p, ctypes.POINTER(GenParams), i64p, I64, i64p, i64p, i32p, i64p, CALLBACK, P, STR,
         SZ],
    ),  # fmt: skip
}
for _name, (_res, _args) in _SIGS.items():
    _fn = getattr(LIB, _name)
    _fn.restype, _fn.argtypes = _res, _args


class DecoderError(RuntimeError):
    """A decoder call was refused (bad input) or failed; the message says what to do."""


def err_buf() -> Any:
    return ctypes.create_string_buffer(ERR_LEN)


def check(rc: int, err: Any, exc: type[Exception] = DecoderError) -> None:
    """Raises ``exc`` with the library's message when ``rc`` is non-zero."""
    if rc:
        raise exc(f"kwker: {err.value.decode()}")


def sized(fn: Callable[..., int], *args: Any, exc: type[Exception] = DecoderError) -> bytes:
    """The bytes a two-call entry point ``fn(*args, out, cap, needed, err, err_len)`` returns."""
    err, need = err_buf(), ctypes.c_size_t()
    cap = 1 << 16
    while True:
        buf = ctypes.create_string_buffer(cap)
        check(fn(*args, buf, cap, ctypes.byref(need), err, ERR_LEN), err, exc)
        if need.value <= cap:
            return buf.raw[: need.value]
        cap = need.value


def _abi() -> dict[str, Any]:
    abi = json.loads(sized(LIB.kwker_decoder_abi, exc=ImportError))
    if abi["version"] != ABI_VERSION:
        raise ImportError(
            f"kwker_torch: the native library speaks decoder ABI {abi['version']}, this package {ABI_VERSION}; "
            "rebuild it with `pip install --no-build-isolation -e .`"
        )
    return abi


ABI = _abi()
TENSORS: dict[str, dict[str, Any]] = {t["name"]: t for t in ABI["tensors"]}
MATRICES = tuple(n for n, t in TENSORS.items() if t["matrix"])
LOGITS: dict[str, int] = ABI["logits"]
# What a step writes for the rows asked for: "logits", or "hidden" (the final normed hidden state).
OUTPUTS: dict[str, int] = ABI["outputs"]
FINISH: dict[int, str] = {int(c): n for c, n in ABI["finish"].items()}
# The quantized formats' table (rust/src/quant.rs: Format), by name: {granule, bits, super_row_bytes}.
QUANT_FORMATS: dict[str, dict[str, Any]] = {f["name"]: f for f in ABI["quant"]}
# GGUF tensor types the library repacks without changing a value (rust/src/quant/gguf.rs), name -> ggml id.
GGUF_TYPES: dict[str, int] = ABI["gguf"]
DTYPES: dict[torch.dtype, str] = {torch.float32: "f32", torch.bfloat16: "bf16"}
assert set(DTYPES.values()) == set(ABI["dtypes"]), "the library's dtypes changed; update native.DTYPES"


def recipe_tensors(recipe: dict[str, Any]) -> list[dict[str, Any]]:
    """[{name, layer, expert, rows, cols}] of every tensor a model of ``recipe`` has (``expert`` is 0 but for a
    sparse layer's per-expert matrices; ValueError if the recipe is refused)."""
    return json.loads(sized(LIB.kwker_recipe_tensors, json.dumps(recipe).encode(), exc=ValueError))


def ptr(t: torch.Tensor, ctype: Any) -> Any:
    return ctypes.cast(t.data_ptr(), ctypes.POINTER(ctype))


def i64(values: Any) -> torch.Tensor:
    return torch.as_tensor(values, dtype=torch.int64).contiguous()


class Builder:
    """A decoder under construction: the recipe and limits, then tensors by name, then ``build()`` (a
    handle). Freed if not built."""

    def __init__(self, recipe: dict[str, Any], slots: int, max_context: int, chunk_rows: int,
                 kv_cache: str = "f32") -> None:  # fmt: skip
        self.err = err_buf()
        self.b = LIB.kwker_decoder_builder(json.dumps(recipe).encode(), slots, max_context, chunk_rows,
                                           kv_cache.encode(), self.err, ERR_LEN)  # fmt: skip
        if not self.b:
            raise ValueError(f"kwker: {self.err.value.decode()}")

    def set(self, name: str, layer: int, t: torch.Tensor, store: str = "as_given",
            importance: torch.Tensor | None = None, expert: int = 0) -> None:  # fmt: skip
        """Copies ``t`` (2-D matrix or 1-D vector, float32 or bfloat16, contiguous) in as tensor ``name`` of
        ``layer`` (and ``expert``, for a per-expert matrix)."""
        rows, cols = (t.shape[0], t.shape[1]) if t.dim() == 2 else (1, t.shape[0])
        imp = importance.data_ptr() if importance is not None else None
        rc = LIB.kwker_decoder_set(self.b, name.encode(), layer, expert, DTYPES[t.dtype].encode(), t.data_ptr(),
                                   rows, cols, store.encode(), imp, self.err, ERR_LEN)  # fmt: skip
        check(rc, self.err, ValueError)

    def set_coded(self, name: str, layer: int, fmt: str, fit: torch.Tensor, codes: torch.Tensor,
                  importance: torch.Tensor | None = None, expert: int = 0) -> None:  # fmt: skip
        """Stores matrix ``name`` as GPTQ leaves it: ``fmt``'s scales fitted to ``fit`` (float32 [rows, cols],
        with ``importance``) as ``set(..., store=fmt)`` fits them, then ``codes`` (uint8, same shape, the stored
        form ``quant_grid`` returns) under those scales."""
        fit, codes = fit.float().contiguous(), codes.to(torch.uint8).contiguous()
        if fit.shape != codes.shape or fit.dim() != 2:
            raise ValueError(f"{name}: fit {tuple(fit.shape)} and codes {tuple(codes.shape)} must be one 2-D shape")
        imp = importance.float().contiguous() if importance is not None else None
        rc = LIB.kwker_decoder_set_coded(self.b, name.encode(), layer, expert, fmt.encode(), fit.data_ptr(),
                                         codes.data_ptr(), fit.shape[0], fit.shape[1],
                                         imp.data_ptr() if imp is not None else None, self.err, ERR_LEN)  # fmt: skip
        check(rc, self.err, ValueError)

    def set_packed(self, name: str, layer: int, fmt: str, data: torch.Tensor, rows: int, cols: int,
                   expert: int = 0) -> None:  # fmt: skip
        rc = LIB.kwker_decoder_set_packed(self.b, name.encode(), layer, expert, fmt.encode(), data.data_ptr(),
                                          data.numel(), rows, cols, self.err, ERR_LEN)  # fmt: skip
        check(rc, self.err, ValueError)

    def set_gguf(self, name: str, layer: int, parts: list[tuple[int, int]], data: Any, cols: int,
                 expert: int = 0) -> tuple[str, bool]:  # fmt: skip
        """A matrix from a GGUF file's blocks: ``parts`` = [(ggml type id, rows)] stacked in order, ``data`` their
        rows of blocks one after another (a contiguous uint8 numpy array). Returns (format stored, whether every
        value is the file's); parts kept in formats of their own give their names joined by ``+`` (``q4k+q6_k``)."""
        types = (ctypes.c_uint32 * len(parts))(*[t for t, _ in parts])
        rows = (ctypes.c_int64 * len(parts))(*[n for _, n in parts])
        fmt, exact = ctypes.create_string_buffer(64), ctypes.c_int32()
        rc = LIB.kwker_decoder_set_gguf(self.b, name.encode(), layer, expert, types, rows, len(parts),
                                        data.ctypes.data, data.nbytes, cols, fmt, ctypes.byref(exact), self.err,
                                        ERR_LEN)  # fmt: skip
        check(rc, self.err, ValueError)
        return fmt.value.decode(), bool(exact.value)

    def build(self) -> int:
        b, self.b = self.b, None
        h = LIB.kwker_decoder_build(b, self.err, ERR_LEN)
        if not h:
            raise ValueError(f"kwker: {self.err.value.decode()}")
        return h

    def __del__(self) -> None:
        if getattr(self, "b", None):
            LIB.kwker_decoder_builder_free(self.b)
            self.b = None


def quant_grid(fmt: str, w: torch.Tensor, importance: torch.Tensor | None = None
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, tuple[int, int]]:  # fmt: skip
    """``fmt`` fitted to ``w`` (float32 [rows, cols], cols a multiple of the format's granule) as the builder fits
    it: (codes uint8 [rows, cols] in stored form, step and offset float32 [rows, cols / 32], (lowest code,
    highest code)); code c of sub-block s stands for ``step[:, s] * c + offset[:, s]`` (rust/src/quant/grid.rs)."""
    w = w.float().contiguous()
    rows, cols = w.shape
    imp = importance.float().contiguous() if importance is not None else None
    codes = torch.empty(rows, cols, dtype=torch.uint8)
    step, offset = torch.empty(rows, cols // 32), torch.empty(rows, cols // 32)
    rng, err = (ctypes.c_uint8 * 2)(), err_buf()
    if cols % 32:
        raise ValueError(f"quant_grid: {cols} columns is not a multiple of 32")
    rc = LIB.kwker_quant_grid(fmt.encode(), w.data_ptr(), rows, cols, imp.data_ptr() if imp is not None else None,
                              codes.data_ptr(), step.data_ptr(), offset.data_ptr(), rng, err, ERR_LEN)  # fmt: skip
    check(rc, err, ValueError)
    return codes, step, offset, (rng[0], rng[1])


def describe(h: Any) -> dict[str, Any]:
    """{"recipe", "limits", "tensors": [{name, layer, expert, rows, cols, format}]} of a built decoder."""
    return json.loads(sized(LIB.kwker_decoder_describe, h))


def export(h: Any, name: str, layer: int, expert: int = 0, values: bool = False) -> tuple[str, int, int, bytes]:
    """(format, rows, cols, bytes) of one stored tensor, exactly as the decoder holds it (``values``: its values
    as little-endian float32 instead, a quantized matrix dequantized as the kernels read it)."""
    fn = LIB.kwker_decoder_export_values if values else LIB.kwker_decoder_export
    err, fmt = err_buf(), ctypes.create_string_buffer(16)
    rows, cols, need = ctypes.c_int64(), ctypes.c_int64(), ctypes.c_size_t()
    args = (h, name.encode(), layer, expert, fmt, ctypes.byref(rows), ctypes.byref(cols))
    check(fn(*args, None, 0, ctypes.byref(need), err, ERR_LEN), err, ValueError)
    buf = (ctypes.c_uint8 * max(need.value, 1))()
    check(fn(*args, buf, need.value, ctypes.byref(need), err, ERR_LEN), err, ValueError)
    return fmt.value.decode(), rows.value, cols.value, bytes(buf)[: need.value]


def pool_stalls() -> int:
    """Times the decoder's thread pool ran a step alone because a worker thread was not scheduled."""
    return int(LIB.kwker_decoder_pool_stalls())
