"""Loads the native library (Rust kernels + the stable-ABI registration shim) and exposes its few
process-wide settings: the instruction-set tier in use and the thread cap.

torch must be imported before the library is loaded: the library links libtorch_cpu/libc10 by name and
relies on the copies ``import torch`` has already mapped (no rpath is baked in).
"""

from __future__ import annotations

import ctypes
import os

import torch

LIB_NAME = "libkwker_shim.so"
TIERS = ("generic", "avx2", "avxvnni", "avx512", "amx")


def _load() -> ctypes.CDLL:
    # The library sits at the package's top (setup.py places it there), one folder above this module.
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), LIB_NAME)
    if not os.path.exists(path):
        raise ImportError(
            f"kwker_torch: the native library {path} is missing. Build it from the repository root with "
            "`pip install --no-build-isolation -e .` (needs torch and a Rust toolchain)."
        )
    torch.ops.load_library(path)  # runs the library's static initialisers: registers torch.ops.kwker.*
    lib = ctypes.CDLL(path)  # the same handle, for the plain C settings functions
    lib.kwker_isa_name.restype = ctypes.c_char_p
    lib.kwker_set_isa.argtypes = [ctypes.c_char_p]
    lib.kwker_set_isa.restype = ctypes.c_int32
    lib.kwker_isa_supported.argtypes = [ctypes.c_char_p]
    lib.kwker_isa_supported.restype = ctypes.c_int32
    lib.kwker_num_threads.restype = ctypes.c_size_t
    lib.kwker_set_num_threads.argtypes = [ctypes.c_size_t]
    return lib


LIB = _load()


def isa() -> str:
    """The instruction-set tier the kernels run on: ``"amx"``, ``"avx512"``, ``"avxvnni"``, ``"avx2"`` or
    ``"generic"``."""
    return LIB.kwker_isa_name().decode()


def set_isa(name: str) -> None:
    """Force a tier for this process (as ``KWKER_ISA`` does at start-up)."""
    rc = LIB.kwker_set_isa(name.encode())
    if rc == 1:
        raise ValueError(f"kwker: unknown instruction-set tier {name!r}; expected one of {TIERS}")
    if rc == 2:
        raise ValueError(f"kwker: this CPU cannot run the {name!r} tier; it supports {supported_isas()}")


def supported_isas() -> list[str]:
    """Every tier this CPU can run, lowest first (``KWKER_ISA_MAX`` hides the tiers above it). Only asks:
    the tier other threads' kernels run on is never touched."""
    return [t for t in TIERS if LIB.kwker_isa_supported(t.encode()) == 0]


def num_threads() -> int:
    """Threads a kernel uses: ``KWKER_NUM_THREADS`` or, by default (0 here), torch's intra-op threads."""
    n = int(LIB.kwker_num_threads())
    return n if n > 0 else torch.get_num_threads()


def set_num_threads(n: int) -> None:
    """Cap the threads a kernel uses (0: follow ``torch.get_num_threads()``)."""
    if n < 0:
        raise ValueError(f"kwker: thread count must be >= 0, got {n}")
    LIB.kwker_set_num_threads(n)
