"""Parent-side handle on a llama.cpp peer running in its own subprocess (``worker.py``).

``LlamaCppWorker(kind="native", threads=2)`` builds the llama.cpp ``kind`` on first use
(``build.ensure_llama_cpp``), starts the worker on it and talks to it one JSON line at a time. It is a
context manager; ``close()`` stops the worker (also at exit). Methods:

- ``load(gguf_path, n_ctx=4096, n_batch=512, n_seq_max=1)`` -> dict: n_vocab, n_ctx, model desc/size/params,
  ``system_info`` (``llama_print_system_info()``) and the build's flags. Keywords ``flash_attn``
  ("auto" as llama-bench, "on", "off"), ``kv_type`` ("f16" as llama-bench, "f32", "q8_0", ...; K and V alike)
  and ``kv_unified`` pass through to the context; ``flash_attn_log`` holds llama.cpp's own lines about flash
  attention from that load (what it resolved "auto" to). ``worker.info`` keeps the dict of the last load.
- ``logits(ids)`` -> float32 ndarray [len(ids), n_vocab]: a fresh sequence, every position's logits,
  decoded in n_batch chunks; the array travels through a .npy file in /dev/shm (deleted after reading).
- ``pp(n_tokens=512)`` / ``tg(n_tokens=128)`` -> seconds, timed as llama-bench's pp/tg tests (see
  ``worker.py``: warm-up as llama-bench, memory cleared, a persistent threadpool). ``depth=d``: after d tokens
  of context (llama-bench ``-d``), those of the last ``fill(ids)`` with ``len(ids) == d`` (cut back to them),
  else d random tokens decoded untimed; ``tokens=``: the tokens to time instead of random ones.
- ``fill(ids)`` -> seconds: the context cleared and ``ids`` decoded in n_batch chunks, for pp/tg at that depth.
- ``batched(n_seq, n_prompt, n_gen)`` -> dict of prompt_s, gen_s, gen_tok_s (summed over sequences), as
  llama-batched-bench; load with ``n_seq_max >= n_seq`` and ``n_ctx >= n_seq * (n_prompt + n_gen)``.
- ``generate_greedy(ids, n_new)`` -> exactly n_new argmax tokens (``stop_at_eog=True`` stops at an
  end-of-generation token, inclusive).
- ``tokenize(text)``, ``quantize(src, dst, ftype)``, ``system_info()``.

An error inside the worker comes back as ``LlamaCppError`` carrying the worker's message (and the last
llama.cpp warnings); a worker that died raises ``LlamaCppError`` with the tail of its stderr.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import weakref
from typing import Any

import numpy as np

from .build import ensure_llama_cpp

WORKER_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "worker.py")


class LlamaCppError(RuntimeError):
    """An error reported by (or about) a llama.cpp worker process."""


class LlamaCppWorker:
    """One llama.cpp build in one subprocess; see the module docstring for the methods."""

    def __init__(self, kind: str = "native", threads: int = 2, lib_dir: str | None = None) -> None:
        self.kind = kind
        self.threads = threads
        self.lib_dir = lib_dir or ensure_llama_cpp(kind)
        self.info: dict[str, Any] | None = None
        self._stderr = tempfile.TemporaryFile(mode="w+b", prefix="kwker-peer-stderr-")
        env = dict(os.environ)
        env.pop("PYTHONPATH", None)  # the worker sees only the build folder and the standard library/site
        self._proc: subprocess.Popen[str] | None = subprocess.Popen(
            [sys.executable, WORKER_SCRIPT, "--lib-dir", self.lib_dir, "--threads", str(threads)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr, text=True, bufsize=1, env=env,
        )
        self._finalizer = weakref.finalize(self, _stop, self._proc)  # also runs at interpreter exit
        self._read_reply("start")

    # ----- plumbing -----
    def _stderr_tail(self, n: int = 25) -> str:
        try:
            self._stderr.seek(0)
            text = self._stderr.read().decode("utf-8", "replace")
        except (OSError, ValueError):
            return ""
        lines = [ln for ln in text.splitlines() if ln.strip()]
        return "\n".join(lines[-n:])

    def _died(self, op: str) -> LlamaCppError:
        rc = self._proc.poll() if self._proc else None
        tail = self._stderr_tail()
        self._proc = None
        return LlamaCppError(
            f"kwker peer: the llama.cpp worker ({self.kind}, {self.lib_dir}) died during {op!r}"
            f" (exit code {rc}).\nIts last output:\n{tail or '(none)'}\n"
            "If the build is broken, delete that folder and run `python -m kwker_torch.peer.build "
            f"--kind {self.kind}`."
        )

    def _read_reply(self, op: str) -> Any:
        assert self._proc is not None and self._proc.stdout is not None
        line = self._proc.stdout.readline()
        if not line:
            self._proc.wait(timeout=10)
            raise self._died(op)
        reply = json.loads(line)
        if not reply.get("ok"):
            raise LlamaCppError(f"kwker peer ({self.kind}) {op}: {reply.get('error')}")
        return reply["result"]

    def _call(self, op: str, **args: Any) -> Any:
        if self._proc is None:
            raise LlamaCppError(f"kwker peer: the llama.cpp worker is closed; cannot run {op!r}")
        assert self._proc.stdin is not None
        try:
            self._proc.stdin.write(json.dumps({"op": op, "args": args}) + "\n")
            self._proc.stdin.flush()
        except BrokenPipeError:
            raise self._died(op) from None
        return self._read_reply(op)

    # ----- API -----
    def load(self, gguf_path: str, n_ctx: int = 4096, n_batch: int = 512, n_seq_max: int = 1,
             *, flash_attn: str = "auto", kv_type: str = "f16", kv_unified: bool = False) -> dict[str, Any]:
        """Loads a GGUF model (replacing any loaded one); returns what llama.cpp reports about it."""
        self.info = self._call("load", gguf_path=os.path.abspath(gguf_path), n_ctx=n_ctx, n_batch=n_batch,
                               n_seq_max=n_seq_max, flash_attn=flash_attn, kv_type=kv_type, kv_unified=kv_unified)
        return self.info

    def logits(self, ids: list[int]) -> np.ndarray:
        """float32 [len(ids), n_vocab]: logits of every position of a fresh sequence."""
        path = self._call("logits", ids=[int(t) for t in ids])["npy"]
        try:
            return np.load(path)
        finally:
            os.unlink(path)

    def pp(self, n_tokens: int = 512, warmup: bool = True, *, depth: int = 0, tokens: list[int] | None = None) -> float:
        """Seconds for one n_tokens prompt, timed as llama-bench's ppN (tok/s = n_tokens / seconds); ``depth``:
        after that many tokens of context (``-d``, the fill untimed); ``tokens``: these instead of random ones."""
        toks = None if tokens is None else [int(t) for t in tokens]
        return float(self._call("pp", n_tokens=n_tokens, warmup=warmup, depth=depth, tokens=toks))

    def tg(self, n_tokens: int = 128, warmup: bool = True, *, depth: int = 0, tokens: list[int] | None = None) -> float:
        """Seconds for n_tokens single-token decodes, timed as llama-bench's tgN; ``depth``, ``tokens`` as pp."""
        toks = None if tokens is None else [int(t) for t in tokens]
        return float(self._call("tg", n_tokens=n_tokens, warmup=warmup, depth=depth, tokens=toks))

    def fill(self, ids: list[int]) -> float:
        """Clears the context and decodes ``ids`` (untimed by pp/tg): later ``pp``/``tg`` with
        ``depth=len(ids)`` run after them. Returns the seconds the fill took."""
        return float(self._call("fill", ids=[int(t) for t in ids]))

    def batched(self, n_seq: int, n_prompt: int, n_gen: int) -> dict[str, Any]:
        """n_seq sequences: prompts in one batch, then n_gen one-token-per-sequence steps (batched-bench)."""
        return self._call("batched", n_seq=n_seq, n_prompt=n_prompt, n_gen=n_gen)

    def generate_greedy(self, ids: list[int], n_new: int, stop_at_eog: bool = False) -> list[int]:
        """The n_new argmax tokens after ids (a fresh sequence)."""
        return list(self._call("generate_greedy", ids=[int(t) for t in ids], n_new=n_new, stop_at_eog=stop_at_eog))

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        """llama.cpp's tokenization of text with the loaded model's vocabulary."""
        return list(self._call("tokenize", text=text, add_special=add_special, parse_special=parse_special))

    def quantize(self, src: str, dst: str, ftype: str, requantize: bool = False) -> dict[str, Any]:
        """llama_model_quantize(src -> dst) to ftype ("Q8_0", "Q4_0", "Q4_K_M", ...); no model needs loading.
        ``requantize``: allow a quantized source (its tensors dequantized, then quantized to ftype)."""
        return self._call(
            "quantize", src=os.path.abspath(src), dst=os.path.abspath(dst), ftype=ftype, requantize=requantize
        )

    def system_info(self) -> str:
        """llama_print_system_info() of this build."""
        return str(self._call("system_info"))

    def close(self) -> None:
        """Stops the worker; safe to call twice."""
        proc, self._proc = self._proc, None
        if proc is not None:
            try:
                assert proc.stdin is not None
                proc.stdin.write(json.dumps({"op": "close", "args": {}}) + "\n")
                proc.stdin.flush()
                proc.wait(timeout=30)
            except (OSError, subprocess.TimeoutExpired):
                pass
            _stop(proc)
        self._finalizer.detach()
        self._stderr.close()

    def __enter__(self) -> LlamaCppWorker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._proc is None else f"pid {self._proc.pid}"
        return f"LlamaCppWorker(kind={self.kind!r}, threads={self.threads}, {state})"


def _stop(proc: subprocess.Popen[str]) -> None:
    """Ends a worker process (this handle's own child) if it still runs."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    for stream in (proc.stdin, proc.stdout):
        try:
            if stream is not None:
                stream.close()
        except OSError:
            pass
