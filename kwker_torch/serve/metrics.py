"""The server's Prometheus metrics (``GET /metrics``, text exposition format), one registry per app so
that several servers in one process (tests, Ray replicas) do not share counters. prometheus_client's
metrics are thread-safe: the engine thread and the HTTP handlers update them concurrently.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

_LATENCY = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class Metrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.requests = Counter("kwker_requests", "HTTP requests answered, by endpoint and status",
                                ["endpoint", "status"], registry=r)  # fmt: skip
        self.prompt_tokens = Counter("kwker_prompt_tokens", "Prompt tokens of admitted requests", registry=r)
        self.cached_tokens = Counter("kwker_cached_prompt_tokens", "Prompt tokens a slot already held (not read)",
                                     registry=r)  # fmt: skip
        self.generated_tokens = Counter("kwker_generated_tokens", "Tokens generated", registry=r)
        self.draft_tokens = Counter("kwker_draft_tokens", "Prompt-lookup tokens proposed", registry=r)
        self.accepted_tokens = Counter("kwker_draft_accepted_tokens", "Prompt-lookup tokens kept", registry=r)
        self.queue_depth = Gauge("kwker_queue_depth", "Requests waiting for a slot", registry=r)
        self.running = Gauge("kwker_running_requests", "Requests holding a slot", registry=r)
        self.batch_size = Histogram("kwker_batch_size", "Sequences per decoder step", registry=r,
                                    buckets=(1, 2, 3, 4, 6, 8, 12, 16, 32, 64))  # fmt: skip
        self.step_seconds = Histogram("kwker_step_seconds", "Time of one decoder step", registry=r, buckets=_LATENCY)
        self.ttft = Histogram("kwker_time_to_first_token_seconds", "Arrival to first generated token", registry=r,
                              buckets=_LATENCY)  # fmt: skip
        self.tokens_per_second = Gauge("kwker_tokens_per_second", "Tokens generated per second, over the last 5 s",
                                       registry=r)  # fmt: skip

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
