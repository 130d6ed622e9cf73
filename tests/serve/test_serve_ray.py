"""Ray Serve scale-out (kwker_torch/serve/ray.py) on this machine: a local Ray instance runs two replicas of
the real server app (each its own process and engine, one CPU and one kernel thread each) behind Ray Serve's
HTTP proxy, and the openai client talks to the proxy.

- Both replicas answer greedy chat completions (the ``x-kwker-replica`` header names the replica) with the
  same text, and a streamed completion through the proxy gives that text too.
- ``/health`` answers from two different pids, the replicas' own.

The model is a tiny random Llama with a byte-level tokenizer, saved to a folder (``--model PATH``): the
replicas load it in well under a second, where the real SmolLM2-135M takes ~25 s each (the GGUF is
dequantized); what is tested here is the scale-out, not the model. Ray's own start and stop dominate.
"""

from __future__ import annotations

import json
import os
import threading
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

pytestmark = pytest.mark.slow

ray = pytest.importorskip("ray", reason="Ray Serve is not installed: pip install 'ray[serve]'")
serve = pytest.importorskip("ray.serve", reason="Ray Serve is not installed: pip install 'ray[serve]'")
openai = pytest.importorskip("openai", reason="the openai client is not installed: pip install openai")

from fixtures.tiny_model import tiny_model  # noqa: E402

from kwker_torch.serve.background import free_port  # noqa: E402
from kwker_torch.serve.options import ServeOptions  # noqa: E402
from kwker_torch.serve.ray import REPLICA_HEADER, build, deploy_errors  # noqa: E402

APP = "kwker-test"
MODEL = "tiny-llama"
DEPLOY_TIMEOUT = 120.0  # seconds for both replicas to start (about 10 s here)
# Ray must not reach the internet (usage stats) and the replicas load the model offline.
ENV = {"RAY_USAGE_STATS_ENABLED": "0", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def base_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    saved = {k: os.environ.get(k) for k in ENV}
    os.environ.update(ENV)
    try:
        with ThreadPoolExecutor(1) as pool:  # the model is written while Ray starts (mostly its own processes)
            folder = pool.submit(tiny_model, str(tmp_path_factory.mktemp(MODEL)))
            # address="local": a fresh instance, never a cluster `ray start` left running on this machine.
            ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
        port = free_port()
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        opts = ServeOptions(model=folder.result(), served_name=MODEL, slots=2, max_context=256, queue=4)
        app = build(opts, replicas=2, num_cpus=1, name=APP)
        # serve.run blocks until every replica is up (or gives up retrying); a replica that can never be
        # placed would block it forever, so it runs on a thread with a deadline.
        failure: list[BaseException] = []

        def deploy() -> None:
            try:
                serve.run(app, name=APP, route_prefix="/")
            except BaseException as e:  # noqa: BLE001  (reported on the test's thread)
                failure.append(e)

        t = threading.Thread(target=deploy, daemon=True)
        t.start()
        t.join(DEPLOY_TIMEOUT)
        if t.is_alive() or failure:
            why = f"not running after {DEPLOY_TIMEOUT:.0f} s" if t.is_alive() else repr(failure[0])
            pytest.fail(f"Ray Serve deploy failed: {why}\n{deploy_errors(APP)}")
        yield f"http://127.0.0.1:{port}"
    finally:
        ray.shutdown()  # stops the replicas too (serve.shutdown() first would add ~3 s); safe if not started
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _chat(client: Any, stream: bool = False) -> tuple[str, str]:
    """(text, replica) of one greedy chat completion of 8 tokens."""
    kw: dict[str, Any] = dict(model=MODEL, messages=MESSAGES, temperature=0, max_tokens=8)
    if stream:
        raw = client.chat.completions.with_raw_response.create(stream=True, **kw)
        text = "".join(c.choices[0].delta.content or "" for c in raw.parse() if c.choices)
    else:
        raw = client.chat.completions.with_raw_response.create(**kw)
        text = raw.parse().choices[0].message.content
    return text, raw.headers[REPLICA_HEADER]


def test_two_replicas_answer_greedy_chat_alike(base_url: str) -> None:
    client = openai.OpenAI(base_url=base_url + "/v1", api_key="x", timeout=60.0, max_retries=0)
    assert [m.id for m in client.models.list().data] == [MODEL]
    answers: list[tuple[str, str]] = []
    with ThreadPoolExecutor(2) as pool:  # two at a time: the proxy sends them to different replicas
        for _ in range(8):
            answers += pool.map(lambda _: _chat(client), range(2))
            if len({r for _, r in answers}) == 2:
                break
    replicas = {r for _, r in answers}
    texts = {t for t, _ in answers}
    assert len(replicas) == 2, f"one replica answered all {len(answers)} requests: {replicas}"
    assert len(texts) == 1 and texts != {""}, f"replicas disagree on greedy text: {answers}"
    streamed, _ = _chat(client, stream=True)
    assert streamed == texts.pop()


def test_health_answers_from_two_processes(base_url: str) -> None:
    pids: set[int] = set()
    replicas: set[str] = set()
    for _ in range(60):
        with urllib.request.urlopen(base_url + "/health", timeout=10) as r:
            body = json.load(r)
            replicas.add(r.headers[REPLICA_HEADER])
        assert body["status"] == "ok"
        pids.add(body["pid"])
        if len(pids) == 2:
            break
    assert len(pids) == 2, f"/health answered from {pids} only"
    assert os.getpid() not in pids
    # The header's pid (TAG@HOST:PID) is the process that answered /health.
    assert {int(v.rsplit(":", 1)[1]) for v in replicas} == pids
