"""Builds llama.cpp's ``llama-imatrix`` and ``llama-quantize`` for this host, once: the benchmark-only peer that
quantizes with an importance matrix (``Q4_K_M`` + imatrix), which llama-cpp-python's C API cannot do (its
``llama_model_quantize_params.imatrix`` is a C++ map pointer). Never needed by kwker's tests or CI.

Contract: ``ensure_llama_tools()`` returns the folder holding both binaries, built from the llama.cpp vendored in
PyPI ``llama-cpp-python`` (the version pinned in ``benchmarks/requirements-peers.txt``, the same source as the
``llama_cpp`` peer), with the ``native`` kind's instruction sets (``build.cmake_args``: AMX off where the CPU has
it), static libraries, CPU backend only. It lives in ``$KWKER_PEER_CACHE`` (default ``~/.cache/kwker/peers``)
``/llama-tools-<version>/bin``. The first call downloads the sdist with pip (``--no-binary``, no dependencies),
installs cmake from PyPI into the peer folder when the host has none, and builds the two targets (about 5
minutes on 2 cores). A failure raises ``RuntimeError`` with the tail of the log, kept beside the folder.

``imatrix(model_gguf, text_file, out, chunks)`` runs ``llama-imatrix`` over the first ``chunks`` chunks of 512
tokens of the text; ``quantize_with_imatrix(src, dst, ftype, imatrix_file)`` runs ``llama-quantize --imatrix``.

CLI: ``python -m kwker_torch.peer.tools_build``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from .build import PACKAGE, cache_root, cmake_args, pinned_version
from .ik_build import BUILD_INFO_SCRIPT, _cmake, build_into, cli, fetch_sdist

TARGETS = ("llama-imatrix", "llama-quantize")
EXTRA_ARGS = [
    "-DCMAKE_BUILD_TYPE=Release",
    "-DBUILD_SHARED_LIBS=OFF",
    "-DLLAMA_BUILD_TOOLS=ON",
    "-DLLAMA_CURL=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_SERVER=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
]


def tools_dir(version: str | None = None) -> Path:
    return cache_root() / f"llama-tools-{version or pinned_version()}" / "bin"


def ensure_llama_tools(version: str | None = None) -> Path:
    """Folder with ``llama-imatrix`` and ``llama-quantize`` for this host, built on first use (module doc)."""
    version = version or pinned_version()
    out = tools_dir(version)
    if all((out / t).exists() for t in TARGETS):
        return out
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    scratch = root / f".llama-tools-{version}-building"
    log = root / f"llama-tools-{version}.build.log"
    print(f"llama.cpp {version}: building {', '.join(TARGETS)} for this CPU (about 5 minutes; log {log}) ...",
          file=sys.stderr, flush=True)  # fmt: skip
    src = fetch_sdist(PACKAGE, version, scratch, "llama.cpp", log)
    info = src / "common" / "cmake" / "build-info-gen-cpp.cmake"
    if not info.exists():  # as in ik_llama.cpp's sdist: the script that fills build-info.cpp.in
        info.parent.mkdir(exist_ok=True)
        info.write_text(BUILD_INFO_SCRIPT)
    isa = [a for a in cmake_args("native").split() if a.startswith("-DGGML_")]
    build_into(_cmake(root / "tools", log), src, [*EXTRA_ARGS, *isa], TARGETS, scratch, out.parent, log, "llama.cpp")
    return out


def imatrix(model_gguf: str, text_file: str, out: str, chunks: int, threads: int = 2) -> str:
    """llama-imatrix over the first ``chunks`` chunks of 512 tokens of ``text_file``; returns ``out``."""
    exe = ensure_llama_tools() / "llama-imatrix"
    cmd = [str(exe), "-m", model_gguf, "-f", text_file, "-o", out, "-c", "512", "--chunks", str(chunks),
           "-t", str(threads)]  # fmt: skip
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0 or not os.path.exists(out):
        raise RuntimeError(f"llama-imatrix failed (exit {r.returncode}):\n{r.stderr[-3000:]}")
    return out


def quantize(src: str, dst: str, ftype: str, imatrix_file: str | None = None, allow_requantize: bool = False,
             threads: int = 2) -> str:  # fmt: skip
    """llama-quantize [--imatrix FILE] [--allow-requantize] ``src`` ``dst`` ``ftype``; returns ``dst``.
    ``allow_requantize``: ``src`` is itself quantized (its tensors dequantized, then quantized to ``ftype``)."""
    exe = ensure_llama_tools() / "llama-quantize"
    flags = (["--imatrix", imatrix_file] if imatrix_file else []) + (["--allow-requantize"] if allow_requantize else [])
    r = subprocess.run([str(exe), *flags, src, dst, ftype, str(threads)], capture_output=True, text=True)
    if r.returncode != 0 or not os.path.exists(dst):
        raise RuntimeError(f"llama-quantize failed (exit {r.returncode}):\n{r.stderr[-3000:]}")
    return dst


def quantize_with_imatrix(src: str, dst: str, ftype: str, imatrix_file: str, threads: int = 2) -> str:
    """llama-quantize --imatrix ``imatrix_file`` ``src`` ``dst`` ``ftype``; returns ``dst``."""
    return quantize(src, dst, ftype, imatrix_file, threads=threads)


if __name__ == "__main__":
    raise SystemExit(cli(ensure_llama_tools, __doc__))
