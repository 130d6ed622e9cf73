"""The decoder's own thread pool against torch's intra-op pool (``KWKER_DECODER_POOL=torch``, read at every
step), quiet and with a busy loop pinned to one core: tg128 and pp512 of KwkDecoder on the real SmolLM2-135M
(bf16), both pools in one process, alternated round after round.

Run: ``python benchmarks/bench_pool.py [--rounds 5]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

import torch
from common import machine, table

from kwker_torch import KwkDecoder
from kwker_torch.testing import load_smollm2


def busy() -> subprocess.Popen:
    cpu = str((os.cpu_count() or 2) - 1)
    p = subprocess.Popen(["taskset", "-c", cpu, sys.executable, "-c", "while True: pass"])
    time.sleep(0.3)
    return p


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5)
    a = p.parse_args()
    torch.set_num_threads(2)
    print(machine(), flush=True)
    dec = KwkDecoder.from_hf(load_smollm2(torch.bfloat16)[0], max_context=1024)
    ids = torch.randint(100, 20000, (512,), generator=torch.Generator().manual_seed(0))

    def tg() -> float:
        dec.reset(0)
        t0 = time.perf_counter()
        for _ in range(128):
            dec.step([(0, [1])])
        return (time.perf_counter() - t0) / 128 * 1e3

    def pp() -> float:
        dec.reset(0)
        t0 = time.perf_counter()
        dec.step([(0, ids)])
        return 512 / (time.perf_counter() - t0)

    tests: dict[str, Callable[[], float]] = {"tg": tg, "pp": pp}
    res: dict[tuple[str, bool, str], list[float]] = {}
    for r in range(a.rounds + 1):
        for loaded in (False, True):
            loop = busy() if loaded else None
            try:
                for pool in ("kwker", "torch"):
                    if pool == "torch":
                        os.environ["KWKER_DECODER_POOL"] = "torch"
                    else:
                        os.environ.pop("KWKER_DECODER_POOL", None)
                    for name, fn in tests.items():
                        v = fn()
                        if r:
                            res.setdefault((pool, loaded, name), []).append(v)
            finally:
                os.environ.pop("KWKER_DECODER_POOL", None)
                if loop is not None:
                    loop.kill()
                    loop.wait()
        if r:
            print(f"round {r}: " + ", ".join(f"{k[0]}{' busy' if k[1] else ''} tg {v[-1]:.2f} ms"
                                              for k, v in res.items() if k[2] == "tg"), flush=True)  # fmt: skip
    m = {k: statistics.median(v) for k, v in res.items()}
    rows = [
        [pool, m[(pool, False, "tg")], m[(pool, True, "tg")], m[(pool, True, "tg")] / m[(pool, False, "tg")],
         m[(pool, False, "pp")], m[(pool, True, "pp")]]
        for pool in ("kwker", "torch")
    ]  # fmt: skip
    print(table(["pool", "tg ms/token quiet", "tg busy", "slow-down", "pp512 tok/s quiet", "pp512 busy"], rows))


if __name__ == "__main__":
    main()
