"""Checks that the llama.cpp peer runs the same model as kwker/HF, and prints its pp512/tg128.

Exports the real SmolLM2-135M-Instruct (HF float32, dequantized from its Q4_1 GGUF) to F32 and BF16 GGUF
files in a cache folder (``$KWKER_PEER_CACHE/gguf``, default ``~/.cache/kwker/peers/gguf``), loads each
in the llama.cpp worker, and prints:
- llama.cpp's 24 greedy tokens of a chat prompt next to HF float32's (``generate_greedy``, exact length);
- the max |logit difference| between llama.cpp and HF float32 on one 64-token chunk of real text, with
  llama-bench's context settings (flash attention auto, f16 KV cache) and with exact ones (flash
  attention off, f32 KV cache);
- pp512 and tg128 (tokens/s, median of 3, each timed as llama-bench does) with llama-bench's settings.

CPU-heavy: run it alone (``flock /tmp/kwker-heavy.lock python benchmarks/check_peer.py``).
``--kind avx2`` (or both) checks another build; ``--reps`` sets the timing repetitions.
"""

from __future__ import annotations

import argparse
import glob
import os
import statistics
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from common import DEFAULT_TEXTS, add_texts_arg, texts_dir  # noqa: E402

from kwker_torch.peer.build import cache_root  # noqa: E402
from kwker_torch.peer.gguf_export import export_gguf  # noqa: E402
from kwker_torch.peer.llama_cpp import LlamaCppWorker  # noqa: E402
from kwker_torch.testing import chat_ids, generate_greedy, load_smollm2  # noqa: E402

PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle."
TEXT_DIR = DEFAULT_TEXTS  # set from --texts in main()


def text_chunk(tok: object, n: int = 64, offset: int = 1000) -> list[int]:
    files = sorted(glob.glob(os.path.join(TEXT_DIR, "*.txt")))
    if not files:
        raise FileNotFoundError(f"check_peer: no .txt files in {TEXT_DIR}")
    with open(files[0], encoding="utf-8", errors="replace") as f:
        text = f.read(200_000)
    ids = tok(text, add_special_tokens=False)["input_ids"]  # type: ignore[operator]
    print(f"text: {os.path.basename(files[0])}, tokens {offset}..{offset + n - 1}")
    return ids[offset:offset + n]


def first_divergence(a: list[int], b: list[int]) -> str:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return f"differ from token {i} ({x} vs {y})"
    return "identical" if len(a) == len(b) else f"equal prefix, lengths {len(a)} vs {len(b)}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kind", nargs="+", default=["native"], help="llama.cpp build kinds to check")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    add_texts_arg(ap)
    args = ap.parse_args()
    global TEXT_DIR
    TEXT_DIR = texts_dir(args.texts)

    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    model, tok = load_smollm2(torch.float32)
    print(f"HF SmolLM2-135M-Instruct float32 loaded in {time.perf_counter() - t0:.1f} s")
    folder = os.path.join(cache_root(), "gguf")
    paths = {}
    for dt in ("f32", "bf16"):
        path = os.path.join(folder, f"SmolLM2-135M-Instruct-from-Q4_1.{dt.upper()}.gguf")
        if not os.path.exists(path):
            t0 = time.perf_counter()
            export_gguf(model, path, dt)
            print(f"exported {path} ({os.path.getsize(path) / 2**20:.0f} MiB) in {time.perf_counter() - t0:.1f} s")
        paths[dt] = path

    ids = chat_ids(tok, PROMPT)
    hf_new = generate_greedy(model, ids, 24, exact=True)[0, ids.shape[1]:].tolist()
    chunk = text_chunk(tok)
    with torch.inference_mode():
        ref = model(torch.tensor([chunk])).logits[0].float().numpy()
    print(f"HF float32 greedy 24: {hf_new}\n  {tok.decode(hf_new)!r}")

    for kind in args.kind:
        with LlamaCppWorker(kind, threads=args.threads) as w:
            print(f"\n=== llama.cpp build {kind!r}: {w.lib_dir}")
            for dt, path in paths.items():
                info = w.load(path, n_ctx=4096, n_batch=512)
                if dt == "f32":
                    print(f"system info: {info['system_info'].strip()}")
                print(f"--- {dt.upper()}: {info['desc']}, {info['size_bytes'] / 2**20:.0f} MiB, "
                      f"{info['n_params'] / 1e6:.1f}M params, n_vocab {info['n_vocab']}")
                ll_new = w.generate_greedy(ids[0].tolist(), 24)
                print(f"llama.cpp greedy 24 (fa auto, f16 KV): {ll_new}\n  {tok.decode(ll_new)!r}")
                print(f"  vs HF float32: {first_divergence(ll_new, hf_new)}")
                lg = w.logits(chunk)
                d_default = float(np.abs(lg - ref).max())
                argmax = float((lg.argmax(-1) == ref.argmax(-1)).mean())
                w.load(path, n_ctx=4096, n_batch=512, flash_attn="off", kv_type="f32")
                lg_exact = w.logits(chunk)
                d_exact = float(np.abs(lg_exact - ref).max())
                ll_exact = w.generate_greedy(ids[0].tolist(), 24)
                print(f"max |logit diff| vs HF float32 on 64 tokens: {d_default:.4g} (fa auto, f16 KV; argmax "
                      f"agreement {argmax:.3f}), {d_exact:.4g} (fa off, f32 KV); |logits| max "
                      f"{np.abs(ref).max():.1f}")
                print(f"  greedy with fa off, f32 KV vs HF float32: {first_divergence(ll_exact, hf_new)}")
                w.load(path, n_ctx=4096, n_batch=512)  # llama-bench's settings for timing
                pp = statistics.median(w.pp(512) for _ in range(args.reps))
                tg = statistics.median(w.tg(128) for _ in range(args.reps))
                print(f"pp512 {512 / pp:7.1f} tok/s   tg128 {128 / tg:6.1f} tok/s   (median of {args.reps}, "
                      f"{args.threads} threads, fa auto, f16 KV)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
