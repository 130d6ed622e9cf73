"""The OpenAI-compatible HTTP app (FastAPI on Starlette): ``/v1/chat/completions`` (with tool calls, tools.py;
reasoning, reasoning.py; each choice's reply split and shaped by chat.py), ``/v1/completions``,
``/v1/responses`` (responses.py, through the chat path's own machinery), ``/v1/embeddings`` (embeddings.py),
``/v1/models``, ``/health``, ``/metrics`` and a chat page at ``/`` (page.py), over one continuous-batching Engine.

``create_app(opts)`` returns the app; its lifespan loads the model and starts the engine at startup, and
at shutdown lets requests in flight finish for ``opts.shutdown_grace`` seconds before ending the rest.
Errors are OpenAI's shape, ``{"error": {"message", "type", "param", "code"}}``: a malformed body, a wrong
type, an empty conversation, a prompt longer than the context or an unenforceable schema is a 400, a body
past ``--max-body`` a 413 (limits.py), an unknown model a 404, a full queue a 429 with Retry-After, a
request past ``--request-timeout`` a 504. Tokenizing and template rendering run off the event loop, after a
character count that refuses text no context could hold, so one large request cannot stall the others.
``app.state.drain()`` starts the engine's graceful shutdown at once (``python -m kwker_torch.serve`` calls it
on SIGTERM, so requests still running when the grace period ends get their error before the server closes
their connections).
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from .. import hf as models
from . import tools
from .chat import ChoiceSplit, ReplyPlan, usage
from .embeddings import add_embeddings
from .engine import Closed, Engine, QueueFull
from .flight import Flight, Stream, chat_logprobs, new_id, outcome, sse, text_logprobs
from .grammar import GrammarError, Grammars
from .limits import BodyLimit, text_fits
from .metrics import Metrics
from .options import TOOL_CALL_STREAMS, ServeOptions, load_model
from .page import add_page
from .reasoning import opens_inside, template_kwargs, thinking_of
from .responses import ChatPath, add_responses
from .sampling import SamplingParams
from .schema import ChatCompletionRequest, CompletionRequest, FieldError, error_body

log = logging.getLogger("kwker.serve")


class ApiError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 kind: str = "invalid_request_error", headers: dict[str, str] | None = None) -> None:  # fmt: skip
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.kind = status, message, param, code, kind
        self.headers = headers


def build_engine(opts: ServeOptions, metrics: Metrics | None = None) -> Engine:
    """Loads the model named by ``opts`` and starts an engine over it (``engine_for``)."""
    opts.check()
    gguf_file = opts.model and opts.model.lower().endswith(".gguf") and os.path.isfile(opts.model)
    if opts.precision == "preserve" and gguf_file:
        # The file's own values are the model's weights: run them as stored, in the file's formats.
        from ..decoder import KwkDecoder
        from ..decoder.gguf import load_tokenizer

        _threads(opts)
        dec = KwkDecoder.from_gguf(opts.model, max_batch=opts.slots, max_context=opts.max_context or "auto",
                                   kv_cache=opts.kv_cache)  # fmt: skip
        return _start(dec, load_tokenizer(opts.model), list(dec.eos_ids), opts, metrics)
    model, tok = load_model(opts)
    return engine_for(model, tok, opts, metrics)


def _threads(opts: ServeOptions) -> None:
    from ..ops import native as _native

    if opts.threads:
        _native.set_num_threads(opts.threads)


def _start(dec: Any, tok: Any, eos: list[int], opts: ServeOptions, metrics: Metrics | None) -> Engine:
    if tok.eos_token_id is not None and tok.eos_token_id not in eos:
        eos.append(int(tok.eos_token_id))
    return Engine(dec, tok, eos=eos, queue=opts.queue, prefill_chunk=opts.prefill_chunk, metrics=metrics,
                  grammars=Grammars(tok, dec.vocab_size), prompt_lookup=opts.prompt_lookup).start()  # fmt: skip


def engine_for(model: Any, tok: Any, opts: ServeOptions, metrics: Metrics | None = None) -> Engine:
    """A started engine over a KwkDecoder of ``model`` with ``opts.slots`` slots (the model is not kept)."""
    from ..decoder import KwkDecoder, compiled, eos_ids, families

    opts.check()
    if not families.maps(model):
        if compiled.is_causal_lm(model):  # the compile backend's path has no slots to batch requests in
            raise compiled.refuse(model, "the server (its continuous batching runs on KwkDecoder.step)")
        families.family_of(model)  # names what it is not
    _threads(opts)
    calib = None
    if opts.calib is not None:
        with open(opts.calib, encoding="utf-8", errors="replace") as f:
            calib = f.read()
    dec = KwkDecoder.from_hf(model, opts.precision, max_batch=opts.slots, max_context=opts.max_context or "auto",
                             calib=calib, tokenizer=tok if calib is not None else None, gptq=opts.gptq,
                             kv_cache=opts.kv_cache)  # fmt: skip
    return _start(dec, tok, eos_ids(model), opts, metrics)


def _err(e: ApiError) -> JSONResponse:
    return JSONResponse(error_body(e.message, e.kind, e.param, e.code), status_code=e.status, headers=e.headers)


def _validation_message(exc: RequestValidationError) -> tuple[str, str | None]:
    parts, param = [], None
    for err in exc.errors():
        loc = [str(x) for x in err.get("loc", ()) if x != "body"]
        top = loc[0] if loc else None  # the request field (not pydantic's path into a union's branch)
        if err.get("type") == "json_invalid":
            return f"the request body is not valid JSON: {err.get('msg')}", "body"
        where = ".".join(loc) or "body"
        param = param or top
        parts.append(f"{where}: {err.get('msg')}")
    return "invalid request: " + "; ".join(dict.fromkeys(parts)), param


def create_app(opts: ServeOptions | None = None, *, engine: Engine | None = None) -> FastAPI:
    """The server app. With ``engine`` given (already started), the app uses it and does not stop it."""
    opts = (opts or ServeOptions()).check()
    state: dict[str, Any] = {"engine": engine}
    name = opts.model_name

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        own = state["engine"] is None
        if own:
            state["engine"] = await asyncio.to_thread(build_engine, opts)
            log.info("kwker serve: %s loaded (%s, %d slots), serving", name, opts.precision, opts.slots)
        yield
        if own:
            await asyncio.to_thread(state["engine"].shutdown, opts.shutdown_grace)

    app = FastAPI(title="kwker", description="OpenAI-compatible API over kwker's native decoder", lifespan=lifespan)
    app.add_middleware(BodyLimit, max_bytes=opts.max_body)
    add_page(app)  # the chat page at /
    draining = threading.Lock()

    def drain() -> None:
        """Starts the engine's graceful shutdown (once) on a thread of its own: no new requests; those in
        flight run for ``shutdown_grace`` seconds, then end with an error event or a 503."""
        e = state["engine"]
        if e is not None and draining.acquire(blocking=False):
            threading.Thread(target=e.shutdown, args=(opts.shutdown_grace,), name="kwker-drain", daemon=True).start()

    app.state.drain = drain

    def eng() -> Engine:
        e = state["engine"]
        if e is None:
            raise ApiError(503, "the model is still loading; retry shortly", kind="server_error")
        return e

    def count(endpoint: str, status: int) -> None:
        if state["engine"] is not None:
            state["engine"].metrics.requests.labels(endpoint, str(status)).inc()

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError) -> JSONResponse:
        count(request.url.path, exc.status)
        return _err(exc)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        message, param = _validation_message(exc)
        count(request.url.path, 400)
        return _err(ApiError(400, message, param))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if exc.status_code == 400:  # (FastAPI's own parse failure, e.g. JSON nested past the parser's depth)
            message = f"the request body cannot be parsed ({exc.detail}): send JSON nested at most a few hundred deep"
            return _err(ApiError(400, message, "body"))
        return _err(ApiError(exc.status_code, str(exc.detail), kind="invalid_request_error"))

    @app.get("/health")
    async def health() -> JSONResponse:
        e = state["engine"]
        status = "loading" if e is None else "ok" if e.alive else "engine stopped"
        body = {"status": status, "pid": os.getpid(), "model": name, "slots": opts.slots,
                "busy": e.busy if e is not None else 0}  # fmt: skip
        return JSONResponse(body, status_code=200 if status == "ok" else 503)

    @app.get("/metrics")
    async def metrics() -> PlainTextResponse:
        body = eng().metrics.exposition()
        return PlainTextResponse(body, media_type="text/plain; version=0.0.4; charset=utf-8")

    def model_card() -> dict[str, Any]:
        return {"id": name, "object": "model", "created": 0, "owned_by": "kwker"}

    @app.get("/v1/models")
    async def list_models() -> dict[str, Any]:
        return {"object": "list", "data": [model_card()]}

    def check_model(model: str) -> None:
        if model != name:
            raise ApiError(404, f"The model '{model}' does not exist; this server serves '{name}' (GET /v1/models)",
                           "model", "model_not_found")  # fmt: skip

    @app.get("/v1/models/{model_id:path}")
    async def get_model(model_id: str) -> dict[str, Any]:
        check_model(model_id)
        return model_card()

    def params(e: Engine, body: Any, prompt_len: int, max_tokens: int | None, logprobs: bool, top: int,
               field: str, limit: str = "max_tokens") -> SamplingParams:  # fmt: skip
        """The sampling parameters of a request whose prompt (the request's ``field``) has ``prompt_len`` tokens;
        ``limit`` names the field of ``max_tokens``."""
        ctx = e.dec.max_context
        room = ctx - prompt_len
        if room < 1:
            raise ApiError(400, f"This model's maximum context length is {ctx} tokens; the prompt has "
                           f"{prompt_len}. Shorten the prompt (or start the server with a larger --max-context).",
                           field, "context_length_exceeded")  # fmt: skip
        if max_tokens is not None and prompt_len + max_tokens > ctx:
            raise ApiError(400, f"This model's maximum context length is {ctx} tokens; the prompt has "
                           f"{prompt_len} and {limit} asks for {max_tokens} more. Lower {limit} to at most "
                           f"{room}.", limit, "context_length_exceeded")  # fmt: skip
        bias = {int(k): float(v) for k, v in (body.logit_bias or {}).items()}
        vocab = e.dec.vocab_size
        if any(not 0 <= t < vocab for t in bias):
            raise ApiError(400, f"logit_bias token id {max(bias)} is out of range: ids must be in [0, {vocab})",
                           "logit_bias")  # fmt: skip
        return SamplingParams(
            max_tokens=max_tokens if max_tokens is not None else room,
            temperature=1.0 if body.temperature is None else float(body.temperature),
            top_p=1.0 if body.top_p is None else float(body.top_p), seed=body.seed, stop=body.stops(),
            logprobs=logprobs, top_logprobs=top, ignore_eos=body.ignore_eos,
            top_k=max(body.top_k or 0, 0), min_p=float(body.min_p or 0.0),
            presence_penalty=float(body.presence_penalty or 0.0),
            frequency_penalty=float(body.frequency_penalty or 0.0),
            repetition_penalty=float(body.repetition_penalty or 1.0), logit_bias=bias,
        )  # fmt: skip

    async def start(e: Engine, prompts: list[list[int]], sp: SamplingParams, body: Any,
                    call: tuple[str, Any] | None = None) -> Flight:  # fmt: skip
        """Submits the choices; ``call``: what a forced tool call is held to, ("json", a JSON schema) or
        ("lark", a Lark grammar of several calls)."""
        choices = len(prompts) * body.n
        if choices > e.dec.max_batch + e.queue_limit:
            raise ApiError(400, f"{choices} choices (n x prompts) are more than this server holds at once "
                           f"({e.dec.max_batch} slots + a queue of {e.queue_limit})", "n")  # fmt: skip

        def compile_all() -> tuple[str | None, list[Any] | None]:  # (off the event loop: it can take a while)
            if call is not None:
                kind, spec = call
                grammar: str | None = (e.grammars.compile_lark(spec, "tools") if kind == "lark"
                                       else e.grammars.compile_schema(spec, "tools"))  # fmt: skip
            else:
                grammar = e.grammars.compile(body.response_format)
            return grammar, [e.grammars.matcher(grammar) for _ in range(choices)] if grammar else None

        try:
            constrained = body.response_format or call is not None
            grammar, matchers = await asyncio.to_thread(compile_all) if constrained else (None, None)
        except GrammarError as err:
            raise ApiError(400, str(err), "tools" if call is not None else "response_format") from err
        sp.grammar = grammar
        try:
            return Flight(e, prompts, sp, body.n, matchers, time.monotonic() + opts.request_timeout)
        except QueueFull as err:
            raise ApiError(429, f"The server is busy: {err}. Retry shortly.", kind="rate_limit_error",
                           code="rate_limit_exceeded", headers={"Retry-After": "1"}) from err  # fmt: skip
        except Closed as err:
            raise ApiError(503, "The server is shutting down; retry on another replica.", kind="server_error") from err

    async def respond(request: Request, flight: Flight, body: Any, chat: bool, echo: list[str],
                      rp: ReplyPlan | None = None) -> Any:  # fmt: skip
        if body.stream:
            count(request.url.path, 200)
            return Stream(flight, stream(flight, body, chat, echo, rp), media_type="text/event-stream")
        got = await outcome(request, flight)
        if got is None:
            count(request.url.path, 499)
            return JSONResponse(error_body("client disconnected"), status_code=499)
        texts, toks, finish, failed = got.texts, got.toks, got.finish, got.failed
        splits = [ChoiceSplit(rp or ReplyPlan(None), fragments=False) for _ in range(len(flight.reqs))]
        if failed is not None:
            raise ApiError(failed.status, failed.error or "failed", kind="server_error" if failed.status >= 500
                           else "invalid_request_error")  # fmt: skip
        count(request.url.path, 200)
        tok = flight.engine.tok
        choices = []
        for i in range(len(flight.reqs)):
            lp = None
            if body.logprobs is not None and body.logprobs is not False:  # (completions' logprobs=0: chosen only)
                lp = chat_logprobs(tok, toks[i]) if chat else text_logprobs(tok, toks[i], len(echo[i]) if echo else 0)
            if chat:
                msg = splits[i].message(splits[i].feed(texts[i], [t.offset for t in toks[i]], end=True))
                fin = "tool_calls" if msg.get("tool_calls") and finish[i] == "stop" else finish[i]
                choices.append({"index": i, "message": msg, "logprobs": lp, "finish_reason": fin})
            else:
                text = (echo[i] if echo else "") + texts[i]
                choices.append({"index": i, "text": text, "logprobs": lp, "finish_reason": finish[i]})
        kind = "chat.completion" if chat else "text_completion"
        return {"id": new_id("chatcmpl" if chat else "cmpl"), "object": kind,
                "created": flight.created, "model": name, "system_fingerprint": "kwker", "choices": choices,
                "usage": usage(flight.usage(), splits) if chat else flight.usage()}  # fmt: skip

    async def stream(flight: Flight, body: Any, chat: bool, echo: list[str],
                     rp: ReplyPlan | None = None) -> AsyncIterator[str]:  # fmt: skip
        rid = new_id("chatcmpl" if chat else "cmpl")
        usage_on = bool(body.stream_options and body.stream_options.include_usage)
        tok = flight.engine.tok
        # A chat choice's text goes through a ChoiceSplit: reasoning, content, and calls (in fragments as they
        # are written, or whole as each closes).
        splits = [ChoiceSplit(rp or ReplyPlan(None)) for _ in range(len(flight.reqs))] if chat else []

        def chunk(i: int, toks: list[Any], finish: str | None, delta: dict[str, Any] | None = None,
                  text: str = "") -> str:  # fmt: skip
            lp = None
            if body.logprobs is not None and body.logprobs is not False and toks:
                lp = chat_logprobs(tok, toks) if chat else text_logprobs(tok, toks, (len(echo[i]) if echo else 0))
            if chat:
                choice = {"index": i, "delta": delta or {}, "logprobs": lp, "finish_reason": finish}
            else:
                choice = {"index": i, "text": text, "logprobs": lp, "finish_reason": finish}
            obj: dict[str, Any] = {"id": rid, "object": "chat.completion.chunk" if chat else "text_completion",
                                   "created": flight.created, "model": name, "system_fingerprint": "kwker",
                                   "choices": [choice]}  # fmt: skip
            if usage_on:
                obj["usage"] = None
            return sse(obj)

        try:
            for i in range(len(flight.reqs)):
                if chat:
                    yield chunk(i, [], None, {"role": "assistant", "content": ""})
                elif echo:
                    yield chunk(i, [], None, text=echo[i])
            async for i, ev in flight.events():
                if ev.error is not None:
                    flight.cancel()
                    yield sse(error_body(ev.error, "server_error" if ev.status >= 500 else "invalid_request_error"))
                    break
                if not chat:
                    if ev.text or ev.tokens:
                        yield chunk(i, ev.tokens, None, text=ev.text)
                    if ev.finish is not None:
                        yield chunk(i, [], ev.finish)
                    continue
                sp = splits[i]
                toks = ev.tokens
                for delta in sp.deltas(sp.feed(ev.text, [t.offset for t in toks], ev.finish is not None)):
                    yield chunk(i, toks, None, delta)
                    toks = []
                if toks and body.logprobs:  # (tokens whose text is held: their logprobs on an empty delta)
                    yield chunk(i, toks, None, {})
                if ev.finish is not None:
                    yield chunk(i, [], "tool_calls" if sp.ncalls and ev.finish == "stop" else ev.finish)
            else:
                if usage_on:
                    yield sse({"id": rid, "object": "chat.completion.chunk" if chat else "text_completion",
                                "created": flight.created, "model": name, "choices": [],
                                "usage": usage(flight.usage(), splits) if chat else flight.usage()})  # fmt: skip
            yield "data: [DONE]\n\n"
        finally:
            flight.cancel()  # (a no-op when all choices finished; frees the slots when the client left)

    def too_long(e: Engine, chars: int, field: str) -> None:
        """A 400 for text no context could hold (limits.py), before anything tokenizes it. Runs off the event
        loop: the first call reads the vocabulary's longest token."""
        if not text_fits(chars, e.dec.max_context, e.tok):
            raise ApiError(400, f"This model's maximum context length is {e.dec.max_context} tokens; the {field} has "
                           f"{chars} characters, more than that many tokens could hold. Shorten it.", field,
                           "context_length_exceeded")  # fmt: skip

    def tokenize(e: Engine, text: str, field: str, special: bool = True) -> list[int]:
        try:
            return list(e.tok(text, add_special_tokens=special)["input_ids"])
        except Exception as err:  # noqa: BLE001  (e.g. a lone surrogate: not text a tokenizer can encode)
            raise ApiError(400, f"the {field} cannot be tokenized ({type(err).__name__}: {err}); send valid "
                           "Unicode text", field) from err  # fmt: skip

    def render_chat(e: Engine, body: ChatCompletionRequest,
                    field: str = "messages") -> tuple[ReplyPlan, Any, list[int]]:  # fmt: skip
        """(how replies split, what a forced call is held to, prompt ids): the template's work, off the event
        loop. ``field`` names the conversation's field in errors (/v1/responses: its input)."""
        too_long(e, sum(len(m.text()) for m in body.messages), field)
        try:
            tp = tools.plan(body, e.tok)
            call = None
            if tp is not None and tp.forced:  # (a forced call's grammar: one call, or several in a row)
                schema = tp.schema(body.tools)
                call = ("lark", tp.lark(schema, e.tok)) if tp.several() else ("json", schema)
        except FieldError as err:  # (tools.ToolError)
            raise ApiError(400, str(err), err.param) from err
        if tp is not None and tp.forced and body.response_format and body.response_format.get("type") != "text":
            raise ApiError(400, "a forced tool call (tool_choice 'required' or a named function) holds the reply to "
                           "the call's schema: leave response_format out", "response_format")  # fmt: skip
        shape = opts.tool_call_stream if body.tool_call_stream is None else body.tool_call_stream
        if shape not in TOOL_CALL_STREAMS:
            raise ApiError(400, f"tool_call_stream must be one of {', '.join(map(repr, TOOL_CALL_STREAMS))} (how "
                           f"streamed tool calls arrive); got {shape!r}", "tool_call_stream")  # fmt: skip
        th = thinking_of(e.tok)
        try:
            kw = template_kwargs(body, th)
        except FieldError as err:  # (reasoning.ReasoningError)
            raise ApiError(400, str(err), err.param) from err
        try:
            ids = models.chat_ids(e.tok, tools.messages(body.messages), tp.tools if tp else None, **kw)[0].tolist()
        except Exception as err:  # noqa: BLE001  (the template's own message says what is wrong)
            raise ApiError(400, f"{field} cannot be rendered with the model's chat template: {err}",
                           field) from err  # fmt: skip
        inside = th.thinks and opens_inside(e.tok.decode(ids[-16:], skip_special_tokens=False))
        if tp is not None and tp.suffix():
            ids += tokenize(e, tp.suffix(), field, special=False)
        return ReplyPlan(tp, th.thinks, inside, shape == "fragments"), call, ids

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request, body: ChatCompletionRequest) -> Any:
        check_model(body.model)
        e = eng()
        rp, call, ids = await asyncio.to_thread(render_chat, e, body)
        top = body.top_logprobs or 0
        if top and not body.logprobs:
            raise ApiError(400, "top_logprobs requires logprobs: true", "top_logprobs")
        sp = params(e, body, len(ids), body.max_completion_tokens or body.max_tokens, body.logprobs, top, "messages")
        flight = await start(e, [ids], sp, body, call)
        return await respond(request, flight, body, True, [], rp)

    @app.post("/v1/completions")
    async def completions(request: Request, body: CompletionRequest) -> Any:
        check_model(body.model)
        e = eng()
        p = body.prompt
        if isinstance(p, str):
            raw: list[Any] = [p]
        elif p and all(isinstance(x, int) for x in p):
            raw = [p]
        else:
            raw = list(p)
        if not raw:
            raise ApiError(400, "prompt is empty: give a string, a list of strings, or token ids", "prompt")
        def tokenize_all() -> tuple[list[list[int]], list[str]]:  # (off the event loop: it can take a while)
            for item in raw:  # (every text bounded before any is tokenized)
                too_long(e, len(item) if isinstance(item, str) else 0, "prompt")
            prompts, echo = [], []
            vocab = e.dec.vocab_size
            for item in raw:
                ids = tokenize(e, item, "prompt") if isinstance(item, str) else list(item)
                if not ids:
                    raise ApiError(400, "prompt is empty (it has no tokens): give some text or token ids", "prompt")
                bad = [t for t in ids if not 0 <= t < vocab]
                if bad:
                    raise ApiError(400, f"prompt token id {bad[0]} is out of range: ids must be in [0, {vocab})",
                                   "prompt")  # fmt: skip
                prompts.append(ids)
                echo.append(item if isinstance(item, str) else e.tok.decode(ids))
            return prompts, echo

        prompts, echo = await asyncio.to_thread(tokenize_all)
        top = body.logprobs or 0
        sp = params(e, body, max(len(x) for x in prompts), body.max_tokens, body.logprobs is not None, top, "prompt")
        flight = await start(e, prompts, sp, body)
        ech = [echo[i // body.n] for i in range(len(prompts) * body.n)] if body.echo else []
        return await respond(request, flight, body, False, ech)

    add_embeddings(app, opts, eng, check_model, ApiError, count)  # POST /v1/embeddings (embeddings.py)
    # /v1/responses (responses.py); app.state.responses: the responses kept for previous_response_id
    app.state.responses = add_responses(app, opts, ChatPath(eng, check_model, render_chat, params, start, ApiError,
                                                            count))  # fmt: skip
    return app
