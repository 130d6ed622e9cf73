"""Helpers shared by the benchmarks: interleaved timing with medians, the machine's STREAM-triad
bandwidth (measured in the same process), and writing results as JSON + a markdown table."""

from __future__ import annotations

import datetime
import json
import os
import platform
import statistics
import subprocess
import time
from collections.abc import Callable

import torch


def time_call(fn: Callable[[], object], min_seconds: float = 0.02) -> float:
    """Seconds per call of fn, averaged over a batch of calls lasting at least min_seconds."""
    n, t0 = 0, time.perf_counter()
    while True:
        fn()
        n += 1
        dt = time.perf_counter() - t0
        if dt >= min_seconds:
            return dt / n


def interleaved(fns: dict[str, Callable[[], object]], rounds: int = 7, min_seconds: float = 0.02) -> dict[str, float]:
    """Median seconds per call of each fn, timing them in turn round after round (so drift in clock
    speed or noise from the other core hits every contender alike)."""
    for fn in fns.values():  # warm-up: caches, packing, lazy init
        fn()
    samples: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(rounds):
        for k, fn in fns.items():
            samples[k].append(time_call(fn, min_seconds))
    return {k: statistics.median(v) for k, v in samples.items()}


def stream_triad_gbs(n: int = 32 * 1024 * 1024, rounds: int = 9) -> float:
    """STREAM triad a = b + s*c on float32 arrays far larger than the caches, with torch's threads.
    Bytes counted as STREAM does: 3 arrays x 4 bytes per element."""
    b, c, a = torch.rand(n), torch.rand(n), torch.empty(n)
    t = interleaved({"triad": lambda: torch.add(b, c, alpha=3.0, out=a)}, rounds=rounds, min_seconds=0.2)["triad"]
    return 3 * 4 * n / t / 1e9


def machine() -> str:
    model = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    threads = torch.get_num_threads()
    py = platform.python_version()
    return f"{model}, {os.cpu_count()} cores, torch {torch.__version__} ({threads} threads), Python {py}"


def save(name: str, payload: dict) -> str:
    payload = dict(payload, date=datetime.date.today().isoformat(), machine=machine())
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", f"{name}.json")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump(payload, f, indent=1)
    return path


def table(headers: list[str], rows: list[list[object]]) -> str:
    def fmt(v: object) -> str:
        return f"{v:.3g}" if isinstance(v, float) and abs(v) < 100 else (f"{v:.0f}" if isinstance(v, float) else str(v))

    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(fmt(v) for v in r) + " |" for r in rows]
    return "\n".join(lines)


def rust_example(name: str, *args: str) -> str:
    """Builds the kernels crate's example ``rust/examples/NAME.rs`` (release) and runs it with ``args``; its
    output is echoed line by line as it comes and returned."""
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    cargo = ["cargo", "build", "--release", "-q", "-p", "kwker-kernels", "--example", name]
    subprocess.run(cargo, cwd=root, check=True)
    exe = os.path.join(root, "target", "release", "examples", name)
    lines = []
    with subprocess.Popen([exe, *args], stdout=subprocess.PIPE, text=True) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            print(line, end="", flush=True)
            lines.append(line)
    if proc.returncode:
        raise RuntimeError(f"{exe} exited with {proc.returncode}")
    return "".join(lines)


# The Austen novels the benchmarks and published quality numbers read: not part of the project (a clone has no
# ../shared), so each benchmark that reads them takes the folder as --texts DIR (default: where developers keep it).
DEFAULT_TEXTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared", "data", "text")


def add_texts_arg(parser: object) -> None:
    parser.add_argument("--texts", default=DEFAULT_TEXTS, metavar="DIR",  # type: ignore[attr-defined]
                        help="folder of plain-text novels to read prompts from (default ../shared/data/text)")


def texts_dir(path: str) -> str:
    """``path`` if it holds *.txt files; else SystemExit naming --texts (benchmarks need real English text)."""
    if not os.path.isdir(path) or not any(n.endswith(".txt") for n in os.listdir(path)):
        raise SystemExit(f"no text folder at {os.path.normpath(path)}: this benchmark reads plain-text novels "
                         "(the Austen texts of ../shared/data/text); pass a folder of *.txt files with --texts DIR")
    return path
