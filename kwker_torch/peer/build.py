"""Builds PyPI ``llama-cpp-python`` from source for this host into a private folder, once.

Contract: ``ensure_llama_cpp(kind)`` returns a folder holding an importable ``llama_cpp`` package (put it
first on ``sys.path``, in a process of its own: two builds cannot be imported into one process). The
folder is ``$KWKER_PEER_CACHE`` (default ``~/.cache/kwker/peers``) ``/llama-cpp-python-<version>-<kind>``,
with the version pinned in ``benchmarks/requirements-peers.txt``. The first call builds it (4-5
minutes on 2 Zen 4 cores, up to 10 on slower ones) with ``pip install --no-cache-dir --no-binary
llama-cpp-python --no-deps --target ...`` under ``CMAKE_ARGS`` chosen by ``kind``:

- ``native``: ``-DGGML_NATIVE=ON`` (``-march=native``: every instruction set this CPU has), except on CPUs with
  AMX: there it lists this CPU's instruction sets one by one with AMX off, because llama.cpp 0.3.35's AMX
  int8 path segfaults in its first Q4_0 prompt batch (seen on the 2-core Xeon VM, 2026-12-02; upstream
  llama.cpp #20824, closed unfixed), so a native build could not be timed on quantized prompts at all;
- ``avx2``: AVX2 + FMA + F16C + BMI2 only (AVX-512, AVX-VNNI and AMX off), to time an AVX2-only deployment.

Option names were checked against ``ggml/CMakeLists.txt`` of the llama.cpp inside the 0.3.35 sdist
(AMX is ``GGML_AMX_TILE/INT8/BF16`` there). The multimodal library (``LLAVA_BUILD``) is skipped; tools,
examples and tests are off. The build happens in a scratch folder that is renamed into place and marked
only after pip succeeded, so a half-built folder is never used; a failed build raises ``RuntimeError``
with the tail of its log (the whole log is kept next to the folder). Packages ``llama_cpp`` imports that
this interpreter lacks (numpy, typing-extensions, diskcache, jinja2) are installed into the same folder.

CLI: ``python -m kwker_torch.peer.build [--kind native avx2]``.
"""

from __future__ import annotations

import argparse
import fcntl
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

PACKAGE = "llama-cpp-python"
REQUIREMENTS = Path(__file__).resolve().parents[2] / "benchmarks" / "requirements-peers.txt"
FALLBACK_VERSION = "0.3.35"
MARKER = ".kwker-peer-ok.json"

_COMMON_ARGS = [
    "-DLLAVA_BUILD=OFF",  # llama-cpp-python's multimodal (mtmd) library: not imported by llama_cpp itself
    "-DLLAMA_BUILD_TOOLS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_SERVER=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_CURL=OFF",
]
KINDS: dict[str, list[str]] = {
    "native": ["-DGGML_NATIVE=ON"],
    "avx2": [
        "-DGGML_NATIVE=OFF",
        "-DGGML_SSE42=ON",
        "-DGGML_AVX=ON",
        "-DGGML_AVX2=ON",
        "-DGGML_FMA=ON",
        "-DGGML_F16C=ON",
        "-DGGML_BMI2=ON",
        "-DGGML_AVX_VNNI=OFF",
        "-DGGML_AVX512=OFF",
        "-DGGML_AVX512_VBMI=OFF",
        "-DGGML_AVX512_VNNI=OFF",
        "-DGGML_AVX512_BF16=OFF",
        "-DGGML_AMX_TILE=OFF",
        "-DGGML_AMX_INT8=OFF",
        "-DGGML_AMX_BF16=OFF",
    ],
}
# What llama_cpp imports at run time (its pyproject's dependencies), as pip requirement specs.
RUNTIME_DEPS = {
    "numpy": "numpy>=1.20.0",
    "typing_extensions": "typing-extensions>=4.5.0",
    "diskcache": "diskcache>=5.6.1",
    "jinja2": "jinja2>=2.11.3",
}


def pinned_version() -> str:
    """The llama-cpp-python version pinned in benchmarks/requirements-peers.txt."""
    if REQUIREMENTS.exists():
        for line in REQUIREMENTS.read_text().splitlines():
            m = re.match(r"\s*llama[-_]cpp[-_]python\s*==\s*([\w.]+)", line, re.IGNORECASE)
            if m:
                return m.group(1)
    return FALLBACK_VERSION


def cpu_flags() -> set[str]:
    """This CPU's feature flags as /proc/cpuinfo names them (empty where it cannot be read)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


# ggml's per-ISA options and the /proc/cpuinfo flag each needs (used for "native" on AMX hosts).
_ISA_OPTIONS = [("GGML_SSE42", "sse4_2"), ("GGML_AVX", "avx"), ("GGML_AVX2", "avx2"), ("GGML_FMA", "fma"),
                ("GGML_F16C", "f16c"), ("GGML_BMI2", "bmi2"), ("GGML_AVX_VNNI", "avx_vnni"),
                ("GGML_AVX512", "avx512f"), ("GGML_AVX512_VBMI", "avx512vbmi"),
                ("GGML_AVX512_VNNI", "avx512_vnni"), ("GGML_AVX512_BF16", "avx512_bf16")]  # fmt: skip


def _native_without_amx(flags: set[str]) -> list[str]:
    on = [f"-D{opt}={'ON' if flag in flags else 'OFF'}" for opt, flag in _ISA_OPTIONS]
    return ["-DGGML_NATIVE=OFF", *on, "-DGGML_AMX_TILE=OFF", "-DGGML_AMX_INT8=OFF", "-DGGML_AMX_BF16=OFF"]


def cmake_args(kind: str) -> str:
    """The CMAKE_ARGS of a build kind (``native`` depends on this CPU: see the module's docstring)."""
    if kind not in KINDS:
        raise ValueError(f"kwker peer: unknown llama.cpp build kind {kind!r}; use one of {sorted(KINDS)}")
    args = KINDS[kind]
    if kind == "native" and "amx_int8" in cpu_flags():
        args = _native_without_amx(cpu_flags())
    return " ".join(args + _COMMON_ARGS)


def cache_root() -> Path:
    return Path(os.environ.get("KWKER_PEER_CACHE", "~/.cache/kwker/peers")).expanduser()


def peer_dir(kind: str, version: str | None = None) -> Path:
    """Where the build of ``kind`` lives (whether or not it is built yet)."""
    return cache_root() / f"{PACKAGE}-{version or pinned_version()}-{kind}"


def is_built(kind: str) -> bool:
    """Built, and with this kind's flags (a build with other flags, such as AMX on, is built again)."""
    folder = peer_dir(kind)
    if not ((folder / MARKER).exists() and (folder / "llama_cpp" / "__init__.py").exists()):
        return False
    try:
        return json.loads((folder / MARKER).read_text()).get("cmake_args") == cmake_args(kind)
    except (OSError, ValueError):
        return False


def _missing_runtime_deps() -> list[str]:
    return [spec for mod, spec in RUNTIME_DEPS.items() if importlib.util.find_spec(mod) is None]


def _tail(path: Path, n: int = 25) -> str:
    """The first compiler/cmake errors of a build log (with a few lines of context) and its last lines."""
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    marks = re.compile(r"CMake Error|error:|Error \d|fatal error|undefined reference|No space left")
    first = next((i for i, ln in enumerate(lines) if marks.search(ln) and "subprocess-exited" not in ln), None)
    cut = len(lines) - n  # where the tail starts
    head = lines[first:min(first + 15, cut)] + ["  [...]"] if first is not None and first < cut else []
    return "\n".join(head + lines[-n:])


def _run_pip(cmd: list[str], env: dict[str, str], log_path: Path) -> int:
    """Runs pip with its output in ``log_path``, printing a progress line every 30 s."""
    start = time.monotonic()
    last_print = start
    step = re.compile(r"\[(\d+)/(\d+)\]")
    phase = "starting pip"
    with open(log_path, "w") as log:
        log.write("$ " + " ".join(cmd) + f"\nCMAKE_ARGS={env.get('CMAKE_ARGS', '')}\n\n")
        log.flush()
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert proc.stdout is not None
        for line in proc.stdout:
            log.write(line)
            m = step.search(line)
            if m:
                phase = f"compiling {m.group(1)}/{m.group(2)}"
            elif "Installing build dependencies" in line:
                phase = "installing build dependencies (scikit-build-core, cmake, ninja)"
            elif "-- Configuring done" in line or "Configuring incomplete" in line:
                phase = "cmake configure done"
            elif "Building wheel" in line and not m:
                phase = "building the wheel (cmake configure + compile)"
            elif "Installing collected packages" in line:
                phase = "installing"
            now = time.monotonic()
            if now - last_print >= 30:
                print(f"  ... {now - start:4.0f} s: {phase}", flush=True)
                last_print = now
        return proc.wait()


def ensure_llama_cpp(kind: str = "native") -> str:
    """Folder with an importable ``llama_cpp`` built for this host as ``kind``; builds it on first use."""
    flags = cmake_args(kind)
    version = pinned_version()
    folder = peer_dir(kind, version)
    if is_built(kind):
        return str(folder)
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    with open(root / f".{folder.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process may be building the same kind: wait for it
        if is_built(kind):
            return str(folder)
        scratch = root / f".{folder.name}.partial-{os.getpid()}"
        shutil.rmtree(scratch, ignore_errors=True)
        log_path = root / f"{folder.name}.build.log"
        deps = _missing_runtime_deps()
        cmd = [sys.executable, "-m", "pip", "install", "-v", "--disable-pip-version-check", "--no-input",
               "--no-cache-dir",  # pip's wheel cache would hand one kind's build to another kind
               "--no-binary", PACKAGE, "--no-deps", "--target", str(scratch), f"{PACKAGE}=={version}", *deps]
        env = dict(os.environ, CMAKE_ARGS=flags)
        env.setdefault("CMAKE_BUILD_PARALLEL_LEVEL", str(os.cpu_count() or 2))
        env.pop("FORCE_CMAKE", None)
        print(f"kwker peer: building {PACKAGE}=={version} ({kind}) from source into {folder}", flush=True)
        print(f"  CMAKE_ARGS={flags}", flush=True)
        if deps:
            print(f"  also installing missing runtime dependencies: {' '.join(deps)}", flush=True)
        print(f"  this takes 4-10 minutes on 2 cores; log: {log_path}", flush=True)
        start = time.monotonic()
        rc = _run_pip(cmd, env, log_path)
        elapsed = time.monotonic() - start
        if rc != 0 or not (scratch / "llama_cpp" / "__init__.py").exists():
            shutil.rmtree(scratch, ignore_errors=True)
            raise RuntimeError(
                f"kwker peer: building {PACKAGE}=={version} ({kind}) failed after {elapsed:.0f} s (pip exit {rc}).\n"
                f"First errors and last lines of {log_path}:\n{_tail(log_path)}\n"
                "Fix the cause shown above (a compiler, cmake flags, network to PyPI) and run "
                f"`python -m kwker_torch.peer.build --kind {kind}` again."
            )
        shutil.rmtree(folder, ignore_errors=True)  # an unmarked leftover of an interrupted run
        scratch.rename(folder)
        info = {"package": PACKAGE, "version": version, "kind": kind, "cmake_args": flags,
                "python": sys.version.split()[0], "build_seconds": round(elapsed, 1),
                "built_at": time.strftime("%Y-%m-%d %H:%M:%S"), "extra_deps": deps}
        (folder / MARKER).write_text(json.dumps(info, indent=1) + "\n")
        print(f"kwker peer: built {kind} in {elapsed / 60:.1f} min -> {folder}", flush=True)
    return str(folder)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Build llama-cpp-python for this host (benchmark peer).")
    ap.add_argument("--kind", nargs="+", default=["native"], choices=sorted(KINDS), help="build kinds")
    args = ap.parse_args(argv)
    for kind in args.kind:
        was_built = is_built(kind)
        folder = ensure_llama_cpp(kind)
        print(f"{kind}: {'already built' if was_built else 'ready'}: {folder}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
