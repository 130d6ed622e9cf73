"""The OpenAI-compatible server, through the real ``openai`` client, on the real SmolLM2-135M-Instruct.

Greedy completions are compared with ``KwkDecoder.generate`` on a decoder of its own (the reference);
errors are checked for their status, OpenAI shape and message, and the server is checked to keep
serving after each. Measured here: the served bf16 rows differ from the same row computed alone only by
the panel kernel's summation order (max |logit difference| below 2e-4 on logits of magnitude ~30), so
greedy tokens agree on these prompts; at int8/int4 rows are bit-identical whatever the batch.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import openai
import pytest
import torch

from kwker_torch.decoder import KwkDecoder
from kwker_torch.serve import ServeOptions, create_app, engine_for
from kwker_torch.serve.background import Background
from kwker_torch.serve.engine import Engine
from kwker_torch.testing import chat_ids

pytestmark = pytest.mark.slow
MODEL = "SmolLM2-135M-Instruct"
CTX = 1024


@pytest.fixture(scope="module")
def server(smollm2: Any) -> Iterator[tuple[Background, Engine]]:
    model, tok = smollm2
    opts = ServeOptions(slots=4, max_context=CTX, queue=16, prefill_chunk=32)
    engine = engine_for(model, tok, opts)
    run = Background(create_app(opts, engine=engine))
    yield run, engine
    run.stop()
    engine.shutdown(grace=5)


@pytest.fixture(scope="module")
def ref(smollm2: Any) -> KwkDecoder:
    return KwkDecoder.from_hf(smollm2[0], max_batch=1, max_context=CTX)


@pytest.fixture
def client(server: tuple[Background, Engine]) -> openai.OpenAI:
    return openai.OpenAI(base_url=server[0].url + "/v1", api_key="none", max_retries=0, timeout=120)


def reference(ref: KwkDecoder, tok: Any, ids: list[int], n: int) -> tuple[str, int]:
    """(text, tokens) of a greedy completion alone, on the reference decoder."""
    out = ref.generate(ids, n, prompt_cache=False)
    toks = out.tokens[:-1] if out.finish_reason == "stop" else out.tokens
    return tok.decode(toks, skip_special_tokens=True), len(out.tokens)


def chat(q: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": q}]


QUESTIONS = ["What is the capital of France?", "Name three colours of the rainbow.", "Write a haiku about rain.",
             "How many legs does a spider have?", "Give me a tip for sleeping well."]  # fmt: skip


def test_models_and_health(client: openai.OpenAI, server: tuple[Background, Engine]) -> None:
    assert [m.id for m in client.models.list().data] == [MODEL]
    assert client.models.retrieve(MODEL).id == MODEL
    h = httpx.get(server[0].url + "/health").json()
    assert h["status"] == "ok" and h["slots"] == 4


def test_concurrent_greedy_chats_equal_generate_alone(client: openai.OpenAI, server: Any, ref: KwkDecoder,
                                                      smollm2: Any) -> None:  # fmt: skip
    tok = smollm2[1]
    expect = [reference(ref, tok, chat_ids(tok, chat(q))[0].tolist(), 40) for q in QUESTIONS]
    steps = server[1].steps

    def ask(q: str) -> Any:
        return client.chat.completions.create(model=MODEL, messages=chat(q), temperature=0, max_tokens=40)

    with ThreadPoolExecutor(len(QUESTIONS)) as pool:  # 5 requests, 4 slots: one waits for a free slot
        got = list(pool.map(ask, QUESTIONS))
    for r, (text, n) in zip(got, expect, strict=True):
        assert r.choices[0].message.content == text
        assert r.usage.completion_tokens == n
        assert r.choices[0].finish_reason == ("length" if n == 40 else "stop")
    assert server[1].steps > steps and server[1].max_rows >= 2  # requests shared decoder steps


def test_stream_equals_whole_response_with_usage(client: openai.OpenAI) -> None:
    whole = client.chat.completions.create(model=MODEL, messages=chat(QUESTIONS[2]), temperature=0, max_tokens=30)
    chunks = list(client.chat.completions.create(model=MODEL, messages=chat(QUESTIONS[2]), temperature=0,
                                                 max_tokens=30, stream=True,
                                                 stream_options={"include_usage": True}))  # fmt: skip
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert chunks[0].choices[0].delta.role == "assistant"
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == [whole.choices[0].finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


def test_completions_with_text_and_token_prompts(client: openai.OpenAI, ref: KwkDecoder, smollm2: Any) -> None:
    tok = smollm2[1]
    prompt = "The three primary colours are"
    ids = tok(prompt)["input_ids"]
    text, _ = reference(ref, tok, ids, 12)
    a = client.completions.create(model=MODEL, prompt=prompt, max_tokens=12, temperature=0)
    b = client.completions.create(model=MODEL, prompt=ids, max_tokens=12, temperature=0, echo=True)
    assert a.choices[0].text == text and a.usage.prompt_tokens == len(ids)
    assert b.choices[0].text == tok.decode(ids) + text
    two = client.completions.create(model=MODEL, prompt=[prompt, "Paris is"], max_tokens=5, temperature=0)
    assert [c.index for c in two.choices] == [0, 1] and two.choices[0].text == text[: len(two.choices[0].text)]


def test_stop_string_across_token_boundaries(client: openai.OpenAI, ref: KwkDecoder, smollm2: Any) -> None:
    tok = smollm2[1]
    ids = chat_ids(tok, chat(QUESTIONS[4]))[0].tolist()
    text, _ = reference(ref, tok, ids, 40)
    out = ref.generate(ids, 40, prompt_cache=False).tokens
    pieces = [tok.decode(out[: i + 1], skip_special_tokens=True) for i in range(len(out))]
    # A stop string that starts inside one token (of 3 to 5 characters) and ends inside a later one.
    cut = next(i for i in range(5, len(pieces)) if 3 <= len(pieces[i]) - len(pieces[i - 1]) <= 5)
    start = len(pieces[cut - 1]) + 1
    stop = text[start : start + 5]
    assert len(stop) == 5 and text.find(stop) == start and start + 5 > len(pieces[cut])
    for stream in (False, True):
        kw: dict[str, Any] = dict(model=MODEL, messages=chat(QUESTIONS[4]), temperature=0, max_tokens=40, stop=[stop])
        if stream:
            chunks = list(client.chat.completions.create(stream=True, **kw))
            got = "".join(c.choices[0].delta.content or "" for c in chunks)
            why = [c.choices[0].finish_reason for c in chunks if c.choices[0].finish_reason]
        else:
            r = client.chat.completions.create(**kw)
            got, why = r.choices[0].message.content, [r.choices[0].finish_reason]
        assert got == text[:start] and why == ["stop"]


def test_n_choices_seeded_sampling_and_greedy(client: openai.OpenAI, ref: KwkDecoder, smollm2: Any) -> None:
    kw: dict[str, Any] = dict(model=MODEL, messages=chat(QUESTIONS[2]), max_tokens=16, n=3)
    a = client.chat.completions.create(temperature=0.9, top_p=0.95, seed=7, **kw)
    b = client.chat.completions.create(temperature=0.9, top_p=0.95, seed=7, **kw)
    texts = [c.message.content for c in a.choices]
    assert [c.index for c in a.choices] == [0, 1, 2]
    assert texts == [c.message.content for c in b.choices]  # seeded: reproducible
    assert len(set(texts)) > 1  # each choice draws its own tokens
    assert a.usage.prompt_tokens == b.usage.prompt_tokens and a.usage.completion_tokens == 48
    # One sampler: choice j draws what the native loop draws for seed 7 + j (same rule, same random stream;
    # without drafts, which verify sampled tokens with draws of their own).
    ids = chat_ids(smollm2[1], chat(QUESTIONS[2]))[0]
    for j, text in enumerate(texts):
        out = ref.generate(ids, 16, temperature=0.9, top_p=0.95, seed=7 + j, prompt_lookup=0, prompt_cache=False)
        toks = out.tokens[:-1] if out.finish_reason == "stop" else out.tokens
        assert text == smollm2[1].decode(toks, skip_special_tokens=True), j
    g = client.chat.completions.create(temperature=0, **kw)
    text, _ = reference(ref, smollm2[1], chat_ids(smollm2[1], chat(QUESTIONS[2]))[0].tolist(), 16)
    assert [c.message.content for c in g.choices] == [text] * 3


def test_logprobs_are_the_models(client: openai.OpenAI, ref: KwkDecoder, smollm2: Any) -> None:
    tok = smollm2[1]
    r = client.chat.completions.create(model=MODEL, messages=chat(QUESTIONS[0]), temperature=0, max_tokens=8,
                                       logprobs=True, top_logprobs=3)  # fmt: skip
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens - (r.choices[0].finish_reason == "stop")
    ids = chat_ids(tok, chat(QUESTIONS[0]))[0].tolist()
    gen = ref.generate(ids, 8, prompt_cache=False).tokens[: len(content)]
    lsm = torch.log_softmax(ref.score(ids + gen)[len(ids) - 1 : -1], dim=-1)
    for i, entry in enumerate(content):
        assert [t.token for t in entry.top_logprobs][0] == entry.token  # greedy: the chosen is the top one
        assert entry.logprob == pytest.approx(float(lsm[i, gen[i]]), abs=2e-3)
        assert [t.logprob for t in entry.top_logprobs] == sorted((t.logprob for t in entry.top_logprobs), reverse=True)
    assert b"".join(bytes(e.bytes) for e in content).decode() == r.choices[0].message.content  # each token's bytes
    c = client.completions.create(model=MODEL, prompt="One, two, three,", max_tokens=4, temperature=0, logprobs=2)
    lp = c.choices[0].logprobs
    assert "".join(lp.tokens) == c.choices[0].text and lp.text_offset[0] == 0 and len(lp.top_logprobs[0]) == 2


def test_json_schema_and_json_object(client: openai.OpenAI) -> None:
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
              "required": ["name", "age"], "additionalProperties": False}  # fmt: skip
    r = client.chat.completions.create(model=MODEL, messages=chat("Describe a person as JSON."), temperature=0,
                                       max_tokens=60, response_format={"type": "json_schema", "json_schema": {
                                           "name": "person", "schema": schema}})  # fmt: skip
    obj = json.loads(r.choices[0].message.content)
    assert set(obj) == {"name", "age"} and isinstance(obj["name"], str) and isinstance(obj["age"], int)
    assert r.choices[0].finish_reason == "stop"
    o = client.chat.completions.create(model=MODEL, messages=chat("A JSON object about cats."), temperature=0,
                                       max_tokens=80, response_format={"type": "json_object"})  # fmt: skip
    if o.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(o.choices[0].message.content), dict)
    else:  # cut by max_tokens: still the start of a JSON object
        assert o.choices[0].message.content.lstrip().startswith("{")
    with pytest.raises(openai.BadRequestError, match="cannot be enforced.*nope"):
        client.chat.completions.create(model=MODEL, messages=chat("x"), response_format={"type": "json_schema",
                                       "json_schema": {"name": "b", "schema": {"$ref": "#/nope"}}})  # fmt: skip


def penalised_greedy(ref: KwkDecoder, ids: list[int], n: int, eos: set[int], freq: float = 0.0, pres: float = 0.0,
                     rep: float = 1.0, bias: dict[int, float] | None = None) -> list[int]:  # fmt: skip
    """Greedy tokens on the reference decoder with the penalties applied by their definitions (OpenAI's
    frequency / presence over the output, Hugging Face's repetition over prompt and output, logit_bias)."""
    ref.reset(0)
    logits = ref.step([(0, ids)])[0][-1]
    out: list[int] = []
    for _ in range(n):
        x = logits.double().clone()
        for t in set(ids) | set(out):
            x[t] = x[t] / rep if x[t] > 0 else x[t] * rep
        for t in set(out):
            x[t] -= freq * out.count(t) + pres
        for t, b in (bias or {}).items():
            x[t] += b
        tok = int(torch.argmax(x))
        out.append(tok)
        if tok in eos:
            break
        logits = ref.step([(0, [tok])])[0][-1]
    return out


def test_penalties_and_logit_bias_change_greedy_text_as_defined(client: openai.OpenAI, ref: KwkDecoder,
                                                                server: Any, smollm2: Any) -> None:  # fmt: skip
    tok = smollm2[1]
    msgs = chat("Write a short poem about the sea, the sea and the sea.")
    ids = chat_ids(tok, msgs)[0].tolist()
    eos = server[1].eos
    plain = penalised_greedy(ref, ids, 40, eos)
    banned = plain[0]  # the first greedy token, biased away
    cases = [dict(freq=1.2), dict(pres=1.5), dict(rep=1.5), dict(freq=0.4, pres=0.4, rep=1.2, bias={banned: -100.0})]
    for case in cases:
        want = penalised_greedy(ref, ids, 40, eos, **case)  # type: ignore[arg-type]
        assert want != plain  # (each setting changes this text, so the comparison below can fail)
        body: dict[str, Any] = {"frequency_penalty": case.get("freq"), "presence_penalty": case.get("pres"),
                                "logit_bias": {str(k): v for k, v in case.get("bias", {}).items()} or None}  # fmt: skip
        extra = {"repetition_penalty": case["rep"]} if "rep" in case else None
        r = client.chat.completions.create(model=MODEL, messages=msgs, temperature=0, max_tokens=40, extra_body=extra,
                                           **{k: v for k, v in body.items() if v is not None})  # fmt: skip
        text = tok.decode([t for t in want if t not in eos], skip_special_tokens=True)
        assert r.choices[0].message.content == text, case
        assert r.usage.completion_tokens == len(want)
    # logit_bias +100 on one token: greedy writes only that token.
    r = client.chat.completions.create(model=MODEL, messages=msgs, temperature=0, max_tokens=5, logit_bias={"28": 100})
    assert r.choices[0].message.content == tok.decode([28] * 5)


def _still_serving(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(model=MODEL, messages=chat("Hi"), temperature=0, max_tokens=3)
    assert r.choices[0].message.content


def test_bad_requests_get_openai_errors_and_the_server_keeps_serving(client: openai.OpenAI, server: Any) -> None:
    url = server[0].url
    cases: list[tuple[Any, int, str, str | None]] = [
        (b'{"model": "x", "messages": [', 400, "not valid JSON", None),
        ({"model": MODEL, "messages": chat("hi"), "max_tokens": "5"}, 400, "max_tokens", "max_tokens"),
        ({"model": MODEL, "messages": chat("hi"), "temperature": "hot"}, 400, "temperature", "temperature"),
        ({"model": MODEL, "messages": []}, 400, "messages", "messages"),
        ({"model": MODEL, "messages": chat("hi"), "stream": 1}, 400, "stream", "stream"),
        ({"model": MODEL, "messages": chat("word " * 1100)}, 400, "maximum context length is 1024", "messages"),
        ({"model": MODEL, "messages": chat("hi"), "max_tokens": 2000}, 400, "Lower max_tokens", "max_tokens"),
        ({"model": "gpt-4o", "messages": chat("hi")}, 404, "'gpt-4o' does not exist", "model"),
        ({"model": MODEL, "messages": chat("hi"), "n": 64}, 400, "more than this server holds", "n"),
        ({"model": MODEL, "messages": chat("hi"), "response_format": {"type": "yaml"}}, 400, "yaml", "response_format"),
        ({"model": MODEL, "messages": chat("hi"), "logit_bias": {"42": 500}}, 400, "[-100, 100]", "logit_bias"),
        ({"model": MODEL, "messages": chat("hi"), "logit_bias": {"x": 1}}, 400, "token ids", "logit_bias"),
        ({"model": MODEL, "messages": chat("hi"), "logit_bias": {"99999999": 1}}, 400, "out of range", "logit_bias"),
        ({"model": MODEL, "messages": chat("hi"), "presence_penalty": 2.5}, 400, "presence_penalty",
         "presence_penalty"),
        ({"model": MODEL, "messages": chat("hi"), "frequency_penalty": -3}, 400, "frequency_penalty",
         "frequency_penalty"),
        ({"model": MODEL, "messages": chat("hi"), "repetition_penalty": 0}, 400, "repetition_penalty",
         "repetition_penalty"),
        ({"model": MODEL, "messages": chat("hi"), "top_k": -2}, 400, "top_k", "top_k"),
        ({"model": MODEL, "messages": chat("hi"), "min_p": 1.5}, 400, "min_p", "min_p"),
        ({"model": MODEL, "messages": chat("hi"), "tools": [{"type": "function", "function": {"name": "f"}}]}, 400,
         "no tool support", "tools"),
    ]
    for body, status, words, param in cases:
        kw = {"content": body, "headers": {"content-type": "application/json"}} if isinstance(body, bytes) else {
            "json": body}
        r = httpx.post(url + "/v1/chat/completions", timeout=60, **kw)
        assert r.status_code == status, (body, r.text)
        err = r.json()["error"]
        assert words in err["message"] and set(err) == {"message", "type", "param", "code"}
        if param:
            assert err["param"] == param
        _still_serving(client)
    r = httpx.post(url + "/v1/completions", json={"model": MODEL, "prompt": [10**7]})
    assert r.status_code == 400 and "out of range" in r.json()["error"]["message"]
    r = httpx.post(url + "/v1/completions", json={"model": MODEL, "prompt": [], "unknown_field": 1})
    assert r.status_code == 400 and "prompt is empty" in r.json()["error"]["message"]
    ok = httpx.post(url + "/v1/completions", json={"model": MODEL, "prompt": "Hi", "max_tokens": 2, "whatever": {},
                                                   "presence_penalty": 0, "logit_bias": {}})  # (defaults: accepted)
    assert ok.status_code == 200  # unknown fields are ignored, as OpenAI does
    ok = httpx.post(url + "/v1/chat/completions", json={"model": MODEL, "messages": chat("hi"), "max_tokens": 2,
                                                        "tools": [{"type": "function", "function": {"name": "f"}}],
                                                        "tool_choice": "none"})  # fmt: skip
    assert ok.status_code == 200  # tools that cannot be called need no tool support
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="nope", messages=chat("hi"))


def test_second_chat_turn_reads_only_its_new_tokens(client: openai.OpenAI, ref: KwkDecoder, smollm2: Any) -> None:
    tok = smollm2[1]
    turn1 = [{"role": "system", "content": "You are a helpful assistant who answers briefly."},
             {"role": "user", "content": "Tell me one fact about the ocean."}]  # fmt: skip
    a = client.chat.completions.create(model=MODEL, messages=turn1, temperature=0, max_tokens=24)
    turn2 = [*turn1, {"role": "assistant", "content": a.choices[0].message.content},
             {"role": "user", "content": "And one about the sky?"}]  # fmt: skip
    b = client.chat.completions.create(model=MODEL, messages=turn2, temperature=0, max_tokens=24)
    first_len = a.usage.prompt_tokens
    assert b.usage.prompt_tokens_details.cached_tokens >= first_len  # the first turn was not read again
    text, _ = reference(ref, tok, chat_ids(tok, turn2)[0].tolist(), 24)
    assert b.choices[0].message.content == text


def test_disconnected_stream_frees_its_slot(server: Any) -> None:
    run, engine = server
    body = {"model": MODEL, "messages": chat("Write a long story about a dragon."), "max_tokens": 900,
            "temperature": 0, "stream": True, "ignore_eos": True}  # fmt: skip
    before = engine.metrics.generated_tokens._value.get()
    with httpx.stream("POST", run.url + "/v1/chat/completions", json=body, timeout=60) as r:
        for i, _ in enumerate(r.iter_lines()):
            if i > 6:
                break  # leave after a few chunks
    deadline = time.time() + 30
    while engine.busy and time.time() < deadline:
        time.sleep(0.05)
    assert engine.busy == 0
    assert engine.metrics.generated_tokens._value.get() - before < 600  # stopped long before 900 tokens


def test_metrics_exposition(server: Any, client: openai.OpenAI) -> None:
    _still_serving(client)
    text = httpx.get(server[0].url + "/metrics").text
    for name in ("kwker_requests_total", "kwker_generated_tokens_total", "kwker_queue_depth", "kwker_batch_size_bucket",
                 "kwker_time_to_first_token_seconds_bucket", "kwker_tokens_per_second"):  # fmt: skip
        assert name in text
    assert 'endpoint="/v1/chat/completions",status="200"' in text


def test_full_queue_429_timeout_504_and_graceful_shutdown(smollm2: Any) -> None:
    model, tok = smollm2
    opts = ServeOptions(slots=1, max_context=256, queue=0, shutdown_grace=20)
    engine = engine_for(model, tok, opts)
    run = Background(create_app(opts, engine=engine))
    # A second app over the same engine whose requests time out after 0.3 s: 200 bf16 tokens of this model
    # read 200 x 269 MB of weights, more than 0.3 s on any CPU.
    hasty = Background(create_app(ServeOptions(slots=1, max_context=256, queue=0, request_timeout=0.3), engine=engine))
    try:
        c = openai.OpenAI(base_url=run.url + "/v1", api_key="none", max_retries=0, timeout=60)
        long = {"model": MODEL, "messages": chat("Tell a story."), "max_tokens": 200, "temperature": 0,
                "ignore_eos": True}  # fmt: skip
        t = threading.Thread(target=lambda: httpx.post(run.url + "/v1/chat/completions", json=long, timeout=60))
        t.start()
        while engine.busy == 0:
            time.sleep(0.01)
        r = httpx.post(run.url + "/v1/chat/completions", json={**long, "max_tokens": 2})
        assert r.status_code == 429 and r.headers["retry-after"] == "1"
        assert r.json()["error"]["type"] == "rate_limit_error"
        t.join()
        r = httpx.post(hasty.url + "/v1/chat/completions", json=long, timeout=60)
        assert r.status_code == 504 and "timed out" in r.json()["error"]["message"]
        # Graceful shutdown: a request in flight finishes; new ones are refused.
        results: list[Any] = []
        t = threading.Thread(target=lambda: results.append(c.chat.completions.create(
            model=MODEL, messages=chat("Count to ten."), temperature=0, max_tokens=120,
            extra_body={"ignore_eos": True})))  # fmt: skip
        t.start()
        while engine.busy == 0:
            time.sleep(0.01)
        engine.shutdown(grace=20)
        t.join()
        assert results and results[0].choices[0].finish_reason == "length"  # it ran to its end
        assert results[0].usage.completion_tokens == 120
        r = httpx.post(run.url + "/v1/chat/completions", json={**long, "max_tokens": 2})
        assert r.status_code == 503 and "shutting down" in r.json()["error"]["message"]
    finally:
        run.stop()
        hasty.stop()
        engine.shutdown(grace=1)


def test_long_prompt_is_read_in_chunks_while_a_stream_keeps_going(server: Any, client: openai.OpenAI,
                                                                  ref: KwkDecoder, smollm2: Any) -> None:  # fmt: skip
    run, engine = server
    tok = smollm2[1]
    story = client.chat.completions.create(model=MODEL, messages=chat("Tell a long story."), temperature=0,
                                           max_tokens=300, stream=True, extra_body={"ignore_eos": True})  # fmt: skip
    got: list[str] = []
    for i, c in enumerate(story):  # wait until the story is generating
        got.append(c.choices[0].delta.content or "")
        if i == 3:
            break
    engine.trace.clear()
    long_q = "Summarise: " + " ".join(["the cat sat on the mat"] * 60)
    ids = chat_ids(tok, chat(long_q))[0].tolist()
    r = client.chat.completions.create(model=MODEL, messages=chat(long_q), temperature=0, max_tokens=8)
    rest = "".join(c.choices[0].delta.content or "" for c in story)
    mixed = [(d, p) for d, p in engine.trace if d >= 1 and p > 0]
    assert sum(p for _, p in mixed) >= len(ids) - 32  # the prompt was read beside the story's decode rows ...
    assert max(p for _, p in mixed) <= 32  # ... at most prefill_chunk tokens per step
    assert r.choices[0].message.content == reference(ref, tok, ids, 8)[0]
    assert len(tok("".join(got) + rest)["input_ids"]) > 250  # the story ran to its end meanwhile


def test_one_failing_request_does_not_fail_the_others(server: Any, smollm2: Any) -> None:
    import queue

    from kwker_torch.serve.engine import Request
    from kwker_torch.serve.sampling import Sampler, SamplingParams
    from kwker_torch.serve.text import Detokenizer

    class Broken(Sampler):
        def choose(self, logits: torch.Tensor) -> Any:
            raise RuntimeError("no token allowed")

    engine, tok = server[1], smollm2[1]
    events: queue.Queue[tuple[int, Any]] = queue.Queue()
    ids = chat_ids(tok, chat(QUESTIONS[0]))[0].tolist()
    sp = SamplingParams(max_tokens=12, temperature=0)
    reqs = [Request(ids, sp, cls(sp), lambda ev, i=i: events.put((i, ev)), Detokenizer(tok, ids))
            for i, cls in enumerate([Broken, Sampler])]  # fmt: skip
    engine.submit(reqs)
    ends: dict[int, Any] = {}
    text = ""
    while len(ends) < 2:
        i, ev = events.get(timeout=60)
        text += ev.text if i == 1 else ""
        if ev.finish or ev.error:
            ends[i] = ev
    assert "no token allowed" in ends[0].error and ends[0].status == 500
    assert ends[1].error is None and ends[1].finish in ("stop", "length")
    assert text == httpx.post(server[0].url + "/v1/chat/completions", json={
        "model": MODEL, "messages": chat(QUESTIONS[0]), "temperature": 0, "max_tokens": 12}).json()[
        "choices"][0]["message"]["content"]  # fmt: skip


def test_disconnected_plain_request_frees_its_slot(server: Any) -> None:
    run, engine = server
    body = {"model": MODEL, "messages": chat("Write a long story about a ship."), "max_tokens": 900,
            "temperature": 0, "ignore_eos": True}  # fmt: skip
    before = engine.metrics.generated_tokens._value.get()
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(run.url + "/v1/chat/completions", json=body, timeout=1.0)  # the client gives up and leaves
    deadline = time.time() + 30
    while engine.busy and time.time() < deadline:
        time.sleep(0.05)
    assert engine.busy == 0
    assert engine.metrics.generated_tokens._value.get() - before < 600


def test_logprobs_zero_nulls_and_every_token_reported(server: Any) -> None:
    url = server[0].url
    r = httpx.post(url + "/v1/completions", json={"model": MODEL, "prompt": "Once upon a time", "max_tokens": 20,
                                                  "temperature": 0, "logprobs": 0, "ignore_eos": True,
                                                  "n": None, "stream": None, "echo": None}).json()  # fmt: skip
    lp = r["choices"][0]["logprobs"]
    assert r["usage"]["completion_tokens"] == 20 and len(lp["tokens"]) == 20  # logprobs=0: the chosen ones
    assert lp["top_logprobs"] == [{}] * 20
    c = httpx.post(url + "/v1/chat/completions", json={"model": MODEL, "messages": chat("Hi"), "max_tokens": 3,
                                                       "logprobs": None, "stream_options": None}).json()  # fmt: skip
    assert c["choices"][0]["logprobs"] is None and c["usage"]["completion_tokens"] >= 1


def test_prompt_lookup_keeps_the_text_and_drafts_when_quoting(client: openai.OpenAI, server: Any, ref: KwkDecoder,
                                                              smollm2: Any) -> None:  # fmt: skip
    tok, engine = smollm2[1], server[1]
    passage = ("It is a truth universally acknowledged, that a single man in possession of a good fortune, must be "
               "in want of a wife. However little known the feelings or views of such a man may be on his first "
               "entering a neighbourhood, this truth is so well fixed in the minds of the surrounding families.")
    q = f"Repeat this passage exactly:\n\n{passage}"
    ids = chat_ids(tok, chat(q))[0].tolist()
    out = ref.generate(ids, 60, prompt_cache=False, prompt_lookup=0)  # plain one-token steps
    expect = tok.decode(out.tokens[:-1] if out.finish_reason == "stop" else out.tokens, skip_special_tokens=True)
    drafted, accepted = engine.drafted, engine.accepted
    for stream in (False, True):  # alone on the server: prompt lookup drafts
        r = client.chat.completions.create(model=MODEL, messages=chat(q), temperature=0, max_tokens=60,
                                           stream=stream, logprobs=True)  # fmt: skip
        if stream:
            got = "".join(c.choices[0].delta.content or "" for c in r)
        else:
            got = r.choices[0].message.content
            assert len(r.choices[0].logprobs.content) == r.usage.completion_tokens - (r.choices[0].finish_reason
                                                                                      == "stop")  # fmt: skip
        assert got == expect
    assert engine.drafted > drafted and engine.accepted - accepted > 20  # drafts were verified and kept
