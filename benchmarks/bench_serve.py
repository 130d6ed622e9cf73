"""The OpenAI-compatible server (``python -m kwker_torch.serve``) under load, against llama.cpp, in one run.

Sections (``--sections``, default all):
  ``throughput``  8 concurrent requests, 64-token prompts + 64 new tokens (greedy, ``ignore_eos``, servers with
             ``--prompt-lookup`` from this script's flag, default 0), summed
             generated tokens/s from the first request sent to the last token received; against the same 8
             requests one at a time on our server, and llama.cpp's batched decoding of 8 sequences x (64 + 64)
             at the same bits (``batched``: llama-batched-bench's protocol, prompt time included), interleaved
             round by round, per precision (preserve vs BF16, int8 vs Q8_0, int4 vs Q4_0).
  ``ttft``   time to first token of a second chat turn on the warm slot (its first turn cached) against the
             same conversation sent cold (no slot holds it).
  ``steps``  what bounds ``throughput``: the decoder's own step times, in this process, no HTTP: a decode step
             of 1 and of 8 sequences (logits of every row) and the 8 x 64-token prompts read in one step, and the
             concurrent / one-at-a-time ratio they allow: (8 x (64-token prompt + 64 x t1)) / (8 prompts + 64 x t8).
  ``lookup`` one request at a time, greedy, 128 tokens: a chat asking to repeat a passage of Austen (quoting)
             and a free story, on a server with ``--prompt-lookup 8`` (the default) and one with 0, interleaved;
             tokens/s of each and whether the texts are equal.
  ``load``   ``--clients`` (64) concurrent streaming chat clients in a loop for ``--seconds`` (120) and at least
             ``--requests`` (10,000) requests: every response checked (finish_reason, [DONE], usage equal to the
             tokens streamed, and the same text every time a prompt repeats: greedy, int8, whose rows do not
             depend on the batch); p50/p99 time to first token; the server's resident memory at the start and end.
Servers are started as subprocesses on 127.0.0.1 (one per precision, all loaded up front, idle when not
measured); clients are asyncio + httpx in this process. The model is the real SmolLM2-135M-Instruct.

Run: ``python benchmarks/bench_serve.py [--rounds 3] [--sections throughput ttft load]``. Results go to
``benchmarks/results/serve.json``; tables are printed as they are measured. ``--model FOLDER --peer-prefix PREFIX
--out NAME`` runs the throughput section on another model (e.g. the Granite 3.1 1B-A400M folder and llama.cpp files
``bench_moe.py`` leaves under the peer cache).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_decoder import cpu_flags, say  # noqa: E402
from common import DEFAULT_TEXTS, add_texts_arg, machine, save, stream_triad_gbs, table, texts_dir  # noqa: E402

from kwker_torch.serve.background import free_port  # noqa: E402

MODEL = "SmolLM2-135M-Instruct"
SECTIONS = ["throughput", "steps", "lookup", "ttft", "load"]
PEER_FORMAT = {"preserve": "BF16", "int8": "Q8_0", "int4": "Q4_0"}
TEXTS = Path(DEFAULT_TEXTS)  # set from --texts in main()


class Server:
    """``python -m kwker_torch.serve`` in a child process."""

    def __init__(self, precision: str, slots: int = 8, extra: list[str] | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [sys.executable, "-m", "kwker_torch.serve", "--precision", precision, "--slots", str(slots),
               "--port", str(self.port), "--queue", "256", *(extra or [])]  # fmt: skip
        self.log = open(f"/tmp/kwker-bench-serve-{precision}-{self.port}.log", "w")  # noqa: SIM115
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + 300
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the server exited ({self.proc.returncode}); see {self.log.name}")
            try:
                health = httpx.get(self.url + "/health", timeout=1).json()
                if health.get("status") == "ok":
                    global MODEL
                    MODEL = health.get("model", MODEL)  # the name requests must carry
                    return
            except (httpx.HTTPError, ValueError):
                pass
            time.sleep(0.5)
        raise RuntimeError(f"the server did not come up in 300 s; see {self.log.name}")

    def rss_mb(self) -> float:
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS"):
                    return int(line.split()[1]) / 1024
        return float("nan")

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


def token_prompts(tok, count: int, length: int, seed: int) -> list[list[int]]:
    """``count`` prompts of exactly ``length`` tokens from real English text (distinct per seed)."""
    text = " ".join(p.read_text() for p in sorted(TEXTS.glob("*.txt")))
    ids = tok(text)["input_ids"]
    rng = random.Random(seed)
    return [ids[s : s + length] for s in (rng.randrange(0, len(ids) - length) for _ in range(count))]


async def complete(client: httpx.AsyncClient, url: str, prompt: list[int], new: int) -> int:
    r = await client.post(url + "/v1/completions", json={"model": MODEL, "prompt": prompt, "max_tokens": new,
                                                         "temperature": 0, "ignore_eos": True})  # fmt: skip
    r.raise_for_status()
    return int(r.json()["usage"]["completion_tokens"])


async def concurrent(url: str, prompts: list[list[int]], new: int) -> float:
    async with httpx.AsyncClient(timeout=600) as c:
        t0 = time.perf_counter()
        made = await asyncio.gather(*(complete(c, url, p, new) for p in prompts))
        return sum(made) / (time.perf_counter() - t0)


async def one_at_a_time(url: str, prompts: list[list[int]], new: int) -> float:
    async with httpx.AsyncClient(timeout=600) as c:
        t0 = time.perf_counter()
        made = [await complete(c, url, p, new) for p in prompts]
        return sum(made) / (time.perf_counter() - t0)


def bench_throughput(servers: dict[str, Server], tok, rounds: int, report: dict, peer_prefix: str | None) -> None:
    from kwker_torch.peer.build import cache_root
    from kwker_torch.peer.llama_cpp import LlamaCppWorker

    prefix = peer_prefix or os.path.join(cache_root(), "gguf", "bench-SmolLM2-135M-real")
    peers = {}
    for prec, fmt in PEER_FORMAT.items():
        if prec in servers:
            w = LlamaCppWorker("native", threads=2)
            w.load(f"{prefix}.{fmt}.gguf", n_ctx=8 * 128 + 256, n_batch=512, n_seq_max=8)
            peers[prec] = w
    res: dict[str, dict[str, list[float]]] = {p: {"batched": [], "single": [], "llama": []} for p in servers}
    try:
        for r in range(rounds):
            for prec, srv in servers.items():
                a = token_prompts(tok, 8, 64, seed=1000 * r + 1)  # fresh prompts: no slot holds them
                b = token_prompts(tok, 8, 64, seed=1000 * r + 2)
                res[prec]["batched"].append(asyncio.run(concurrent(srv.url, a, 64)))
                res[prec]["single"].append(asyncio.run(one_at_a_time(srv.url, b, 64)))
                out = peers[prec].batched(8, 64, 64)
                res[prec]["llama"].append(8 * 64 / (out["prompt_s"] + out["gen_s"]))
                d = {k: v[-1] for k, v in res[prec].items()}
                say(f"  round {r + 1} {prec}: 8 concurrent {d['batched']:.0f} tok/s, one at a time {d['single']:.0f}, "
                    f"llama.cpp batched {PEER_FORMAT[prec]} {d['llama']:.0f}")
    finally:
        for w in peers.values():
            w.close()
    rows = []
    for prec, d in res.items():
        m = {k: statistics.median(v) for k, v in d.items()}
        rows.append([prec, PEER_FORMAT[prec], f"{m['batched']:.0f}", f"{m['single']:.0f}", f"{m['llama']:.0f}",
                     f"{m['batched'] / m['single']:.2f}", f"{m['batched'] / m['llama']:.2f}"])  # fmt: skip
        report.setdefault("throughput", {})[prec] = {**m, "rounds": d}
    say(table(["precision", "llama.cpp", "kwker 8 concurrent tok/s", "kwker one at a time", "llama.cpp batched",
               "concurrent / one at a time", "kwker / llama.cpp"], rows))  # fmt: skip


async def first_token(client: httpx.AsyncClient, url: str, messages: list[dict], max_tokens: int = 64
                      ) -> tuple[float, str, dict]:  # fmt: skip
    """(seconds to the first content chunk, whole text, usage) of a streamed greedy chat completion."""
    body = {"model": MODEL, "messages": messages, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}  # fmt: skip
    t0 = time.perf_counter()
    ttft, parts, usage, finish, done = None, [], {}, None, False
    async with client.stream("POST", url + "/v1/chat/completions", json=body) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                done = True
                break
            obj = json.loads(line[6:])
            if "error" in obj:
                raise RuntimeError(obj["error"]["message"])
            if obj.get("usage"):
                usage = obj["usage"]
            for ch in obj.get("choices", []):
                piece = ch["delta"].get("content")
                if piece:
                    ttft = ttft if ttft is not None else time.perf_counter() - t0
                    parts.append(piece)
                if ch.get("finish_reason"):
                    finish = ch["finish_reason"]
    if not done:
        raise RuntimeError("the stream ended without [DONE]")
    return (ttft if ttft is not None else time.perf_counter() - t0), "".join(parts), {**usage, "finish_reason": finish}


def bench_ttft(srv: Server, rounds: int, report: dict) -> None:
    text = sorted(TEXTS.glob("*.txt"))[0].read_text()
    async def run(r: int) -> tuple[float, float, int, int]:  # noqa: E306
        async with httpx.AsyncClient(timeout=600) as c:
            doc = text[r * 1500 : r * 1500 + 1500]
            turn1 = [{"role": "user", "content": f"Read this and answer my questions.\n\n{doc}"}]
            _, answer, _ = await first_token(c, srv.url, turn1)
            turn2 = [*turn1, {"role": "assistant", "content": answer},
                     {"role": "user", "content": "Now summarise it in one sentence."}]  # fmt: skip
            warm, _, u_warm = await first_token(c, srv.url, turn2, 8)
            # Cold: the same second turn, with its first message changed at the start, so no slot holds it.
            cold2 = [{"role": "user", "content": "Please. " + turn1[0]["content"]}, *turn2[1:]]
            cold, _, u_cold = await first_token(c, srv.url, cold2, 8)
            return warm, cold, u_warm["prompt_tokens_details"]["cached_tokens"], u_cold["prompt_tokens"]

    warm_s, cold_s = [], []
    for r in range(rounds):
        warm, cold, cached, prompt = asyncio.run(run(r))
        warm_s.append(warm)
        cold_s.append(cold)
        say(f"  round {r + 1}: second turn of {prompt} tokens ({cached} cached): warm {warm * 1e3:.1f} ms, "
            f"cold {cold * 1e3:.1f} ms ({cold / warm:.1f}x)")
    w, c = statistics.median(warm_s), statistics.median(cold_s)
    report["ttft"] = {"warm_s": warm_s, "cold_s": cold_s, "ratio": c / w}
    say(table(["second chat turn", "warm slot ms", "cold ms", "cold / warm"], [["median", f"{w * 1e3:.1f}",
              f"{c * 1e3:.1f}", f"{c / w:.1f}"]]))  # fmt: skip


def bench_load(srv: Server, clients: int, seconds: float, requests: int, report: dict) -> None:
    system = ("You are a concise assistant. Answer every question in one short sentence, without preamble, "
              "and never ask a question back.")  # fmt: skip
    topics = ["rain", "bread", "rivers", "the moon", "bees", "salt", "clocks", "glass", "maps", "tea"]
    pool = [f"In a few words: what is {t} made of, question {k}?" for k in range(20) for t in topics]
    seen: dict[str, str] = {}
    stats = {"ok": 0, "bad": 0, "ttft": [], "mismatch": 0, "errors": [], "rss": []}

    async def client(cid: int, end: float) -> None:
        rng = random.Random(cid)
        async with httpx.AsyncClient(timeout=120) as c:
            while time.monotonic() < end or stats["ok"] + stats["bad"] < requests:
                q = rng.choice(pool)
                msgs = [{"role": "system", "content": system}, {"role": "user", "content": q}]
                try:
                    ttft, text, usage = await first_token(c, srv.url, msgs, 12)
                except Exception as e:  # noqa: BLE001  (counted: a lost or broken response)
                    stats["bad"] += 1
                    stats["errors"].append(repr(e)[:200])
                    continue
                if usage.get("finish_reason") not in ("stop", "length") or not usage.get("completion_tokens"):
                    stats["bad"] += 1
                    continue
                if seen.setdefault(q, text) != text:
                    stats["mismatch"] += 1
                stats["ok"] += 1
                stats["ttft"].append(ttft)
                if stats["ok"] % 500 == 0:  # resident memory along the run: flat, or growing per request
                    stats["rss"].append((stats["ok"], srv.rss_mb()))

    async def run() -> float:
        # Warm up (every prompt once) before measuring memory, so the start RSS holds the slots' pages.
        async with httpx.AsyncClient(timeout=120) as c:
            await asyncio.gather(*(first_token(c, srv.url, [{"role": "system", "content": system},
                                                            {"role": "user", "content": q}], 12) for q in pool[:16]))
        t0 = time.monotonic()
        await asyncio.gather(*(client(i, t0 + seconds) for i in range(clients)))
        return time.monotonic() - t0

    rss0 = srv.rss_mb()
    wall = asyncio.run(run())
    rss1 = srv.rss_mb()
    t = sorted(stats["ttft"]) or [float("nan")]
    p50, p99 = t[len(t) // 2], t[int(len(t) * 0.99)]
    n = stats["ok"] + stats["bad"]
    report["load"] = {"clients": clients, "seconds": wall, "requests": n, "ok": stats["ok"], "bad": stats["bad"],
                      "mismatch": stats["mismatch"], "ttft_p50_s": p50, "ttft_p99_s": p99, "rss_start_mb": rss0,
                      "rss_end_mb": rss1, "rss_along": stats["rss"], "errors": stats["errors"][:5]}  # fmt: skip
    say("RSS along the run (requests: MB): " + ", ".join(f"{n}: {mb:.0f}" for n, mb in stats["rss"]))
    say(table(["clients", "requests", "seconds", "lost / broken", "text differs on repeat", "TTFT p50 ms",
               "TTFT p99 ms", "RSS start MB", "RSS end MB"],
              [[clients, n, f"{wall:.0f}", stats["bad"], stats["mismatch"], f"{p50 * 1e3:.0f}", f"{p99 * 1e3:.0f}",
                f"{rss0:.0f}", f"{rss1:.0f}"]]))  # fmt: skip


def bench_lookup(rounds: int, report: dict) -> None:
    text = sorted(TEXTS.glob("*.txt"))[-1].read_text()
    servers = {"lookup 8": Server("preserve", extra=["--prompt-lookup", "8"]),
               "lookup 0": Server("preserve", extra=["--prompt-lookup", "0"])}  # fmt: skip
    res: dict[str, dict[str, list[float]]] = {}
    texts: dict[str, dict[str, str]] = {}

    async def one(url: str, messages: list[dict]) -> tuple[float, str]:
        async with httpx.AsyncClient(timeout=600) as c:
            t0 = time.perf_counter()
            r = await c.post(url + "/v1/chat/completions", json={"model": MODEL, "messages": messages,
                                                                 "max_tokens": 128, "temperature": 0})  # fmt: skip
            r.raise_for_status()
            body = r.json()
            return body["usage"]["completion_tokens"] / (time.perf_counter() - t0), body["choices"][0]["message"][
                "content"]  # fmt: skip

    try:
        for r in range(rounds):
            passage = text[20000 + 3000 * r : 20000 + 3000 * r + 700]
            subject = ["fox", "ship", "clock"][r % 3]
            prompts = {"quoting": [{"role": "user", "content": f"Repeat this passage exactly:\n\n{passage}"}],
                       "free story": [{"role": "user", "content": f"Write a short story about a {subject}."}]}
            for kind, msgs in prompts.items():
                for name, srv in servers.items():
                    rate, out = asyncio.run(one(srv.url, msgs))
                    res.setdefault(kind, {}).setdefault(name, []).append(rate)
                    texts.setdefault(f"{kind} {r}", {})[name] = out
                say(f"  round {r + 1} {kind}: " + ", ".join(f"{n} {v[-1]:.1f} tok/s" for n, v in res[kind].items()))
    finally:
        for srv in servers.values():
            srv.close()
    rows = []
    for kind, d in res.items():
        m = {n: statistics.median(v) for n, v in d.items()}
        same = all(len(set(t.values())) == 1 for k, t in texts.items() if k.startswith(kind))
        rows.append([kind, f"{m['lookup 8']:.1f}", f"{m['lookup 0']:.1f}", f"{m['lookup 8'] / m['lookup 0']:.2f}",
                     "yes" if same else "NO"])  # fmt: skip
        report.setdefault("lookup", {})[kind] = {**m, "same_text": same, "rounds": d}
    say(table(["request (alone, greedy, 128 tokens)", "--prompt-lookup 8 tok/s", "--prompt-lookup 0 tok/s",
               "ratio", "same text"], rows))  # fmt: skip


def bench_steps(precisions: list[str], rounds: int, report: dict) -> None:
    import torch

    from kwker_torch.decoder import KwkDecoder
    from kwker_torch.testing import load_smollm2

    model = load_smollm2(torch.bfloat16)[0]
    rows = []
    for prec in precisions:
        dec = KwkDecoder.from_hf(model, prec, max_batch=8, max_context=256)
        prompts = [list(range(1000 + 64 * s, 1064 + 64 * s)) for s in range(8)]
        t: dict[str, list[float]] = {"prompt1": [], "prompt8": [], "t1": [], "t8": []}
        for _ in range(rounds):
            for n in (1, 8):
                dec.reset()
                t0 = time.perf_counter()
                dec.step([(s, prompts[s]) for s in range(n)])
                t[f"prompt{n}"].append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                for i in range(64):
                    dec.step([(s, [prompts[s][i]]) for s in range(n)])
                t[f"t{n}"].append((time.perf_counter() - t0) / 64)
        m = {k: statistics.median(v) for k, v in t.items()}
        ceiling = 8 * (m["prompt1"] + 64 * m["t1"]) / (m["prompt8"] + 64 * m["t8"])
        report.setdefault("steps", {})[prec] = {**m, "ceiling": ceiling}
        rows.append([prec, f"{m['t1'] * 1e3:.2f}", f"{m['t8'] * 1e3:.2f}", f"{m['t8'] / m['t1']:.2f}",
                     f"{m['prompt1'] * 1e3:.0f}", f"{m['prompt8'] * 1e3:.0f}", f"{ceiling:.2f}"])  # fmt: skip
        del dec
    say(table(["precision", "1-row step ms", "8-row step ms", "8 / 1", "64-token prompt ms", "8 x 64 prompts ms",
               "ratio these allow"], rows))  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--sections", nargs="+", default=SECTIONS, choices=SECTIONS)
    ap.add_argument("--precisions", nargs="+", default=["preserve", "int8", "int4"])
    ap.add_argument("--prompt-lookup", type=int, default=0,
                    help="the throughput servers' --prompt-lookup (default 0: off, as issue 19's bars define it)")
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--seconds", type=float, default=120)
    ap.add_argument("--requests", type=int, default=10_000)
    ap.add_argument("--model", default=None,
                    help="a Hugging Face model folder to serve instead of the real SmolLM2 (throughput and steps "
                         "sections; e.g. the Granite 1B-A400M folder bench_moe.py saves under the peer cache)")
    ap.add_argument("--peer-prefix", default=None,
                    help="llama.cpp's files of that model: PREFIX.{BF16,Q8_0,Q4_0}.gguf")
    ap.add_argument("--out", default="serve",
                    help="results/OUT.json (sections already there and not run are kept)")  # fmt: skip
    add_texts_arg(ap)
    args = ap.parse_args()
    global TEXTS
    TEXTS = Path(texts_dir(args.texts))
    from kwker_torch.testing import load_smollm2

    say(f"{machine()}\nCPU flags: {cpu_flags()}")
    triad = stream_triad_gbs()
    say(f"STREAM triad {triad:.1f} GB/s")
    report: dict = {"machine": machine(), "flags": cpu_flags(), "triad_gbs": triad, "command": " ".join(sys.argv)}
    tok = load_smollm2()[1]
    if "throughput" in args.sections:
        extra = ["--model", args.model] if args.model else []
        extra += ["--prompt-lookup", str(args.prompt_lookup)]
        servers = {p: Server(p, extra=extra) for p in args.precisions}
        report["model"] = args.model or MODEL
        try:
            bench_throughput(servers, tok, args.rounds, report, args.peer_prefix)
        finally:
            for s in servers.values():
                s.close()
    if "steps" in args.sections:
        bench_steps(args.precisions, args.rounds, report)
    if "lookup" in args.sections:
        bench_lookup(args.rounds, report)
    if "ttft" in args.sections:
        srv = Server("preserve")
        try:
            bench_ttft(srv, args.rounds, report)
        finally:
            srv.close()
    if "load" in args.sections:
        srv = Server("int8")
        try:
            bench_load(srv, args.clients, args.seconds, args.requests, report)
        finally:
            srv.close()
    report["triad_end_gbs"] = stream_triad_gbs()
    say(f"STREAM triad at the end {report['triad_end_gbs']:.1f} GB/s")
    for name in SECTIONS:  # each section notes the run it came from; sections not run now are kept
        if name in report:
            report[name].update(command=report["command"], triad_gbs=[triad, report["triad_end_gbs"]])
    path = Path(__file__).parent / "results" / f"{args.out}.json"
    if path.exists():
        old = json.loads(path.read_text())
        report.update({k: old[k] for k in SECTIONS if k not in report and k in old})
    print(save(args.out, report))


if __name__ == "__main__":
    main()
