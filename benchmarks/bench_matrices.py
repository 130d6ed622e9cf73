"""Per-matrix decode bandwidth of each quantized format (q4k, q6k, q4, q8): one x row through copies of a
model's layer matrices totalling 384 MB (so every pass streams from memory) on the decoder's 2-thread pool,
each shape alone and the layer's four matrices in decode order, as GB/s of weight bytes; beside the STREAM
triad and a plain 2-thread read measured in the same run (this VM's bandwidth drifts within minutes).

Run: ``python benchmarks/bench_matrices.py [--model SmolLM2-360M] [--rounds 3]`` (builds and runs the Rust
example ``rust/examples/quant_stream.rs``; rounds repeat the whole table). Output is printed; nothing is saved.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
from bench_decoder import cpu_flags, say  # noqa: E402
from common import machine, rust_example, stream_triad_gbs  # noqa: E402

# hidden, intermediate, q rows, k/v rows of each model's layer (its published config).
SHAPES = {
    "SmolLM2-360M": (960, 2560, 960, 320),
    "Qwen2.5-0.5B": (896, 4864, 896, 128),
    "Qwen3-0.6B": (1024, 3072, 2048, 1024),
    "SmolLM2-1.7B": (2048, 8192, 2048, 2048),
}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", choices=list(SHAPES), default="SmolLM2-360M")
    p.add_argument("--rounds", type=int, default=3)
    a = p.parse_args()
    say(machine())
    say(f"CPU flags: {cpu_flags()}")
    say(f"{a.model}: hidden, intermediate, q rows, k/v rows = {SHAPES[a.model]}")
    for r in range(a.rounds):
        say(f"\nround {r + 1}: STREAM triad {stream_triad_gbs():.1f} GB/s")
        rust_example("quant_stream", *map(str, SHAPES[a.model]))
    say(f"\nSTREAM triad at the end {stream_triad_gbs():.1f} GB/s")


if __name__ == "__main__":
    main()
