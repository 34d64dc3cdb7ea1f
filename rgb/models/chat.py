"""The `api` model family: a classifier behind an OpenAI-compatible chat-completions endpoint (OpenAI, Gemini or
Claude through their compatible endpoints, vLLM, SGLang, Ollama, LM Studio, or `rgb-serve`).

It has no weights and cannot be attacked, so it enters only the black-box protocol. One request per image, the
image exactly as stored (the split's own PNG bytes as a base64 data URL: a re-encoded image would change the
perturbation). Here: the classifier (images -> requests -> class predictions) and the family; the protocol it
speaks is rgb.endpoints': the settings (rgb.endpoints.settings), the endpoint client (rgb.endpoints.client), the
answer cache (one JSONL file per model identity, rgb.endpoints.cache), the Batch path (rgb.endpoints.batch) and
the answer parser (rgb.endpoints.answers).
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import threading
import time
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import asdict, dataclass

from tqdm import tqdm

from rgb.core.errors import UserError
from rgb.core.values import ConfigValueError
from rgb.endpoints.answers import AnswerParser, Parsed, choice_format, parse_choice
from rgb.endpoints.batch import ask_by_batch
from rgb.endpoints.cache import AnswerCache
from rgb.endpoints.client import ApiError, Endpoint, RateLimiter, RequestBudget, RequestStats
from rgb.endpoints.cost import combined, image_tokens, png_size, text_tokens
from rgb.endpoints.settings import ApiSettings, ClientSettings, split_config


class InferenceOnlyError(UserError, ValueError):
    """Training asked of a model answered by an endpoint: it has no weights here."""

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
log = logging.getLogger(__name__)
COMPLETION_ESTIMATE = 16  # dry_run's completion tokens of a request that sends no token limit (a class name or so)


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
    def body(self, image: bytes) -> dict:
        """The chat-completions request of one image (its stored PNG bytes as a data URL)."""
        if not image.startswith(PNG_MAGIC):
            raise ApiError("an image of the split is not PNG: it is sent as stored or not at all (no re-encoding)")
        url = "data:image/png;base64," + base64.b64encode(image).decode("ascii")
        content = [{"type": "text", "text": self.prompt}, {"type": "image_url", "image_url": {"url": url}}]
        system = [{"role": "system", "content": self.settings.system_prompt}] if self.settings.system_prompt else []
        answer = {"response_format": choice_format(self.class_names)} if self.settings.answer_format == "choice" else {}
        return {"model": self.settings.api_model, "messages": [*system, {"role": "user", "content": content}],
                **self.settings.decoding, **answer, **self.settings.request}

    def cut(self, reply: dict) -> bool:
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
        budget = budget or RequestBudget()
        keys = [self.request_key(b) for b in images]
        if self.client_settings.batch:  # the Batch API: the same records, asked by the batch
            cached_before = {k for k in keys if k in cache}
            stats = ask_by_batch(self, images, keys, cache, budget, desc)
            return self.collect(keys, cache, stats, cached_before), stats
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
                body = self.body(image)
                prompt_tokens, completion_tokens = self.estimate(image)
                held = reserve(prompt_tokens, completion_tokens)
                if held is None:
                    return
                reply = ask(body, held)
                retry = self._retry_body(body) if self.cut(reply) else None
                held = None if retry is None else reserve(prompt_tokens, self.client_settings.retry_max_tokens)
                if held is not None:
                    again = ask(retry, held)
                    reply = {**again, "max_tokens_retried": self.client_settings.retry_max_tokens,
                             "billed": combined(reply["billed"], again["billed"])}
                if self.cut(reply):  # not an answer: left unanswered (PARTIAL), asked again by the next run
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
    """The `api` family: a classifier answered by a chat-completions endpoint.

    No weights, no head: the record alone rebuilds the model (`weights = False` for rgb.models.load).
    """

    name: str = "api"
    weights: bool = False
    text_tower: bool = False

    def describe(self, model: ApiClassifier) -> dict:
        """model.json fields of an endpoint model: its settings, client settings, class names and dataset.

        Args:
            model: An `ApiClassifier`.

        Returns:
            The record's fields.
        """
        return model.describe()

    def model_name(self, record: dict) -> str | None:
        """The record's `api_model`.

        Args:
            record: An `api` model.json.

        Returns:
            The endpoint's model name.
        """
        return record.get("api_model")

    def num_classes(self, model: ApiClassifier) -> int:
        """How many class names the model answers with.

        Args:
            model: An `ApiClassifier`.

        Returns:
            The class count.
        """
        return len(model.class_names)

    def rebuild(self, record: dict) -> ApiClassifier:
        """The classifier the record's settings describe (no weights: ready to ask the endpoint).

        Args:
            record: An `api` model.json (`api`, `client`, `class_names`, `dataset`).

        Returns:
            The `ApiClassifier`.

        Raises:
            ConfigValueError: A setting of the record has an invalid value.
        """
        return from_record(record)

    def head(self, model: ApiClassifier):
        """Refused: an endpoint model has no head to train.

        Args:
            model: An `ApiClassifier` (answered by its endpoint; a head cannot be probed there).

        Returns:
            Never returns.

        Raises:
            InferenceOnlyError: Always.
        """
        raise InferenceOnlyError("an api model has no head to train: it is evaluated by inference only")

    def backbone(self, model: ApiClassifier):
        """Refused: an endpoint model has no parameters to train.

        Args:
            model: An `ApiClassifier`.

        Returns:
            Never returns: nothing here is an optimiser's to walk.

        Raises:
            InferenceOnlyError: Always.
        """
        raise InferenceOnlyError("an api model has no parameters to train: it is evaluated by inference only")


FAMILY = ApiFamily()

__all__ = ["Answer", "ApiClassifier", "FAMILY"]
