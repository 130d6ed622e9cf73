"""Mixtures of experts against llama.cpp, interleaved in one run: random-initialised models of the real shapes
of Granite 3.1 1B-A400M (all 24 layers) and Qwen3-30B-A3B (``--qwen-layers`` of its 48: its 128 experts per
layer take 1.2 GB each in bf16, and the model, its llama.cpp files and the decoders must share 24 GiB).

Per model: KwkDecoder ``int4`` and ``int8`` (and ``preserve`` for Granite) from the bf16 weights; llama.cpp
Q4_0, Q4_K_M and Q8_0 (and BF16 for Granite): llama.cpp's own ``convert_hf_to_gguf.py`` of the pinned sdist
on the same weights (``kwker_torch.peer.convert``), quantized by llama.cpp's quantizer. Each round times
pp512 (one 512-token batch from an empty context) and tg128 (128 single-token steps after one warm-up token),
llama-bench's definitions, then 8 sequences decoding together (64-token prompts, 64 new tokens each, as
llama-batched-bench; ``kwk_batched``), 2 threads, and measures the STREAM triad; medians over ``--rounds``.
The random models carry the real SmolLM2's tokenizer padded to the family's vocabulary. A token's weight bytes
count the router and the k experts it reads (``weight_bytes_per_token``: the mean expert size times k); GB/s =
those bytes / tg128 step time.

Bars (issue 17): int4 pp >= 2x Q4_K_M and >= 1.5x Q4_0; int4 tg >= 1.3x Q4_K_M and >= 1.0x Q4_0; batched
decoding of 8 >= 1.5x llama.cpp's (int4 against Q4_0, int8 against Q8_0; the server's own figure is
bench_serve.py's).

Run: ``python benchmarks/bench_moe.py [--rounds 3] [--models ...] [--qwen-layers 4]``. Results:
``benchmarks/results/moe.json``. Files are cached under the peer cache (``~/.cache/kwker/peers/moe``).
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import time
from typing import Any

import torch
from bench_decoder import cpu_flags, kwk_batched, kwk_pp, kwk_tg, say, start
from common import save, stream_triad_gbs, table

from kwker_torch import KwkDecoder
from kwker_torch.peer.build import cache_root
from kwker_torch.peer.convert import convert_hf, save_for_converter
from kwker_torch.peer.gguf_export import quantize
from kwker_torch.peer.llama_cpp import LlamaCppWorker
from kwker_torch.testing import load_smollm2, random_model

MODELS = ["Granite-3.1-1B-A400M", "Qwen3-30B-A3B"]
SEQS, PROMPT, GEN = 8, 64, 64
HEADERS = ["model", "contender", "bits/weight (active)", "MB/token", "pp512 tok/s", "tg128 tok/s", "GB/s",
           "GB/s / triad", "8 seqs tok/s"]  # fmt: skip
BARS = ["model", "int4 pp / Q4_K_M (>= 2)", "int4 pp / Q4_0 (>= 1.5)", "int4 tg / Q4_K_M (>= 1.3)",
        "int4 tg / Q4_0 (>= 1.0)", "int4 8 seqs / Q4_0 (>= 1.5)", "int8 8 seqs / Q8_0 (>= 1.5)",
        "int8 pp / Q8_0", "int8 tg / Q8_0", "preserve tg / BF16"]  # fmt: skip


def active_gguf(path: str) -> tuple[float, float]:
    """(bits per active weight, MB a token reads) of a GGUF of a mixture, counted as KwkDecoder counts them: the
    expert tensors (``*_exps``) at k / experts of their size, the embedding in the bits but not in the bytes read
    unless it is also the output matrix."""
    import gguf

    r = gguf.GGUFReader(path)
    field = {f.name: f for f in r.fields.values()}
    arch = bytes(field["general.architecture"].parts[-1]).decode()
    share = int(field[f"{arch}.expert_used_count"].parts[-1][0]) / int(field[f"{arch}.expert_count"].parts[-1][0])
    mats = [t for t in r.tensors if len(t.shape) > 1]
    tied = not any(t.name == "output.weight" for t in mats)
    bits = weights = read = 0.0
    for t in mats:
        part = share if "_exps" in t.name else 1.0
        bits += 8.0 * int(t.n_bytes) * part
        weights += int(t.n_elements) * part
        if t.name != "token_embd.weight" or tied:
            read += int(t.n_bytes) * part
    return bits / weights, read / 1e6


def files(name: str, model: torch.nn.Module, layers: int | None, kinds: list[str]) -> dict[str, str]:
    """llama.cpp's BF16 conversion of ``model`` and its quantizations ``kinds`` (cached)."""
    tag = f"{name}-random-seed0" + (f"-{layers}L" if layers else "")
    root = os.path.join(cache_root(), "moe")
    folder, bf16 = os.path.join(root, f"{tag}-hf"), os.path.join(root, f"{tag}.BF16.gguf")
    if not os.path.exists(bf16):
        say(f"  saving {tag} and converting it with llama.cpp's convert_hf_to_gguf.py ...")
        save_for_converter(model, load_smollm2(torch.bfloat16)[1], folder)
        convert_hf(folder, bf16, "bf16")
    out = {"BF16": bf16}
    for k in kinds:
        path = os.path.join(root, f"{tag}.{k}.gguf")
        if not os.path.exists(path):
            say(f"  quantizing {k} with llama.cpp ...")
            quantize(bf16, path, k, kind="native")
        out[k] = path
    return out


def bench(name: str, rounds: int, layers: int | None, rows: list, bars: list) -> None:
    model = random_model(name, torch.bfloat16, num_hidden_layers=layers)
    label = f"{name} (random init{f', {layers} of its layers' if layers else ''})"
    say(f"\n== {label}")
    with_bf16 = layers is None  # the full-precision pair only where memory allows
    paths = files(name, model, layers, ["Q8_0", "Q4_0", "Q4_K_M"])
    if not with_bf16:
        paths.pop("BF16")
    precisions = ["int4", "int8"] + (["preserve"] if with_bf16 else [])
    decs: dict[str, KwkDecoder] = {}
    for p in precisions:
        decs[p] = KwkDecoder.from_hf(model, precision=p, max_batch=SEQS, max_context=1024)
        gc.collect()
    del model
    gc.collect()
    order = precisions + list(paths)
    t: dict[str, dict[str, list[float]]] = {c: {"pp": [], "tg": [], "b8": []} for c in order}
    triads: list[float] = []
    workers: dict[str, LlamaCppWorker] = {}
    try:
        for ft in paths:
            workers[ft] = LlamaCppWorker("native")
            workers[ft].load(paths[ft], n_ctx=512 * SEQS, n_batch=512, n_seq_max=SEQS)  # 512 per sequence
        for r in range(rounds + 1):  # round 0 warms up
            if r:
                triads.append(stream_triad_gbs(rounds=3))
            for c in order:
                time.sleep(0.2)  # let the other contenders' spinning threads settle
                if c in decs:
                    pp, tg = kwk_pp(decs[c]), kwk_tg(decs[c])
                    b8 = SEQS * GEN / kwk_batched(decs[c], SEQS, PROMPT, GEN)
                else:
                    pp, tg = workers[c].pp(512), workers[c].tg(128)
                    b8 = workers[c].batched(SEQS, PROMPT, GEN)["gen_tok_s"]
                if r:
                    t[c]["pp"].append(512 / pp)
                    t[c]["tg"].append(128 / tg)
                    t[c]["b8"].append(b8)
            if r:
                say(f"  round {r}: " + ", ".join(
                    f"{c} pp {t[c]['pp'][-1]:.0f} tg {t[c]['tg'][-1]:.1f} b8 {t[c]['b8'][-1]:.0f}" for c in order))
        say(f"  triad during the rounds: {', '.join(f'{x:.1f}' for x in triads)} GB/s")
        triad = statistics.median(triads)
        med = {c: {k: statistics.median(v) for k, v in d.items()} for c, d in t.items()}
        size: dict[str, tuple[float, float]] = {}
        for c in order:
            if c in decs:
                size[c] = (decs[c].info["bits_per_weight"], decs[c].info["weight_bytes_per_token"] / 1e6)
            else:
                size[c] = active_gguf(paths[c])
        desc = {"preserve": "KwkDecoder preserve", "int4": "KwkDecoder int4", "int8": "KwkDecoder int8"}
        for c in order:
            gbs = size[c][1] * 1e6 * med[c]["tg"] / 1e9
            rows.append([label, desc.get(c, f"llama.cpp {c}"), size[c][0], size[c][1], med[c]["pp"], med[c]["tg"],
                         gbs, gbs / triad, med[c]["b8"]])  # fmt: skip
        m = med
        bars.append([label, m["int4"]["pp"] / m["Q4_K_M"]["pp"], m["int4"]["pp"] / m["Q4_0"]["pp"],
                     m["int4"]["tg"] / m["Q4_K_M"]["tg"], m["int4"]["tg"] / m["Q4_0"]["tg"],
                     m["int4"]["b8"] / m["Q4_0"]["b8"], m["int8"]["b8"] / m["Q8_0"]["b8"],
                     m["int8"]["pp"] / m["Q8_0"]["pp"], m["int8"]["tg"] / m["Q8_0"]["tg"],
                     m["preserve"]["tg"] / m["BF16"]["tg"] if with_bf16 else float("nan")])  # fmt: skip
        say(table(HEADERS, rows[-len(order) :]))
        say(table(BARS, bars[-1:]))
        info = next(iter(workers.values())).info or {}
        say(f"  llama.cpp: {info.get('system_info', '').strip()}")
    finally:
        for w in workers.values():
            w.close()
    del decs
    gc.collect()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--models", nargs="+", default=MODELS, choices=MODELS)
    p.add_argument("--qwen-layers", type=int, default=4,
                   help="Qwen3-30B-A3B's layers (of 48): its bf16 weights, the decoders and llama.cpp's files must "
                        "share 24 GB of memory")  # fmt: skip
    a = p.parse_args()
    triad = start("native")
    rows: list[Any] = []
    bars: list[Any] = []
    for name in a.models:
        bench(name, a.rounds, a.qwen_layers if name.startswith("Qwen3") else None, rows, bars)
    say("\n" + table(HEADERS, rows))
    say("\n" + table(BARS, bars))
    end = stream_triad_gbs()
    say(f"\nSTREAM triad at the end {end:.1f} GB/s")
    out = {"triad_gbs": triad, "triad_gbs_end": end, "rounds": a.rounds, "cpu_flags": cpu_flags(), "rows": rows,
           "headers": HEADERS, "bars": bars, "bars_headers": BARS, "qwen_layers": a.qwen_layers}  # fmt: skip
    say(f"saved {save('moe', out)}")


if __name__ == "__main__":
    main()
