"""The families' bars, interleaved in one run: KwkDecoder against llama.cpp on random-initialised models of the
real shapes of Qwen3-0.6B, Gemma 3 1B and Phi-4-mini, and against a Llama-shaped twin of each.

Per model: KwkDecoder ``preserve`` and ``int4`` from the bf16 weights; llama.cpp BF16 (its own
``convert_hf_to_gguf.py`` from the pinned sdist converting the same weights; ``kwker_torch.peer.convert``) and
Q4_0 (llama.cpp's quantizer from that BF16 file); and KwkDecoder ``preserve`` on a Llama-shaped random model
of the same size (same widths, heads, layers and vocabulary, tied) whose decode GB/s the family's must match
within 10 %. Each round times pp512 (one 512-token batch from an empty context) and tg128 (128 single-token
steps after one warm-up token), llama-bench's definitions, 2 threads, and measures the STREAM triad; medians
over ``--rounds``. The random models carry the real SmolLM2's tokenizer (the converter pads it to the
family's vocabulary).

Bars (issue 16): preserve tg >= 1.0x llama.cpp BF16; int4 pp >= 1.5x Q4_0; int4 tg and bits per weight
beside Q4_0's; decode GB/s within 10 % of the Llama twin's.

Run: ``python benchmarks/bench_families.py [--rounds 3] [--models ...] [--phi-layers 16]``. Results:
``benchmarks/results/families.json``. Files are cached under the peer cache (``~/.cache/kwker/peers``).
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import time
from typing import Any

import torch
from bench_decoder import cpu_flags, kwk_pp, kwk_tg, say, start
from bench_quant import gguf_bits
from common import save, stream_triad_gbs, table

from kwker_torch import KwkDecoder
from kwker_torch.decoder import families
from kwker_torch.peer.build import cache_root
from kwker_torch.peer.convert import convert_hf, save_for_converter
from kwker_torch.peer.gguf_export import quantize
from kwker_torch.peer.llama_cpp import LlamaCppWorker
from kwker_torch.testing import load_smollm2, random_model

MODELS = ["Qwen3-0.6B", "Gemma-3-1B", "Phi-4-mini"]
HEADERS = ["model", "contender", "bits/weight", "MB/token", "pp512 tok/s", "tg128 tok/s", "GB/s", "GB/s / triad",
           "tg vs BF16", "pp vs Q4_0", "tg vs Q4_0", "GB/s vs Llama twin"]  # fmt: skip
BARS = ["model", "preserve tg / BF16 (>= 1.0)", "int4 pp / Q4_0 (>= 1.5)", "int4 tg / Q4_0", "int4 / Q4_0 bits",
        "preserve GB/s / twin (>= 0.9)", "int4 GB/s / twin"]  # fmt: skip


def twin_of(model: torch.nn.Module) -> torch.nn.Module:
    """A Llama-shaped random model of the same size: same widths, heads, layers and vocabulary, tied."""
    r = families.read(model)[1]
    return random_model(
        "Llama-3.2-1B", torch.bfloat16, num_hidden_layers=r["layers"], hidden_size=r["hidden"],
        intermediate_size=r["intermediate"], num_attention_heads=r["heads"], num_key_value_heads=r["kv_heads"],
        head_dim=r["head_dim"], vocab_size=r["vocab"], tie_word_embeddings=True, bos_token_id=1, eos_token_id=2,
    )  # fmt: skip


def files(name: str, model: torch.nn.Module, layers: int | None, kind: str) -> dict[str, str]:
    """llama.cpp BF16 (converted by llama.cpp) and Q4_0 (quantized by llama.cpp) of ``model`` (cached)."""
    tag = f"{name}-random-seed0" + (f"-{layers}L" if layers else "")
    root = os.path.join(cache_root(), "families")
    folder, bf16, q4 = (os.path.join(root, f"{tag}{s}") for s in ("-hf", ".BF16.gguf", ".Q4_0.gguf"))
    if not os.path.exists(bf16):
        say(f"  saving {tag} and converting it with llama.cpp's convert_hf_to_gguf.py ...")
        save_for_converter(model, load_smollm2(torch.bfloat16)[1], folder)
        convert_hf(folder, bf16, "bf16")
    if not os.path.exists(q4):
        say("  quantizing Q4_0 with llama.cpp ...")
        quantize(bf16, q4, "Q4_0", kind=kind)
    return {"BF16": bf16, "Q4_0": q4}


def bench(name: str, rounds: int, layers: int | None, kind: str, rows: list, bars: list) -> None:
    model = random_model(name, torch.bfloat16, num_hidden_layers=layers)
    label = f"{name} (random init{f', {layers} of its layers' if layers else ''})"
    say(f"\n== {label}")
    paths = files(name, model, layers, kind)
    decs = {p: KwkDecoder.from_hf(model, precision=p, max_context=1024) for p in ("preserve", "int4")}
    twin = twin_of(model)
    del model
    gc.collect()
    decs["twin"] = KwkDecoder.from_hf(twin, max_context=1024)
    del twin
    gc.collect()
    workers = {ft: LlamaCppWorker(kind) for ft in paths}
    try:
        info = {ft: w.load(paths[ft], n_ctx=1024, n_batch=512) for ft, w in workers.items()}
        order = ["preserve", "int4", "BF16", "Q4_0", "twin"]
        t: dict[str, dict[str, list[float]]] = {c: {"pp": [], "tg": []} for c in order}
        triads: list[float] = []
        for r in range(rounds + 1):  # round 0 warms up
            if r:
                triads.append(stream_triad_gbs(rounds=3))
            for c in order:
                time.sleep(0.2)  # let the other contenders' spinning threads settle
                if c in decs:
                    pp = kwk_pp(decs[c]) if c != "twin" else float("nan")
                    tg = kwk_tg(decs[c])
                else:
                    pp, tg = workers[c].pp(512), workers[c].tg(128)
                if r:
                    t[c]["pp"].append(512 / pp)
                    t[c]["tg"].append(128 / tg)
            if r:
                say(f"  round {r}: " + ", ".join(f"{c} pp {t[c]['pp'][-1]:.0f} tg {t[c]['tg'][-1]:.1f}" for c in order))
        triad = statistics.median(triads)
        say(f"  triad during the rounds: {', '.join(f'{x:.1f}' for x in triads)} GB/s")
        med = {c: {k: statistics.median(v) for k, v in d.items()} for c, d in t.items()}
        size: dict[str, tuple[float, float]] = {}
        for c in order:
            if c in decs:
                size[c] = (decs[c].info["bits_per_weight"], decs[c].info["weight_bytes_per_token"] / 1e6)
            else:
                size[c] = gguf_bits(paths[c])
        gbs = {c: size[c][1] * 1e6 * med[c]["tg"] / 1e9 for c in order}
        desc = {"preserve": "KwkDecoder preserve", "int4": "KwkDecoder int4", "BF16": "llama.cpp BF16",
                "Q4_0": "llama.cpp Q4_0", "twin": "KwkDecoder preserve, Llama twin"}  # fmt: skip
        for c in order:
            rows.append([label, desc[c], size[c][0], size[c][1], med[c]["pp"], med[c]["tg"], gbs[c], gbs[c] / triad,
                         med[c]["tg"] / med["BF16"]["tg"], med[c]["pp"] / med["Q4_0"]["pp"],
                         med[c]["tg"] / med["Q4_0"]["tg"], gbs[c] / gbs["twin"]])  # fmt: skip
        bars.append([label, med["preserve"]["tg"] / med["BF16"]["tg"], med["int4"]["pp"] / med["Q4_0"]["pp"],
                     med["int4"]["tg"] / med["Q4_0"]["tg"], size["int4"][0] / size["Q4_0"][0],
                     gbs["preserve"] / gbs["twin"], gbs["int4"] / gbs["twin"]])  # fmt: skip
        say(table(HEADERS, rows[-len(order) :]))
        say(table(BARS, bars[-1:]))
        say(f"  llama.cpp: {info['BF16'].get('system_info', '').strip()}")
    finally:
        for w in workers.values():
            w.close()
    del decs
    gc.collect()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--models", nargs="+", default=MODELS, choices=MODELS)
    p.add_argument("--phi-layers", type=int, default=16,
                   help="Phi-4-mini's layers (of 32): its bf16 weights, the decoders and llama.cpp's files must share "
                        "24 GB of memory")  # fmt: skip
    a = p.parse_args()
    triad = start("native")
    rows: list[Any] = []
    bars: list[Any] = []
    for name in a.models:
        bench(name, a.rounds, a.phi_layers if name == "Phi-4-mini" else None, "native", rows, bars)
    say("\n" + table(HEADERS, rows))
    say("\n" + table(BARS, bars))
    end = stream_triad_gbs()
    say(f"\nSTREAM triad at the end {end:.1f} GB/s")
    out = {"triad_gbs": triad, "triad_gbs_end": end, "rounds": a.rounds, "cpu_flags": cpu_flags(), "rows": rows,
           "headers": HEADERS, "bars": bars, "bars_headers": BARS, "phi_layers": a.phi_layers}  # fmt: skip
    say(f"saved {save('families', out)}")


if __name__ == "__main__":
    main()
