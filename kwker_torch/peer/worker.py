"""Child process that runs one build of llama.cpp (PyPI ``llama_cpp``) for ``LlamaCppWorker``.

Run as ``python -m kwker_torch.peer.worker --lib-dir <folder>`` or, as ``LlamaCppWorker`` does (to keep
torch and kwker's own library out of this process), ``python <path>/worker.py --lib-dir <folder>``; the
folder (from ``build.ensure_llama_cpp``) goes first on ``sys.path``. Protocol: one JSON object per line,
``{"op": name, "args": {...}}`` on stdin, ``{"ok": true, "result": ...}`` or ``{"ok": false, "error":
message, "traceback": text}`` on the original stdout. Everything else (Python prints, llama.cpp's C-level
output) goes to stderr; llama.cpp's log callback keeps only the last warnings/errors, which are added
to error messages. Large arrays come back as the path of a ``.npy`` file in /dev/shm that the parent
reads and deletes.

Timing protocols (copied from the llama.cpp sources in the 0.3.35 sdist):
- ``pp``/``tg`` follow ``tools/llama-bench/llama-bench.cpp``: a persistent ggml threadpool (default
  params: poll 50) attached to the context; warm-up = one full untimed prompt run for pp, one untimed
  single-token decode for tg; then ``llama_memory_clear``, and timed: ``test_prompt`` (random tokens, the
  first one BOS if the vocabulary adds BOS, in ``llama_batch_get_one`` chunks of n_batch, so logits only
  on each chunk's last row, one ``llama_synchronize`` at the end) or ``test_gen`` (n single-token
  ``llama_batch_get_one`` decodes, ``llama_synchronize`` after each). Tokens come from a fixed seed, or are the
  caller's (``tokens=``).
- At a depth (``depth=d``, llama-bench's ``-d``): the timed test runs after d tokens of context, the fill excluded
  from the time. The context holding the tokens of the last ``fill(ids)`` (or of an untimed random fill of d
  tokens, as llama-bench's depth run, when it holds no fill of that length) is cut back to its first d tokens
  (``llama_memory_seq_rm``) before the warm-up and before the timed run; llama-bench restores a saved copy of
  the filled state instead, which holds the same cells. The warm-up runs at the depth, not on an empty
  context. ``depth=0`` is the behaviour above.
  One difference: llama-bench makes a context of n_prompt + n_gen cells per test, this uses the loaded
  one (4096 by default); attention spans the used cells padded to 256 either way (``get_n_kv``), so the
  work is the same (measured on SmolLM2-135M: tg128 equal within the VM's noise for n_ctx 128..4096).
- ``batched`` follows ``tools/batched-bench/batched-bench.cpp`` (not shared prompt, not tg-separate):
  no attached threadpool (as that tool); warm-up 16 tokens on sequence 0; memory cleared; timed: one
  batch of n_seq prompts (seq ids 0..n_seq-1, logits on each prompt's last row) decoded in n_batch-sized
  views, one synchronize; then n_gen steps, each one batch of n_seq tokens (all with logits) and a
  synchronize.
Numerics: whatever llama.cpp computes; logits are its float32 outputs, copied unchanged.
"""

from __future__ import annotations

import argparse
import collections
import ctypes
import json
import os
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from typing import Any


def _fix_sys_path(lib_dir: str) -> None:
    """Puts the build first on sys.path; drops this file's own folder (it holds a ``llama_cpp.py``)."""
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
    sys.path.insert(0, lib_dir)


FTYPES = {"F32": 0, "F16": 1, "Q4_0": 2, "Q4_1": 3, "Q8_0": 7, "Q5_0": 8, "Q5_1": 9, "Q4_K_M": 15,
          "Q5_K_M": 17, "Q6_K": 18, "BF16": 32}
FLASH_ATTN = {"auto": -1, "off": 0, "on": 1}
KV_TYPES = {"f32": 0, "f16": 1, "q8_0": 8, "bf16": 30}
_SEED = 1234


class Worker:
    """Holds one model and one context; each public method is one protocol op."""

    def __init__(self, lib_dir: str, threads: int) -> None:
        import llama_cpp as lc  # the build in lib_dir (first on sys.path)
        import numpy as np

        self.np = np
        self.lc = lc
        self.lib_dir = lib_dir
        self.threads = threads
        self.model: Any = None
        self.ctx: Any = None
        self.vocab: Any = None
        self.n_batch = 0
        self.threadpool: Any = None
        self.recent_log: collections.deque[str] = collections.deque(maxlen=30)
        self.flash_log: list[str] = []  # llama.cpp's lines about flash attention, of any level (load() returns them)
        self.depth = 0  # tokens of the last fill() the memory holds at its start (0 once cleared)
        self._last_level = 0

        def on_log(level: int, text: bytes | None, _user: Any) -> None:
            if level == 5:  # GGML_LOG_LEVEL_CONT: continues the previous line
                level = self._last_level
            self._last_level = level
            if text and b"flash" in text.lower():
                self.flash_log.append(text.decode("utf-8", "replace").rstrip())
            if level >= 3 and text:  # WARN, ERROR
                self.recent_log.append(text.decode("utf-8", "replace").rstrip())

        self._log_cb = lc.llama_log_callback(on_log)  # kept referenced: C holds the pointer
        lc.llama_log_set(self._log_cb, ctypes.c_void_p(0))
        lc.llama_backend_init()
        lib = os.path.join(os.path.dirname(lc.__file__), "lib")
        self._ggml_base = ctypes.CDLL(os.path.join(lib, "libggml-base.so"))
        self._ggml_cpu = ctypes.CDLL(os.path.join(lib, "libggml-cpu.so"))
        self._ggml_base.ggml_threadpool_params_init.argtypes = [ctypes.c_void_p, ctypes.c_int]
        self._ggml_base.ggml_threadpool_params_init.restype = None
        self._ggml_cpu.ggml_threadpool_new.argtypes = [ctypes.c_void_p]
        self._ggml_cpu.ggml_threadpool_new.restype = ctypes.c_void_p
        self._ggml_cpu.ggml_threadpool_free.argtypes = [ctypes.c_void_p]
        self._ggml_cpu.ggml_threadpool_free.restype = None
        llama = lc.llama_cpp._lib
        llama.llama_attach_threadpool.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
        llama.llama_attach_threadpool.restype = None
        llama.llama_detach_threadpool.argtypes = [ctypes.c_void_p]
        llama.llama_detach_threadpool.restype = None
        self._llama = llama

    # ----- helpers -----
    def _log_tail(self) -> str:
        return ("\nllama.cpp said:\n  " + "\n  ".join(self.recent_log)) if self.recent_log else ""

    def _need_ctx(self) -> None:
        if self.ctx is None:
            raise RuntimeError("no model loaded: call load(gguf_path) first")

    def _decode(self, batch: Any, what: str) -> None:
        rc = self.lc.llama_decode(self.ctx, batch)
        if rc != 0:
            raise RuntimeError(f"llama_decode failed ({what}) with code {rc}{self._log_tail()}")

    def _clear(self) -> None:
        self.lc.llama_memory_clear(self.lc.llama_get_memory(self.ctx), False)
        self.depth = 0

    def _at_depth(self, depth: int, rng: Any) -> None:
        """Leaves the memory holding ``depth`` tokens (module doc): cleared for 0, the held fill cut back to
        ``depth`` tokens, else an untimed fill of ``depth`` random tokens (llama-bench's depth run)."""
        if depth == 0:
            self._clear()
        elif self.depth == depth:
            if not self.lc.llama_memory_seq_rm(self.lc.llama_get_memory(self.ctx), 0, depth, -1):
                raise RuntimeError(f"llama_memory_seq_rm could not cut the context back to {depth} tokens")
        else:
            self._clear()
            self._test_prompt(depth, rng)
            self.depth = depth

    def _attach_threadpool(self) -> None:
        if self.threadpool is None:
            params = ctypes.create_string_buffer(8192)  # > sizeof(ggml_threadpool_params) (512 B mask + fields)
            self._ggml_base.ggml_threadpool_params_init(params, self.threads)
            tp = self._ggml_cpu.ggml_threadpool_new(params)
            if not tp:
                raise RuntimeError(f"ggml_threadpool_new({self.threads} threads) failed{self._log_tail()}")
            self.threadpool = tp
        self._llama.llama_attach_threadpool(self.ctx, self.threadpool, None)

    def _detach_threadpool(self) -> None:
        self._llama.llama_detach_threadpool(self.ctx)

    def _rand_tokens(self, n: int, rng: Any) -> list[int]:
        return [int(t) for t in rng.integers(0, self.n_vocab, size=n)]

    def _free(self) -> None:
        lc = self.lc
        if self.ctx is not None:
            lc.llama_free(self.ctx)
            self.ctx = None
        if self.model is not None:
            lc.llama_model_free(self.model)
            self.model = None
        if self.threadpool is not None:
            self._ggml_cpu.ggml_threadpool_free(self.threadpool)
            self.threadpool = None

    def _fill(self, batch: Any, rows: list[tuple[int, int, int, bool]]) -> None:
        """Writes (token, pos, seq_id, wants_logits) rows into a llama_batch from llama_batch_init."""
        for i, (tok, pos, seq, out) in enumerate(rows):
            batch.token[i] = tok
            batch.pos[i] = pos
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = seq
            batch.logits[i] = out
        batch.n_tokens = len(rows)

    def _view(self, batch: Any, start: int, n: int) -> Any:
        """A llama_batch over rows start..start+n of ``batch`` (no copy), as batched-bench's batch_view."""
        lc = self.lc
        v = lc.llama_batch()
        v.n_tokens = n
        i32 = ctypes.sizeof(ctypes.c_int32)
        v.token = ctypes.cast(ctypes.cast(batch.token, ctypes.c_void_p).value + start * i32, type(batch.token))
        v.embd = None
        v.pos = ctypes.cast(ctypes.cast(batch.pos, ctypes.c_void_p).value + start * i32, type(batch.pos))
        v.n_seq_id = ctypes.cast(
            ctypes.cast(batch.n_seq_id, ctypes.c_void_p).value + start * i32, type(batch.n_seq_id))
        v.seq_id = ctypes.cast(
            ctypes.cast(batch.seq_id, ctypes.c_void_p).value + start * ctypes.sizeof(ctypes.c_void_p),
            type(batch.seq_id))
        v.logits = ctypes.cast(ctypes.cast(batch.logits, ctypes.c_void_p).value + start, type(batch.logits))
        return v

    def _decode_rows(self, rows: list[tuple[int, int, int, bool]], what: str, sync_each: bool) -> None:
        """Decodes rows in n_batch-sized views of one prefilled batch."""
        batch = self.lc.llama_batch_init(max(len(rows), 1), 0, 1)
        try:
            self._fill(batch, rows)
            for start in range(0, len(rows), self.n_batch):
                n = min(self.n_batch, len(rows) - start)
                self._decode(self._view(batch, start, n), what)
                if sync_each:
                    self.lc.llama_synchronize(self.ctx)
        finally:
            self.lc.llama_batch_free(batch)

    # ----- ops -----
    def load(self, gguf_path: str, n_ctx: int = 4096, n_batch: int = 512, n_seq_max: int = 1,
             flash_attn: str = "auto", kv_type: str = "f16", kv_unified: bool = False) -> dict[str, Any]:
        lc = self.lc
        if not os.path.exists(gguf_path):
            raise FileNotFoundError(f"GGUF file not found: {gguf_path}")
        if flash_attn not in FLASH_ATTN:
            raise ValueError(f"flash_attn must be one of {sorted(FLASH_ATTN)}, got {flash_attn!r}")
        if kv_type not in KV_TYPES:
            raise ValueError(f"kv_type must be one of {sorted(KV_TYPES)}, got {kv_type!r}")
        self._free()
        self.recent_log.clear()
        self.flash_log.clear()
        mparams = lc.llama_model_default_params()
        mparams.n_gpu_layers = 0
        model = lc.llama_model_load_from_file(gguf_path.encode(), mparams)
        if not model:
            raise RuntimeError(f"llama.cpp could not load {gguf_path}{self._log_tail()}")
        self.model = model
        cparams = lc.llama_context_default_params()
        cparams.n_ctx = n_ctx
        cparams.n_batch = n_batch
        cparams.n_ubatch = min(n_batch, 512)  # llama-bench and batched-bench default n_ubatch
        cparams.n_seq_max = n_seq_max
        cparams.n_threads = self.threads
        cparams.n_threads_batch = self.threads
        cparams.flash_attn_type = FLASH_ATTN[flash_attn]
        cparams.type_k = KV_TYPES[kv_type]
        cparams.type_v = KV_TYPES[kv_type]
        cparams.kv_unified = kv_unified
        cparams.no_perf = True
        ctx = lc.llama_init_from_model(model, cparams)
        if not ctx:
            raise RuntimeError(f"llama.cpp could not create a context (n_ctx={n_ctx}, n_batch={n_batch}, "
                               f"n_seq_max={n_seq_max}) for {gguf_path}{self._log_tail()}")
        self.ctx = ctx
        self.vocab = lc.llama_model_get_vocab(model)
        self.n_vocab = lc.llama_vocab_n_tokens(self.vocab)
        self.n_batch = lc.llama_n_batch(ctx)
        self._attach_threadpool()
        buf = ctypes.create_string_buffer(512)
        lc.llama_model_desc(model, buf, len(buf))
        desc = buf.value.decode()
        lc.llama_model_meta_val_str(model, b"general.architecture", buf, len(buf))
        arch = buf.value.decode()
        ftype_name = None
        if hasattr(lc, "llama_model_ftype") and hasattr(lc, "llama_ftype_name"):
            ftype_name = lc.llama_ftype_name(lc.llama_model_ftype(model)).decode()
        marker = os.path.join(self.lib_dir, ".kwker-peer-ok.json")
        build = json.load(open(marker)) if os.path.exists(marker) else {}
        return {
            "path": gguf_path,
            "n_vocab": self.n_vocab,
            "n_ctx": lc.llama_n_ctx(ctx),
            "n_ctx_seq": lc.llama_n_ctx_seq(ctx),
            "n_batch": self.n_batch,
            "n_ubatch": lc.llama_n_ubatch(ctx),
            "n_seq_max": lc.llama_n_seq_max(ctx),
            "n_threads": self.threads,
            "flash_attn": flash_attn,
            "flash_attn_log": list(self.flash_log),
            "kv_type": kv_type,
            "kv_unified": kv_unified,
            "arch": arch,
            "desc": desc,
            "ftype": ftype_name,
            "size_bytes": lc.llama_model_size(model),
            "n_params": lc.llama_model_n_params(model),
            "n_layer": lc.llama_model_n_layer(model),
            "n_embd": lc.llama_model_n_embd(model),
            "add_bos": bool(lc.llama_vocab_get_add_bos(self.vocab)),
            "bos": lc.llama_vocab_bos(self.vocab),
            "eos": lc.llama_vocab_eos(self.vocab),
            "system_info": lc.llama_print_system_info().decode(),
            "llama_cpp_version": getattr(lc, "__version__", "?"),
            "build": build,
        }

    def logits(self, ids: list[int]) -> dict[str, Any]:
        self._need_ctx()
        np, lc = self.np, self.lc
        n = len(ids)
        if n == 0:
            raise ValueError("logits(ids): ids is empty")
        if n > lc.llama_n_ctx_seq(self.ctx):
            raise ValueError(f"logits(ids): {n} tokens exceed the context of {lc.llama_n_ctx_seq(self.ctx)} "
                             "per sequence; load() with a larger n_ctx")
        self._check_ids(ids)
        out = np.empty((n, self.n_vocab), dtype=np.float32)
        self._clear()
        batch = lc.llama_batch_init(min(n, self.n_batch), 0, 1)
        try:
            for start in range(0, n, self.n_batch):
                chunk = ids[start:start + self.n_batch]
                self._fill(batch, [(t, start + i, 0, True) for i, t in enumerate(chunk)])
                self._decode(batch, f"logits of positions {start}..{start + len(chunk) - 1}")
                ptr = lc.llama_get_logits(self.ctx)
                out[start:start + len(chunk)] = np.ctypeslib.as_array(ptr, shape=(len(chunk), self.n_vocab))
        finally:
            lc.llama_batch_free(batch)
        fd, path = tempfile.mkstemp(prefix="kwker-peer-logits-", suffix=".npy",
                                    dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
        with os.fdopen(fd, "wb") as f:
            np.save(f, out)
        return {"npy": path}

    def _check_ids(self, ids: list[int]) -> None:
        bad = [t for t in ids if not 0 <= int(t) < self.n_vocab]
        if bad:
            raise ValueError(f"token ids out of range 0..{self.n_vocab - 1}: {bad[:5]}")

    def _test_prompt(self, n_prompt: int, rng: Any, tokens: list[int] | None = None) -> None:
        """llama-bench's test_prompt (``tokens``: the caller's instead of random ones and BOS)."""
        lc = self.lc
        add_bos = lc.llama_vocab_get_add_bos(self.vocab)
        bos = lc.llama_vocab_bos(self.vocab)
        n_processed = 0
        while n_processed < n_prompt:
            n = min(n_prompt - n_processed, self.n_batch)
            if tokens is not None:
                toks = tokens[n_processed:n_processed + n]
            else:
                toks = self._rand_tokens(n, rng)
                if n_processed == 0 and add_bos:
                    toks[0] = bos
            arr = (lc.llama_token * n)(*toks)
            self._decode(lc.llama_batch_get_one(arr, n), "prompt batch")
            n_processed += n
        lc.llama_synchronize(self.ctx)

    def _test_gen(self, n_gen: int, rng: Any, tokens: list[int] | None = None) -> None:
        """llama-bench's test_gen (``tokens``: the caller's instead of random ones and BOS)."""
        lc = self.lc
        tok = (lc.llama_token * 1)()
        if tokens is not None:
            tok[0], nxt = tokens[0], [*tokens[1:n_gen], 0]
        else:
            add_bos = lc.llama_vocab_get_add_bos(self.vocab)
            tok[0] = lc.llama_vocab_bos(self.vocab) if add_bos else self._rand_tokens(1, rng)[0]
            nxt = self._rand_tokens(n_gen, rng)
        for i in range(n_gen):
            self._decode(lc.llama_batch_get_one(tok, 1), "generation token")
            lc.llama_synchronize(self.ctx)
            tok[0] = nxt[i]

    def _check_room(self, n: int, what: str) -> None:
        room = self.lc.llama_n_ctx_seq(self.ctx)
        if n > room:
            raise ValueError(
                f"{what}: {n} tokens do not fit the context ({room} per sequence); load() with n_ctx >= {n}")

    def _bench(self, what: str, test: Callable[..., None], n_tokens: int, warmup_tokens: int | None,
               depth: int = 0, tokens: list[int] | None = None) -> float:  # fmt: skip
        """Seconds of llama-bench's timed ``test`` of ``n_tokens`` (module doc): the threadpool attached, an
        untimed warm-up run of ``warmup_tokens`` (None: no warm-up), the memory cleared (or, at ``depth``, cut
        back to the depth's fill), then the timed run (of ``tokens`` if given)."""
        self._need_ctx()
        self._check_room(depth + n_tokens, what)
        if tokens is not None:
            if len(tokens) < n_tokens:
                raise ValueError(f"{what}: {len(tokens)} tokens given for a test of {n_tokens}")
            self._check_ids(tokens)
        self._attach_threadpool()
        rng = self.np.random.default_rng(_SEED)
        if warmup_tokens is not None:
            self._at_depth(depth, rng)
            test(warmup_tokens, rng)
        self._at_depth(depth, rng)
        t0 = time.perf_counter_ns()
        test(n_tokens, rng, tokens)
        return (time.perf_counter_ns() - t0) / 1e9

    def pp(self, n_tokens: int = 512, warmup: bool = True, depth: int = 0, tokens: list[int] | None = None) -> float:
        return self._bench("pp", self._test_prompt, n_tokens, n_tokens if warmup else None, depth, tokens)

    def tg(self, n_tokens: int = 128, warmup: bool = True, depth: int = 0, tokens: list[int] | None = None) -> float:
        return self._bench("tg", self._test_gen, n_tokens, 1 if warmup else None, depth, tokens)

    def fill(self, ids: list[int]) -> float:
        """Clears the memory and decodes ``ids`` in n_batch chunks (as test_prompt); later pp/tg at
        ``depth=len(ids)`` run after them. Returns the seconds it took (not part of any test's time)."""
        self._need_ctx()
        self._check_room(len(ids), "fill")
        self._check_ids(ids)
        self._attach_threadpool()
        self._clear()
        t0 = time.perf_counter_ns()
        self._test_prompt(len(ids), None, [int(t) for t in ids])
        seconds = (time.perf_counter_ns() - t0) / 1e9
        self.depth = len(ids)
        return seconds

    def batched(self, n_seq: int, n_prompt: int, n_gen: int) -> dict[str, Any]:
        self._need_ctx()
        lc = self.lc
        n_seq_max = lc.llama_n_seq_max(self.ctx)
        if n_seq > n_seq_max:
            raise ValueError(f"batched: {n_seq} sequences but the context was made for n_seq_max={n_seq_max}; "
                             f"load(..., n_seq_max={n_seq}, n_ctx>={n_seq * (n_prompt + n_gen)})")
        need = n_seq * (n_prompt + n_gen)
        if need > lc.llama_n_ctx(self.ctx) or n_prompt + n_gen > lc.llama_n_ctx_seq(self.ctx):
            raise ValueError(
                f"batched: {n_seq} x ({n_prompt} + {n_gen}) tokens do not fit the context (n_ctx="
                f"{lc.llama_n_ctx(self.ctx)}, {lc.llama_n_ctx_seq(self.ctx)} per sequence); "
                f"load(..., n_ctx>={need}, n_seq_max={n_seq})")
        rng = self.np.random.default_rng(_SEED)
        self._detach_threadpool()  # batched-bench attaches none: ggml makes one per graph
        try:
            self._clear()
            self._decode_rows([(t, i, 0, False) for i, t in enumerate(self._rand_tokens(16, rng))],
                              "warm-up", sync_each=True)
            prompt = [(t, i, j, i == n_prompt - 1)
                      for j in range(n_seq) for i, t in enumerate(self._rand_tokens(n_prompt, rng))]
            gen_tokens = [self._rand_tokens(n_seq, rng) for _ in range(n_gen)]
            pbatch = lc.llama_batch_init(len(prompt), 0, 1)
            gbatch = lc.llama_batch_init(n_seq, 0, 1)
            try:
                self._fill(pbatch, prompt)
                self._clear()
                t0 = time.perf_counter_ns()
                for start in range(0, len(prompt), self.n_batch):
                    self._decode(self._view(pbatch, start, min(self.n_batch, len(prompt) - start)), "prompts")
                lc.llama_synchronize(self.ctx)
                t1 = time.perf_counter_ns()
                for i in range(n_gen):
                    self._fill(gbatch, [(gen_tokens[i][j], n_prompt + i, j, True) for j in range(n_seq)])
                    self._decode(gbatch, "generation step")
                    lc.llama_synchronize(self.ctx)
                t2 = time.perf_counter_ns()
            finally:
                lc.llama_batch_free(pbatch)
                lc.llama_batch_free(gbatch)
        finally:
            self._attach_threadpool()
        t_pp, t_tg = (t1 - t0) / 1e9, (t2 - t1) / 1e9
        return {"n_seq": n_seq, "n_prompt": n_prompt, "n_gen": n_gen, "prompt_s": t_pp, "gen_s": t_tg,
                "prompt_tok_s": n_seq * n_prompt / t_pp, "gen_tok_s": n_seq * n_gen / t_tg if t_tg > 0 else 0.0,
                "total_tok_s": n_seq * (n_prompt + n_gen) / (t_pp + t_tg)}

    def generate_greedy(self, ids: list[int], n_new: int, stop_at_eog: bool = False) -> list[int]:
        self._need_ctx()
        np, lc = self.np, self.lc
        if not ids:
            raise ValueError("generate_greedy(ids): ids is empty")
        self._check_ids(ids)
        self._check_room(len(ids) + n_new, "generate_greedy")
        self._clear()
        batch = lc.llama_batch_init(self.n_batch, 0, 1)
        out: list[int] = []
        try:
            for start in range(0, len(ids), self.n_batch):
                chunk = ids[start:start + self.n_batch]
                last = start + len(chunk) == len(ids)
                self._fill(batch, [(t, start + i, 0, last and i == len(chunk) - 1) for i, t in enumerate(chunk)])
                self._decode(batch, "prompt")
            pos = len(ids)
            for _ in range(n_new):
                row = np.ctypeslib.as_array(lc.llama_get_logits_ith(self.ctx, -1), shape=(self.n_vocab,))
                tok = int(np.argmax(row))
                out.append(tok)
                if stop_at_eog and lc.llama_vocab_is_eog(self.vocab, tok):
                    break
                if len(out) == n_new:
                    break
                self._fill(batch, [(tok, pos, 0, True)])
                self._decode(batch, "generated token")
                pos += 1
        finally:
            lc.llama_batch_free(batch)
        return out

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        self._need_ctx()
        lc = self.lc
        data = text.encode()
        cap = len(data) + 16
        buf = (lc.llama_token * cap)()
        n = lc.llama_tokenize(self.vocab, data, len(data), buf, cap, add_special, parse_special)
        if n < 0:
            raise RuntimeError(f"llama_tokenize failed ({n})")
        return list(buf[:n])

    def quantize(self, src: str, dst: str, ftype: str, requantize: bool = False) -> dict[str, Any]:
        lc = self.lc
        if ftype not in FTYPES:
            raise ValueError(f"quantize: unknown ftype {ftype!r}; known: {sorted(FTYPES)}")
        if not os.path.exists(src):
            raise FileNotFoundError(f"quantize: source GGUF not found: {src}")
        params = lc.llama_model_quantize_default_params()
        params.ftype = FTYPES[ftype]
        params.nthread = self.threads
        # A pre-quantized source (a Q4_K_M file) is dequantized and quantized again only when asked.
        params.allow_requantize = requantize
        self.recent_log.clear()
        t0 = time.perf_counter()
        rc = lc.llama_model_quantize(src.encode(), dst.encode(), ctypes.byref(params))
        if rc != 0:
            raise RuntimeError(f"llama_model_quantize({src} -> {dst}, {ftype}) failed with code {rc}{self._log_tail()}")
        return {"path": dst, "seconds": time.perf_counter() - t0, "size_bytes": os.path.getsize(dst)}

    def system_info(self) -> str:
        return self.lc.llama_print_system_info().decode()

    def close(self) -> None:
        self._free()


def serve(lib_dir: str, threads: int) -> None:
    proto = os.fdopen(os.dup(1), "w", buffering=1)  # the protocol channel: the original stdout
    os.dup2(2, 1)  # from here on, anything printed to fd 1 (Python or C) goes to stderr
    sys.stdout = sys.stderr
    try:
        worker = Worker(lib_dir, threads)
        proto.write(json.dumps({"ok": True, "result": {"ready": True, "pid": os.getpid()}}) + "\n")
    except BaseException as e:  # report why the worker could not start, then exit
        proto.write(json.dumps({"ok": False, "error": f"{type(e).__name__}: {e}",
                                "traceback": traceback.format_exc()}) + "\n")
        return
    ops = {"load", "logits", "pp", "tg", "fill", "batched", "generate_greedy", "tokenize", "quantize", "system_info",
           "close"}
    for line in sys.stdin:
        if not line.strip():
            continue
        msg: dict[str, Any] = {}
        try:
            msg = json.loads(line)
            op = msg.get("op")
            if op not in ops:
                raise ValueError(f"unknown op {op!r}; known: {sorted(ops)}")
            result = getattr(worker, op)(**msg.get("args", {}))
            reply = {"ok": True, "result": result}
        except Exception as e:
            reply = {"ok": False, "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()}
        proto.write(json.dumps(reply) + "\n")
        if msg.get("op") == "close":
            break
    worker.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="llama.cpp peer worker (JSON lines on stdin/stdout)")
    ap.add_argument("--lib-dir", required=True, help="folder holding the llama_cpp package to use")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    _fix_sys_path(os.path.abspath(args.lib_dir))
    serve(os.path.abspath(args.lib_dir), args.threads)
    return 0


if __name__ == "__main__":
    sys.exit(main())
