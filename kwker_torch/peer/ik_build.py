"""Builds ik_llama.cpp's ``llama-bench`` (the fastest CPU fork of llama.cpp) for this host, once: a
benchmark-only peer, never needed by kwker's tests or CI.

Contract: ``ensure_ik_llama_bench()`` returns the path of a ``llama-bench`` built from the ik_llama.cpp source
vendored in PyPI ``ik-llama-cpp-python`` (version pinned in ``benchmarks/requirements-peers.txt``), with
``-DGGML_NATIVE=ON`` (every instruction set this CPU has) and its CPU backend only. It lives in
``$KWKER_PEER_CACHE`` (default ``~/.cache/kwker/peers``) ``/ik_llama-<version>-native/``. The first call
downloads the sdist with pip (``--no-binary``, no dependencies), adds the one file the sdist lacks
(``common/cmake/build-info-gen-cpp.cmake``, which writes ``build-info.cpp``; ``../shared/design/peer-notes.md``),
installs cmake from PyPI into the same folder when the host has none, and builds the ``llama-bench`` target (about
15 minutes on 2 Zen 3 cores: its iqk kernels are large). The build goes to a scratch folder renamed into place only
after it succeeded; a failure raises ``RuntimeError`` with the tail of the log, kept beside the folder.

CLI: ``python -m kwker_torch.peer.ik_build``.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tarfile
from collections.abc import Callable, Sequence
from pathlib import Path

from .build import REQUIREMENTS, cache_root

PACKAGE = "ik-llama-cpp-python"
FALLBACK_VERSION = "0.1.5"
# The script the sdist's common/CMakeLists.txt runs and does not ship: it fills build-info.cpp.in.
BUILD_INFO_SCRIPT = """\
set(BUILD_NUMBER 0)
set(BUILD_COMMIT "ik-llama-cpp-python-sdist")
set(BUILD_COMPILER "${CMAKE_C_COMPILER_ID} ${CMAKE_C_COMPILER_VERSION}")
set(BUILD_TARGET "native")
configure_file(common/build-info.cpp.in common/build-info.cpp)
"""
CMAKE_ARGS = [
    "-DCMAKE_BUILD_TYPE=Release",
    "-DGGML_NATIVE=ON",
    "-DLLAMA_CURL=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_SERVER=OFF",
    "-DLLAMA_BUILD_EXAMPLES=ON",  # llama-bench is an example in this tree
    "-DBUILD_SHARED_LIBS=OFF",
]


def pinned_version() -> str:
    """The ik-llama-cpp-python version pinned in benchmarks/requirements-peers.txt."""
    if REQUIREMENTS.exists():
        for line in REQUIREMENTS.read_text().splitlines():
            m = re.match(rf"^\s*{re.escape(PACKAGE)}\s*==\s*([\w.]+)", line)
            if m:
                return m.group(1)
    return FALLBACK_VERSION


def bench_path(version: str | None = None) -> Path:
    return cache_root() / f"ik_llama-{version or pinned_version()}-native" / "bin" / "llama-bench"


def _run(cmd: list[str], log: Path) -> None:
    with log.open("a") as f:
        f.write(f"\n$ {' '.join(cmd)}\n")
        f.flush()
        rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT).returncode
    if rc != 0:
        tail = "\n".join(log.read_text().splitlines()[-25:])
        raise RuntimeError(f"building ik_llama.cpp failed at `{' '.join(cmd[:3])} ...` (exit {rc}); "
                           f"the whole log is {log}. Its tail:\n{tail}")  # fmt: skip


def fetch_sdist(package: str, version: str, scratch: Path, vendored: str, log: Path) -> Path:
    """Downloads ``package==version``'s source distribution into ``scratch`` (emptied first; ``log`` too), unpacks
    it there and returns its ``vendor/<vendored>`` folder (the C++ project the Python package wraps)."""
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir()
    log.write_text("")
    _run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", package,
          f"{package}=={version}", "-d", str(scratch)], log)  # fmt: skip
    (sdist,) = scratch.glob("*.tar.gz")
    with tarfile.open(sdist) as t:
        t.extractall(scratch, filter="data")
    (src,) = scratch.glob(f"*/vendor/{vendored}")
    return src


def _cmake(tools: Path, log: Path) -> str:
    found = shutil.which("cmake")
    if found:
        return found
    exe = tools / "bin" / "cmake"
    if not exe.exists():
        print("ik_llama.cpp: installing cmake from PyPI into the peer folder ...", file=sys.stderr, flush=True)
        _run([sys.executable, "-m", "pip", "install", "-q", "--target", str(tools / "site"), "cmake"], log)
        # The wheel's console script needs its package on the path; call its data folder's binary directly.
        binaries = list((tools / "site").glob("cmake/data/bin/cmake"))
        if not binaries:
            raise RuntimeError(f"pip installed cmake into {tools / 'site'} but no cmake binary is there")
        exe.parent.mkdir(parents=True, exist_ok=True)
        exe.symlink_to(binaries[0])
    return str(exe)


def build_into(cmake: str, src: Path, args: list[str], targets: Sequence[str], scratch: Path, final: Path, log: Path,
               what: str) -> None:
    """Configures ``src`` with ``args`` and builds ``targets`` in ``scratch/build``, copies their binaries into
    ``scratch/bin``, drops the build tree, then puts ``scratch`` in place of ``final`` (only after all succeeded;
    ``what`` names the project in errors)."""
    build = scratch / "build"
    _run([cmake, "-S", str(src), "-B", str(build), *args], log)
    jobs = str(os.cpu_count() or 2)
    _run([cmake, "--build", str(build), "--target", *targets, "-j", jobs], log)
    (scratch / "bin").mkdir()
    for t in targets:
        binary = next(build.glob(f"bin/{t}"), None)
        if binary is None:
            raise RuntimeError(f"the {what} build finished but made no bin/{t} under {build}; log {log}")
        shutil.copy2(binary, scratch / "bin" / t)
    shutil.rmtree(build)
    shutil.rmtree(final, ignore_errors=True)
    scratch.rename(final)


def cli(ensure: Callable[[], object], doc: str, argv: list[str] | None = None) -> int:
    """A peer build module's command line (no options; ``--help`` shows ``doc``'s first line): prints what
    ``ensure()`` returns, building it first when needed."""
    argparse.ArgumentParser(description=doc.splitlines()[0]).parse_args(argv)
    print(ensure())
    return 0


def ensure_ik_llama_bench(version: str | None = None) -> str:
    """Path of ik_llama.cpp's llama-bench for this host, built on first use (see the module doc)."""
    version = version or pinned_version()
    out = bench_path(version)
    if out.exists():
        return str(out)
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    final = out.parents[1]
    scratch = root / f".ik_llama-{version}-building"
    log = root / f"ik_llama-{version}-native.build.log"
    print(f"ik_llama.cpp {version}: building llama-bench for this CPU (about 15 minutes; log {log}) ...",
          file=sys.stderr, flush=True)  # fmt: skip
    src = fetch_sdist(PACKAGE, version, scratch, "ik_llama.cpp", log)
    (src / "common" / "cmake").mkdir(exist_ok=True)
    (src / "common" / "cmake" / "build-info-gen-cpp.cmake").write_text(BUILD_INFO_SCRIPT)
    build_into(_cmake(root / "tools", log), src, CMAKE_ARGS, ["llama-bench"], scratch, final, log, "ik_llama.cpp")
    return str(out)


if __name__ == "__main__":
    raise SystemExit(cli(ensure_ik_llama_bench, __doc__))
