"""Tool calling in OpenAI's shape: ``tools``, ``tool_choice``, ``parallel_tool_calls``, the calls parsed out of
the model's reply into ``message.tool_calls`` (``delta.tool_calls`` when streamed).

The model's own chat template renders the tools and the conversation (``apply_chat_template(..., tools=)``:
earlier calls as the assistant's ``tool_calls``, results as ``role: "tool"`` messages). How a reply marks a
call is the template's, recognised from its source (``syntax_of``):
- ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks (Qwen 2.5 / Qwen 3, Hermes, SmolLM3
  and other Hermes-style templates), anywhere in the reply, several allowed;
- a reply that is one JSON object ``{"name": ..., "parameters": {...}}`` (Llama 3.1 / 3.2 templates).
A template that never mentions tools has no tool support: such a request is refused (400) unless
``tool_choice`` is ``"none"``, which never renders tools.

``tool_choice``: ``"auto"`` (the default with tools) lets the model answer or call, and parses what it
wrote: a block that is not a JSON object with a string ``name`` stays in the text. ``"required"`` and a
named function are enforced by constrained decoding: the call's opening marker is appended to the prompt
and the reply is held by llguidance to a JSON object whose ``name`` is one of the allowed functions and
whose arguments follow that function's ``parameters`` schema (objects that list their properties take no
others, as OpenAI's strict mode), so the call is valid whatever the weights (cut only by ``max_tokens``).
Unless ``parallel_tool_calls`` is false, a forced reply may hold several calls, one block after another
(the grammar is then Lark: each call that JSON schema, the template's close and open markers between them;
Llama 3 JSON replies hold one). ``"none"``: the tools are not rendered and nothing is parsed.
``parallel_tool_calls: false`` keeps only the first call of an ``auto`` reply and forces one call.
Parsing replies, whole or in fragments as they stream: calls.py.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from .calls import HERMES, LLAMA3_JSON, CallStream, CallSyntax, split_reply  # noqa: F401  (re-exported)
from .schema import FieldError


class ToolError(FieldError):
    """A tools request this server cannot honour for this model; ``param`` names the field."""

    def __init__(self, message: str, param: str = "tools") -> None:
        super().__init__(message, param)


def template_source(tok: Any) -> str:
    t = getattr(tok, "chat_template", None)
    if isinstance(t, dict):  # named templates: the tool one when there is one
        t = t.get("tool_use") or t.get("default") or ""
    return t or ""


def syntax_of(tok: Any) -> CallSyntax | None:
    """The call syntax of the tokenizer's chat template; None when the template does not render tools."""
    src = template_source(tok)
    if "tools" not in src:
        return None
    if "<tool_call>" in src:
        return HERMES
    if "<|python_tag|>" in src or '"parameters"' in src:
        return LLAMA3_JSON
    raise ToolError("this model's chat template renders tools, but marks calls in a way this server does not parse "
                    "(known: <tool_call> JSON blocks as Qwen / Hermes templates, Llama 3 JSON replies); send the "
                    "request without tools")  # fmt: skip


@dataclass
class ToolPlan:
    """What one chat request's tools ask of generation."""

    tools: list[dict[str, Any]]  # OpenAI tool objects, as the template receives them
    syntax: CallSyntax
    forced: list[str] | None = None  # the reply must call one of these (required / named), else None
    parallel: bool = True
    names: list[str] = field(default_factory=list)

    def suffix(self) -> str:
        """Text appended to the prompt when a call is forced: the call's opening marker."""
        return self.syntax.open + "\n" if self.forced and self.syntax.open else ""

    def schema(self, tools: list[Any]) -> dict[str, Any]:
        """JSON Schema of a forced call: ``{"name": one of forced, <args key>: its parameters}``."""
        key = self.syntax.args_key
        options, defs = [], {}
        for t in tools:
            if t.function.name in (self.forced or []):
                params = _closed(t.function.parameters or {"type": "object", "properties": {}})
                params, own = _hoist(params, t.function.name)
                defs.update(own)
                options.append({"type": "object", "properties": {"name": {"const": t.function.name}, key: params},
                                "required": ["name", key], "additionalProperties": False})  # fmt: skip
        schema: dict[str, Any] = options[0] if len(options) == 1 else {"anyOf": options}
        if defs:
            schema["$defs"] = defs
        # (written as the templates write calls, with Python's json.dumps separators)
        return {**schema, "x-guidance": {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}}

    def several(self) -> bool:
        """A forced reply may hold several calls (parallel_tool_calls allows it and calls have markers)."""
        return bool(self.forced) and self.parallel and bool(self.syntax.open)

    def lark(self, schema: dict[str, Any], tok: Any) -> str:
        """llguidance grammar (Lark) of a forced reply of one or more calls, each held to ``schema``, one
        block after another, the last block closed or not: ``call (close open call)* close?`` (the reply may end
        after a call, or after its close marker, as the templates' models write it). A marker that is one token
        of the tokenizer is named by its id (llguidance matches added tokens only so)."""

        def marker(text: str) -> str:
            ids = tok.encode(text, add_special_tokens=False)
            return f"<[{ids[0]}]>" if len(ids) == 1 and ids[0] in tok.added_tokens_decoder else json.dumps(text)

        close, opening = f'"\\n" {marker(self.syntax.close)}', f'"\\n" {marker(self.syntax.open)} "\\n"'
        return (f"start: call (close opening call)* close?\nclose: {close}\nopening: {opening}\n"
                f"call: %json {json.dumps(schema)}\n")  # fmt: skip

    def stream(self, fragments: bool) -> CallStream:
        """A CallStream for one choice's reply (a forced reply starts inside its first call's block)."""
        if self.forced:
            return CallStream(self.syntax, self.several(), self.forced, fragments, inside=bool(self.syntax.open))
        return CallStream(self.syntax, self.parallel, self.names, fragments)


def _hoist(params: dict[str, Any], fn: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """A function's parameters nest inside the call's schema, where ``#/$defs/x`` would point at the call's
    root: its definitions move there, renamed ``<function>__x`` (two functions may both define ``x``), and
    its references follow. References to the parameters' own root (``#``, ``#/properties/...``: a recursive
    schema, which ``response_format`` takes at the root) follow the parameters themselves, moved to
    ``$defs/<function>__root``. Other references (not into the document) are a 400."""
    moved = {}
    for where in ("$defs", "definitions"):
        for k, v in (params.pop(where, None) or {}).items():
            moved[f"#/{where}/{k}"] = (f"{fn}__{k}", v)
    root = f"{fn}__root"
    rooted = False

    def fix(x: Any) -> Any:
        nonlocal rooted
        if isinstance(x, list):
            return [fix(v) for v in x]
        if not isinstance(x, dict):
            return x
        out = {k: fix(v) for k, v in x.items()}
        ref = out.get("$ref")
        if isinstance(ref, str) and (ref == "#" or ref.startswith("#/")):
            hit = next((p for p in moved if ref == p or ref.startswith(p + "/")), None)
            if hit is not None:
                out["$ref"] = "#/$defs/" + moved[hit][0] + ref[len(hit) :]
            else:
                out["$ref"] = "#/$defs/" + root + ref[1:]
                rooted = True
        elif isinstance(ref, str):
            raise ToolError(f"tools: function {fn!r}: $ref {ref!r} does not point into the schema itself; only "
                            "references starting with '#' are supported", "tools")  # fmt: skip
        return out

    fixed, defs = fix(params), {name: fix(v) for name, v in moved.values()}
    if rooted:
        defs[root] = fixed
        fixed = {"$ref": f"#/$defs/{root}"}
    return fixed, defs


def _closed(schema: Any, close: bool = True) -> Any:
    """The schema with ``additionalProperties: false`` wherever an object lists its properties and says
    nothing of others (OpenAI's strict mode): a forced call writes only the arguments the function names,
    so weights that ramble cannot invent keys without end. The branches of an ``allOf`` are not closed
    themselves (each lists only its own properties: closed, no object could satisfy them all)."""
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    for key in ("properties", "$defs", "definitions", "patternProperties"):  # name -> schema maps
        if isinstance(out.get(key), dict):
            out[key] = {name: _closed(sub) for name, sub in out[key].items()}
    for key in ("items", "additionalItems", "not", "if", "then", "else"):
        if isinstance(out.get(key), dict):
            out[key] = _closed(out[key])
    for key in ("anyOf", "oneOf", "allOf", "prefixItems"):
        if isinstance(out.get(key), list):
            out[key] = [_closed(sub, key != "allOf") for sub in out[key]]
    if close and "properties" in out and "additionalProperties" not in out and "allOf" not in out:
        out["additionalProperties"] = False
    return out


def plan(body: Any, tok: Any) -> ToolPlan | None:
    """The request's ToolPlan, or None when no tool can be called (no tools, or ``tool_choice: "none"``)."""
    choice = body.tool_choice
    if not body.tools:
        if choice is not None and choice != "none":
            raise ToolError("tool_choice needs tools: send the functions in 'tools', or leave tool_choice out",
                            "tool_choice")  # fmt: skip
        return None
    if choice == "none":
        return None
    names = [t.function.name for t in body.tools]
    if len(set(names)) != len(names):
        raise ToolError(f"tools: each function needs its own name; got {names}", "tools")
    for t in body.tools:
        params = t.function.parameters
        if params is not None and (not isinstance(params, dict) or params.get("type", "object") != "object"):
            # OpenAI's rule: a call's arguments are one JSON object, so its schema must describe an object.
            raise ToolError(f"tools: function {t.function.name!r}: parameters must be a JSON Schema of an object "
                            f'(type "object"), got {json.dumps(params)[:200]}', "tools")  # fmt: skip
    syntax = syntax_of(tok)
    if syntax is None:
        raise ToolError("this model's chat template has no tool support (it never renders 'tools'); send the request "
                        "without tools or with tool_choice 'none', or serve a model whose template has tools "
                        "(e.g. Qwen 2.5 / Qwen 3, Llama 3.1+)")  # fmt: skip
    forced = None
    if choice == "required":
        forced = names
    elif choice is not None and choice != "auto":
        if choice.function.name not in names:
            raise ToolError(f"tool_choice names the function {choice.function.name!r}, which is not in tools "
                            f"({', '.join(names)})", "tool_choice")  # fmt: skip
        forced = [choice.function.name]
    tools = [t.model_dump(exclude_none=True) for t in body.tools]
    return ToolPlan(tools, syntax, forced, body.parallel_tool_calls is not False, names)


def messages(msgs: list[Any]) -> list[dict[str, Any]]:
    """OpenAI chat messages as chat templates take them: ``developer`` as ``system``; an assistant's calls
    with their arguments as objects (templates write them with ``tojson``), its ``reasoning_content`` as
    such (the template keeps or drops it: Qwen 3 drops it from turns before the last user message); no
    ``None`` content."""
    out = []
    for m in msgs:
        d: dict[str, Any] = {"role": "system" if m.role == "developer" else m.role, "content": m.text()}
        if m.tool_calls:
            d["tool_calls"] = [{"id": c.id, "type": "function",
                                "function": {"name": c.function.name, "arguments": _arguments(c.function.arguments)}}
                               for c in m.tool_calls]  # fmt: skip
        if m.reasoning_content is not None and m.role == "assistant":  # (as Qwen 3's template reads it)
            d["reasoning_content"] = m.reasoning_content
        if m.tool_call_id is not None:
            d["tool_call_id"] = m.tool_call_id
        if m.name is not None:
            d["name"] = m.name
        out.append(d)
    return out


def _arguments(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text  # (not JSON: the template writes it as it came)
