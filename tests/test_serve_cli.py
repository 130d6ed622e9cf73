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
from tiny_model import tiny_model

from kwker_torch.serve.background import free_port

pytestmark = pytest.mark.slow
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def run(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kwker_torch.serve", *args], capture_output=True, text=True,
                          timeout=timeout, env=ENV)  # fmt: skip


def test_help_lists_the_flags() -> None:
    out = run("--help")
    assert out.returncode == 0
    for flag in ("--model", "--precision", "--slots", "--host", "--port", "--max-context", "--queue",
                 "--prefill-chunk", "--request-timeout", "--shutdown-grace"):  # fmt: skip
        assert flag in out.stdout


def test_bad_flags_and_a_missing_model_are_refused_clearly(tmp_path: object) -> None:
    out = run("--slots", "0")
    assert out.returncode == 2 and "--slots must be a positive integer, got 0" in out.stderr
    out = run("--precision", "int3")
    assert out.returncode == 2 and "--precision 'int3': expected one of preserve, balanced, int8, int4" in out.stderr
    out = run("--model", "/nonexistent/model", "--port", str(free_port()))
    assert out.returncode != 0 and "--model '/nonexistent/model': no Hugging Face model folder" in out.stderr


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    yield tiny_model(str(tmp_path_factory.mktemp("tiny")))


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
