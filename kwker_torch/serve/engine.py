"""Continuous batching: one thread owns the decoder and advances every request in flight in one native
step per token.

Each loop: take in new requests (FIFO, as slots free up), then one ``KwkDecoder.step`` over every running
request: one token for each request that is generating, plus up to ``prefill_chunk`` prompt tokens of
requests still reading their prompt (so a long prompt is read in chunks between decode steps and the
running streams do not stall). Then each row's logits pick that request's next token (sampling.py), the
text is released through the detokenizer and stop matcher (text.py), and events go to the request's
consumer (the HTTP handler, on the event loop) through ``Request.emit``.

Per-slot prefix reuse: a free slot keeps the text it read; a new request takes the free slot its prompt
continues (the next chat turn), else the least recently used one, into which the longest start of the
prompt that any slot holds is copied (a shared system prompt; ``prompt_cache.seat``). Choices 2..n of
one request wait until choice 1 has read the prompt, then copy it.

Prompt lookup (``prompt_lookup`` drafts, as ``KwkDecoder.generate``): while at most ``LOOKUP_SEQS`` requests
are generating, a greedy request's step also feeds the tokens that followed the latest earlier occurrence
of its last 3 (or 2) tokens (lookup.py), and keeps those the model itself chooses; the rejected ones are
truncated off its slot. Per request, ``lookup.DraftPolicy`` (the native loop's rule, ``lookup.rs``) sizes the
drafts from the measured acceptance and step times and pauses after failures. With more requests in flight
a step is bound by arithmetic and extra rows would slow every stream, so none are drafted.

Exactness: every row of a step is computed as if alone (the decoder's rows do not mix), so a greedy
request gets the tokens ``KwkDecoder.generate`` gives it alone, whatever else is in flight (tested); with
drafts a token is kept only where it is the model's own choice, so the text is the same.

Jobs (``submit_job``; embeddings.py): work that needs slots but generates nothing runs on the engine thread
too, one piece per loop before new requests are admitted, on the free slots least recently used first (so
chat prefixes are kept where a slot is to spare); a job leaves its slots empty.

Threads: ``submit``/``submit_job``/``cancel``/``shutdown`` may be called from any thread; only the engine thread
calls the decoder. A client that disconnects cancels its request, which frees its slot at the next step.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from ..decoder import PROMPT_LOOKUP, KwkDecoder, prompt_cache
from ..decoder.lookup import DraftPolicy
from .metrics import Metrics
from .sampling import Sampler, SamplingParams, TokenOut
from .text import Detokenizer, StopMatcher

log = logging.getLogger("kwker.serve")

# With nothing generating, nothing can stall: prompts are read in chunks this large instead.
IDLE_CHUNK = 512
# Prompt lookup drafts only while this few requests are generating (beyond, a step is bound by arithmetic).
LOOKUP_SEQS = 2


class QueueFull(RuntimeError):
    """More requests are waiting than the server's queue holds."""


class Closed(RuntimeError):
    """The server is shutting down and takes no new requests."""


@dataclass
class Event:
    """What a request's consumer receives: new text (with its tokens), then one event with ``finish``
    ("stop", "length") or ``error`` set."""

    text: str = ""
    tokens: list[TokenOut] = field(default_factory=list)
    finish: str | None = None
    error: str | None = None
    status: int = 500  # HTTP status of an error


class Request:
    """One completion choice in flight. ``emit`` is called on the engine thread with each Event."""

    def __init__(self, prompt: list[int], params: SamplingParams, sampler: Sampler, emit: Callable[[Event], None],
                 detok: Detokenizer, *, after: Request | None = None,
                 deadline: float | None = None) -> None:  # fmt: skip
        self.prompt = prompt
        self.params = params
        self.sampler = sampler
        self.emit = emit
        self.detok = detok
        self.stopper = StopMatcher(params.stop)
        self.after = after  # another choice of the same prompt: read after it, by copying its K/V
        self.deadline = deadline
        self.arrival = time.monotonic()
        self.first_token: float | None = None
        self.cancelled = False
        self.slot = -1
        self.cached = 0  # prompt tokens the slot already held
        self.fed = 0  # prompt tokens the slot holds now
        self.out: list[int] = []  # generated tokens (a stop token not included)
        self.n_generated = 0  # tokens the model chose, a stop token included (usage.completion_tokens)
        self.done = False
        self._pending: list[TokenOut] = []  # tokens whose text is not released yet
        self.drafts: list[int] = []  # prompt-lookup tokens fed after out[-1] in the current step
        self.policy: DraftPolicy | None = None  # prompt lookup's draft sizing (the native loop's own)

    @property
    def reading(self) -> bool:
        return self.fed < len(self.prompt)


class Job(Protocol):
    """Slot work that is not a generation (embeddings.py's EmbedJob), run on the engine thread."""

    def run(self, free: list[int]) -> bool:
        """Runs one piece (one native step) on some of ``free`` (at least one slot, least recently used first),
        leaving them empty; True when the job is done."""
        ...

    def fail(self, message: str, status: int) -> None:
        """The job will not run (the server is stopping, or a piece raised)."""
        ...


class Engine:
    def __init__(self, dec: KwkDecoder, tokenizer: Any, *, eos: list[int], queue: int = 64, prefill_chunk: int = 64,
                 metrics: Metrics | None = None, grammars: Any = None,
                 prompt_lookup: int = PROMPT_LOOKUP) -> None:  # fmt: skip
        self.dec = dec
        self.tok = tokenizer
        self.grammars = grammars  # grammar.Grammars of this tokenizer (response_format)
        self.eos = set(eos)
        self.queue_limit = queue
        self.prefill_chunk = prefill_chunk
        self.metrics = metrics or Metrics()
        self.steps = 0  # decoder steps run (tests read it)
        self.prompt_lookup = prompt_lookup
        self.drafted = self.accepted = 0  # prompt-lookup tokens proposed and kept
        self.max_rows = 0  # most sequences seen in one step
        self.trace: collections.deque[tuple[int, int]] = collections.deque(maxlen=1024)  # (decode rows, prompt tokens)
        self._cv = threading.Condition()
        self._inbox: collections.deque[Request] = collections.deque()
        self._queued = 0  # requests submitted and not yet in a slot (under _cv)
        self._waiting: collections.deque[Request] = collections.deque()  # engine thread only
        self._running: dict[int, Request] = {}  # slot -> request (engine thread only)
        self._jobs: collections.deque[Job] = collections.deque()  # slot work waiting or in progress (under _cv)
        self._used = [0] * dec.max_batch  # when each slot was last given out (least recently used first)
        self._clock = 0
        self._closing = False
        self._stop = False
        self._rate: collections.deque[tuple[float, int]] = collections.deque()
        self._rate_tokens = 0  # the sum of the counts in _rate (kept as they come and go: O(1) a step)
        self._thread = threading.Thread(target=self._loop, name="kwker-engine", daemon=True)

    # ---- any thread
    def start(self) -> Engine:
        self._thread.start()
        return self

    def submit(self, reqs: list[Request]) -> None:
        """Queues the choices of one request (all or none). Raises QueueFull or Closed."""
        with self._cv:
            if self._closing or not self._thread.is_alive():
                raise Closed("the server is shutting down")
            if self._queued + len(reqs) > self.queue_limit + max(self.dec.max_batch - len(self._running), 0):
                raise QueueFull(f"{self._queued} requests are waiting (the queue holds {self.queue_limit})")
            self._queued += len(reqs)
            self._inbox.extend(reqs)
            self.metrics.queue_depth.set(self._queued)
            self._cv.notify()

    def submit_job(self, job: Job) -> None:
        """Queues slot work that generates nothing (see the module's header). Raises Closed."""
        with self._cv:
            if self._closing or not self._thread.is_alive():
                raise Closed("the server is shutting down")
            self._jobs.append(job)
            self._cv.notify()

    def cancel(self, req: Request) -> None:
        req.cancelled = True
        with self._cv:
            self._cv.notify()

    @property
    def busy(self) -> int:
        """Requests queued or running, and jobs."""
        with self._cv:
            return self._queued + len(self._running) + len(self._jobs)

    def forget(self) -> None:
        """Empties every slot's cached text (benchmarks and demos that must read prompts cold). Only while
        idle: the engine thread touches the decoder only for requests in flight."""
        with self._cv:
            if self._queued or self._running or self._inbox:
                raise RuntimeError("kwker: forget() while requests are in flight")
            self.dec.reset()

    def shutdown(self, grace: float = 30.0) -> None:
        """Takes no new requests; lets those in flight finish for up to ``grace`` seconds, then ends the
        rest with an error, and stops the engine thread."""
        with self._cv:
            self._closing = True
            self._cv.notify()
        end = time.monotonic() + grace
        while self.busy and time.monotonic() < end and self._thread.is_alive():
            time.sleep(0.02)
        with self._cv:
            self._stop = True
            self._cv.notify()
        if self._thread.is_alive():
            self._thread.join(timeout=60)

    # ---- engine thread
    @property
    def alive(self) -> bool:
        """The engine thread is running (if it died, requests are refused and /health says so)."""
        return self._thread.is_alive()

    def _loop(self) -> None:
        try:
            self._run()
        finally:
            with self._cv:
                self._closing = True
            self._fail_all("the server's engine stopped", 503)

    def _run(self) -> None:
        while True:
            with self._cv:
                while not (self._inbox or self._waiting or self._running or self._jobs or self._stop):
                    self._cv.wait()
                self._waiting.extend(self._inbox)
                self._inbox.clear()
                stop = self._stop
            if stop:
                self._fail_all("the server shut down before this request finished", 503)
                return
            try:
                self._reap()
                self._run_job()
                self._admit()
                if self._running:
                    self._step()
                elif self._waiting:  # only choices waiting on a sibling that is not running: poll
                    time.sleep(0.001)
            except Exception as e:  # noqa: BLE001  (the engine must outlive one failed step)
                log.exception("kwker serve: a decoder step failed; the requests in it end with an error")
                for slot, req in list(self._running.items()):
                    self._finish(req, error=f"the decoder failed: {e}")
                    try:
                        self.dec.truncate(slot, 0)
                    except Exception:  # noqa: BLE001  (a slot that cannot be emptied is only not reused)
                        log.exception("kwker serve: slot %d could not be emptied", slot)

    def _run_job(self) -> None:
        """One piece of the oldest job, on the free slots (none free: it waits for a request to end)."""
        with self._cv:
            job = self._jobs[0] if self._jobs else None
        free = sorted((s for s in range(self.dec.max_batch) if s not in self._running), key=lambda s: self._used[s])
        if job is None or not free:
            return
        try:
            done = job.run(free)
        except Exception as e:  # noqa: BLE001  (the job fails alone)
            log.exception("kwker serve: a job failed")
            job.fail(f"the decoder failed: {e}", 500)
            done = True
        if done:
            with self._cv:
                self._jobs.popleft()

    def _reap(self) -> None:
        now = time.monotonic()
        for req in [*self._waiting, *self._running.values()]:
            if req.cancelled:
                self._finish(req, error="cancelled", status=499)
            elif req.deadline is not None and now > req.deadline:
                self._finish(req, error="the request timed out (the server's --request-timeout)", status=504)

    def _admit(self) -> None:
        free = sorted((s for s in range(self.dec.max_batch) if s not in self._running), key=lambda s: self._used[s])
        for req in list(self._waiting):
            if not free:
                break
            if req.after is not None and not req.after.done and (req.after.slot < 0 or req.after.reading):
                continue  # read once: wait for the sibling to read the prompt, then copy it
            if len(req.prompt) >= self.dec.max_context:
                self._finish(req, error=f"the prompt has {len(req.prompt)} tokens; this server's context is "
                             f"{self.dec.max_context} tokens per request", status=400)  # fmt: skip
                continue
            try:
                prompt = torch.tensor(req.prompt, dtype=torch.int64)
                slot, held = prompt_cache.seat(self.dec, prompt, free, range(self.dec.max_batch))
            except Exception as e:  # noqa: BLE001  (this request fails alone)
                log.exception("kwker serve: a request could not take a slot")
                self._finish(req, error=f"the request could not take a slot: {e}")
                continue
            free.remove(slot)
            self._waiting.remove(req)
            self._clock += 1
            self._used[slot] = self._clock
            req.slot, req.cached, req.fed = slot, held, held
            self._running[slot] = req
            with self._cv:
                self._queued -= 1
                self.metrics.queue_depth.set(self._queued)
            self.metrics.prompt_tokens.inc(len(req.prompt))
            self.metrics.cached_tokens.inc(held)
        self.metrics.running.set(len(self._running))

    def _step(self) -> None:
        seqs: list[tuple[int, list[int]]] = []
        modes: list[str] = []
        who: list[Request] = []
        generating = [r for r in self._running.values() if not r.reading]
        lookup = self.prompt_lookup > 0 and len(generating) <= LOOKUP_SEQS
        drafted = 0
        for req in generating:
            req.drafts = self._drafts(req, len(generating), len(generating) + drafted) if lookup else []
            drafted += len(req.drafts)
            seqs.append((req.slot, [req.out[-1], *req.drafts]))
            modes.append("all" if req.drafts else "last")
            who.append(req)
        decoding = len(seqs)
        budget = self.prefill_chunk if seqs else IDLE_CHUNK
        for req in self._running.values():
            if req.reading and budget > 0:
                chunk = req.prompt[req.fed : req.fed + budget]
                budget -= len(chunk)
                req.fed += len(chunk)
                seqs.append((req.slot, chunk))
                modes.append("none" if req.reading else "last")
                who.append(req)
        t0 = time.perf_counter()
        rows = self.dec.step(seqs, logits=modes)
        took = time.perf_counter() - t0
        self.metrics.step_seconds.observe(took)
        self.metrics.batch_size.observe(len(seqs))
        self.steps += 1
        self.max_rows = max(self.max_rows, len(seqs))
        self.trace.append((decoding, sum(len(t) for _, t in seqs[decoding:])))
        made = 0
        n_rows = sum(len(t) for _, t in seqs)
        for req, mode, logits in zip(who, modes, rows, strict=True):
            if mode != "none":
                before = len(req.out)
                try:
                    if req.drafts:
                        self._verify(req, logits, n_rows, took)
                    else:
                        if req.policy is not None:
                            req.policy.record(n_rows, took)
                        self._advance(req, logits[0])
                except Exception as e:  # noqa: BLE001  (e.g. a grammar that allows no token: this request fails alone)
                    log.exception("kwker serve: choosing a request's next token failed")
                    self._finish(req, error=f"choosing the next token failed: {e}")
                made += max(len(req.out) - before, 1)
        self._count_rate(made)

    def _drafts(self, req: Request, batch: int, rows: int) -> list[int]:
        """Prompt-lookup drafts for a greedy request without a grammar (sampled text keeps its own rule), in a
        step of ``batch`` generating requests and ``rows`` rows so far."""
        if req.sampler.rng is not None or req.sampler.matcher is not None:
            return []
        if req.policy is None:
            req.policy = DraftPolicy(self.prompt_lookup)
        room = min(req.params.max_tokens - len(req.out), self.dec.max_context - len(req.prompt) - len(req.out)) - 1
        return req.policy.next(req.prompt + req.out, room, batch, rows)

    def _verify(self, req: Request, logits: torch.Tensor, rows: int, took: float) -> None:
        """Keeps the drafts the model itself chooses, then one token of its own (from the first row whose
        input it agrees with), and truncates the rejected drafts off the slot."""
        drafts, held = req.drafts, len(req.prompt) + len(req.out)  # (the slot held held - 1 before the step)
        kept = 0
        for j in range(len(drafts) + 1):
            self._advance(req, logits[j])
            if req.done or j == len(drafts) or req.out[-1] != drafts[j]:
                break
            kept += 1
        if kept < len(drafts):
            self.dec.truncate(req.slot, held + kept)
        self.drafted += len(drafts)
        self.accepted += kept
        self.metrics.draft_tokens.inc(len(drafts))
        self.metrics.accepted_tokens.inc(kept)
        if req.policy is not None:
            req.policy.update(len(drafts), kept)
            req.policy.record(rows, took)

    def _advance(self, req: Request, logits: torch.Tensor) -> None:
        tok, lp, top = req.sampler.choose(logits)
        if req.first_token is None:
            req.first_token = time.monotonic()
            self.metrics.ttft.observe(req.first_token - req.arrival)
        self.metrics.generated_tokens.inc()
        req.n_generated += 1
        if tok in self.eos and not req.params.ignore_eos:
            self._finish(req, finish="stop")
            return
        req.out.append(tok)
        piece = req.detok.push(tok)
        req._pending.append(TokenOut(tok, piece, len(req.stopper.text), lp, top))
        text, hit = req.stopper.feed(piece)
        if hit:
            self._finish(req, finish="stop", text=text, hit=True)
            return
        if req.sampler.grammar_done:
            self._finish(req, finish="stop", text=text)
        elif len(req.out) >= req.params.max_tokens or len(req.prompt) + len(req.out) >= self.dec.max_context:
            self._finish(req, finish="length", text=text)
        elif text or not req.params.stop:
            req.emit(Event(text, self._released(req)))

    def _released(self, req: Request) -> list[TokenOut]:
        """Tokens whose text starts in released text (all of them once generation ends)."""
        n = 0
        while n < len(req._pending) and req._pending[n].offset < req.stopper.released:
            n += 1
        out, req._pending = req._pending[:n], req._pending[n:]
        return out

    def _finish(self, req: Request, *, finish: str | None = None, text: str = "", hit: bool = False,
                error: str | None = None, status: int = 500) -> None:  # fmt: skip
        """Ends a request: frees its slot (which keeps its text for the prompt cache) and sends the last
        event. ``text``: released by the token that ended it; ``hit``: a stop string ended it (the text
        after it is dropped), else any text held back is released now."""
        if req.done:
            return
        req.done = True
        if req.slot >= 0 and self._running.get(req.slot) is req:
            del self._running[req.slot]
            self.metrics.running.set(len(self._running))
            self._clock += 1
            self._used[req.slot] = self._clock  # a conversation that just ended is evicted last
        elif req in self._waiting:
            self._waiting.remove(req)
            with self._cv:
                self._queued -= 1
                self.metrics.queue_depth.set(self._queued)
        if error is not None:
            req.emit(Event(error=error, status=status))
            return
        if not hit:
            extra, hit = req.stopper.feed(req.detok.flush())
            text += extra
            if not hit:
                text += req.stopper.flush()
        # Without a stop string every token is reported (trailing ones may have no text: skipped specials).
        end = len(req.stopper.text)
        req.emit(Event(text, [t for t in req._pending if t.offset < end or not hit], finish=finish))

    def _fail_all(self, message: str, status: int) -> None:
        for req in [*self._waiting, *self._running.values(), *self._inbox]:
            self._finish(req, error=message, status=status)
        with self._cv:
            jobs, self._jobs = list(self._jobs), collections.deque()
        for job in jobs:
            job.fail(message, status)

    def _count_rate(self, made: int) -> None:
        now = time.monotonic()
        self._rate.append((now, made))
        self._rate_tokens += made
        while self._rate and self._rate[0][0] < now - 5.0:
            self._rate_tokens -= self._rate.popleft()[1]
        span = now - self._rate[0][0] if len(self._rate) > 1 else 0.0
        if span > 0:
            self.metrics.tokens_per_second.set(self._rate_tokens / span)
