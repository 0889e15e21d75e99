"""Prometheus metrics of one engine and its server (`GET /metrics`, the text exposition format).

The registry is the engine's own, not prometheus_client's process-wide default, so several
engines in one process (tests, a CLI next to a server) never share or collide on counters.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

if TYPE_CHECKING:
    from pegmask.engine.scheduler import Scheduler, Submission

_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class Metrics:
    """Counters of requests, tokens and time; gauges of the scheduler's rows and queue."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("pegmask_requests", "HTTP requests by API and status code",
                                ["api", "status"], registry=r)
        self.running = Gauge("pegmask_running_rows", "Rows (choices) decoding now", registry=r)
        self.queued = Gauge("pegmask_queued_requests", "Requests waiting for room", registry=r)
        self.batch_size = Histogram("pegmask_batch_size", "Rows sampled per decode step",
                                    buckets=_BATCH_BUCKETS, registry=r)
        self.prompt_tokens = Counter("pegmask_prompt_tokens", "Prompt tokens prefilled",
                                     registry=r)
        self.cached_prompt_tokens = Counter(
            "pegmask_prompt_tokens_cached", "Prompt tokens read from the prefix cache",
            registry=r)
        self.generation_tokens = Counter("pegmask_generation_tokens",
                                         "Output tokens (forced ones included)", registry=r)
        self.draft_tokens = Counter(
            "pegmask_draft_tokens", "Tokens drafted by prompt lookup and checked in a forward",
            registry=r)
        self.draft_tokens_kept = Counter(
            "pegmask_draft_tokens_kept", "Drafted tokens the samples agreed with", registry=r)
        self.time_to_first_token = Histogram(
            "pegmask_time_to_first_token_seconds", "From submission to the first output token",
            buckets=_LATENCY_BUCKETS, registry=r)
        self.request_duration = Histogram(
            "pegmask_request_duration_seconds", "From submission to the end of the request",
            buckets=_LATENCY_BUCKETS, registry=r)
        self.mask_seconds = Counter("pegmask_mask_seconds",
                                    "Time spent filling and applying token masks", registry=r)
        self.grammar_compiles = Counter(
            "pegmask_grammar_compiles", "Grammar compiles by outcome (ok, invalid, "
            "compile_time, compile_memory, error)", ["outcome"], registry=r)
        self.grammar_compile_seconds = Histogram(
            "pegmask_grammar_compile_seconds", "Time a grammar's compile took (worker included)",
            buckets=_LATENCY_BUCKETS, registry=r)

    def watch(self, scheduler: Scheduler) -> None:
        """Read the scheduler's rows and queue at each scrape."""
        self.running.set_function(lambda: scheduler.running)
        self.queued.set_function(lambda: scheduler.queued)

    # ----------------------------------------------------------------- the scheduler's hooks
    def step(self, rows: int, mask_s: float) -> None:
        self.batch_size.observe(rows)
        self.mask_seconds.inc(mask_s)

    def first_token(self, submission: Submission) -> None:
        self.time_to_first_token.observe(time.monotonic() - submission.submitted_at)

    def request_ended(self, submission: Submission) -> None:
        self.request_duration.observe(time.monotonic() - submission.submitted_at)
        if submission.rows:
            self.prompt_tokens.inc(len(submission.spec.prompt_ids))
            self.cached_prompt_tokens.inc(submission.cached_tokens)
            self.generation_tokens.inc(sum(len(row.generated) for row in submission.rows))

    def grammar_compiled(self, outcome: str, seconds: float) -> None:
        """(`CompileService`'s hook.)"""
        self.grammar_compiles.labels(outcome=outcome).inc()
        self.grammar_compile_seconds.observe(seconds)

    # ----------------------------------------------------------------- the server's
    def http(self, api: str, status: int) -> None:
        self.requests.labels(api=api, status=str(status)).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
