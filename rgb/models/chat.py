"""The `api` model family: a classifier behind an OpenAI-compatible chat-completions endpoint (OpenAI, Gemini or
Claude through their compatible endpoints, vLLM, SGLang, Ollama, LM Studio, or `rgb-serve`).

It has no weights and cannot be attacked, so it enters only the black-box protocol. One request per image, the
image exactly as stored (the split's own PNG bytes as a base64 data URL: a re-encoded image would change the
perturbation). Here: the classifier (images -> requests -> class predictions) and the family; the protocol it
speaks is rgb.endpoints': the settings (rgb.endpoints.settings), the endpoint client (rgb.endpoints.client), the
answer cache (one JSONL file per model identity, rgb.endpoints.cache), the Batch path (rgb.endpoints.batch) and
the answer readers (rgb.endpoints.answers: strict, the default, or lenient).
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from rgb.core.errors import UserError
from rgb.core.values import ConfigValueError
from rgb.endpoints.answers import READERS, UNPARSED, Parsed, choice_format, parse_choice
from rgb.endpoints.batch import ask_by_batch
from rgb.endpoints.cache import AnswerCache
from rgb.endpoints.client import EndpointError, Endpoint, RequestBudget, RequestStats
from rgb.endpoints.cost import image_tokens, png_size, text_tokens
from rgb.endpoints.online import ask_online
from rgb.endpoints.settings import CLARIFY_TURN, RECORDED_FORMAT_DEFAULT, EndpointSettings, ClientSettings, split_config


class InferenceOnlyError(UserError, ValueError):
    """Training asked of a model answered by an endpoint: it has no weights here."""

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
log = logging.getLogger(__name__)
COMPLETION_ESTIMATE = 16  # dry_run's completion tokens of a request that sends no token limit (a class name or so)


@dataclass(frozen=True)
class Answer:
    text: str
    pred: int | None  # None: unparsed (read as no class)
    reason: str       # the reader's (rgb.endpoints.answers): why pred is what it is


class ChatClassifier:
    """Classifies PNG images by asking a chat-completions endpoint; `inputs = "png"` tells evaluation to hand it
    the split's stored bytes instead of tensors."""

    family = "api"  # model.json's `family` (a format: stays "api"); ChatFamily.name reads it here
    inputs = "png"

    def __init__(self, settings: EndpointSettings, client: ClientSettings, class_names: Sequence[str], dataset: str,
                 sleep=time.sleep):
        self.settings, self.client_settings = settings, client
        self.class_names, self.dataset = list(class_names), dataset
        try:
            self.prompt = settings.prompt.format(dataset=dataset, classes="; ".join(self.class_names))
        except (KeyError, IndexError, ValueError) as err:
            raise ConfigValueError(f"model.prompt may hold only {{dataset}} and {{classes}} ({type(err).__name__}: "
                                   f"{err}); write a literal brace as {{{{ or }}}}") from None
        self.parser = READERS[client.answer_parser](self.class_names)  # reads answers, cached ones too
        self.answer_format_used = settings.answer_format  # "text" once the endpoint refused response_format
        if settings.clarify and client.batch:
            raise ConfigValueError("model.clarify=true asks a follow-up turn as soon as an answer names no class; a "
                                   "Batch answers all at once: set model.batch=false or model.clarify=false")
        self.endpoint = Endpoint(settings.address, settings.api_model, client, sleep)
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
        return {"api": self.settings.record(), "client": self.client_settings.record(),
                "class_names": self.class_names, "num_classes": len(self.class_names), "dataset": self.dataset,
                "api_model": self.settings.api_model}

    # ------------------------------------------------------------------------------------------ one request
    def body(self, image: bytes) -> dict:
        """The chat-completions request of one image (its stored PNG bytes as a data URL)."""
        if not image.startswith(PNG_MAGIC):
            raise EndpointError("an image of the split is not PNG: it is sent as stored or not at all (no re-encoding)")
        url = "data:image/png;base64," + base64.b64encode(image).decode("ascii")
        content = [{"type": "text", "text": self.prompt}, {"type": "image_url", "image_url": {"url": url}}]
        system = [{"role": "system", "content": self.settings.system_prompt}] if self.settings.system_prompt else []
        answer = {"response_format": choice_format(self.class_names)} if self.answer_format_used == "choice" else {}
        return {"model": self.settings.api_model, "messages": [*system, {"role": "user", "content": content}],
                **self.settings.decoding, **answer, **self.settings.request}

    def fall_back_to_text(self) -> bool:
        """Ask in text from now on, the endpoint having refused `response_format` (said once, in one line); False
        when the requests asked for no format (nothing to fall back from)."""
        if self.settings.answer_format != "choice":
            return False
        if self.answer_format_used == "choice":
            log.warning("%s (model %r) refuses response_format: asking in text instead, read by the text rule and "
                        "recorded as answered in text (model.answer_format=text asks so from the start)",
                        self.settings.base_url, self.settings.api_model)
            self.answer_format_used = "text"
        return True

    def format_note(self, body: dict) -> dict:
        """What a cache record says of the format its request asked in: {"answer_format_used": "text"} when it
        asked in text instead of the configured choice (the endpoint refused response_format), else nothing."""
        fell_back = self.settings.answer_format == "choice" and "response_format" not in body
        return {"answer_format_used": "text"} if fell_back else {}

    @staticmethod
    def cut(reply: dict) -> bool:
        """An answer the token limit cut: an error to count and ask again, never an answer to cache, whatever its
        text ("tiger" may be the start of "tiger shark"), under any reader."""
        return reply.get("finish_reason") == "length"

    def unparsed(self, record: dict) -> bool:
        """The answer of a cache record names no class (an abstention), its clarification's neither."""
        return self._read(record).pred is None

    def clarification(self, body: dict, reply: dict) -> tuple[dict, int] | None:
        """`model.clarify=true`: the request that follows `body`'s answer (`reply`) in the same conversation with
        CLARIFY_TURN, and the prompt tokens it adds to `body`'s estimate (None: clarify is off)."""
        if not self.settings.clarify:
            return None
        turn = CLARIFY_TURN.format(classes="; ".join(self.class_names))
        messages = [*body["messages"], {"role": "assistant", "content": reply["answer"]},
                    {"role": "user", "content": turn}]
        return {**body, "messages": messages}, text_tokens(reply["answer"]) + text_tokens(turn)

    def _read(self, record: dict) -> Parsed:
        """What a cache record answers: its answer's class, else its clarification's (`model.clarify=true`)."""
        parsed = self._parse(record)
        if parsed.pred is None and "clarification" in record:
            return self._parse(record["clarification"])
        return parsed

    def retry_body(self, body: dict) -> dict | None:
        """The request once more with `retry_max_tokens` as its limit (in the field the request uses)."""
        limit = self.client_settings.retry_max_tokens
        if limit is None:
            return None
        field_name = "max_completion_tokens" if "max_completion_tokens" in body else "max_tokens"
        return {**body, field_name: limit}

    def _parse(self, record: dict) -> Parsed:
        """The class a reply asserts; none for one the token limit cut (a cache written before cut answers were
        left out may hold one)."""
        if self.cut(record):
            return Parsed(None, UNPARSED)
        if self.settings.answer_format == "choice":
            return parse_choice(self.parser, record["answer"])
        return self.parser.parse(record["answer"])

    def estimate(self, image: bytes) -> tuple[int, int]:
        """(prompt, completion) tokens of one request, tokenizer-free (rgb.endpoints.cost): the texts at
        characters / 4 and the image by OpenAI's tile rule; the completion at its limit (the field the request
        sends), else COMPLETION_ESTIMATE."""
        texts = self.prompt + (self.settings.system_prompt or "")
        limit = self.completion_limit()
        return (text_tokens(texts) + image_tokens(*png_size(image)), COMPLETION_ESTIMATE if limit is None else limit)

    def completion_limit(self) -> int | None:
        """The completion token limit each request sends (None: none)."""
        body = {**self.settings.decoding, **self.settings.request}
        limit = body.get("max_completion_tokens", body.get("max_tokens"))
        return None if limit is None else int(limit)

    # ------------------------------------------------------------------------------------------ many images
    def plan(self, images: Sequence[bytes], cache: AnswerCache) -> tuple[int, list[str]]:
        """(images already answered, the distinct request keys still to ask, in order of first use)."""
        keys = [self.request_key(b) for b in images]
        todo = [k for k in dict.fromkeys(keys) if k not in cache]
        return sum(k in cache for k in keys), todo

    def answer(self, images: Sequence[bytes], cache: AnswerCache, budget: RequestBudget | None = None,
               desc: str = "api") -> tuple[list[Answer | None], RequestStats]:
        """Answers for `images` in order (None: not asked, the budget ran out), asking each distinct uncached
        image once: online, `max_concurrency` at a time (rgb.endpoints.online), or by the Batch API
        (rgb.endpoints.batch, `model.batch=true`); every answer enters the cache as it arrives."""
        budget = budget or RequestBudget()
        keys = [self.request_key(b) for b in images]
        cached_before = {k for k in keys if k in cache}
        if self.client_settings.batch:
            stats = ask_by_batch(self, images, keys, cache, budget, desc)
        else:
            stats = ask_online(self, images, keys, cache, budget, desc, self._sleep)
        return self.collect(keys, cache, stats, cached_before), stats

    @staticmethod
    def _text(record: dict) -> str:
        """The answer of a cache record as predictions.parquet keeps it: with its clarification's, when asked."""
        if "clarification" not in record:
            return record["answer"]
        return f"{record['answer']}\n[clarified] {record['clarification']['answer']}"

    def collect(self, keys: list[str], cache: AnswerCache, stats: RequestStats,
                cached_before: set[str]) -> list[Answer | None]:
        """The cached answers of `keys` (None: not answered), and their counts into `stats` (`cached_before`: the
        keys answered before this call, whose tokens it used; the other answered keys are new, once each)."""
        parsed = {k: self._read(cache.get(k)) for k in dict.fromkeys(keys) if k in cache}
        answers = [Answer(self._text(cache.get(k)), parsed[k].pred, parsed[k].reason) if k in parsed else None
                   for k in keys]
        answered = [a for a in answers if a is not None]
        for k in set(keys) & cached_before:
            usage = cache.get(k).get("usage") or {}
            stats.cached_prompt_tokens += int(usage.get("prompt_tokens") or 0)
            stats.cached_completion_tokens += int(usage.get("completion_tokens") or 0)
        new = {k for k in parsed if k not in cached_before}  # asked by this call: the first of its images is new
        stats.cached = len(answered) - len(new)
        stats.unanswered = len(keys) - len(answered)
        stats.unparsed = sum(a.pred is None for a in answered)
        stats.answered_in_text = sum(uses for k, uses in Counter(keys).items()
                                     if k in parsed and cache.get(k).get("answer_format_used") == "text")
        stats.clarified = sum(uses for k, uses in Counter(keys).items()
                              if k in parsed and "clarification" in cache.get(k))
        stats.negations = sum(a.reason == "negation" for a in answered)
        stats.alternatives = sum(a.reason == "alternative" for a in answered)
        return answers


# --------------------------------------------------------------------------------------------------- the family
def from_record(record: dict) -> ChatClassifier:
    """The classifier of a model.json (family `api`); one without answer_format was made for free text."""
    settings, client = split_config({"answer_format": RECORDED_FORMAT_DEFAULT, **record["api"],
                                     **record.get("client", {})})
    return ChatClassifier(settings, client, record["class_names"], record["dataset"])


@dataclass(frozen=True)
class ChatFamily:
    """The `api` family: a classifier answered by a chat-completions endpoint.

    No weights, no head: the record alone rebuilds the model (`weights = False` for rgb.models.load).
    """

    name: str = ChatClassifier.family  # the models' own word, written into model.json
    weights: bool = False
    text_tower: bool = False

    def describe(self, model: ChatClassifier) -> dict:
        """model.json fields of an endpoint model: its settings, client settings, class names and dataset.

        Args:
            model: An `ChatClassifier`.

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

    def num_classes(self, model: ChatClassifier) -> int:
        """How many class names the model answers with.

        Args:
            model: An `ChatClassifier`.

        Returns:
            The class count.
        """
        return len(model.class_names)

    def rebuild(self, record: dict) -> ChatClassifier:
        """The classifier the record's settings describe (no weights: ready to ask the endpoint).

        Args:
            record: An `api` model.json (`api`, `client`, `class_names`, `dataset`).

        Returns:
            The `ChatClassifier`.

        Raises:
            ConfigValueError: A setting of the record has an invalid value.
        """
        return from_record(record)

    def head(self, model: ChatClassifier):
        """Refused: an endpoint model has no head to train.

        Args:
            model: An `ChatClassifier` (answered by its endpoint; a head cannot be probed there).

        Returns:
            Never returns.

        Raises:
            InferenceOnlyError: Always.
        """
        raise InferenceOnlyError("an api model has no head to train: it is evaluated by inference only")

    def backbone(self, model: ChatClassifier):
        """Refused: an endpoint model has no parameters to train.

        Args:
            model: An `ChatClassifier`.

        Returns:
            Never returns: nothing here is an optimiser's to walk.

        Raises:
            InferenceOnlyError: Always.
        """
        raise InferenceOnlyError("an api model has no parameters to train: it is evaluated by inference only")


FAMILY = ChatFamily()

__all__ = ["Answer", "ChatClassifier", "FAMILY"]
