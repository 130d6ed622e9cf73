"""``POST /v1/embeddings`` in OpenAI's shape, over the engine's decoder (``KwkDecoder.step(output="hidden")``).

``input`` is a string, a list of strings, a list of token ids or a list of lists of ids (at most
``MAX_INPUTS``); each is embedded alone (no padding: every vector is its sequence's own). Pooling comes from the
model folder's sentence-transformers config when it has one (``modules.json``: its Pooling module's
``config.json``, ``pooling_mode_lasttoken`` or ``pooling_mode_mean_tokens`` true, or sentence-transformers 6's
``pooling_mode`` "lasttoken" or "mean"; and whether a Normalize module follows), else from the server's
``--pooling`` (normalized). ``encoding_format`` "float" (lists of numbers) or "base64" (little-endian float32
bytes, as OpenAI sends them). ``dimensions`` cuts each vector to its first
values and normalizes it again (Matryoshka), for models that say they support it (``--matryoshka``, or
``is_matryoshka`` / ``matryoshka_dimensions`` in the model's config, vLLM's fields); otherwise, or out of range,
a 400. ``usage`` counts the input tokens.

The work runs on the engine thread as a job (``Engine.submit_job``): each engine loop reads the next group of
inputs, one per free slot (least recently used first) and up to ``decoder.embed.ROW_BUDGET`` tokens, in one
native step, between the generation steps of requests in flight (so neither waits for the other to finish).
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import torch
from fastapi import FastAPI, Request
from pydantic import Field

from ..decoder import embed as emb
from .engine import Closed, Engine
from .limits import text_fits
from .options import ServeOptions
from .schema import _Strict

MAX_INPUTS = 2048  # OpenAI's bound on the inputs of one request


class EmbeddingRequest(_Strict):
    model: str
    input: str | list[str] | list[int] | list[list[int]]
    encoding_format: Literal["float", "base64"] | None = "float"
    dimensions: int | None = Field(default=None, ge=1)
    user: str | None = None


@dataclass
class Pooling:
    """How a model's embeddings are made: ``mode`` "last" or "mean", then L2-normalized if ``normalize``;
    ``source`` says where that was read; ``problem``: why this model's config cannot be served (or None)."""

    mode: str
    normalize: bool
    source: str
    problem: str | None = None


_MODES = {"pooling_mode_lasttoken": "last", "pooling_mode_mean_tokens": "mean"}
_NEW_NAMES = {"mean": "mean_tokens", "max": "max_tokens", "cls": "cls_token", "weightedmean": "weightedmean_tokens",
              "mean_sqrt_len_tokens": "mean_sqrt_len_tokens"}  # fmt: skip


def pooling_of(folder: str | None, flag: str) -> Pooling:
    """The pooling of the model folder's sentence-transformers config (``modules.json``), else ``flag``'s."""
    path = os.path.join(folder, "modules.json") if folder and os.path.isdir(folder) else None
    if path is None or not os.path.isfile(path):
        return Pooling(flag, True, "--pooling")
    with open(path, encoding="utf-8") as f:
        modules = json.load(f)
    kinds = [str(m.get("type", "")).rsplit(".", 1)[-1] for m in modules]
    normalize = "Normalize" in kinds
    where = f"{folder}/modules.json"
    extra = [k for k in kinds if k not in ("Transformer", "Pooling", "Normalize")]
    if "Pooling" not in kinds:
        return Pooling(flag, normalize, where, "its sentence-transformers modules have no Pooling module")
    if extra:
        return Pooling(flag, normalize, where, f"its sentence-transformers modules include {', '.join(extra)}, "
                       "which this server does not apply (it pools the hidden states and normalizes)")  # fmt: skip
    pool = modules[kinds.index("Pooling")]
    with open(os.path.join(folder, str(pool.get("path", "")), "config.json"), encoding="utf-8") as f:
        cfg = json.load(f)
    # sentence-transformers < 6 writes one boolean per mode (pooling_mode_lasttoken: true), 6 a name or names
    # (pooling_mode: "lasttoken").
    named = cfg.get("pooling_mode")
    if named is not None:
        on = [f"pooling_mode_{_NEW_NAMES.get(n, n)}" for n in ([named] if isinstance(named, str) else named)]
    else:
        on = [k for k, v in cfg.items() if k.startswith("pooling_mode_") and v is True]
    if len(on) != 1 or on[0] not in _MODES or cfg.get("include_prompt", True) is False:
        return Pooling(flag, normalize, where, f"its Pooling config asks for {on or 'no mode'} (include_prompt="
                       f"{cfg.get('include_prompt', True)}); this server computes pooling_mode_lasttoken or "
                       "pooling_mode_mean_tokens over the whole input")  # fmt: skip
    return Pooling(_MODES[on[0]], normalize, where)


def matryoshka_dims(config: Any, flag: bool, width: int) -> list[int] | None:
    """The dimensions a request may ask for (None: no cutting): the config's ``matryoshka_dimensions``, or any
    of 1..width with ``--matryoshka`` or the config's ``is_matryoshka``."""
    listed = getattr(config, "matryoshka_dimensions", None)
    if listed:
        return sorted(int(d) for d in listed if 0 < int(d) <= width)
    if flag or getattr(config, "is_matryoshka", False):
        return list(range(1, width + 1))
    return None


class EmbedJob:
    """One request's inputs, read a group per engine loop (``Engine.Job``); resolves ``future`` (on ``loop``)
    with the pooled, not yet normalized, vectors [n, hidden] or an exception."""

    def __init__(self, e: Engine, seqs: list[torch.Tensor], mode: str, loop: asyncio.AbstractEventLoop,
                 future: asyncio.Future[torch.Tensor], error: Callable[[int, str], Exception]) -> None:  # fmt: skip
        self.dec, self.mode = e.dec, mode
        self.switch = emb.long_from(e.dec)
        self.idx = emb.order([len(t) for t in seqs], self.switch)
        self.seqs = [seqs[i] for i in self.idx]
        self.loop, self.future, self.error = loop, future, error
        self.at = 0
        self.parts: list[torch.Tensor] = []

    def run(self, free: list[int]) -> bool:
        if self.future.done():  # (the client left)
            return True
        g = emb.groups([len(t) for t in self.seqs[self.at :]], len(free), switch=self.switch)[0]
        self.parts.append(emb.run_group(self.dec, self.seqs[self.at : self.at + len(g)], free, self.mode))
        self.at += len(g)
        if self.at < len(self.seqs):
            return False
        pooled = torch.empty(len(self.idx), self.dec.hidden_size)
        pooled[self.idx] = torch.cat(self.parts)
        self.loop.call_soon_threadsafe(self._resolve, pooled, None)
        return True

    def fail(self, message: str, status: int) -> None:
        self.loop.call_soon_threadsafe(self._resolve, None, self.error(status, message))

    def _resolve(self, value: torch.Tensor | None, exc: Exception | None) -> None:
        if self.future.done():
            return
        if exc is not None:
            self.future.set_exception(exc)
        else:
            self.future.set_result(value)


def _encode(v: torch.Tensor, fmt: str) -> Any:
    if fmt == "base64":
        return base64.b64encode(v.numpy().astype("<f4").tobytes()).decode("ascii")
    return v.tolist()


def add_embeddings(app: FastAPI, opts: ServeOptions, eng: Callable[[], Engine], check_model: Callable[[str], None],
                   api_error: Callable[..., Exception], count: Callable[[str, int], None]) -> None:  # fmt: skip
    """Registers ``POST /v1/embeddings`` on ``app``: ``eng()`` gives the started engine, ``check_model`` refuses
    another model's name, ``api_error(status, message, param, code)`` is the app's error (OpenAI's shape),
    ``count`` the request counter."""
    pooling = pooling_of(opts.model, opts.pooling)
    name = opts.model_name

    def bad(message: str, param: str | None = "input", code: str | None = None) -> Exception:
        return api_error(400, message, param, code)

    def prepare(e: Engine, body: EmbeddingRequest) -> tuple[list[torch.Tensor], list[int] | None]:
        """(the inputs' token ids, the dimensions allowed); the 400s. Runs off the event loop."""
        dec = e.dec
        raw = body.input
        items: list[Any] = [raw] if isinstance(raw, str) or (raw and isinstance(raw[0], int)) else list(raw)
        if not items:
            raise bad("input is empty: give a string, a list of strings, a list of token ids or a list of lists "
                      "of token ids")  # fmt: skip
        if len(items) > MAX_INPUTS:
            raise bad(f"input has {len(items)} items; at most {MAX_INPUTS} per request")
        for i, item in enumerate(items):
            if isinstance(item, str) and not text_fits(len(item), dec.max_context, e.tok):
                raise bad(f"input[{i}] has {len(item)} characters, more than this model's context of "
                          f"{dec.max_context} tokens could hold; shorten it",
                          code="context_length_exceeded")  # fmt: skip
        seqs = []
        for i, item in enumerate(items):
            if isinstance(item, str):
                try:
                    ids = list(e.tok(item)["input_ids"])
                except Exception as err:  # noqa: BLE001  (e.g. a lone surrogate)
                    raise bad(f"input[{i}] cannot be tokenized ({type(err).__name__}: {err}); send valid "
                              "Unicode text") from err  # fmt: skip
            else:
                ids = list(item)
            if not ids:
                raise bad(f"input[{i}] is empty (it has no tokens): give some text or token ids")
            out = [t for t in ids if not 0 <= t < dec.vocab_size]
            if out:
                raise bad(f"input[{i}] has token id {out[0]}, outside the vocabulary: ids must be in "
                          f"[0, {dec.vocab_size})")  # fmt: skip
            if len(ids) > dec.max_context:
                raise bad(f"input[{i}] has {len(ids)} tokens; this model's maximum context length is "
                          f"{dec.max_context} tokens. Shorten it.", code="context_length_exceeded")  # fmt: skip
            seqs.append(torch.tensor(ids, dtype=torch.int64))
        return seqs, matryoshka_dims(dec.config, opts.matryoshka, dec.hidden_size)

    @app.post("/v1/embeddings")
    async def embeddings(request: Request, body: EmbeddingRequest) -> Any:
        check_model(body.model)
        e = eng()
        if pooling.problem is not None:
            raise api_error(400, f"this model cannot serve embeddings: {pooling.problem} ({pooling.source})",
                            "model")  # fmt: skip
        seqs, dims = await asyncio.to_thread(prepare, e, body)
        width = e.dec.hidden_size
        if body.dimensions is not None:
            if dims is None:
                raise bad(f"dimensions: this model's embeddings are {width} values and it does not say it was "
                          "trained to be cut (Matryoshka): leave dimensions out, or start the server with "
                          "--matryoshka for such a model", "dimensions")  # fmt: skip
            if body.dimensions not in dims:
                allowed = f"1..{width}" if dims == list(range(1, width + 1)) else ", ".join(map(str, dims))
                raise bad(f"dimensions={body.dimensions}: this model's embeddings can be cut to {allowed}",
                          "dimensions")  # fmt: skip
        loop = asyncio.get_running_loop()
        future: asyncio.Future[torch.Tensor] = loop.create_future()
        job = EmbedJob(e, seqs, pooling.mode, loop, future, lambda status, msg: api_error(
            status, msg, None, None, "server_error" if status >= 500 else "invalid_request_error"))  # fmt: skip
        try:
            e.submit_job(job)
        except Closed as err:
            raise api_error(503, "The server is shutting down; retry on another replica.", None, None,
                            "server_error") from err  # fmt: skip
        pooled = await future
        vecs = emb.finish(pooled, pooling.normalize, body.dimensions)
        fmt = body.encoding_format or "float"
        tokens = sum(len(t) for t in seqs)
        count(request.url.path, 200)
        return {"object": "list", "model": name,
                "data": [{"object": "embedding", "index": i, "embedding": _encode(v, fmt)} for i, v in enumerate(vecs)],
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}  # fmt: skip
