"""The endpoint client of the `api` family: one chat-completions request at a time, retried with exponential backoff
and jitter (or the server's Retry-After), under a per-minute rate limit; what asking cost; how many requests are left.
The API key is read from the environment at request time and never written anywhere, nor shown in an error.
"""

from __future__ import annotations

import email.utils
import functools
import json
import math
import os
import random
import threading
import time
from collections import deque
from dataclasses import dataclass, field

from rgb.core.errors import UserError
from rgb.core.jsonrecord import JsonRecord
from rgb.core.options import Ruled
from rgb.core.secrets import fill_secrets, redact_logs
from rgb.core.values import POSITIVE, POSITIVE_INT, ConfigValueError, Rule, optional, problems
from rgb.endpoints.cost import Price, billed_usage
from rgb.endpoints.settings import ClientSettings

# The HTTP libraries log each URL they ask (at INFO or DEBUG): a key in its query is redacted there too.
redact_logs("httpx", "httpx2", "openai", "openai._base_client")

# Transient failures worth another try; any other HTTP error is the endpoint refusing for good.
RETRY_STATUS = frozenset({408, 409, 425, 429, 500, 502, 503, 504})


class ApiError(UserError, RuntimeError):
    """The endpoint refused for good (401, unknown model, image not supported) or kept failing: one line that
    names the endpoint and the model, never the key. Also class names no answer could tell apart."""


class RateLimiter:
    """Requests and tokens per minute over a sliding 60 s window (None: unlimited). Tokens are charged by each
    request's estimate (the mean of the answers so far) and corrected when its usage is known."""

    WINDOW_S = 60.0

    def __init__(self, requests_per_minute: float | None, tokens_per_minute: float | None,
                 clock=time.monotonic, sleep=time.sleep):
        self.rpm, self.tpm = requests_per_minute, tokens_per_minute
        self.clock, self.sleep = clock, sleep
        self._events: deque[list] = deque()  # [time, tokens]
        self._lock = threading.Lock()
        self._seen_tokens, self._seen_requests = 0, 0

    def acquire(self) -> list:
        while True:
            with self._lock:
                now = self.clock()
                while self._events and self._events[0][0] <= now - self.WINDOW_S:
                    self._events.popleft()
                estimate = self._seen_tokens / self._seen_requests if self._seen_requests else 0.0
                used = sum(e[1] for e in self._events)
                if ((self.rpm is None or len(self._events) < self.rpm)
                        and (self.tpm is None or not self._events or used + estimate <= self.tpm)):
                    event = [now, estimate]
                    self._events.append(event)
                    return event
                delay = self._events[0][0] + self.WINDOW_S - now
            self.sleep(max(delay, 0.01))

    def settle(self, event: list, tokens: int) -> None:
        with self._lock:
            event[1] = tokens
            self._seen_tokens += tokens
            self._seen_requests += 1


@dataclass
class RequestStats(JsonRecord):
    """What asking cost, per call of `ApiClassifier.answer` (one split), and as scores.json records it per split
    (rgb.evaluation.records.ApiUsage) with the money of rgb.evaluation.endpoint_eval.ApiPredictor.money. Of the
    abstentions, `negations` and `alternatives` named a class but denied it or offered it as one of several (0 when
    recorded before answer parser version 2). The fields keep the order scores.json has always written them in."""

    images: int = 0
    requests: int = 0      # new answers received from the endpoint
    cached: int = 0        # images answered from the cache (other splits, earlier runs, duplicates in the split)
    retries: int = 0
    abstained: int = 0     # answers that name no class (counted wrong)
    unanswered: int = 0    # not asked (max_requests reached) or cut by the token limit (truncated)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    backoff_s: float = 0.0
    negations: int = 0     # abstentions naming a class but denying it ("not 3")
    alternatives: int = 0  # abstentions offering a class as one of several ("3 or 8")
    truncated: int = 0     # answers cut by the token limit before naming a class: not cached, asked again next run
    cached_prompt_tokens: int = 0      # the usage of the cached answers used (once per distinct answer), so that
    cached_completion_tokens: int = 0  # a run resumed after a cap totals as one uninterrupted run (0 before kept)
    spent: float | None = None      # USD billed for the answers this split is the first of its evaluation to use
    list_cost: float | None = None  # the same answers at list price (None: no price, or recorded before)


def _cap(rule: Rule):
    return field(default=None, metadata={"rule": optional(rule)})


@dataclass(frozen=True)
class RequestCaps(Ruled):
    """What one evaluation may send and spend on new answers (None: no limit), declared once: a cap is its field
    here (its rule, enforced by RequestBudget) and its key in conf/evaluate.yaml, which evaluate.py maps by name.
    A capped run may stop early: it is then partial, and a re-run continues from the answer cache."""

    max_requests: int | None = _cap(POSITIVE_INT)  # new requests
    max_tokens_total: int | None = _cap(POSITIVE_INT)  # tokens (prompt and completion) of new answers
    max_cost: float | None = _cap(POSITIVE)  # USD billed for new answers (needs a price)

    def __post_init__(self):
        found = problems({name: getattr(self, name) for name in self.names()}, self.rules())
        if found:
            raise ConfigValueError(f"invalid value: {found[0]} (null: no limit)")

    @property
    def capped(self) -> bool:
        """Some cap is set: a split may stay unasked (missing, never 0)."""
        return any(getattr(self, name) is not None for name in self.names())


@dataclass
class RequestBudget:
    """What this evaluation may still spend: `max_requests` new requests, `max_tokens_total` tokens (prompt and
    completion) and `max_cost` USD billed (priced by `price`) of new answers (None: no limit). Each request holds
    its estimated tokens and cost (`reserve`) until its usage is known (`settle`), and is sent only when the spent,
    the held and its own fit under the caps, so the requests in flight never take a run past a cap. An estimate
    is scaled by the largest actual/estimated tokens seen, should the endpoint count more than the estimate. When
    a cap is reached no new request is sent: the answers so far are cached, the rest is left to a re-run."""

    remaining: int | None = None
    max_tokens_total: int | None = None
    max_cost: float | None = None
    price: Price | None = None
    tokens: int = 0      # spent so far by new answers
    cost: float = 0.0    # USD billed for them
    held_tokens: int = 0  # reserved by the requests in flight
    held_cost: float = 0.0
    scale: float = 1.0    # the largest actual/estimated tokens of a request so far (at least 1)
    stopped_by: str | None = None  # the cap that stopped the asking (logged once)

    def __post_init__(self):
        RequestCaps(self.remaining, self.max_tokens_total, self.max_cost)  # each cap's rule
        if self.max_cost is not None and self.price is None:
            raise ConfigValueError("max_cost needs the model's price: set model.price={input: USD, output: USD} per "
                                   "1M tokens (its model is not in conf/prices.yaml)")

    @classmethod
    def of(cls, caps: RequestCaps, price: Price | None) -> RequestBudget:
        return cls(caps.max_requests, caps.max_tokens_total, caps.max_cost, price)

    def take(self, wanted: int) -> int:
        granted = wanted if self.remaining is None else min(wanted, self.remaining)
        if self.remaining is not None:
            self.remaining -= granted
        return granted

    def reserve(self, prompt_tokens: int, completion_tokens: int) -> tuple[int, float, int] | None:
        """Hold one request's estimate (tokens, USD at the online price, the unscaled tokens) until `settle`; None,
        holding nothing, when it could take the run past a cap, which is then `stopped_by` for good (the caller
        holds the lock of its requests)."""
        if self.stopped_by is not None:
            return None
        prompt, completion = math.ceil(prompt_tokens * self.scale), math.ceil(completion_tokens * self.scale)
        tokens, cost = prompt + completion, 0.0 if self.price is None else self.price.cost(prompt, completion)
        if self.max_tokens_total is not None and self.tokens + self.held_tokens + tokens > self.max_tokens_total:
            self.stopped_by = f"max_tokens_total={self.max_tokens_total}"
        elif self.max_cost is not None and self.cost + self.held_cost + cost > self.max_cost:
            self.stopped_by = f"max_cost={self.max_cost:g}"
        if self.stopped_by is not None:
            return None
        self.held_tokens += tokens
        self.held_cost += cost
        return tokens, cost, prompt_tokens + completion_tokens

    def settle(self, held: tuple[int, float, int], billed: dict | None) -> None:
        """Release a request's hold and count what it was billed (rgb.endpoints.cost.billed_usage; None: it
        failed, nothing billed)."""
        self.held_tokens -= held[0]
        self.held_cost -= held[1]
        if billed is None:
            return
        tokens = billed["prompt_tokens"] + billed["completion_tokens"]
        self.tokens += tokens
        self.cost += 0.0 if self.price is None else self.price.billed(billed)
        self.scale = max(self.scale, tokens / max(held[2], 1))


def _retry_after(headers) -> float | None:
    """The server's wait in seconds: retry-after-ms (OpenAI's), else Retry-After (a number or an HTTP date)."""
    try:
        return max(0.0, float(headers["retry-after-ms"]) / 1000)
    except (KeyError, TypeError, ValueError):
        pass
    value = headers.get("retry-after")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        try:
            return max(0.0, email.utils.parsedate_to_datetime(value).timestamp() - time.time())
        except (TypeError, ValueError):
            return None


def _one_line(text: str, limit: int = 200) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


class _Transient(Exception):
    """A failure worth another try; `attempts`: at most this many tries in all for its kind (None: max_retries)."""

    attempts: int | None = None

    def __init__(self, reason: str, retry_after: float | None = None):
        super().__init__(reason)
        self.retry_after = retry_after


class _Unreachable(_Transient):
    """Nothing answers at the address (refused, unknown host): one quick second try, then one line, in seconds."""

    attempts = 2


def _error_message(response) -> str:
    """The error message of an OpenAI-style error body, else the start of the body."""
    try:
        error = response.json().get("error")
        return str(error.get("message") if isinstance(error, dict) else error)
    except (ValueError, AttributeError):
        return response.text[:200] or response.reason_phrase


def completion_record(reply: dict, batch: bool = False) -> dict:
    """The answer cache's record of a chat.completion body (less its key), whichever path asked: one request or
    a line of a Batch (rgb.endpoints.batch), with what the provider billed for it (`billed`: the Batch rate,
    prompt-cached tokens). KeyError/IndexError/TypeError: no choices[0].message.content."""
    choice = reply["choices"][0]
    text = choice["message"]["content"]
    usage = reply.get("usage") or {}
    # content is null when a reasoning model spent its whole token limit thinking: an empty, cut answer
    return {"answer": "" if text is None else text if isinstance(text, str) else json.dumps(text),
            "usage": {k: int(usage.get(k) or 0) for k in ("prompt_tokens", "completion_tokens")},
            "finish_reason": choice.get("finish_reason"), "served_model": reply.get("model"),
            "billed": billed_usage(usage, batch)}


@functools.cache
def _sdk_request_fields() -> frozenset:
    """The request fields the SDK's chat-completions `create` names; its own options (timeout, extra_*) are not."""
    import inspect

    from openai.resources.chat.completions import Completions

    return frozenset(k for k in inspect.signature(Completions.create).parameters
                     if k not in ("self", "timeout") and not k.startswith("extra_"))


class Endpoint:
    """One model of a chat-completions endpoint, asked through the official `openai` SDK (it speaks to OpenAI,
    Azure, vLLM, SGLang, Ollama and the compatible endpoints) with the SDK's own retries off: retries, rate limits,
    the cache and the accounting are ours."""

    def __init__(self, base_url: str, api_model: str, client: ClientSettings, sleep=time.sleep):
        self.base_url, self.api_model, self.client_settings = base_url, api_model, client
        self._sleep = sleep

    def refused(self, what: str, key: str | None) -> ApiError:
        message = _one_line(what)
        if key:
            message = message.replace(key, "[key]")
        return ApiError(f"{self.base_url} (model {self.api_model!r}): {message}")

    def api_key(self) -> str | None:
        """The key in the environment variable `api_key_env` names (None when unset or empty), read at each use and
        never stored."""
        return os.environ.get(self.client_settings.api_key_env) or None

    def address(self) -> tuple[str, dict, dict]:
        """(base URL, query parameters, headers) to send: a secret recorded as REDACTED (a key in a query parameter or a header,
        rgb.core.secrets) filled with the key from the environment; never stored."""
        key = self.api_key()
        try:
            return fill_secrets(self.base_url, self.client_settings.headers, key)
        except ValueError as err:
            raise self.refused(f"{err}: set {self.client_settings.api_key_env}", key) from None

    def sdk(self, api_key: str, max_retries: int = 0, http_client=None):
        """The `openai` SDK client of this endpoint (the one place one is built): its address (`address`: the
        query and headers with their secrets filled) and the settings' timeout."""
        import openai

        base_url, query, headers = self.address()
        return openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=max_retries,
                             timeout=self.client_settings.timeout_s, default_headers=headers, default_query=query,
                             http_client=http_client)

    def session(self):
        """The SDK client of one `answer` call (a context manager), on an HTTP client of `max_concurrency`
        connections. The key is not given here: each request reads it from the environment (`post_once`)."""
        import httpx2  # the SDK's HTTP library
        import openai

        http = openai.DefaultHttpxClient(limits=httpx2.Limits(max_connections=self.client_settings.max_concurrency))
        return self.sdk("read-per-request", http_client=http)

    def check_served(self) -> None:
        """GET {base_url}/models, as train.py asks before it makes a run dir for this endpoint: an ApiError (one
        line) when nothing answers there, the endpoint refuses (a wrong key: 401), or `api_model` is not among the
        ids it serves (listed)."""
        import openai

        key = self.api_key()
        auth = {"Authorization": f"Bearer {key}" if key else openai.Omit()}

        def failed(what: str) -> ApiError:
            return ApiError(f"{self.refused(what, key)} (model.check_endpoint=false skips this check)")

        try:
            with self.session() as sdk:
                served = [model.id for model in sdk.models.list(extra_headers=auth)]
        except openai.APIConnectionError as err:  # refused, unknown host, timeout
            raise failed(f"GET /models: cannot reach the endpoint ({type(err.__cause__ or err).__name__})") from None
        except openai.APIStatusError as err:
            hint = {401: f"; is {self.client_settings.api_key_env} set to a valid key?"}.get(err.status_code, "")
            raise failed(f"GET /models: HTTP {err.status_code}: {_error_message(err.response)}{hint}") from None
        if self.api_model not in served:
            shown = ", ".join(served[:10]) + (f", ... ({len(served)} in all)" if len(served) > 10 else "")
            raise ApiError(f"{self.base_url} does not serve model {self.api_model!r}; it serves: {shown or 'none'} "
                           f"(model.check_endpoint=false skips this check)")

    @staticmethod
    def _sdk_arguments(body: dict) -> dict:
        """`body` as keyword arguments of the SDK's `create`: the fields it does not name go in `extra_body`."""
        named = _sdk_request_fields()
        extra = {k: v for k, v in body.items() if k not in named}
        return {**{k: v for k, v in body.items() if k in named}, **({"extra_body": extra} if extra else {})}

    def post_once(self, sdk, body: dict, key: str | None) -> dict:
        import openai

        create = sdk.chat.completions.with_raw_response.create
        # no key: no Authorization header at all (a local server), which the SDK allows only when asked per request
        auth = {"Authorization": f"Bearer {key}" if key else openai.Omit()}
        try:
            raw = create(**self._sdk_arguments(body), extra_headers=auth)
        except openai.APITimeoutError:
            raise _Transient(f"timeout after {self.client_settings.timeout_s:g} s") from None
        except openai.APIConnectionError as err:
            cause = err.__cause__
            if type(cause).__name__ == "ConnectError":  # httpx's (or httpx2's): refused, unknown host
                raise _Unreachable(f"cannot connect ({_one_line(cause) or type(cause).__name__})") from None
            raise _Transient(f"connection error ({type(cause or err).__name__})") from None
        except openai.APIStatusError as err:
            if err.status_code in RETRY_STATUS:
                raise _Transient(f"HTTP {err.status_code}", _retry_after(err.response.headers)) from None
            hint = {401: f"; is {self.client_settings.api_key_env} set to a valid key?"}.get(err.status_code, "")
            raise self.refused(f"HTTP {err.status_code}: {_error_message(err.response)}{hint}", key) from None
        try:
            return completion_record(raw.parse().model_dump())
        except Exception:  # noqa: BLE001 - any body the SDK cannot read as a chat completion is a bad answer
            raise _Transient("malformed response (no choices[0].message.content)") from None

    def ask(self, sdk, limiter: RateLimiter, body: dict, stats: RequestStats, lock) -> dict:
        """One answer, retried with exponential backoff and jitter (or the server's Retry-After)."""
        key = self.api_key()
        attempts, attempt = self.client_settings.max_retries + 1, 0
        while True:
            event = limiter.acquire()
            try:
                reply = self.post_once(sdk, body, key)
            except _Transient as err:
                limiter.settle(event, 0)
                allowed = attempts if err.attempts is None else min(attempts, err.attempts)
                if attempt >= allowed - 1:
                    raise self.refused(f"gave up after {attempt + 1} attempts, last: {err}", key) from None
                backoff = min(self.client_settings.backoff_max_s, self.client_settings.backoff_s * 2 ** attempt)
                delay = err.retry_after if err.retry_after is not None else backoff * (0.5 + random.random() / 2)
                with lock:
                    stats.retries += 1
                    stats.backoff_s += delay
                self._sleep(delay)
                attempt += 1
                continue
            limiter.settle(event, sum(reply["usage"].values()))
            return reply
