"""The machine's own multiply-add peak per instruction (``vpmaddubsw`` and ``vpmaddubsw + vpaddw`` on AVX2,
``vpdpbusd`` on AVX-VNNI and AVX-512 VNNI, ``vfmadd231ps`` on ymm / zmm), on 1 thread and on every thread, so a
GEMM's multiply-adds per second can be put beside what the CPU can issue (its share of the peak).

Run: ``python benchmarks/bench_peak.py [--seconds 0.3]`` (builds and runs the Rust example
``rust/examples/dot_peak.rs``: inline assembly, 10-12 independent registers per instruction; tiers this CPU lacks
are skipped). Output is printed; nothing is saved.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
from bench_decoder import cpu_flags, say  # noqa: E402
from common import machine, rust_example  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=0.3, help="length of each measurement")
    a = p.parse_args()
    say(machine())
    say(f"CPU flags: {cpu_flags()}")
    rust_example("dot_peak", str(a.seconds))


if __name__ == "__main__":
    main()
