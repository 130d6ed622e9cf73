"""``python -m kwker_torch.serve`` as a user runs it: its flags, a clear refusal of bad ones and of a missing
model, and a graceful SIGTERM (a stream in flight runs to its end, then the app shuts down cleanly)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import httpx
import pytest
from fixtures.tiny_model import tiny_model

from kwker_torch.serve.background import free_port

pytestmark = pytest.mark.slow
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def run(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kwker_torch.serve", *args], capture_output=True, text=True,
                          timeout=timeout, env=ENV)  # fmt: skip


def test_help_lists_the_flags() -> None:
    out = run("--help")
    assert out.returncode == 0
    for flag in ("--model", "--precision", "--calib", "--gptq", "--slots", "--host", "--port", "--max-context",
                 "--queue", "--prefill-chunk", "--request-timeout", "--shutdown-grace"):  # fmt: skip
        assert flag in out.stdout
    # The product's own name for it: python -m kwker.serve (the short package) is the same server.
    short = subprocess.run([sys.executable, "-m", "kwker.serve", "--help"], capture_output=True, text=True,
                           timeout=120, env=ENV)  # fmt: skip
    assert short.returncode == 0 and short.stdout.startswith("usage: python -m kwker.serve")
    assert short.stdout[short.stdout.index("options:"):] == out.stdout[out.stdout.index("options:"):]


def test_bad_flags_and_a_missing_model_are_refused_clearly(tmp_path: object) -> None:
    out = run("--slots", "0")
    assert out.returncode == 2 and "--slots must be a positive integer, got 0" in out.stderr
    out = run("--precision", "int3")
    assert out.returncode == 2 and "--precision 'int3': expected one of preserve, balanced, int8, int4" in out.stderr
    out = run("--precision", "int4", "--gptq")
    assert out.returncode == 2 and "--gptq fits each matrix to calibration text: pass --calib FILE" in out.stderr
    out = run("--precision", "int4", "--calib", "/nonexistent.txt")
    assert out.returncode == 2 and "--calib '/nonexistent.txt': no such file" in out.stderr
    out = run("--model", "/nonexistent/model", "--port", str(free_port()))
    assert out.returncode != 0 and "--model '/nonexistent/model': no Hugging Face model folder" in out.stderr


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    yield tiny_model(str(tmp_path_factory.mktemp("tiny")))


def test_int4_calibrated_with_gptq_serves(folder: str, tmp_path: object) -> None:
    """--precision int4 --calib FILE --gptq: the decoder's matrices are GPTQ's, and it answers."""
    from kwker_torch.serve import ServeOptions, create_app, engine_for
    from kwker_torch.serve.background import Background
    from kwker_torch.serve.options import add_flags, from_flags, load_model

    text = os.path.join(str(tmp_path), "calib.txt")
    with open(text, "w") as f:
        f.write("The quick brown fox jumps over the lazy dog while the cat sleeps by the fire. " * 30)
    import argparse

    parser = argparse.ArgumentParser()
    add_flags(parser)
    opts: ServeOptions = from_flags(parser.parse_args(["--model", folder, "--precision", "int4", "--calib", text,
                                                       "--gptq", "--slots", "2", "--max-context", "256"]))
    assert opts.gptq and opts.calib == text
    model, tok = load_model(opts)
    engine = engine_for(model, tok, opts)
    try:
        info = engine.dec.info
        assert info["calibrated"] and info["gptq"] == info["q4k_matrices"] + info["q6k_matrices"] > 0
        with Background(create_app(opts, engine=engine)) as srv:
            body = {"model": opts.model_name, "prompt": "The quick", "max_tokens": 4, "temperature": 0}
            r = httpx.post(srv.url + "/v1/completions", json=body, timeout=60)
            assert r.status_code == 200 and r.json()["choices"][0]["finish_reason"] in ("length", "stop")
    finally:
        engine.shutdown(grace=5)


def test_sigterm_lets_a_stream_finish_then_exits(folder: str) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen([sys.executable, "-m", "kwker_torch.serve", "--model", folder, "--port", str(port),
                             "--max-context", "4096", "--served-name", "tiny"], env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
    try:
        deadline = time.time() + 120
        while True:
            assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.time() < deadline, "the server did not come up"
            time.sleep(0.2)
        body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3000,
                "temperature": 0, "stream": True, "ignore_eos": True}  # fmt: skip
        finishes, chunks = [], 0
        with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=120) as r:
            for line in r.iter_lines():
                if not line.startswith("data: {"):
                    continue
                chunks += 1
                if chunks == 3:  # the stream is running: ask the server to stop
                    threading.Thread(target=proc.send_signal, args=(signal.SIGTERM,)).start()
                choice = json.loads(line[6:])["choices"][0]
                if choice.get("finish_reason"):
                    finishes.append(choice["finish_reason"])
        assert finishes == ["length"] and chunks > 500  # the stream ran to its end after SIGTERM
        # uvicorn re-raises the signal once it has shut down cleanly: the status is SIGTERM's (or 0).
        assert proc.wait(timeout=60) in (0, -signal.SIGTERM)
        log = proc.stdout.read() if proc.stdout else ""
        assert "Application shutdown complete" in log and "Traceback" not in log
        with pytest.raises(httpx.ConnectError):
            httpx.get(url + "/health", timeout=2)
    finally:
        if proc.poll() is None:
            proc.kill()


def test_random_bad_bodies_get_4xx_in_openai_shape_never_a_crash(folder: str) -> None:
    """300 requests with fields swapped for values of the wrong type or range (seeded): each answer is a 200
    or a 4xx in OpenAI's error shape, a stream always ends with [DONE], and the server stays healthy."""
    import random

    from kwker_torch.serve import ServeOptions, create_app, engine_for
    from kwker_torch.serve.background import Background
    from kwker_torch.serve.options import load_model

    opts = ServeOptions(model=folder, served_name="tiny", slots=2, max_context=256, queue=8)
    model, tok = load_model(opts)
    engine = engine_for(model, tok, opts)
    rng = random.Random(5)
    weird = [None, 0, -1, 1, 2**63, -(2**63), 1e308, -0.0, 0.5, "", "5", "é🐈", [], {}, [1, "a"], {"a": 1}, True,
             [[1, 2], [3]], "a" * 3000, [0] * 300, 21, 129, {"type": "json_object"}, {"type": "json_schema"},
             [{"role": "user", "content": [{"type": "text", "text": "hi"}]}], [{"role": "bogus", "content": "x"}]]
    fields = ["model", "messages", "prompt", "max_tokens", "temperature", "top_p", "seed", "stop", "n", "stream",
              "stream_options", "logprobs", "top_logprobs", "response_format", "echo", "logit_bias", "best_of"]
    statuses: set[int] = set()
    try:
        with Background(create_app(opts, engine=engine)) as srv, httpx.Client(timeout=60) as c:
            for _ in range(300):
                chat = rng.random() < 0.5
                body: dict = {"model": "tiny", "max_tokens": 4, "temperature": 0}
                body.update({"messages": [{"role": "user", "content": "hi"}]} if chat else {"prompt": "hi"})
                for _ in range(rng.randint(1, 3)):
                    body[rng.choice(fields)] = rng.choice(weird)
                path = "/v1/chat/completions" if chat else "/v1/completions"
                with c.stream("POST", srv.url + path, json=body) as r:
                    text = r.read().decode()
                statuses.add(r.status_code)
                assert r.status_code in (200, 400, 404), (body, text[:300])
                if r.status_code != 200:
                    assert set(json.loads(text)["error"]) == {"message", "type", "param", "code"}
                elif body.get("stream") is True:
                    assert text.rstrip().endswith("data: [DONE]"), (body, text[-300:])
            assert httpx.get(srv.url + "/health").json()["busy"] == 0
    finally:
        engine.shutdown(grace=5)
    assert {200, 400} <= statuses  # both kinds were exercised
