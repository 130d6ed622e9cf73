"""The chat page at ``/`` (kwker_torch/serve/page.py, static/chat.html) in a real headless browser: Debian's
Chromium driven by Playwright, on the real SmolLM2-135M-Instruct served in this process.

Questions typed into the page stream answers equal to the same greedy requests made with the ``openai`` client
(same system prompt, the conversation so far, same max_tokens), over two turns; the answer grows over several
reads of the stream; ``#stats`` shows a time to first token and a tokens/s; a 400 from the server (max tokens
past the context) is shown with its status and message, and the page serves the next question; Stop aborts a
stream and the server frees its slot. On a random Qwen 3 with its thinking template and a scripted reply
(``kwker_torch.testing.scripted``), the reasoning shows folded above the answer and a tool call as a card, and
the next question sends both back. Screenshots go to ``tmp_path``; the answer test also writes one to
``$KWKER_SCREENSHOT`` when set (the README's docs/chat-page.png).

Needs ``/usr/bin/chromium`` and the ``playwright`` package; ``scripts/setup.sh`` installs both. Playwright's own
browser download is not used, and a missing browser fails the test rather than skipping it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from kwker_torch.serve import ServeOptions, create_app, engine_for
from kwker_torch.serve.background import Background
from kwker_torch.serve.engine import Engine
from kwker_torch.testing import qwen_tokenizer, random_model
from kwker_torch.testing.scripted import Scripted

pytestmark = pytest.mark.slow
MODEL = "SmolLM2-135M-Instruct"
CTX = 1024
CHROMIUM = "/usr/bin/chromium"
WAIT_MS = 120_000  # generous: CI shares two cores
SETUP = "run scripts/setup.sh (it installs Debian's chromium and the pinned playwright from requirements.txt)"


@pytest.fixture(scope="module")
def server(smollm2: Any) -> Iterator[tuple[str, Engine]]:
    model, tok = smollm2
    opts = ServeOptions(slots=2, max_context=CTX, queue=8, prefill_chunk=32)
    engine = engine_for(model, tok, opts)
    run = Background(create_app(opts, engine=engine))
    yield run.url, engine
    run.stop()
    engine.shutdown(grace=5)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not os.access(CHROMIUM, os.X_OK):
        pytest.fail(f"{CHROMIUM} is missing: {SETUP}", pytrace=False)
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.fail(f"the playwright package is missing: {SETUP}", pytrace=False)
    with sync_playwright() as p:
        args = ["--no-sandbox", "--disable-dev-shm-usage"]  # (we run as root: no sandbox)
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=args)
        yield b
        b.close()


@pytest.fixture
def page(browser: Any, server: tuple[str, Engine]) -> Iterator[Any]:
    """The chat page, loaded (its model id read), in a 1000x700 window; JS errors on it fail the test."""
    ctx = browser.new_context(viewport={"width": 1000, "height": 700})
    pg = ctx.new_page()
    errors: list[str] = []
    pg.on("pageerror", lambda e: errors.append(str(e)))
    pg.goto(server[0] + "/")
    pg.wait_for_function("document.body.dataset.state === 'idle'", timeout=WAIT_MS)
    yield pg
    ctx.close()
    assert not errors, f"JavaScript errors on the page: {errors}"


def wait_idle(pg: Any, answers: int) -> None:
    """Waits until the page has ``answers`` .assistant elements and is no longer streaming."""
    pg.wait_for_function(f"document.querySelectorAll('.assistant').length === {answers} && "
                         "document.body.dataset.state === 'idle'", timeout=WAIT_MS)  # fmt: skip


def shoot(pg: Any, tmp_path: Path, name: str, publish: bool = False) -> None:
    shot = tmp_path / f"{name}.png"
    pg.screenshot(path=str(shot))
    dest = os.environ.get("KWKER_SCREENSHOT")
    if publish and dest:
        Path(dest).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(shot, dest)


# Counts the batches of DOM changes inside .assistant elements (one per read of the stream that brought text).
COUNT_UPDATES = """() => {
  window.updates = 0;
  new MutationObserver((records) => {
    const inAnswer = (r) => { const e = r.target.nodeType === 1 ? r.target : r.target.parentElement;
                              return e && e.closest('.assistant'); };
    if (records.some(inAnswer)) window.updates += 1;
  }).observe(document.getElementById('log'), {childList: true, subtree: true, characterData: true});
}"""


def test_typed_questions_stream_the_greedy_answers(page: Any, server: tuple[str, Engine], tmp_path: Path) -> None:
    client = openai.OpenAI(base_url=server[0] + "/v1", api_key="none", max_retries=0, timeout=120)
    assert page.inner_text("#model") == MODEL
    page.fill("#temperature", "0")
    page.fill("#max-tokens", "40")
    system = page.input_value("#system")
    assert system  # (the page's default system prompt, sent first)
    messages: list[dict[str, str]] = [{"role": "system", "content": system}]
    page.evaluate(COUNT_UPDATES)
    for turn, question in enumerate(["What is the capital of France?", "And what is the capital of Germany?"]):
        page.click("#prompt")
        page.keyboard.type(question)
        updates = page.evaluate("window.updates")
        if turn == 0:
            page.click("#send")
        else:
            page.press("#prompt", "Enter")  # Enter sends too
        wait_idle(page, turn + 1)
        got = page.locator(".assistant").nth(turn).text_content()
        messages.append({"role": "user", "content": question})
        r = client.chat.completions.create(model=MODEL, messages=messages, temperature=0, max_tokens=40)
        assert got == r.choices[0].message.content and got
        messages.append({"role": "assistant", "content": got})
        assert page.evaluate("window.updates") - updates > 1  # streamed: the answer grew over several reads
        stats = page.inner_text("#stats")
        m = re.fullmatch(r"TTFT (\d+) ms · ([\d.]+) tokens/s · (\d+) tokens", stats)
        assert m, stats
        assert int(m[1]) > 0 and float(m[2]) > 0 and int(m[3]) == r.usage.completion_tokens
        assert page.input_value("#prompt") == ""
    assert page.locator(".user").all_text_contents() == [m["content"] for m in messages if m["role"] == "user"]
    shoot(page, tmp_path, "chat", publish=True)


def test_a_server_error_is_shown_readably_and_the_page_goes_on(page: Any, tmp_path: Path) -> None:
    page.fill("#max-tokens", "5000")  # past the context (1024 tokens): the server answers 400
    page.fill("#prompt", "Hi")
    page.click("#send")
    page.wait_for_selector(".error", timeout=WAIT_MS)
    wait_idle(page, 0)
    err = page.inner_text(".error")
    assert err.startswith("HTTP 400"), err
    assert "maximum context length is 1024" in err and "Lower max_tokens to at most" in err
    assert page.input_value("#prompt") == "Hi"  # kept, to send again
    shoot(page, tmp_path, "error")
    page.fill("#max-tokens", "5")
    page.click("#send")
    wait_idle(page, 1)
    assert page.locator(".assistant").first.text_content()
    assert "tokens/s" in page.inner_text("#stats")


def test_stop_aborts_the_stream_and_frees_the_slot(page: Any, server: tuple[str, Engine], tmp_path: Path) -> None:
    engine = server[1]
    page.fill("#max-tokens", "600")
    page.fill("#prompt", "Write a long story about a dragon.")
    page.click("#send")
    page.wait_for_function("document.querySelector('.assistant').textContent.length > 20", timeout=WAIT_MS)
    page.click("#stop")
    wait_idle(page, 1)
    assert page.locator(".assistant").first.text_content()
    assert page.inner_text("#stats").endswith("· stopped")
    shoot(page, tmp_path, "stopped")
    deadline = time.time() + 30
    while engine.busy and time.time() < deadline:
        time.sleep(0.05)
    assert engine.busy == 0  # the server saw the client leave


@pytest.fixture(scope="module")
def thinking() -> Iterator[tuple[str, Scripted, Any, list[Any]]]:
    """A random Qwen 3 under Qwen's thinking template, its replies scripted; the requests it got, in order."""
    tok = qwen_tokenizer()
    model = random_model("Qwen3-0.6B", num_hidden_layers=2, hidden_size=64, intermediate_size=128,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16)  # fmt: skip
    opts = ServeOptions(slots=2, max_context=CTX, prompt_lookup=0, served_name="qwen3-tiny")
    engine = engine_for(model, tok, opts)
    engine.dec = script = Scripted(engine.dec, tok.convert_tokens_to_ids("<|im_end|>"))
    app = create_app(opts, engine=engine)
    seen: list[Any] = []

    @app.middleware("http")
    async def keep(request: Any, call_next: Any) -> Any:  # (the bodies the page sent)
        if request.url.path == "/v1/chat/completions":
            seen.append(await request.json())
        return await call_next(request)

    run = Background(app)
    yield run.url, script, tok, seen
    run.stop()
    engine.shutdown(grace=5)


def test_reasoning_folds_above_the_answer_and_calls_show_as_cards(
    browser: Any, thinking: tuple[str, Scripted, Any, list[Any]], tmp_path: Path
) -> None:
    url, script, tok, seen = thinking
    ctx = browser.new_context(viewport={"width": 1000, "height": 700})
    pg = ctx.new_page()
    errors: list[str] = []
    pg.on("pageerror", lambda e: errors.append(str(e)))
    pg.goto(url + "/")
    pg.wait_for_function("document.body.dataset.state === 'idle'", timeout=WAIT_MS)
    script.say(tok, "<think>\nThe user greets me.\n</think>\n\nHello! How can I help?")
    pg.fill("#prompt", "Hi")
    pg.click("#send")
    wait_idle(pg, 1)
    first = pg.locator(".assistant").nth(0)
    fold = first.locator("details.reasoning")
    assert fold.count() == 1 and fold.get_attribute("open") is None  # folded
    assert fold.locator(".reasoning-text").text_content() == "The user greets me."
    assert first.locator(".answer").text_content() == "Hello! How can I help?"
    assert first.evaluate("e => e.firstElementChild.tagName") == "DETAILS"  # above the answer
    shoot(pg, tmp_path, "reasoning")
    tool = {"type": "function", "function": {"name": "add", "parameters": {"type": "object", "properties": {
        "a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}}}  # fmt: skip
    pg.fill("#tools", json.dumps([tool]))
    script.say(tok, '<think>\nI should add.\n</think>\n\n<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}'
                    "\n</tool_call>")  # fmt: skip
    pg.fill("#prompt", "What is 2 + 3?")
    pg.click("#send")
    wait_idle(pg, 2)
    second = pg.locator(".assistant").nth(1)
    card = second.locator(".tool-call")
    assert card.count() == 1 and card.locator(".tool-name").text_content() == "add"
    assert card.locator(".tool-args").text_content() == '{"a": 2, "b": 3}'
    assert second.locator("details.reasoning .reasoning-text").text_content() == "I should add."
    assert second.locator(".answer").count() == 0  # (no text besides the call)
    shoot(pg, tmp_path, "tool-call")
    # The page sent the tools, and sends both answers back as OpenAI messages with the next question.
    script.say(tok, "Done.")
    pg.fill("#prompt", "Thanks")
    pg.click("#send")
    wait_idle(pg, 3)
    script.say(tok, None)
    assert seen[1]["tools"] == [tool]
    sent = seen[2]["messages"]
    said = {"role": "assistant", "content": "Hello! How can I help?", "reasoning_content": "The user greets me."}
    assert sent[2] == said
    call = sent[4]["tool_calls"][0]
    assert sent[4]["reasoning_content"] == "I should add." and sent[4]["content"] == ""
    assert call["function"] == {"name": "add", "arguments": '{"a": 2, "b": 3}'} and call["id"].startswith("call_")
    ctx.close()
    assert not errors, f"JavaScript errors on the page: {errors}"
