"""Prompt lookup, a draft model and the prompt cache on the real SmolLM2-135M, interleaved in one run.

1. Prompt lookup (``KwkDecoder.generate``, greedy, 128 new tokens, no stop token, prompt reading included):
   four prompts that quote their input (summarize, rewrite, extract, edit code) and two that do not (free
   stories), at preserve / int8 / int4; plain (``prompt_lookup=0``) and lookup timed alternately per round;
   the text must be identical. Beside them llama.cpp's plain greedy rate on the same prompts (BF16 / Q8_0 /
   Q4_0 GGUFs of the same weights; llama-cpp-python's low-level API has no prompt lookup to drive).
2. Draft model: SmolLM2-135M preserve with its own int4 conversion drafting (random-initialised larger
   configs accept nothing, so the acceptance-sensitive speed-up is measured this way), same prompts; the
   target as the bf16 checkpoint and as the float32 weights (the draft is 2.2x / 4.4x cheaper per step).
3. Hugging Face's ``generate(prompt_lookup_num_tokens=8)`` under ``decode.install()`` (bf16 model, greedy, 128
   new tokens with ``min_new_tokens`` so every run does the same work), same prompts: plain ``generate()``, HF's
   own candidate generator (``PromptLookupCandidateGenerator``, unhooked) and the adaptive one installed models
   use (``kwker_torch/decoder/hf_lookup.py``), timed alternately per round; the text must be identical.
4. Prompt cache: a chat with a 1,024-token system prompt (Austen text), 64-token user messages and
   32-token answers; time to first token of turns 2-5 with the cache and with ``prompt_cache=False``.

Run: ``python benchmarks/bench_speculative.py [--rounds 3] [--precisions preserve int8 int4] [--sections lookup
draft hf cache] [--out speculative]``. Results: ``benchmarks/results/speculative.json`` (or ``--out``).
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import time
from typing import Any

import torch
from bench_decoder import ggufs, load, say, start
from bench_quant import peer_ggufs
from common import DEFAULT_TEXTS, add_texts_arg, save, table, texts_dir

from kwker_torch import KwkDecoder
from kwker_torch.peer.llama_cpp import LlamaCppWorker
from kwker_torch.testing import load_smollm2

TEXT_DIR = DEFAULT_TEXTS  # set from --texts in main()
PEER_OF = {"preserve": "BF16", "int8": "Q8_0", "int4": "Q4_0"}
CODE = '''def moving_average(values, window):
    result = []
    for i in range(len(values)):
        start = max(0, i - window + 1)
        chunk = values[start:i + 1]
        result.append(sum(chunk) / len(chunk))
    return result


def normalise(values):
    low = min(values)
    high = max(values)
    return [(v - low) / (high - low) for v in values]
'''


def passage(name: str, start: str, words: int) -> str:
    with open(os.path.join(TEXT_DIR, name), encoding="utf-8") as f:
        text = f.read()
    return " ".join(text[text.index(start) :].split()[:words])


def prompts() -> dict[str, tuple[str, bool]]:
    """name -> (user message, quotes its input)."""
    p1 = passage("persuasion.txt", "Sir Walter Elliot", 180)
    p2 = passage("prideprejudice.txt", "It is a truth universally", 160)
    p3 = passage("northangerabbey.txt", "No one who had ever seen Catherine", 170)
    return {
        "summarize": (f"Summarize this passage, quoting its key sentences:\n\n{p1}", True),
        "rewrite": (f"Rewrite this passage with every sentence on its own line:\n\n{p2}", True),
        "extract": (f"List every sentence of this passage that mentions a person:\n\n{p3}", True),
        "edit code": (f"Add type hints and a docstring to each function, keeping the code:\n\n{CODE}", True),
        "story 1": ("Write a short story about a lighthouse keeper who finds a message in a bottle.", False),
        "story 2": ("Write a story about a girl who builds a kite that can fly to the moon.", False),
    }


def ids_of(tok: Any, text: str | list[dict[str, str]]) -> torch.Tensor:
    from kwker_torch.testing import chat_ids

    return chat_ids(tok, text)[0]


def timed(fn: Any) -> tuple[float, Any]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def geomean(xs: list[float]) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def lookup_section(decs: dict[str, KwkDecoder], tok: Any, rounds: int, rows: list, peers: dict) -> None:
    ps = prompts()
    for prec, dec in decs.items():
        say(f"\n== prompt lookup, {prec}")
        worker = peers.get(prec)
        for name, (text, quotes) in ps.items():
            ids = ids_of(tok, text)
            t: dict[str, list[float]] = {"plain": [], "lookup": [], "llama.cpp": []}
            out: dict[str, Any] = {}
            for r in range(rounds + 1):
                for mode in t:
                    if mode == "llama.cpp":
                        if worker is None:
                            continue
                        s, o = timed(lambda: worker.generate_greedy(ids.tolist(), 128))
                    else:
                        k = 0 if mode == "plain" else 8
                        s, o = timed(lambda k=k: dec.generate(ids, 128, stop_tokens=[], prompt_lookup=k,
                                                              prompt_cache=False))  # fmt: skip
                    out[mode] = o
                    if r:
                        t[mode].append(s)
            same = out["plain"].tokens == out["lookup"].tokens
            c = out["lookup"]
            med = {m: statistics.median(v) for m, v in t.items() if v}
            peer = 128 / med["llama.cpp"] if "llama.cpp" in med else float("nan")
            speedup = med["plain"] / med["lookup"]
            rows.append([prec, name, "quotes" if quotes else "free", len(ids), 128 / med["plain"],
                         128 / med["lookup"], speedup, f"{c.accepted}/{c.drafted}", same, peer])  # fmt: skip
            say(table(LOOKUP_HEADERS, rows[-1:]))
            if not same:
                say("  TEXT DIFFERS: " + repr(tok.decode(c.tokens)[:200]))


def hf_section(tok: Any, rounds: int, rows: list) -> None:
    """HF generate() under install: plain, HF's own prompt lookup, the adaptive one."""
    from kwker_torch import decode
    from kwker_torch.decoder import hf_lookup
    from kwker_torch.testing import generate_greedy

    model = load_smollm2(torch.bfloat16)[0]
    decode.install(model, max_batch=2, max_context=2048, prompt_cache=False)
    say("\n== Hugging Face generate(prompt_lookup_num_tokens=8) under decode.install(), preserve")
    modes = ["plain", "hf lookup", "adaptive"]
    try:
        for name, (text, quotes) in prompts().items():
            ids = ids_of(tok, text)[None]
            t: dict[str, list[float]] = {m: [] for m in modes}
            out: dict[str, Any] = {}
            kept = ""
            for r in range(rounds + 1):
                for mode in modes:
                    kw = {} if mode == "plain" else {"prompt_lookup_num_tokens": 8}
                    if mode == "hf lookup":
                        hf_lookup.unhook(model)  # HF's own PromptLookupCandidateGenerator
                    s, o = timed(lambda kw=kw: generate_greedy(model, ids, 128, exact=True, **kw))
                    if mode == "hf lookup":
                        hf_lookup.hook(model, lambda g: setattr(model._kwker_decode, "lookup", g))
                    if mode == "adaptive":
                        lk = model._kwker_decode.lookup
                        kept = f"{lk.kept}/{lk.proposed}"
                    out[mode] = o[0, ids.shape[1] :].tolist()
                    if r:
                        t[mode].append(s)
            med = {m: statistics.median(v) for m, v in t.items()}
            same = out["plain"] == out["hf lookup"] == out["adaptive"]
            rows.append([name, "quotes" if quotes else "free", ids.shape[1], 128 / med["plain"],
                         128 / med["hf lookup"], 128 / med["adaptive"], med["plain"] / med["hf lookup"],
                         med["plain"] / med["adaptive"], kept, same])  # fmt: skip
            say(table(HF_HEADERS, rows[-1:]))
    finally:
        decode.uninstall(model)


HF_HEADERS = ["prompt", "kind", "prompt tokens", "plain tok/s", "HF lookup tok/s", "adaptive tok/s",
              "HF lookup vs plain", "adaptive vs plain", "kept/proposed", "same text"]  # fmt: skip
LOOKUP_HEADERS = ["precision", "prompt", "kind", "prompt tokens", "plain tok/s", "lookup tok/s", "speed-up",
                  "accepted/drafted", "same text", "llama.cpp plain tok/s"]  # fmt: skip
DRAFT_HEADERS = ["target (preserve)", "draft", "prompt", "plain tok/s", "drafted tok/s", "speed-up", "accepted/drafted",
                 "same text"]  # fmt: skip
CACHE_HEADERS = ["turn", "prompt tokens", "cached tokens", "TTFT cached ms", "TTFT fresh ms", "speed-up", "same answer"]


def draft_section(label: str, target: KwkDecoder, draft: KwkDecoder, tok: Any, rounds: int, rows: list,
                  only: tuple[str, ...] = ()) -> None:  # fmt: skip
    say(f"\n== draft model: {label}, drafted by SmolLM2-135M int4")
    for name, (text, _) in prompts().items():
        if only and name not in only:
            continue
        ids = ids_of(tok, text)
        t: dict[str, list[float]] = {"plain": [], "draft": []}
        out: dict[str, Any] = {}
        for r in range(rounds + 1):
            s, out["plain"] = timed(lambda: target.generate(ids, 128, stop_tokens=[], prompt_lookup=0,
                                                            prompt_cache=False))  # fmt: skip
            if r:
                t["plain"].append(s)
            s, out["draft"] = timed(lambda: target.generate(ids, 128, stop_tokens=[], draft=draft, prompt_cache=False))
            if r:
                t["draft"].append(s)
        med = {m: statistics.median(v) for m, v in t.items()}
        c = out["draft"]
        same = out["plain"].tokens == c.tokens
        rows.append([label, "SmolLM2-135M int4", name, 128 / med["plain"], 128 / med["draft"],
                     med["plain"] / med["draft"], f"{c.accepted}/{c.drafted}", same])  # fmt: skip
        say(table(DRAFT_HEADERS, rows[-1:]))


def chat(tok: Any, msgs: list[dict[str, str]]) -> list[int]:
    ids = tok.apply_chat_template(msgs, add_generation_prompt=msgs[-1]["role"] == "user", tokenize=True)
    return list(ids if isinstance(ids, list) else ids["input_ids"])


def cache_section(dec: KwkDecoder, tok: Any, rounds: int, rows: list) -> None:
    say("\n== prompt cache: 1,024-token system prompt, 64-token user turns, 32-token answers")
    words = passage("mansfieldpark.txt", "About thirty years ago", 2000).split()
    overhead = len(chat(tok, [{"role": "system", "content": ""}]))
    system = tok.decode(tok(" ".join(words[:900]))["input_ids"][: 1024 - overhead])
    msgs: list[dict[str, str]] = [{"role": "system", "content": system}]
    say(f"  system prompt: {len(chat(tok, msgs))} tokens")
    prev: list[int] = []
    for turn in range(1, 6):
        user_ids = tok(" ".join(words[900 + 50 * turn : 950 + 50 * turn]))["input_ids"]
        msgs.append({"role": "user", "content": tok.decode(user_ids[: 64 - 5])})  # + the template's 5 tokens
        ids = ids_of(tok, msgs)
        ttft: dict[str, list[float]] = {"cached": [], "fresh": []}
        res: dict[str, Any] = {}
        for _ in range(rounds if turn > 1 else 1):
            for mode in ("fresh", "cached"):
                dec.reset(0)
                if mode == "cached" and prev:  # the slot as the previous turn left it
                    dec.step([(0, prev)], logits="none")
                seen: list[float] = []
                t0 = time.perf_counter()
                res[mode] = dec.generate(ids, 32, stop_tokens=[], slots=[0], prompt_cache=mode == "cached",
                                         callback=lambda i, tk: seen.append(time.perf_counter()) and None)  # fmt: skip
                ttft[mode].append(seen[0] - t0)
        answer = res["cached"].tokens
        prev = ids.tolist() + answer[:-1]
        msgs.append({"role": "assistant", "content": tok.decode(answer)})
        if turn > 1:
            f, c = statistics.median(ttft["fresh"]), statistics.median(ttft["cached"])
            rows.append([turn, len(ids), res["cached"].cached, 1e3 * c, 1e3 * f, f / c,
                         answer == res["fresh"].tokens])  # fmt: skip
            say(table(CACHE_HEADERS, rows[-1:]))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--precisions", nargs="+", default=["preserve", "int8", "int4"])
    p.add_argument("--sections", nargs="+", default=["lookup", "draft", "hf", "cache"])
    p.add_argument("--out", default="speculative", help="results/OUT.json")
    p.add_argument("--no-peer", action="store_true", help="skip llama.cpp's plain rate")
    add_texts_arg(p)
    a = p.parse_args()
    global TEXT_DIR
    TEXT_DIR = texts_dir(a.texts)
    triad = start("native")
    model, tok = load_smollm2(torch.bfloat16)
    decs = {pr: KwkDecoder.from_hf(model, precision=pr, max_batch=2, max_context=2048) for pr in a.precisions}
    result: dict[str, Any] = {"triad_gbs": triad, "rounds": a.rounds}
    peers: dict[str, LlamaCppWorker] = {}
    if "lookup" in a.sections and not a.no_peer:
        bench_model, _ = load("SmolLM2-135M")
        paths = {"BF16": ggufs("SmolLM2-135M", bench_model)["bf16"]}
        paths.update(peer_ggufs("SmolLM2-135M", bench_model, "native"))
        for pr in a.precisions:
            w = LlamaCppWorker("native")
            w.load(paths[PEER_OF[pr]], n_ctx=2048, n_batch=512)
            peers[pr] = w
    try:
        if "lookup" in a.sections:
            rows: list = []
            lookup_section(decs, tok, a.rounds, rows, peers)
            say("\n" + table(LOOKUP_HEADERS, rows))
            for pr in a.precisions:
                q = [r[6] for r in rows if r[0] == pr and r[2] == "quotes"]
                f = [r[6] for r in rows if r[0] == pr and r[2] == "free"]
                say(f"  {pr}: geometric mean speed-up, quoting prompts {geomean(q):.2f}x; stories {geomean(f):.2f}x")
            result["lookup"] = {"headers": LOOKUP_HEADERS, "rows": rows}
            save(a.out, result)  # each section as it ends
    finally:
        for w in peers.values():
            w.close()
    if "draft" in a.sections:
        # Two targets: the bf16 checkpoint (preserve stores bf16) and the same model as the float32 weights
        # the GGUF dequantizes to (not bf16-exact, so preserve keeps float32: twice the bytes per step).
        target = decs.get("preserve") or KwkDecoder.from_hf(model, max_batch=2, max_context=2048)
        draft = decs.get("int4") or KwkDecoder.from_hf(model, precision="int4", max_batch=2, max_context=2048)
        f32 = KwkDecoder.from_hf(load_smollm2(torch.float32)[0], max_batch=2, max_context=2048)
        rows = []
        labels = ["SmolLM2-135M bf16", "SmolLM2-135M float32"]
        for label, tgt in zip(labels, (target, f32), strict=True):
            draft_section(label, tgt, draft, tok, a.rounds, rows)
        del f32
        # A random-initialised 1.7B accepts nothing: what drafting costs when it never pays.
        big = KwkDecoder.from_hf(load("SmolLM2-1.7B")[0], max_batch=1, max_context=2048)
        labels.append("SmolLM2-1.7B bf16 (random init)")
        draft_section(labels[-1], big, draft, tok, 1, rows, only=("summarize", "story 1"))
        del big
        say("\n" + table(DRAFT_HEADERS, rows))
        for label in labels:
            say(f"  {label}: geometric mean speed-up {geomean([r[5] for r in rows if r[0] == label]):.2f}x")
        result["draft"] = {"headers": DRAFT_HEADERS, "rows": rows}
        save(a.out, result)
    if "hf" in a.sections:
        rows = []
        hf_section(tok, a.rounds, rows)
        say("\n" + table(HF_HEADERS, rows))
        for kind in ("quotes", "free"):
            say(f"  {kind}: geometric mean vs plain, HF lookup {geomean([r[6] for r in rows if r[1] == kind]):.2f}x, "
                f"adaptive {geomean([r[7] for r in rows if r[1] == kind]):.2f}x")
        result["hf"] = {"headers": HF_HEADERS, "rows": rows}
        save(a.out, result)
    if "cache" in a.sections:
        rows = []
        cache_section(decs[a.precisions[0]], tok, a.rounds, rows)
        say("\n" + table(CACHE_HEADERS, rows))
        result["cache"] = {"headers": CACHE_HEADERS, "rows": rows, "precision": a.precisions[0]}
    say(f"saved {save(a.out, result)}")


if __name__ == "__main__":
    main()
