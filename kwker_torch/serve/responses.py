"""OpenAI's Responses API: ``POST /v1/responses``, ``GET`` and ``DELETE /v1/responses/{id}``, ``GET
/v1/responses/{id}/input_items``, run through the
chat endpoint's own machinery (app.py's ``ChatPath``: the chat template, tools.py's tool plan and forced-call
grammar, reasoning.py, chat.py's reply splitting, the engine) and shaped by outputs.py.

A request becomes a chat request: ``instructions`` a system message first; ``input`` a string (one user
message) or items: messages (``role`` user, system, developer or assistant; ``content`` a string or
``input_text`` / ``output_text`` parts), ``function_call`` items (an assistant's calls, joined to the assistant
message before them), ``function_call_output`` items (``tool`` messages) and ``reasoning`` items (the next
assistant message's ``reasoning_content``: the template keeps or drops it); ``tools`` function tools in the
Responses shape (flat: ``{"type": "function", "name", "description", "parameters", "strict"}``);
``tool_choice`` "auto", "none", "required" or ``{"type": "function", "name"}``; ``max_output_tokens`` the
chat's ``max_completion_tokens`` (reasoning tokens count); ``reasoning.effort`` mapped onto the template's
thinking switch as chat's ``reasoning_effort``; ``text.format`` (text, json_object, json_schema) the chat's
``response_format``. Anything else wrong is a 400 naming the field and what was expected.

``previous_response_id``: the follow-up's input is appended to the kept conversation (the earlier input items and
output items; not its instructions), so the rendered prompt starts with the text the earlier reply's slot
holds and the prompt cache reads only the new tokens (``usage.input_tokens_details.cached_tokens``). Responses
are kept unless ``store`` is false, for ``--responses-ttl`` seconds, at most ``--responses-keep`` of them; an
unknown (or expired) id is a 404. ``stream``: the events of outputs.py between ``response.created`` /
``response.in_progress`` and ``response.completed`` (``response.incomplete`` when cut by
``max_output_tokens``; an ``error`` event and ``response.failed`` when generation fails). ``GET
/v1/responses/{id}/input_items`` lists a kept response's own input items (a string input as one user message;
each item with its id or a new one), paged as OpenAI's list endpoints (``limit``, ``order``, ``after``,
``before``).

Logprobs: ``include`` ["message.output_text.logprobs"] (or ``top_logprobs`` > 0) puts the answer's tokens' logprobs
(the model's own, as chat's; ``top_logprobs`` alternatives each) on the ``output_text`` part and on its stream's
deltas; the reasoning's tokens and a call's have none, as OpenAI's. Other ``include`` values are 400s.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import Field, ValidationError

from .chat import ChoiceSplit, ReplyPlan
from .engine import Engine
from .flight import Flight, Stream, chat_logprobs, outcome, sse
from .options import ServeOptions
from .outputs import Kept, Output, item_id
from .reasoning import EFFORT_OFF, EFFORTS, thinking_of
from .sampling import SamplingParams
from .schema import ChatCompletionRequest, FieldError, _Strict, error_body

NAME = r"^[a-zA-Z0-9_-]{1,64}$"
ROLES = ("user", "system", "developer", "assistant")
ITEMS = "message, function_call, function_call_output or reasoning"
ECHOED = ("instructions", "tools", "tool_choice", "metadata", "user", "text", "reasoning")  # (in the response object)


class ResponsesRequest(_Strict):
    model: str
    input: str | list[Any]
    instructions: str | None = None
    tools: list[Any] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    max_output_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    stream: bool | None = False
    previous_response_id: str | None = None
    store: bool | None = True
    metadata: dict[str, str] | None = None
    user: str | None = None
    reasoning: Any = None  # {"effort": ...}: checked here, whose 400s say what is expected
    text: Any = None  # {"format": {"type": "text" | "json_object" | "json_schema", ...}}
    seed: int | None = None  # (an extension, as chat's)
    chat_template_kwargs: Any = None  # (an extension, as chat's)
    background: bool | None = None  # refused when true: every response is answered in the request
    include: list[str] | None = None  # "message.output_text.logprobs" only (the others need tools not served)
    top_logprobs: int | None = Field(default=None, ge=0, le=20)


class Bad(FieldError):
    """A request this endpoint cannot take; ``param`` names the field."""


@dataclass(frozen=True)
class ChatPath:
    """The chat endpoint's machinery (app.py), which responses run through."""

    eng: Callable[[], Engine]
    check_model: Callable[[str], None]
    render: Callable[[Engine, ChatCompletionRequest, str], tuple[ReplyPlan, Any, list[int]]]
    params: Callable[..., SamplingParams]
    start: Callable[..., Awaitable[Flight]]
    error: Callable[..., Exception]  # app.py's ApiError(status, message, param, code)
    count: Callable[[str, int], None]


def _text_of(content: Any, where: str, kinds: tuple[str, ...]) -> str:
    """The text of an item's content: a string, or a list of text parts of ``kinds``."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise Bad(f"{where} must be a string or a list of {' / '.join(kinds)} parts, got {type(content).__name__}",
                  "input")  # fmt: skip
    out = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in kinds or not isinstance(part.get("text"), str):
            raise Bad(f"{where}[{j}] must be a text part ({{\"type\": one of {', '.join(kinds)}, \"text\": ...}}); "
                      f"got {str(part)[:120]} (this server reads text only)", "input")  # fmt: skip
        out.append(part["text"])
    return "".join(out)


def conversation(items: str | list[Any], field: str = "input") -> list[dict[str, Any]]:
    """Chat messages of a Responses ``input`` (or of a response's output items); raises Bad."""
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    msgs: list[dict[str, Any]] = []
    thought: str | None = None  # a reasoning item's text, for the next assistant message
    joinable = False  # the last message is an assistant's that this input wrote (calls may join it)
    for i, it in enumerate(items):
        where = f"{field}[{i}]"
        if not isinstance(it, dict):
            raise Bad(f"{where} must be an object (a message or an item of type {ITEMS}), got "
                      f"{type(it).__name__}", field)  # fmt: skip
        kind = it.get("type", "message")
        if kind == "message":
            role = it.get("role")
            if role not in ROLES:
                raise Bad(f"{where}.role must be one of {', '.join(ROLES)}; got {role!r}", field)
            kinds = ("output_text", "input_text") if role == "assistant" else ("input_text", "output_text")
            m: dict[str, Any] = {"role": role, "content": _text_of(it.get("content"), f"{where}.content", kinds)}
            if role == "assistant" and thought is not None:
                m["reasoning_content"], thought = thought, None
            msgs.append(m)
            joinable = role == "assistant"
        elif kind == "function_call":
            fields = ("call_id", "name", "arguments")
            if any(not isinstance(it.get(k), str) for k in fields):
                raise Bad(f"{where}: a function_call item needs call_id, name and arguments (strings); got keys "
                          f"{sorted(it)}", field)  # fmt: skip
            call = {"id": it["call_id"], "type": "function",
                    "function": {"name": it["name"], "arguments": it["arguments"]}}  # fmt: skip
            if not joinable:
                msgs.append({"role": "assistant", "content": ""})
                if thought is not None:
                    msgs[-1]["reasoning_content"], thought = thought, None
                joinable = True
            msgs[-1].setdefault("tool_calls", []).append(call)
        elif kind == "function_call_output":
            if not isinstance(it.get("call_id"), str):
                raise Bad(f"{where}: a function_call_output item needs the call_id of the call it answers", field)
            out = _text_of(it.get("output"), f"{where}.output", ("input_text", "output_text"))
            msgs.append({"role": "tool", "tool_call_id": it["call_id"], "content": out})
            joinable = False
        elif kind == "reasoning":
            parts = it.get("content") or it.get("summary") or []
            thought = _text_of(parts, f"{where}.content", ("reasoning_text", "summary_text"))
        else:
            raise Bad(f"{where}.type {kind!r} is not supported: expected {ITEMS}", field)
    return msgs


#: Id prefixes of input items that come without one (OpenAI's shapes).
ITEM_PREFIX = {"message": "msg", "function_call": "fc", "function_call_output": "fco", "reasoning": "rs"}


def input_items(items: str | list[Any]) -> list[dict[str, Any]]:
    """A request's ``input`` as the items ``GET /v1/responses/{id}/input_items`` lists: a string as one user message,
    message contents as lists of text parts, each item with an id (its own, or a new one). Call after
    ``conversation`` has checked the input."""
    if isinstance(items, str):
        items = [{"type": "message", "role": "user", "content": items}]
    out = []
    for it in items:
        kind = it.get("type", "message")
        item = {"id": it.get("id") or item_id(ITEM_PREFIX[kind]), "type": kind,
                **{k: v for k, v in it.items() if k not in ("id", "type")}}  # fmt: skip
        if kind == "message":
            if isinstance(item.get("content"), str):
                part = {"type": "input_text", "text": item["content"]}
                if item.get("role") == "assistant":
                    part = {"type": "output_text", "text": item["content"], "annotations": []}
                item["content"] = [part]
            item.setdefault("status", "completed")
        out.append(item)
    return out


def page(items: list[dict[str, Any]], limit: Any, order: Any, after: Any, before: Any) -> dict[str, Any]:
    """One page of a list endpoint, as OpenAI pages: ``order`` "desc" (the default) newest first, ``after`` /
    ``before`` item ids, ``limit`` 1-100 (default 20); raises Bad naming the field."""
    if order not in ("asc", "desc"):
        raise Bad(f"order must be 'asc' or 'desc', got {order!r}", "order")
    try:
        n = int(limit)
    except (TypeError, ValueError):
        raise Bad(f"limit must be an integer from 1 to 100, got {limit!r}", "limit") from None
    if not 1 <= n <= 100:
        raise Bad(f"limit must be from 1 to 100, got {n}", "limit")
    seq = items if order == "asc" else items[::-1]
    ids = [it["id"] for it in seq]
    lo, hi = 0, len(seq)
    for name, at, edge in (("after", after, 1), ("before", before, 0)):
        if at is None:
            continue
        if at not in ids:
            raise Bad(f"{name} must be the id of one of the response's input items; {at!r} is not", name)
        if edge:
            lo = ids.index(at) + 1
        else:
            hi = ids.index(at)
    data = seq[lo:hi][:n]
    return {"object": "list", "data": data, "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None, "has_more": lo + n < hi}  # fmt: skip


def _tools(tools: list[Any] | None) -> list[dict[str, Any]] | None:
    """Chat tools of Responses function tools (flat)."""
    if tools is None:
        return None
    out = []
    for i, t in enumerate(tools):
        where = f"tools[{i}]"
        if not isinstance(t, dict) or t.get("type") != "function":
            kind = t.get("type") if isinstance(t, dict) else type(t).__name__
            raise Bad(f"{where}.type {kind!r} is not supported: this server runs function tools only "
                      '({"type": "function", "name": ..., "parameters": {...}})', "tools")  # fmt: skip
        if "function" in t and "name" not in t:
            raise Bad(f"{where}: the Responses API takes function tools flat ({{\"type\": \"function\", \"name\": "
                      "..., \"parameters\": ...}), not nested under 'function' as chat completions do",
                      "tools")  # fmt: skip
        name = t.get("name")
        if not isinstance(name, str) or not re.match(NAME, name):
            raise Bad(f"{where}.name must be 1 to 64 letters, digits, '_' or '-'; got {name!r}", "tools")
        params = t.get("parameters")
        if params is not None and not isinstance(params, dict):
            raise Bad(f"{where}.parameters must be a JSON Schema object, got {type(params).__name__}", "tools")
        fn = {"name": name, "parameters": params}
        for k, kinds in (("description", str), ("strict", bool)):
            if t.get(k) is not None:
                if not isinstance(t[k], kinds):
                    raise Bad(f"{where}.{k} must be a {kinds.__name__}, got {type(t[k]).__name__}", "tools")
                fn[k] = t[k]
        out.append({"type": "function", "function": {k: v for k, v in fn.items() if v is not None}})
    return out


def _tool_choice(choice: Any) -> Any:
    if choice is None or choice in ("auto", "none", "required"):
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    raise Bad(f'tool_choice must be "auto", "none", "required" or {{"type": "function", "name": ...}}; got '
              f"{str(choice)[:120]}", "tool_choice")  # fmt: skip


def _format(text: Any) -> dict[str, Any] | None:
    """Chat's response_format of a Responses ``text`` config."""
    if text is None:
        return None
    fmt = text.get("format") if isinstance(text, dict) else None
    if not isinstance(text, dict) or (fmt is not None and not isinstance(fmt, dict)):
        raise Bad('text must be an object such as {"format": {"type": "text"}}', "text")
    kind = (fmt or {}).get("type", "text")
    if kind == "json_schema":
        if not isinstance(fmt, dict) or not isinstance(fmt.get("schema"), dict):
            raise Bad('text.format json_schema needs a "schema" (a JSON Schema object)', "text")
        return {"type": "json_schema", "json_schema": {"name": fmt.get("name", "reply"), "schema": fmt["schema"]}}
    if kind in ("text", "json_object"):
        return {"type": kind}
    raise Bad(f"text.format.type must be text, json_object or json_schema; got {kind!r}", "text")


#: The one ``include`` value this server can fill.
LOGPROBS = "message.output_text.logprobs"


def wants_logprobs(body: ResponsesRequest) -> bool:
    """Whether the answer's logprobs are asked for; raises Bad for an ``include`` value this server cannot fill."""
    for i, v in enumerate(body.include or []):
        if v != LOGPROBS:
            raise Bad(f"include[{i}] {v!r} is not supported: this server runs function tools only and can include "
                      f"{LOGPROBS!r}", "include")  # fmt: skip
    return LOGPROBS in (body.include or []) or bool(body.top_logprobs)


def _template_kwargs(body: ResponsesRequest, tok: Any) -> Any:
    """chat_template_kwargs with ``reasoning.effort`` mapped onto the template's thinking switch."""
    r = body.reasoning
    if r is None:
        return body.chat_template_kwargs
    if not isinstance(r, dict):
        raise Bad(f'reasoning must be an object such as {{"effort": "low"}}, got {type(r).__name__}', "reasoning")
    effort = r.get("effort")
    if effort is None:
        return body.chat_template_kwargs
    if effort not in EFFORTS:
        raise Bad(f"reasoning.effort must be one of {', '.join(EFFORTS)}; got {effort!r}", "reasoning")
    th = thinking_of(tok)
    if th.switch is None:
        what = "always thinks" if th.thinks else "does not think"
        raise Bad(f"reasoning.effort: this model's chat template {what} and has no switch for thinking, so the "
                  "effort cannot be honoured; leave reasoning out", "reasoning")  # fmt: skip
    kw = body.chat_template_kwargs
    kw = dict(kw) if isinstance(kw, dict) else {} if kw is None else kw
    if isinstance(kw, dict):
        on = effort not in EFFORT_OFF
        if th.switch in kw and kw[th.switch] is not on:
            raise Bad(f"reasoning.effort {effort!r} turns thinking {'on' if on else 'off'} but chat_template_kwargs "
                      f"sets {th.switch} to {kw[th.switch]!r}; send one of the two", "reasoning")  # fmt: skip
        kw[th.switch] = on
    return kw


def chat_request(body: ResponsesRequest, messages: list[dict[str, Any]], tok: Any) -> ChatCompletionRequest:
    """The chat request a response runs as (``messages``: the conversation, instructions first)."""
    for field in ECHOED:  # (sent back in the response object, which must encode as UTF-8)
        try:
            json.dumps(getattr(body, field), ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError as err:
            raise Bad(f"{field} holds text that is not valid Unicode (a lone surrogate); send valid UTF-8 text",
                      field) from err  # fmt: skip
    if body.background:
        raise Bad("background responses are not supported: every response is answered in its request; leave "
                  "background out", "background")  # fmt: skip
    if not messages:
        raise Bad("input is empty: give a string or a list of items (messages, function_call_output, ...)", "input")
    meta = body.metadata or {}
    if len(meta) > 16 or any(len(k) > 64 or len(v) > 512 for k, v in meta.items()):
        raise Bad("metadata holds at most 16 pairs, keys of at most 64 characters and values of at most 512",
                  "metadata")  # fmt: skip
    d = {"model": body.model, "messages": messages, "stream": bool(body.stream), "tool_call_stream": "fragments",
         "temperature": body.temperature, "top_p": body.top_p, "seed": body.seed,
         "max_completion_tokens": body.max_output_tokens, "tools": _tools(body.tools),
         "tool_choice": _tool_choice(body.tool_choice), "parallel_tool_calls": body.parallel_tool_calls,
         "chat_template_kwargs": _template_kwargs(body, tok), "response_format": _format(body.text)}  # fmt: skip
    try:
        return ChatCompletionRequest.model_validate(d)
    except ValidationError as err:
        e = err.errors()[0]
        loc = ".".join(str(x) for x in e.get("loc", ()))
        raise Bad(f"input: {loc}: {e.get('msg')}", "input") from err


def usage_of(base: dict[str, Any], split: ChoiceSplit) -> dict[str, Any]:
    """Responses usage of the engine's counts (``cache_write_tokens``: the prompt tokens read into the slot's
    cache, where a follow-up finds them)."""
    cached = base["prompt_tokens_details"]["cached_tokens"]
    return {"input_tokens": base["prompt_tokens"], "output_tokens": base["completion_tokens"],
            "total_tokens": base["total_tokens"],
            "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": base["prompt_tokens"] - cached},
            "output_tokens_details": {"reasoning_tokens": split.reasoning_tokens()}}  # fmt: skip


def add_responses(app: FastAPI, opts: ServeOptions, path: ChatPath) -> Kept:
    """Registers ``/v1/responses`` on ``app``; returns the kept responses."""
    kept = Kept(opts.responses_keep, opts.responses_ttl)
    name = opts.model_name

    def shell(body: ResponsesRequest, rid: str, created: int) -> dict[str, Any]:
        """The response object before its output (status in_progress)."""
        effort = body.reasoning.get("effort") if isinstance(body.reasoning, dict) else None
        return {"id": rid, "object": "response", "created_at": created, "status": "in_progress", "background": False,
                "error": None, "incomplete_details": None, "instructions": body.instructions,
                "max_output_tokens": body.max_output_tokens, "model": name, "output": [],
                "parallel_tool_calls": body.parallel_tool_calls is not False,
                "previous_response_id": body.previous_response_id,
                "reasoning": {"effort": effort, "summary": None}, "store": body.store is not False,
                "temperature": 1.0 if body.temperature is None else body.temperature,
                "text": body.text if isinstance(body.text, dict) else {"format": {"type": "text"}},
                "tool_choice": body.tool_choice or "auto", "tools": body.tools or [],
                "top_p": 1.0 if body.top_p is None else body.top_p, "truncation": "disabled", "usage": None,
                "user": body.user, "metadata": body.metadata or {}}  # fmt: skip

    def finished(resp: dict[str, Any], out: Output, cut: bool, usage: dict[str, Any]) -> dict[str, Any]:
        done = {**resp, "status": "incomplete" if cut else "completed", "output": out.items, "usage": usage,
                "incomplete_details": {"reason": "max_output_tokens"} if cut else None}  # fmt: skip
        if not cut:
            done["completed_at"] = int(time.time())
        return done

    def keep(body: ResponsesRequest, resp: dict[str, Any], before: list[dict[str, Any]]) -> None:
        if body.store is not False:
            kept.put(resp["id"], resp, before + conversation(resp["output"], "output"), input_items(body.input))

    def missing(rid: str, param: str) -> Exception:
        return path.error(404, f"No response with id {rid!r} is kept on this server (responses are kept "
                          f"{opts.responses_ttl:g} s, at most {opts.responses_keep}, unless store is false); send "
                          "the whole conversation as input instead", param, "previous_response_not_found"
                          if param == "previous_response_id" else "response_not_found")  # fmt: skip

    @app.post("/v1/responses")
    async def create(request: Request, body: ResponsesRequest) -> Any:
        path.check_model(body.model)
        e = path.eng()
        before: list[dict[str, Any]] = []
        if body.previous_response_id is not None:
            prior = kept.get(body.previous_response_id)
            if prior is None:
                raise missing(body.previous_response_id, "previous_response_id")
            before = list(prior.messages)
        try:
            before = before + conversation(body.input)
            system = [{"role": "system", "content": body.instructions}] if body.instructions is not None else []
            chat = chat_request(body, system + before, e.tok)
            lp = wants_logprobs(body)
        except Bad as err:
            raise path.error(400, str(err), err.param) from err
        rp, call, ids = await asyncio.to_thread(path.render, e, chat, "input")
        top = body.top_logprobs or 0
        sp = path.params(e, chat, len(ids), body.max_output_tokens, lp, top, "input", "max_output_tokens")
        flight = await path.start(e, [ids], sp, chat, call)
        rid = item_id("resp")
        resp = shell(body, rid, flight.created)
        if body.stream:
            path.count(request.url.path, 200)
            lp_tok = e.tok if lp else None
            return Stream(flight, stream(flight, rp, body, resp, before, lp_tok), media_type="text/event-stream")
        got = await outcome(request, flight)
        if got is None:
            path.count(request.url.path, 499)
            return JSONResponse(error_body("client disconnected"), status_code=499)
        if got.failed is not None:
            st = got.failed.status
            raise path.error(st, got.failed.error or "failed", None, None,
                             "server_error" if st >= 500 else "invalid_request_error")  # fmt: skip
        split = ChoiceSplit(rp, fragments=False)
        out = Output()
        items = split.feed(got.texts[0], [t.offset for t in got.toks[0]], end=True)
        if lp:
            out.logprobs(chat_logprobs(e.tok, split.answer_tokens(got.toks[0]))["content"])
        out.feed(items)
        cut = got.finish[0] == "length"
        out.finish(cut)
        done = finished(resp, out, cut, usage_of(flight.usage(), split))
        keep(body, done, before)
        path.count(request.url.path, 200)
        return done

    async def stream(flight: Flight, rp: ReplyPlan, body: ResponsesRequest, resp: dict[str, Any],
                     before: list[dict[str, Any]], lp_tok: Any) -> AsyncIterator[str]:  # fmt: skip
        """The stream's events (``lp_tok``: the tokenizer when the answer's logprobs are asked for, else None)."""
        out = Output()
        split = ChoiceSplit(rp)
        out.event("response.created", response=resp)
        out.event("response.in_progress", response=resp)
        cut = False
        try:
            async for _, ev in flight.events():
                if ev.error is not None:
                    flight.cancel()
                    kind = "server_error" if ev.status >= 500 else "invalid_request_error"
                    out.event("error", code=kind, message=ev.error, param=None)
                    failed = {**resp, "status": "failed", "output": out.items,
                              "error": {"code": "server_error", "message": ev.error}}  # fmt: skip
                    out.event("response.failed", response=failed)
                    for x in out.drain():
                        yield sse(x, x["type"])
                    return
                items = split.feed(ev.text, [t.offset for t in ev.tokens], ev.finish is not None)
                if lp_tok is not None:
                    out.logprobs(chat_logprobs(lp_tok, split.answer_tokens(ev.tokens))["content"])
                out.feed(items)
                cut = ev.finish == "length"
                for x in out.drain():
                    yield sse(x, x["type"])
            out.finish(cut)
            done = finished(resp, out, cut, usage_of(flight.usage(), split))
            keep(body, done, before)
            out.event("response.incomplete" if cut else "response.completed", response=done)
            for x in out.drain():
                yield sse(x, x["type"])
        finally:
            flight.cancel()  # (a no-op when the reply finished; frees the slot when the client left)

    @app.get("/v1/responses/{response_id}")
    async def retrieve(response_id: str) -> Any:
        got = kept.get(response_id)
        if got is None:
            raise missing(response_id, "response_id")
        return got.response

    @app.get("/v1/responses/{response_id}/input_items")
    async def items(response_id: str, limit: Any = 20, order: Any = "desc", after: Any = None,
                    before: Any = None) -> Any:  # fmt: skip
        got = kept.get(response_id)
        if got is None:
            raise missing(response_id, "response_id")
        try:
            return page(got.items, limit, order, after, before)
        except Bad as err:
            raise path.error(400, str(err), err.param) from err

    @app.delete("/v1/responses/{response_id}")
    async def delete(response_id: str) -> Any:
        if not kept.delete(response_id):
            raise missing(response_id, "response_id")
        return {"id": response_id, "object": "response.deleted", "deleted": True}

    return kept
