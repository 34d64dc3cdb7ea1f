"""The settings of a model behind a chat-completions endpoint: what identifies its answers (EndpointSettings, model.json
`api`) and how politely to ask (ClientSettings, model.json `client`), each value checked by a rule when made, so a
bad value is one line wherever it comes from (train.py model=api_chat, or the load of a model.json)."""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, fields
from urllib.parse import parse_qsl, urlencode, urlsplit

from rgb.core.options import Ruled, ruled
from rgb.core.secrets import declared_problems, url_credentials_problem, url_query_problem
from rgb.core.values import (
    BOOL,
    NON_NEGATIVE,
    NON_NEGATIVE_INT,
    POSITIVE,
    POSITIVE_INT,
    ConfigValueError,
    Rule,
    optional,
    unshown,
)
from rgb.endpoints.cost import Price

IMAGE_ENCODING = "png_base64_data_url"
DEFAULT_PROMPT = ("This image comes from the {dataset} image classification task. The possible classes are: {classes}. "
                  "Answer with exactly one class name from this list and nothing else.")
# free text, or a JSON object whose one value is a class name (rgb.endpoints.answers.choice_format)
ANSWER_FORMATS = ("text", "choice")
# model.json's answer_format when it has none: written before `choice` became the default, when absence meant text
# (and still does, so that those runs keep their identity and answer cache)
RECORDED_FORMAT_DEFAULT = "text"
# model.answer_parser: the readers of rgb.endpoints.answers.READERS by name, the card's first (its numbers alone enter
# a Sum or Borda of card entries; the others' are marked as under another protocol)
ANSWER_PARSERS = ("strict", "lenient")
# model.clarify=true: the user turn that follows an answer naming no class ({classes}: the class names joined by "; ")
CLARIFY_TURN = "Reply with exactly one of: {classes}"


def _text(v) -> bool:
    return isinstance(v, str) and bool(v.strip())


def _texts(v) -> bool:
    return v is None or isinstance(v, dict) and all(isinstance(k, str) and isinstance(x, str) for k, x in v.items())


# The request fields rgb writes itself (the image and prompt, the model): `model.request` may not set them.
OWN_FIELDS = frozenset({"model", "messages"})
# The config section both settings are read from (model=api_chat): their keys are `model.<field>`.
PREFIX = "model."

# The rules of the model config's values (rgb.core.values), declared on the fields (rgb.core.options) and checked
# when the settings are made: by train.py model=api_chat (its schema spreads them, before anything runs) and by every
# load of a model.json, so a bad value is one line wherever it comes from. Where a secret typed by mistake would sit
# (a token for a variable's name, or for a whole mapping) a bad value is named, never shown (`unshown`).
BASE_URL: Rule = (lambda v: isinstance(v, str) and re.match(r"(?i)^https?://[^/\s]", v) is not None
                  and url_credentials_problem(v) is None, "an http(s) URL ending in /v1, without user:password@ "
                  "(credentials belong in the variable model.api_key_env names, or in model.header_env)")
REQUEST: Rule = (lambda v: v is None or isinstance(v, dict) and all(isinstance(k, str) for k in v)
                 and not set(v) & OWN_FIELDS, f"a mapping of request fields other than {sorted(OWN_FIELDS)}")
ENV_NAME: Rule = (_text, "the name of an environment variable")
TEXT_OR_NULL: Rule = (lambda v: v is None or isinstance(v, str), "null or a text")


def _public(what: str) -> Rule:
    return unshown((_texts, f"a mapping of {what}: text (public values: recorded)"))


def _secret(what: str) -> Rule:
    return unshown((_texts, f"a mapping of {what}: environment variable name"))


def _declared(*declared: tuple[str, dict | None, dict | None]) -> None:
    """ConfigValueError naming every query parameter or header that may not be sent as declared (rgb.core.secrets:
    typed values are public, secrets come from the environment)."""
    refused = [p for kind, public, secret in declared for p in declared_problems(kind, public or {}, secret or {})]
    if refused:
        raise ConfigValueError("; ".join(refused))


@dataclass(frozen=True)
class EndpointSettings(Ruled):
    """What identifies the model's answers (model.json `api`): a change of any of these is another model. The
    answer parser is not among them: it maps the cached answer texts, and the version that scored them is
    recorded with the scores (a model.json of an older parser still loads; its answers are re-parsed).
    `temperature=None` and `max_tokens=None` are not sent; `request` is merged into every request as it is (e.g.
    `max_completion_tokens`, `reasoning_effort`, `extra_body` fields such as `top_k`); `system_prompt` is sent as
    a system message. `answer_format=choice` (the default) asks for a JSON object whose value is one of the class
    names (rgb.endpoints.answers.choice_format; the reply read by parse_choice, a reply that ignores the format by the
    text reader); `text` asks for free text. The last three enter the identity only when set (answer_format: when
    not "text"), so earlier answer caches keep theirs; a model.json without answer_format was made for text
    (`from_record`)."""

    base_url: str = ruled(rule=BASE_URL)
    api_model: str = ruled(rule=(_text, "the endpoint's model name (e.g. gpt-4o-mini)"))
    prompt: str | None = ruled(DEFAULT_PROMPT, (TEXT_OR_NULL[0], "a text"))  # None: DEFAULT_PROMPT
    temperature: float | None = ruled(0.0, optional(NON_NEGATIVE))  # None: not sent (reasoning models refuse it)
    max_tokens: int | None = ruled(16, optional(POSITIVE_INT))
    image_encoding: str = IMAGE_ENCODING
    system_prompt: str | None = ruled(None, TEXT_OR_NULL)
    request: dict | None = ruled(default_factory=dict, rule=REQUEST)
    answer_format: str = ruled("choice", (lambda v: v in ANSWER_FORMATS, " or ".join(ANSWER_FORMATS)))
    # an answer that names no class is followed, in the same conversation, by one turn asking for exactly one of the
    # class names (rgb.endpoints.online; CLARIFY_TURN): its own request, counted and priced as one
    clarify: bool = ruled(False, BOOL)
    # public query parameters sent with every request (recorded); a secret one is ClientSettings.query_env
    query: dict | None = ruled(default_factory=dict, rule=_public("parameter"))

    def __post_init__(self):
        self.check(PREFIX, lead="invalid value: ")
        _declared(("query parameter", self.query, {}))
        problem = url_query_problem(self.base_url)  # names the parameter, never its value
        both = set(self.query or {}) & {name for name, _ in parse_qsl(urlsplit(self.base_url).query)}
        if problem or both:
            raise ConfigValueError(problem or f"the query parameter {min(both)!r} is in both model.base_url and "
                                              f"model.query: keep one")
        if self.image_encoding != IMAGE_ENCODING:
            raise ConfigValueError(f"image_encoding {self.image_encoding!r}: only {IMAGE_ENCODING} keeps the stored "
                                   f"pixels")
        object.__setattr__(self, "base_url", self.base_url.rstrip("/"))
        object.__setattr__(self, "prompt", DEFAULT_PROMPT if self.prompt is None else self.prompt)
        object.__setattr__(self, "request", dict(self.request or {}))  # null (the config's default): none
        object.__setattr__(self, "query", dict(self.query or {}))

    @property
    def address(self) -> str:
        """The URL requests go to: base_url with the public `query` parameters (the secret ones are added when
        sent, rgb.endpoints.client.Endpoint.address)."""
        if not self.query:
            return self.base_url
        return f"{self.base_url}{'&' if '?' in self.base_url else '?'}{urlencode(self.query)}"

    @property
    def decoding(self) -> dict:
        """The sampling fields of every request, as rgb writes them (`request` may add or override fields)."""
        sent = {"temperature": self.temperature, "max_tokens": self.max_tokens}
        return {k: v for k, v in sent.items() if v is not None}

    def identity_extras(self) -> dict:
        """What identifies the answers beyond the legacy identity: only what is set."""
        extras = (("system_prompt", self.system_prompt), ("request", self.request),
                  ("answer_format", None if self.answer_format == "text" else self.answer_format),
                  ("clarify", self.clarify), ("query", self.query))
        return {k: v for k, v in extras if v}

    def record(self) -> dict:
        """model.json's `api`: the legacy fields, and the extras only when set (earlier run dirs keep their
        identity)."""
        extras = ("system_prompt", "request", "answer_format", "clarify", "query")
        legacy = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in extras}
        return {**legacy, **self.identity_extras()}


@dataclass(frozen=True)
class ClientSettings(Ruled):
    """How politely to ask, and how to read what comes back (model.json `client`): none of it changes an answer, so
    none of it is in the cache key. `answer_parser` reads the (cached) answers: `strict`, the card's, or `lenient`
    (rgb.endpoints.answers.ANSWER_PARSERS), whose numbers are marked as under another protocol wherever shown."""

    api_key_env: str = ruled("OPENAI_API_KEY", ENV_NAME)
    # sent with every request: `headers` as typed (public: recorded; a name that says secret is refused), and
    # {name: environment variable} whose values are read when sent, only the names recorded (rgb.core.secrets)
    headers: dict | None = ruled(default_factory=dict, rule=_public("header"))
    header_env: dict | None = ruled(default_factory=dict, rule=_secret("header"))
    query_env: dict | None = ruled(default_factory=dict, rule=_secret("parameter"))
    # an answer cut by the token limit is asked once more with this limit
    retry_max_tokens: int | None = ruled(None, optional(POSITIVE_INT))
    max_concurrency: int = ruled(4, POSITIVE_INT)
    requests_per_minute: float | None = ruled(None, optional(POSITIVE))
    tokens_per_minute: float | None = ruled(None, optional(POSITIVE))
    timeout_s: float = ruled(60.0, POSITIVE)
    max_retries: int = ruled(6, NON_NEGATIVE_INT)
    backoff_s: float = ruled(1.0, NON_NEGATIVE)
    backoff_max_s: float = ruled(60.0, NON_NEGATIVE)
    # The Batch API (rgb.endpoints.batch) instead of one request per image: the same requests and the same cache
    # records, so the same answers either way (hence not in the cache key); OpenAI charges half and answers within
    # 24 h. Polled every batch_poll_s; after batch_wait_s a run stops, and the next one resumes the batch.
    batch: bool = ruled(False, BOOL)
    batch_poll_s: float = ruled(30.0, POSITIVE)
    batch_wait_s: float = ruled(26 * 3600.0, POSITIVE)
    price: dict | None = None  # USD per 1M tokens {input, output, cached_input}; null: conf/prices.yaml, else unknown
    answer_parser: str = ruled(ANSWER_PARSERS[0], (lambda v: v in ANSWER_PARSERS, " or ".join(ANSWER_PARSERS)))

    def __post_init__(self):
        self.check(PREFIX, lead="invalid value: ")
        _declared(("header", self.headers, self.header_env), ("query parameter", {}, self.query_env))
        for name in ("headers", "header_env", "query_env"):  # null (the config's default): none
            object.__setattr__(self, name, dict(getattr(self, name) or {}))
        Price.of(self.price)

    def record(self) -> dict:
        """model.json's `client`: every field, the secrets' variables only when declared (earlier records are
        written back as they were)."""
        return {k: v for k, v in asdict(self).items() if k not in ("header_env", "query_env") or v}


def split_config(config: dict) -> tuple[EndpointSettings, ClientSettings]:
    """Both settings from one flat mapping (the model config, or model.json's two sections merged: rgb.models.chat
    `from_record` reads an absent answer_format as RECORDED_FORMAT_DEFAULT); a null is the value given
    (`max_tokens: null` sends no limit), an absent key the default."""
    names = {f.name for f in fields(EndpointSettings)}, {f.name for f in fields(ClientSettings)}
    return (EndpointSettings(**{k: v for k, v in config.items() if k in names[0]}),
            ClientSettings(**{k: v for k, v in config.items() if k in names[1]}))
