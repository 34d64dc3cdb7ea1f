"""rgb-serve for its operator: what the server did and is doing, and how much it takes on.

- `ServerLog`: what was asked (each image's sha256), which faults were served, and the requests worked on and
  waiting right now; `Queue`: at most `limits.max_concurrency` requests worked on at once, `limits.max_queue` more
  waiting first come first served, beyond both a 429 with Retry-After; `misbehave`: the `faults` served on purpose.
- `AccessLog`: one line per HTTP request (client, method, path, status, latency, tokens, request id) on the
  `rgb.serve.access` logger, as vLLM's access log reads; every reply carries an `x-request-id` header (the client's
  own when it sent one, as OpenAI's API and vLLM echo it; else a fresh one).
- `Throughput`: every `log_interval_s` a line of requests/s, prompt and generation tokens/s (vLLM's "Avg prompt
  throughput"); `Metrics`: the same, and more, for Prometheus (`GET /metrics`, what vLLM's dashboards and
  autoscalers scrape): requests and errors by route and status, the requests running and waiting, a latency
  histogram, prompt and generation tokens. Each server has its own registry (two servers in one process count
  apart).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
import uuid
from dataclasses import dataclass, field

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from rgb.serve.protocol import ErrorReply
from rgb.serve.request import Faults, Limits

access_log = logging.getLogger("rgb.serve.access")
# Polled by probes and scrapers every few seconds: their access lines are DEBUG, so they do not bury the requests.
POLLED = ("/health", "/metrics")
# A client's x-request-id is echoed when it is this short and visible ASCII (it goes into a header and a log line).
MAX_REQUEST_ID = 128


@dataclass
class ServerLog:
    """What the server was asked (sha256 of each image, in order), which faults it served, and the requests
    being worked on (`active`) or waiting (`waiting`) right now."""

    images: list[str] = field(default_factory=list)
    faults: dict[str, int] = field(default_factory=dict)
    active: int = 0
    waiting: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def count(self) -> int:
        with self.lock:
            return len(self.images)

    def record(self, image_sha256: str, faults: Faults) -> tuple[int, str | None]:
        """Log an image asked about: its number (from 1) and the fault it gets (None: an honest answer)."""
        with self.lock:
            self.images.append(image_sha256)
            number = len(self.images)
            fault = faults.pick(number)
            if fault:
                self.faults[fault] = self.faults.get(fault, 0) + 1
        return number, fault


async def misbehave(faults: Faults, fault: str | None) -> None:
    """Serve `fault` before the answer: a 429 or a 500 instead of it, or a slow one (the malformed answer is the
    caller's: it answers without asking the model)."""
    if fault == "rate_limit":
        raise ErrorReply(429, "rate limit reached", "rate_limit_exceeded", kind="requests",
                         headers={"Retry-After": f"{faults.retry_after_s:g}"})
    if fault == "error":
        raise ErrorReply(500, "injected server error", "server_error", kind="server_error")
    if fault == "slow":
        await asyncio.sleep(faults.slow_s)


class Queue:
    """The server's turns: `max_concurrency` requests worked on at once, `max_queue` more waiting in line."""

    def __init__(self, limits: Limits, counts: ServerLog):
        self.limits, self.counts = limits, counts
        self._turns = asyncio.Semaphore(limits.max_concurrency)

    @contextlib.asynccontextmanager
    async def turn(self):
        """Hold one turn, waiting in line if the queue has room (else an ErrorReply 429)."""
        counts, limits = self.counts, self.limits
        with counts.lock:
            if counts.active + counts.waiting >= limits.max_concurrency + limits.max_queue:
                raise ErrorReply(429, "rgb-serve is at its concurrency limit, retry later", "rate_limit_exceeded",
                                 kind="requests", headers={"Retry-After": "1"})
            counts.waiting += 1
        try:
            await self._turns.acquire()
        finally:
            with counts.lock:
                counts.waiting -= 1
        with counts.lock:
            counts.active += 1
        try:
            yield
        finally:
            with counts.lock:
                counts.active -= 1
            self._turns.release()


class Throughput:
    """The completions answered (chat route and Batch lines alike) and their tokens since the last report."""

    def __init__(self, clock=time.monotonic):
        self.clock, self.lock = clock, threading.Lock()
        self.since, self.requests, self.prompt_tokens, self.completion_tokens = clock(), 0, 0, 0

    def add(self, prompt_tokens: int, completion_tokens: int) -> None:
        with self.lock:
            self.requests += 1
            self.prompt_tokens += prompt_tokens
            self.completion_tokens += completion_tokens

    def report(self, active: int, waiting: int) -> str | None:
        """The rates since the last report, which starts a new interval; None when nothing was asked or is
        waiting (an idle server logs nothing)."""
        with self.lock:
            now = self.clock()
            seconds, counts = max(now - self.since, 1e-9), (self.requests, self.prompt_tokens, self.completion_tokens)
            self.since, self.requests, self.prompt_tokens, self.completion_tokens = now, 0, 0, 0
        if not counts[0] and not active and not waiting:
            return None
        return (f"throughput: {counts[0] / seconds:.2f} requests/s, prompt {counts[1] / seconds:.1f} tokens/s, "
                f"generation {counts[2] / seconds:.1f} tokens/s, running {active}, waiting {waiting} "
                f"(last {seconds:.1f} s)")


class Metrics:
    """The server's Prometheus metrics, in a registry of its own; the running and waiting gauges read `counts`
    when scraped (nothing is counted twice)."""

    def __init__(self, counts: ServerLog):
        self.registry = CollectorRegistry()
        labels = ("method", "route", "status")
        self.requests = Counter("rgb_serve_requests", "HTTP requests answered", labels, registry=self.registry)
        self.errors = Counter("rgb_serve_request_errors", "HTTP requests answered with a status >= 400", labels,
                              registry=self.registry)
        self.latency = Histogram("rgb_serve_request_duration_seconds", "Time from a request's arrival to its "
                                 "answer's end", ("method", "route"), registry=self.registry)
        self.prompt_tokens = Counter("rgb_serve_prompt_tokens", "Prompt tokens of the completions answered (chat "
                                     "route and Batch lines)", registry=self.registry)
        self.generation_tokens = Counter("rgb_serve_generation_tokens", "Completion tokens of the completions "
                                         "answered (chat route and Batch lines)", registry=self.registry)
        self.completions = Counter("rgb_serve_completions", "Completions answered (chat route and Batch lines)",
                                   registry=self.registry)
        Gauge("rgb_serve_requests_running", "Requests being worked on by the model", registry=self.registry
              ).set_function(lambda: counts.active)
        Gauge("rgb_serve_requests_waiting", "Requests waiting for a turn (the queue's depth)", registry=self.registry
              ).set_function(lambda: counts.waiting)

    def answered(self, method: str, route: str, status: int, seconds: float) -> None:
        """Count an HTTP request answered."""
        self.requests.labels(method, route, str(status)).inc()
        if status >= 400:
            self.errors.labels(method, route, str(status)).inc()
        self.latency.labels(method, route).observe(seconds)

    def completed(self, prompt_tokens: int, completion_tokens: int) -> None:
        """Count a completion answered and its tokens."""
        self.completions.inc()
        self.prompt_tokens.inc(prompt_tokens)
        self.generation_tokens.inc(completion_tokens)

    def exposition(self) -> tuple[bytes, str]:
        """The metrics in Prometheus's text format, and its content type."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


def _request_id(scope) -> str:
    """The client's x-request-id when it is a short visible-ASCII token, else a fresh one."""
    given = dict(scope["headers"]).get(b"x-request-id", b"")
    if 0 < len(given) <= MAX_REQUEST_ID and all(0x21 <= c <= 0x7E for c in given):
        return given.decode()
    return uuid.uuid4().hex


class AccessLog:
    """ASGI middleware: one line per HTTP request once its answer is sent (client, method, path, status, latency
    and, for a completion, its tokens, which the route leaves in the scope's `rgb.usage`; then its request id),
    the request counted in `metrics` under its route's template (so ids in paths make no new series), and the
    `x-request-id` header on every reply."""

    def __init__(self, app, metrics: Metrics):
        self.app, self.metrics = app, metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        start, status, usage = time.perf_counter(), [500], scope.setdefault("rgb.usage", {})
        request_id = _request_id(scope)

        async def sending(message):
            if message["type"] == "http.response.start":
                status[0] = message["status"]
                message = {**message, "headers": [*message.get("headers", ()), (b"x-request-id", request_id.encode())]}
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            seconds = time.perf_counter() - start
            route = getattr(scope.get("route"), "path", "unmatched")
            self.metrics.answered(scope["method"], route, status[0], seconds)
            client = "%s:%s" % tuple(scope["client"]) if scope.get("client") else "-"
            tokens = "".join(f" {key}={value}" for key, value in usage.items())
            access_log.log(logging.DEBUG if scope["path"] in POLLED else logging.INFO,
                           '%s "%s %s" %d %.1f ms%s request_id=%s', client, scope["method"], scope["path"],
                           status[0], seconds * 1000, tokens, request_id)
