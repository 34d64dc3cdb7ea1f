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
import re
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import NamedTuple
from urllib.parse import parse_qsl, urlsplit, urlunsplit

from rgb.core.errors import UserError
from rgb.core.jsonrecord import JsonRecord
from rgb.core.options import Ruled
from rgb.core.secrets import MissingSecretError, from_environment, redact_logs
from rgb.core.values import POSITIVE, POSITIVE_INT, ConfigValueError, Rule, optional, problems
from rgb.endpoints.cost import Price, billed_usage
from rgb.endpoints.settings import ClientSettings

# The HTTP libraries log each URL they ask (at INFO or DEBUG): a secret of model.query_env is redacted there too.
redact_logs("httpx", "httpx2", "openai", "openai._base_client")

# Transient failures worth another try; any other HTTP error is the endpoint refusing for good.
RETRY_STATUS = frozenset({408, 409, 425, 429, 500, 502, 503, 504})


class EndpointError(UserError, RuntimeError):
    """The endpoint refused for good (401, unknown model, image not supported) or kept failing: one line that
    names the endpoint and the model, never the key. Also class names no answer could tell apart."""


class FormatRefused(EndpointError):
    """The endpoint refused a request for its `response_format` (an HTTP 400 naming it): it may be asked in text."""


# What a 400 names when the endpoint refuses structured output (OpenAI: "Invalid parameter: 'response_format' of type
# 'json_schema' is not supported with this model").
FORMAT_FIELDS = re.compile(r"response_format|json_schema", re.IGNORECASE)


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
    """What asking cost, per call of `ChatClassifier.answer` (one split), and as scores.json records it per split
    (rgb.evaluation.records.EndpointUsage) with the money of rgb.evaluation.endpoint_eval.EndpointPredictor.money.
    `unparsed`: answers the reader read as no class (written `abstained` before strict reading; read either way).
    Of those, the lenient reader's `negations` and `alternatives` named a class but denied it or offered it as one
    of several (0 under the strict reader, or before parser version 2). The fields keep the order scores.json has
    always written them in."""

    images: int = 0
    requests: int = 0      # requests answered by the endpoint (an answer asked again after a cut: two)
    cached: int = 0        # images answered from the cache (other splits, earlier runs, duplicates in the split)
    retries: int = 0
    unparsed: int = 0      # answers read as no class (counted wrong)
    unanswered: int = 0    # not asked (max_requests reached) or cut by the token limit (truncated)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    backoff_s: float = 0.0
    negations: int = 0     # abstentions naming a class but denying it ("not 3")
    alternatives: int = 0  # abstentions offering a class as one of several ("3 or 8")
    truncated: int = 0     # answers cut by the token limit before naming a class, each (asked again or not)
    cached_prompt_tokens: int = 0      # the usage of the cached answers used (once per distinct answer), so that
    cached_completion_tokens: int = 0  # a run resumed after a cap totals as one uninterrupted run (0 before kept)
    spent: float | None = None      # USD billed for the answers this split is the first of its evaluation to use
    list_cost: float | None = None  # the same answers at list price (None: no price, or recorded before)
    reasked: int = 0  # of the truncated, those asked again with retry_max_tokens (one still cut is not cached:
    #                   unanswered, asked again by the next run)
    answered_in_text: int = 0  # answers asked in text, the endpoint having refused answer_format=choice's format
    clarified: int = 0  # answers naming no class followed by a clarifying turn (model.clarify; its own request)

    @property
    def unparsed_rate(self) -> float | None:
        """The share of the answers used that were read as no class (None: none answered)."""
        answered = self.images - self.unanswered
        return self.unparsed / answered if answered > 0 else None

    @classmethod
    def from_json(cls, data: dict, where: str = "") -> RequestStats:
        """Also a record written before strict reading, whose unparsed answers were counted as `abstained`."""
        if isinstance(data, dict) and "abstained" in data and "unparsed" not in data:
            data = {("unparsed" if k == "abstained" else k): v for k, v in data.items()}
        return super().from_json(data, where)


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


class Hold(NamedTuple):
    """What one request holds of the budget until its usage is known: its reserved tokens and USD (its estimate
    scaled), the estimate itself (prompt, completion) and the scales it was held at, to calibrate by."""

    tokens: int
    cost: float
    prompt_estimate: int
    completion_estimate: int
    prompt_scale: float = 1.0
    completion_scale: float = 1.0


@dataclass
class RequestBudget:
    """What this evaluation may still spend: `max_requests` new requests (`remaining`), `max_tokens_total` tokens
    (prompt and completion) and `max_cost` USD billed (priced by `price`) of new answers (None: no limit). Each
    request (an answer asked again or clarified is its own) holds a bound of its tokens and cost (`reserve`) until
    its usage is known (`settle`), and is sent only when the spent, the held and its own fit under the caps. The
    bound: the completion at the limit the request sends, the prompt at its estimate scaled by the largest
    actual/estimated prompt tokens seen. That is a bound only while the endpoint counts no more than it did: so a
    capped run has few requests in flight (`in_flight`): one until the first answer (sent on its estimate alone:
    nothing is known of how the endpoint counts before it), one again after any answer counted above the scale its
    hold used (the requests in flight settle first, the next ones are held at the new scale), one more for each
    answer that kept to its hold, and one when the room left is under `max_concurrency` holds. A cap can be passed
    only by a request the endpoint counts above every answer before it: the first, or one sent alone after a
    rise (by its excess over its hold), or several far from the cap billed more than twice their holds; a reply
    with more completion tokens than the limit sent is the endpoint's error, counted, never prevented. When a cap
    is reached no new request is sent: the answers so far are cached, the rest is left to a re-run."""

    remaining: int | None = None
    max_tokens_total: int | None = None
    max_cost: float | None = None
    price: Price | None = None
    tokens: int = 0      # spent so far by new answers
    cost: float = 0.0    # USD billed for them
    held_tokens: int = 0  # reserved by the requests in flight
    held_cost: float = 0.0
    prompt_scale: float = 1.0      # the largest actual/estimated prompt tokens of an answer so far (at least 1)
    completion_scale: float = 1.0  # the same of completion tokens (1 while the endpoint keeps to the limit sent)
    answers: int = 0     # requests settled with a usage: the scales are calibrated once there is one
    steady: int = 0      # answers after the first that kept to the scales of their holds, since the last that did not
    last_hold: Hold | None = None  # the latest request's hold: the size of one more, to tell the room left
    stopped_by: str | None = None  # the cap that stopped the asking, as `name=value` (logged once, recorded)
    max_requests: int | None = field(init=False)  # the cap `remaining` started from, as the messages name it

    def __post_init__(self):
        RequestCaps(self.remaining, self.max_tokens_total, self.max_cost)  # each cap's rule
        self.max_requests = self.remaining
        if self.max_cost is not None and self.price is None:
            raise ConfigValueError("max_cost needs the model's price: set model.price={input: USD, output: USD} per "
                                   "1M tokens (its model is not in conf/prices.yaml)")

    @classmethod
    def of(cls, caps: RequestCaps, price: Price | None) -> RequestBudget:
        return cls(caps.max_requests, caps.max_tokens_total, caps.max_cost, price)

    @property
    def caps_usage(self) -> bool:
        """A token or cost cap is set: a request's usage must be bounded before it is sent."""
        return self.max_tokens_total is not None or self.max_cost is not None

    def in_flight(self, most: int) -> int:
        """How many first requests may be in flight now, of `most` (max_concurrency): all without a usage cap; else
        one until an answer came and after an answer counted above its hold's scale, one more for each answer
        since that kept to it, and one when the room left under a cap is under `most` holds the size of the last."""
        if not self.caps_usage:
            return most
        if self.answers == 0 or self.last_hold is None:
            return 1
        room = [(self.max_tokens_total, self.tokens + self.held_tokens, self.last_hold.tokens),
                (self.max_cost, self.cost + self.held_cost, self.last_hold.cost)]
        if any(cap is not None and cap - used < most * hold for cap, used, hold in room):
            return 1
        return max(1, min(most, 1 + self.steady))

    def take(self, wanted: int) -> int:
        """Of `wanted` requests, how many `max_requests` still allows (taken from it at once: the Batch path)."""
        granted = wanted if self.remaining is None else min(wanted, self.remaining)
        if self.remaining is not None:
            self.remaining -= granted
        if granted < wanted:
            self.stopped_by = self.stopped_by or f"max_requests={self.max_requests}"
        return granted

    def reserve(self, prompt_tokens: int, completion_tokens: int) -> Hold | None:
        """Hold one request's bound (its estimate scaled) until `settle`, and count it against `max_requests`;
        None, holding nothing, when it could take the run past a cap, which is then `stopped_by` for good (the
        caller holds the lock of its requests)."""
        if self.stopped_by is not None:
            return None
        prompt = math.ceil(prompt_tokens * self.prompt_scale)
        completion = math.ceil(completion_tokens * self.completion_scale)
        tokens, cost = prompt + completion, 0.0 if self.price is None else self.price.cost(prompt, completion)
        if self.remaining is not None and self.remaining < 1:
            self.stopped_by = f"max_requests={self.max_requests}"
        elif self.max_tokens_total is not None and self.tokens + self.held_tokens + tokens > self.max_tokens_total:
            self.stopped_by = f"max_tokens_total={self.max_tokens_total}"
        elif self.max_cost is not None and self.cost + self.held_cost + cost > self.max_cost:
            self.stopped_by = f"max_cost={self.max_cost:g}"
        if self.stopped_by is not None:
            return None
        self.take(1)
        self.held_tokens += tokens
        self.held_cost += cost
        self.last_hold = Hold(tokens, cost, prompt_tokens, completion_tokens, self.prompt_scale, self.completion_scale)
        return self.last_hold

    def settle(self, held: Hold, billed: dict | None) -> None:
        """Release a request's hold and count what it was billed (rgb.endpoints.cost.billed_usage; None: it
        failed, nothing billed), calibrating the scales by it: an answer counted above the scales of its hold
        (the endpoint's ratio rose) starts `steady` again."""
        self.held_tokens -= held.tokens
        self.held_cost -= held.cost
        if billed is None:
            return
        self.tokens += billed["prompt_tokens"] + billed["completion_tokens"]
        self.cost += 0.0 if self.price is None else self.price.billed(billed)
        prompt = billed["prompt_tokens"] / max(held.prompt_estimate, 1)
        completion = billed["completion_tokens"] / max(held.completion_estimate, 1)
        rose = prompt > held.prompt_scale or completion > held.completion_scale
        self.steady = 0 if rose or self.answers == 0 else self.steady + 1
        self.prompt_scale = max(self.prompt_scale, prompt)
        self.completion_scale = max(self.completion_scale, completion)
        self.answers += 1


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
        """`base_url`: the address with its public query (rgb.endpoints.settings.EndpointSettings.address)."""
        self.base_url, self.api_model, self.client_settings = base_url, api_model, client
        self._sleep = sleep
        typed = {name for name, _ in parse_qsl(urlsplit(base_url).query, keep_blank_values=True)}
        both = sorted(typed & set(client.query_env))
        if both:
            raise ConfigValueError(f"the query parameter {both[0]!r} is in both model.base_url (or model.query) and "
                                   f"model.query_env: keep one")

    def refused(self, what: str, key: str | None) -> EndpointError:
        message = _one_line(what)
        secrets = [key, *(os.environ.get(v) for v in (*self.client_settings.query_env.values(),
                                                         *self.client_settings.header_env.values()))]
        for secret in filter(None, secrets):  # an error that quotes the request never shows what it sent
            message = message.replace(secret, "[secret]" if secret != key else "[key]")
        return EndpointError(f"{self.base_url} (model {self.api_model!r}): {message}")

    def api_key(self) -> str | None:
        """The key in the environment variable `api_key_env` names (None when unset or empty), read at each use and
        never stored."""
        return os.environ.get(self.client_settings.api_key_env) or None

    def address(self) -> tuple[str, dict, dict]:
        """(base URL without its query, query parameters, headers) to send, the query apart as the SDK takes it
        (`default_query`: it appends paths to the base URL): the public ones as declared, the secret ones read
        from the environment variables model.query_env and model.header_env name (rgb.core.secrets); never
        stored. No value is ever replaced by the API key: that goes only in the Authorization header."""
        settings = self.client_settings
        parts = urlsplit(self.base_url)
        try:
            query = {**dict(parse_qsl(parts.query, keep_blank_values=True)),
                     **from_environment(settings.query_env, "query parameter")}
            headers = {**settings.headers, **from_environment(settings.header_env, "header")}
        except MissingSecretError as err:
            raise self.refused(str(err), None) from None
        return urlunsplit((parts.scheme, parts.netloc, parts.path, "", parts.fragment)), query, headers

    def sdk(self, api_key: str, max_retries: int = 0, http_client=None):
        """The `openai` SDK client of this endpoint (the one place one is built): its address (`address`: the
        declared query and headers, the secret ones from the environment) and the settings' timeout."""
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
        """GET {base_url}/models, as train.py asks before it makes a run dir for this endpoint: an EndpointError (one
        line) when nothing answers there, the endpoint refuses (a wrong key: 401), or `api_model` is not among the
        ids it serves (listed)."""
        import openai

        key = self.api_key()
        auth = {"Authorization": f"Bearer {key}" if key else openai.Omit()}

        def failed(what: str) -> EndpointError:
            return EndpointError(f"{self.refused(what, key)} (model.check_endpoint=false skips this check)")

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
            raise EndpointError(f"{self.base_url} does not serve model {self.api_model!r}; it serves: {shown or 'none'} "
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
            refusal = self.refused(f"HTTP {err.status_code}: {_error_message(err.response)}{hint}", key)
            if err.status_code == 400 and FORMAT_FIELDS.search(_error_message(err.response)):
                raise FormatRefused(str(refusal)) from None
            raise refusal from None
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
