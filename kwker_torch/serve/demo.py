"""The demo's ``serve`` section: the OpenAI-compatible server's app on a local port, driven by the real
``openai`` client. A streamed chat answer; 8 greedy chat requests one at a time, then all 8 at once
(continuous batching: summed tokens/s, and each answer must be the same text as alone); a second chat turn's
time to first token on its warm slot against the same conversation cold.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from .app import create_app, engine_for
from .background import Background
from .options import ServeOptions

QUESTIONS = ["What is the capital of France?", "Name three colours of the rainbow.", "Write a haiku about rain.",
             "How many legs does a spider have?", "Give me a tip for sleeping well.", "What do bees make?",
             "Why is the sky blue?", "Suggest a name for a cat."]  # fmt: skip


def serve_demo(model: Any, tok: Any, say: Callable[..., None], new_tokens: int = 48) -> bool:
    """Runs the section; returns False if a batched answer differed from the same request alone."""
    from openai import OpenAI

    opts = ServeOptions(slots=8, max_context=1024)
    engine = engine_for(model, tok, opts)
    try:
        with Background(create_app(opts, engine=engine)) as srv:
            c = OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0)
            say(f"[serve] the server's app on {srv.url} (python -m kwker_torch.serve), the openai client; streamed:")
            say("  ", end="")
            for chunk in c.chat.completions.create(model=opts.model_name, messages=_chat(QUESTIONS[6]), stream=True,
                                                   temperature=0, max_tokens=new_tokens):  # fmt: skip
                say(chunk.choices[0].delta.content or "", end="")
            say("")

            def ask(q: str) -> tuple[str, int]:
                r = c.chat.completions.create(model=opts.model_name, messages=_chat(q), temperature=0,
                                              max_tokens=new_tokens)  # fmt: skip
                return r.choices[0].message.content or "", r.usage.completion_tokens

            t0 = time.perf_counter()
            alone = [ask(q) for q in QUESTIONS]
            t_alone = time.perf_counter() - t0
            engine.forget()  # (so that the batched run reads its prompts again, as the first did)
            t0 = time.perf_counter()
            with ThreadPoolExecutor(len(QUESTIONS)) as pool:
                together = list(pool.map(ask, QUESTIONS))
            t_together = time.perf_counter() - t0
            same = [a[0] == b[0] for a, b in zip(alone, together, strict=True)]
            n = sum(k for _, k in together)
            say(f"  8 chat requests one at a time: {sum(k for _, k in alone) / t_alone:.1f} tok/s; all 8 at once: "
                f"{n / t_together:.1f} tok/s ({t_alone / t_together:.2f}x); same text as alone: "
                f"{sum(same)}/{len(same)}")  # fmt: skip
            warm, cold = _second_turn(c, opts.model_name)
            say(f"  second chat turn, time to first token: warm slot {warm * 1e3:.0f} ms, cold {cold * 1e3:.0f} ms "
                f"({cold / warm:.1f}x sooner)\n")  # fmt: skip
            return all(same)
    finally:
        engine.shutdown(grace=5)


def _chat(q: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": q}]


def _first_token(c: Any, model: str, messages: list[dict[str, str]]) -> tuple[float, str]:
    t0 = time.perf_counter()
    first, parts = None, []
    for chunk in c.chat.completions.create(model=model, messages=messages, stream=True, temperature=0, max_tokens=48):
        piece = chunk.choices[0].delta.content if chunk.choices else None
        if piece:
            first = first if first is not None else time.perf_counter() - t0
            parts.append(piece)
    return (first if first is not None else time.perf_counter() - t0), "".join(parts)


def _second_turn(c: Any, model: str) -> tuple[float, float]:
    doc = " ".join(f"Item {i}: a lamp, a key, a coat, a map and a cup of tea." for i in range(24))
    turn1 = [{"role": "user", "content": f"Here is a list.\n{doc}\nWhich item numbers mention a lamp?"}]
    _, answer = _first_token(c, model, turn1)
    turn2 = [*turn1, {"role": "assistant", "content": answer}, {"role": "user", "content": "And a key?"}]
    warm, _ = _first_token(c, model, turn2)
    cold, _ = _first_token(c, model, [{"role": "user", "content": "List: " + turn1[0]["content"]}, *turn2[1:]])
    return warm, cold
