"""The `api` model family: a classifier behind an OpenAI-compatible chat-completions endpoint (OpenAI, Gemini or
Claude through their compatible endpoints, vLLM, SGLang, Ollama, LM Studio, or `rgb-serve`).

It has no weights and cannot be attacked, so it enters only the black-box protocol. One request per image, the
image exactly as stored (the split's own PNG bytes as a base64 data URL: a re-encoded image would change the
perturbation). Here: the settings, the classifier that asks for many images at once, and the family; its parts
have a module each: the endpoint client (rgb.endpoints.client), the answer cache (one JSONL file per model
identity, rgb.endpoints.cache) and the answer parser (rgb.endpoints.answers).
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import re
import threading
import time
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import asdict, dataclass, field, fields

from tqdm import tqdm

from rgb.core.secrets import redact_headers, redact_text, redact_url, url_credentials_problem
from rgb.core.values import (
    NON_NEGATIVE,
    NON_NEGATIVE_INT,
    POSITIVE,
    POSITIVE_INT,
    ConfigValueError,
    Rule,
    optional,
    problems,
)
from rgb.endpoints.answers import ANSWER_FORMATS, AnswerParser, Parsed, choice_format, parse_choice
from rgb.endpoints.cache import AnswerCache
from rgb.endpoints.client import ApiError, Endpoint, RateLimiter, RequestBudget, RequestStats
from rgb.endpoints.cost import Price, combined, image_tokens, png_size, text_tokens

IMAGE_ENCODING = "png_base64_data_url"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
log = logging.getLogger(__name__)
COMPLETION_ESTIMATE = 16  # dry_run's completion tokens of a request that sends no token limit (a class name or so)
DEFAULT_PROMPT = ("This image comes from the {dataset} image classification task. The possible classes are: {classes}. "
                  "Answer with exactly one class name from this list and nothing else.")


# ------------------------------------------------------------------------------------------------ the settings
def _text(v) -> bool:
    return isinstance(v, str) and bool(v.strip())


# The request fields rgb writes itself (the image and prompt, the model): `model.request` may not set them.
OWN_FIELDS = frozenset({"model", "messages"})


# The rules of the model config's values (rgb.core.values), checked when the settings are made: by train.py
# model=api_chat and by every load of a model.json, so a bad value is one line wherever it comes from.
API_RULES: dict[str, Rule] = {
    "model.base_url": (lambda v: isinstance(v, str) and re.match(r"(?i)^https?://[^/\s]", v) is not None
                       and url_credentials_problem(v) is None, "an http(s) URL ending in /v1, without user:password@ "
                       "(credentials belong in the variable model.api_key_env names, or in model.headers)"),
    "model.api_model": (_text, "the endpoint's model name (e.g. gpt-4o-mini)"),
    "model.prompt": (lambda v: v is None or isinstance(v, str), "a text"),
    "model.system_prompt": (lambda v: v is None or isinstance(v, str), "null or a text"),
    "model.temperature": optional(NON_NEGATIVE), "model.max_tokens": optional(POSITIVE_INT),
    "model.request": (lambda v: v is None or isinstance(v, dict) and all(isinstance(k, str) for k in v)
                      and not set(v) & OWN_FIELDS, f"a mapping of request fields other than {sorted(OWN_FIELDS)}"),
    "model.answer_format": (lambda v: v in ANSWER_FORMATS, " or ".join(ANSWER_FORMATS)),
}
CLIENT_RULES: dict[str, Rule] = {
    "model.api_key_env": (_text, "the name of an environment variable"),
    "model.headers": (lambda v: v is None or isinstance(v, dict) and all(isinstance(k, str) and isinstance(x, str)
                                                            for k, x in v.items()), "a mapping of header: text"),
    "model.retry_max_tokens": optional(POSITIVE_INT),
    "model.max_concurrency": POSITIVE_INT, "model.requests_per_minute": optional(POSITIVE),
    "model.tokens_per_minute": optional(POSITIVE), "model.timeout_s": POSITIVE, "model.max_retries": NON_NEGATIVE_INT,
    "model.backoff_s": NON_NEGATIVE, "model.backoff_max_s": NON_NEGATIVE,
    "model.batch": (lambda v: isinstance(v, bool), "true or false"), "model.batch_poll_s": POSITIVE,
    "model.batch_wait_s": POSITIVE,
}


def _check(settings, rules: dict[str, Rule]) -> None:
    found = problems({f"model.{f.name}": getattr(settings, f.name) for f in fields(settings)}, rules)
    if found:
        raise ConfigValueError("invalid value: " + redact_text("; ".join(found)))  # the values shown: no secret


@dataclass(frozen=True)
class ApiSettings:
    """What identifies the model's answers (model.json `api`): a change of any of these is another model. The
    answer parser is not among them: it maps the cached answer texts, and the version that scored them is
    recorded with the scores (a model.json of an older parser still loads; its answers are re-parsed).
    `temperature=None` and `max_tokens=None` are not sent; `request` is merged into every request as it is (e.g.
    `max_completion_tokens`, `reasoning_effort`, `extra_body` fields such as `top_k`); `system_prompt` is sent as
    a system message. `answer_format=choice` asks for a JSON object whose value is one of the class names
    (rgb.endpoints.answers.choice_format; the reply read by parse_choice). The last three enter the identity only when
    set (answer_format: when not "text"), so earlier answer caches keep theirs."""

    base_url: str
    api_model: str
    prompt: str | None = DEFAULT_PROMPT  # None: DEFAULT_PROMPT
    temperature: float | None = 0.0  # None: not sent (reasoning models refuse it)
    max_tokens: int | None = 16
    image_encoding: str = IMAGE_ENCODING
    system_prompt: str | None = None
    request: dict | None = field(default_factory=dict)
    answer_format: str = "text"

    def __post_init__(self):
        _check(self, API_RULES)
        if self.image_encoding != IMAGE_ENCODING:
            raise ConfigValueError(f"image_encoding {self.image_encoding!r}: only {IMAGE_ENCODING} keeps the stored "
                                   f"pixels")
        # a key in a query parameter is recorded as REDACTED: the request fills it from the environment
        object.__setattr__(self, "base_url", redact_url(self.base_url.rstrip("/")))
        object.__setattr__(self, "prompt", DEFAULT_PROMPT if self.prompt is None else self.prompt)
        object.__setattr__(self, "request", dict(self.request or {}))  # null (the config's default): none

    @property
    def decoding(self) -> dict:
        """The sampling fields of every request, as rgb writes them (`request` may add or override fields)."""
        sent = {"temperature": self.temperature, "max_tokens": self.max_tokens}
        return {k: v for k, v in sent.items() if v is not None}

    def identity_extras(self) -> dict:
        """What identifies the answers beyond the legacy identity: only what is set."""
        extras = (("system_prompt", self.system_prompt), ("request", self.request),
                  ("answer_format", None if self.answer_format == "text" else self.answer_format))
        return {k: v for k, v in extras if v}

    def record(self) -> dict:
        """model.json's `api`: the legacy fields, and the extras only when set (earlier run dirs keep their
        identity)."""
        extras = ("system_prompt", "request", "answer_format")
        legacy = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in extras}
        return {**legacy, **self.identity_extras()}


@dataclass(frozen=True)
class ClientSettings:
    """How politely to ask (model.json `client`): none of it changes an answer, so none of it is in the cache key."""

    api_key_env: str = "OPENAI_API_KEY"
    # sent with every request; a secret one (Authorization, api-key, ...) is recorded as REDACTED and sent with the
    # key from api_key_env (rgb.core.secrets)
    headers: dict | None = field(default_factory=dict)
    retry_max_tokens: int | None = None  # an answer cut by the token limit is asked once more with this limit
    max_concurrency: int = 4
    requests_per_minute: float | None = None
    tokens_per_minute: float | None = None
    timeout_s: float = 60.0
    max_retries: int = 6
    backoff_s: float = 1.0
    backoff_max_s: float = 60.0
    # The Batch API (rgb.endpoints.batch) instead of one request per image: the same requests and the same cache
    # records, so the same answers either way (hence not in the cache key); OpenAI charges half and answers within
    # 24 h. Polled every batch_poll_s; after batch_wait_s a run stops, and the next one resumes the batch.
    batch: bool = False
    batch_poll_s: float = 30.0
    batch_wait_s: float = 26 * 3600.0
    price: dict | None = None  # USD per 1M tokens {input, output, cached_input}; null: conf/prices.yaml, else unknown

    def __post_init__(self):
        _check(self, CLIENT_RULES)
        object.__setattr__(self, "headers", redact_headers(self.headers or {}))  # null (the config's default): none
        Price.of(self.price)


def split_config(config: dict) -> tuple[ApiSettings, ClientSettings]:
    """Both settings from one flat mapping (the model config, or model.json's two sections merged); a null is
    the value given (`max_tokens: null` sends no limit), an absent key the default."""
    names = {f.name for f in fields(ApiSettings)}, {f.name for f in fields(ClientSettings)}
    return (ApiSettings(**{k: v for k, v in config.items() if k in names[0]}),
            ClientSettings(**{k: v for k, v in config.items() if k in names[1]}))


@dataclass(frozen=True)
class Answer:
    text: str
    pred: int | None  # None: an abstention
    reason: str       # AnswerParser's: why pred is what it is


class ApiClassifier:
    """Classifies PNG images by asking a chat-completions endpoint; `inputs = "png"` tells evaluation to hand it
    the split's stored bytes instead of tensors."""

    family = "api"
    inputs = "png"

    def __init__(self, settings: ApiSettings, client: ClientSettings, class_names: Sequence[str], dataset: str,
                 sleep=time.sleep):
        self.settings, self.client_settings = settings, client
        self.class_names, self.dataset = list(class_names), dataset
        try:
            self.prompt = settings.prompt.format(dataset=dataset, classes="; ".join(self.class_names))
        except (KeyError, IndexError, ValueError) as err:
            raise ConfigValueError(f"model.prompt may hold only {{dataset}} and {{classes}} ({type(err).__name__}: "
                                   f"{err}); write a literal brace as {{{{ or }}}}") from None
        self.parser = AnswerParser(self.class_names)
        self.endpoint = Endpoint(settings.base_url, settings.api_model, client, sleep)
        self._sleep = sleep
        identity = {"base_url": settings.base_url, "api_model": settings.api_model, "prompt": self.prompt,
                    "decoding": settings.decoding, "image_encoding": settings.image_encoding,
                    **settings.identity_extras()}
        self._identity = json.dumps(identity, sort_keys=True)
        self.identity_sha256 = hashlib.sha256(self._identity.encode()).hexdigest()

    def request_key(self, image: bytes) -> str:
        """sha256 of (image bytes, prompt, model identity, decoding parameters)."""
        return hashlib.sha256(hashlib.sha256(image).digest() + self._identity.encode()).hexdigest()

    def describe(self) -> dict:
        return {"api": self.settings.record(), "client": asdict(self.client_settings),
                "class_names": self.class_names, "num_classes": len(self.class_names), "dataset": self.dataset,
                "api_model": self.settings.api_model}

    # ------------------------------------------------------------------------------------------ one request
    def _body(self, image: bytes) -> dict:
        if not image.startswith(PNG_MAGIC):
            raise ApiError("an image of the split is not PNG: it is sent as stored or not at all (no re-encoding)")
        url = "data:image/png;base64," + base64.b64encode(image).decode("ascii")
        content = [{"type": "text", "text": self.prompt}, {"type": "image_url", "image_url": {"url": url}}]
        system = [{"role": "system", "content": self.settings.system_prompt}] if self.settings.system_prompt else []
        answer = {"response_format": choice_format(self.class_names)} if self.settings.answer_format == "choice" else {}
        return {"model": self.settings.api_model, "messages": [*system, {"role": "user", "content": content}],
                **self.settings.decoding, **answer, **self.settings.request}

    def _cut(self, reply: dict) -> bool:
        """An answer the token limit cut before it named a class: an error to count and ask again, never an
        abstention to cache."""
        return reply.get("finish_reason") == "length" and self._parse(reply).pred is None

    def _retry_body(self, body: dict) -> dict | None:
        """The request once more with `retry_max_tokens` as its limit (in the field the request uses)."""
        limit = self.client_settings.retry_max_tokens
        if limit is None:
            return None
        field_name = "max_completion_tokens" if "max_completion_tokens" in body else "max_tokens"
        return {**body, field_name: limit}

    def _parse(self, record: dict) -> Parsed:
        if self.settings.answer_format == "choice":
            return parse_choice(self.parser, record["answer"])
        return self.parser.parse(record["answer"])

    def estimate(self, image: bytes) -> tuple[int, int]:
        """(prompt, completion) tokens of one request, tokenizer-free (rgb.endpoints.cost): the texts at
        characters / 4 and the image by OpenAI's tile rule; the completion at its limit (the field the request
        sends), else COMPLETION_ESTIMATE."""
        texts = self.prompt + (self.settings.system_prompt or "")
        body = {**self.settings.decoding, **self.settings.request}
        limit = body.get("max_completion_tokens", body.get("max_tokens"))
        return (text_tokens(texts) + image_tokens(*png_size(image)),
                COMPLETION_ESTIMATE if limit is None else int(limit))

    # ------------------------------------------------------------------------------------------ many images
    def plan(self, images: Sequence[bytes], cache: AnswerCache) -> tuple[int, list[str]]:
        """(images already answered, the distinct request keys still to ask, in order of first use)."""
        keys = [self.request_key(b) for b in images]
        todo = [k for k in dict.fromkeys(keys) if k not in cache]
        return sum(k in cache for k in keys), todo

    def answer(self, images: Sequence[bytes], cache: AnswerCache, budget: RequestBudget | None = None,
               desc: str = "api") -> tuple[list[Answer | None], RequestStats]:
        """Answers for `images` in order (None: not asked, the budget ran out), asking each distinct uncached
        image once, `max_concurrency` at a time; every answer enters the cache as it arrives."""
        if self.client_settings.batch:  # the Batch API: the same records, asked by the batch
            from rgb.endpoints.batch import answer_by_batch

            return answer_by_batch(self, images, cache, budget or RequestBudget(), desc)
        budget = budget or RequestBudget()
        keys = [self.request_key(b) for b in images]
        uses = Counter(keys)
        first_image: dict[str, int] = {}
        for i, k in enumerate(keys):
            first_image.setdefault(k, i)
        todo = [k for k in uses if k not in cache]
        cached_before = set(uses) - set(todo)
        todo = todo[: budget.take(len(todo))]
        stats, lock = RequestStats(images=len(images)), threading.Lock()
        limiter = RateLimiter(self.client_settings.requests_per_minute, self.client_settings.tokens_per_minute,
                              sleep=self._sleep)
        with tqdm(total=len(images), desc=desc, unit="img", leave=False) as bar, \
                self.endpoint.session() as sdk, \
                ThreadPoolExecutor(self.client_settings.max_concurrency) as pool:
            cached = sum(uses[k] for k in uses if k in cache)
            bar.update(cached)
            abstained = [sum(uses[k] for k in uses if k in cache and self._parse(cache.get(k)).pred is None)]
            started = time.monotonic()

            def ask(body: dict, held: tuple) -> dict:
                try:
                    reply = self.endpoint.ask(sdk, limiter, body, stats, lock)
                except BaseException:
                    with lock:
                        budget.settle(held, None)
                    raise
                with lock:
                    stats.requests += 1
                    stats.prompt_tokens += reply["usage"]["prompt_tokens"]
                    stats.completion_tokens += reply["usage"]["completion_tokens"]
                    budget.settle(held, reply["billed"])
                return reply

            def reserve(prompt_tokens: int, completion_tokens: int) -> tuple | None:
                with lock:
                    first = budget.stopped_by is None
                    held = budget.reserve(prompt_tokens, completion_tokens)
                    if held is None and first:  # said once per evaluation
                        log.warning("%s: %s reached, no new request (the answers so far are cached; re-run to "
                                    "continue)", desc, budget.stopped_by)
                return held

            def one(k: str) -> None:
                image = images[first_image[k]]
                body = self._body(image)
                prompt_tokens, completion_tokens = self.estimate(image)
                held = reserve(prompt_tokens, completion_tokens)
                if held is None:
                    return
                reply = ask(body, held)
                retry = self._retry_body(body) if self._cut(reply) else None
                held = None if retry is None else reserve(prompt_tokens, self.client_settings.retry_max_tokens)
                if held is not None:
                    again = ask(retry, held)
                    reply = {**again, "max_tokens_retried": self.client_settings.retry_max_tokens,
                             "billed": combined(reply["billed"], again["billed"])}
                if self._cut(reply):  # not an answer: left unanswered (PARTIAL), asked again by the next run
                    with lock:
                        stats.truncated += uses[k]
                        bar.update(uses[k])
                    return
                cache.add({"key": k, **reply})
                with lock:
                    abstained[0] += uses[k] if self._parse(reply).pred is None else 0
                    bar.update(uses[k])
                    rate = stats.requests / max(time.monotonic() - started, 1e-9)
                    money = {} if budget.price is None else {"usd": f"{budget.cost:.4f}"}
                    bar.set_postfix(sent=stats.requests, req_s=f"{rate:.2f}", cached=cached, retried=stats.retries,
                                    tokens=stats.prompt_tokens + stats.completion_tokens, **money,
                                    abstained=abstained[0], refresh=False)

            try:
                done, _ = wait([pool.submit(one, k) for k in todo], return_when=FIRST_EXCEPTION)
            except BaseException:  # Ctrl-C: ask nothing more; the requests in flight finish into the cache
                pool.shutdown(wait=False, cancel_futures=True)
                raise
            failed = next((f.exception() for f in done if f.exception() is not None), None)
            if failed is not None:  # refused for good: stop asking (the answers so far are in the cache)
                pool.shutdown(wait=True, cancel_futures=True)
                raise failed
        return self.collect(keys, cache, stats, cached_before), stats

    def collect(self, keys: list[str], cache: AnswerCache, stats: RequestStats,
                cached_before: set[str]) -> list[Answer | None]:
        """The cached answers of `keys` (None: not answered), and their counts into `stats` (its `requests` are
        the new answers among them; `cached_before`: the keys answered before this run, whose tokens it used)."""
        parsed = {k: self._parse(cache.get(k)) for k in dict.fromkeys(keys) if k in cache}
        answers = [Answer(cache.get(k)["answer"], parsed[k].pred, parsed[k].reason) if k in parsed else None
                   for k in keys]
        answered = [a for a in answers if a is not None]
        for k in set(keys) & cached_before:
            usage = cache.get(k).get("usage") or {}
            stats.cached_prompt_tokens += int(usage.get("prompt_tokens") or 0)
            stats.cached_completion_tokens += int(usage.get("completion_tokens") or 0)
        stats.cached = len(answered) - stats.requests
        stats.unanswered = len(keys) - len(answered)
        stats.abstained = sum(a.pred is None for a in answered)
        stats.negations = sum(a.reason == "negation" for a in answered)
        stats.alternatives = sum(a.reason == "alternative" for a in answered)
        return answers


# --------------------------------------------------------------------------------------------------- the family
def from_record(record: dict) -> ApiClassifier:
    """The classifier of a model.json (family `api`)."""
    settings, client = split_config({**record["api"], **record.get("client", {})})
    return ApiClassifier(settings, client, record["class_names"], record["dataset"])


@dataclass(frozen=True)
class ApiFamily:
    """No weights, no head: the record alone rebuilds the model (`weights = False` for rgb.models.load)."""

    name: str = "api"
    weights: bool = False
    text_tower: bool = False

    def describe(self, model: ApiClassifier) -> dict:
        return model.describe()

    def model_name(self, record: dict) -> str | None:
        return record.get("api_model")

    def num_classes(self, model: ApiClassifier) -> int:
        return len(model.class_names)

    def rebuild(self, record: dict) -> ApiClassifier:
        return from_record(record)

    def head(self, model: ApiClassifier):
        raise ValueError("an api model has no head to train: it is evaluated by inference only")

    def backbone(self, model: ApiClassifier):
        raise ValueError("an api model has no parameters to train: it is evaluated by inference only")


FAMILY = ApiFamily()

__all__ = ["Answer", "ApiClassifier", "ApiSettings", "ClientSettings", "FAMILY", "split_config"]
