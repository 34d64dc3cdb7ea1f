"""The `api` model family: a classifier behind an OpenAI-compatible chat-completions endpoint (OpenAI, Gemini or
Claude through their compatible endpoints, vLLM, SGLang, Ollama, LM Studio, or `rgb-serve`).

It has no weights and cannot be attacked, so it enters only the black-box protocol. One request per image, the
image exactly as stored (the split's own PNG bytes as a base64 data URL: a re-encoded image would change the
perturbation). Answers are kept in a content-addressed, append-only cache (one JSONL file per model identity):
the same image in two splits is asked once, a re-run asks nothing, and kill -9 loses only in-flight answers.
The API key is read from the environment at request time and never written anywhere.
"""

from __future__ import annotations

import base64
import email.utils
import hashlib
import json
import os
import random
import re
import threading
import time
import unicodedata
from collections import Counter, deque
from collections.abc import Sequence
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from tqdm import tqdm

from rgb.core.errors import UserError
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

PARSER_VERSION = 2  # AnswerParser; cached answers are re-parsed by the version that scores them
IMAGE_ENCODING = "png_base64_data_url"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
DEFAULT_PROMPT = ("This image comes from the {dataset} image classification task. The possible classes are: {classes}. "
                  "Answer with exactly one class name from this list and nothing else.")
# Transient failures worth another try; any other HTTP error is the endpoint refusing for good.
RETRY_STATUS = frozenset({408, 409, 425, 429, 500, 502, 503, 504})


class ApiError(UserError, RuntimeError):
    """The endpoint refused for good (401, unknown model, image not supported) or kept failing: one line that
    names the endpoint and the model, never the key. Also class names no answer could tell apart."""


# ---------------------------------------------------------------------------------------------- the answer parser
_MARKDOWN = re.compile(r"[*_`#>~|\[\]()\"“”]")  # not "'": "isn't" must stay one word
_ANSWER_MARK = re.compile(r"\b(?:answer|class|category|label|prediction)\s*(?:is|:|=|-)\s*(?:is\s*)?[:\-]?\s*(.+)",
                          re.IGNORECASE)
# Scripts written without spaces between words: each character is a token, so a class name is found inside a
# sentence ("这是一只狗" names 狗) the way a name of several words is (tokens joined).
_UNSPACED = re.compile("([\u0e00-\u0eff\u1000-\u109f\u1780-\u17ff\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff"
                       "\uf900-\ufaff\U00020000-\U0002fa1f])")
_NOT = re.compile(r"n['’]t\b")  # "isn't" -> "is not"
ARTICLES = frozenset({"a", "an", "the"})
# Words that deny a class or offer alternatives: English, and a few of other languages an answer may come in.
NEGATIONS = frozenset({"not", "cannot", "no", "none", "never", "neither", "nor", "не", "нет", "nicht", "kein",
                       "keine", "pas", "δεν", "όχι", "ليس", "不", "没"})
ALTERNATIVES = frozenset({"or", "или", "oder", "ou", "ή", "أو", "或"})
NUMBER_WORDS = {word: str(i) for i, word in enumerate(
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen "
    "seventeen eighteen nineteen twenty".split())}
# British spellings (singular) and their American form: either names the same class.
SPELLINGS = {
    "harbour": "harbor", "colour": "color", "grey": "gray", "aeroplane": "airplane", "tyre": "tire",
    "jewellery": "jewelry", "centre": "center", "theatre": "theater", "metre": "meter", "aluminium": "aluminum",
    "neighbour": "neighbor", "favourite": "favorite", "moustache": "mustache", "doughnut": "donut",
    "plough": "plow", "kerb": "curb", "pyjama": "pajama", "mould": "mold", "catalogue": "catalog",
    "armour": "armor", "parlour": "parlor", "sulphur": "sulfur", "defence": "defense", "licence": "license",
}
# Plurals the s/es/ies rules miss.
IRREGULAR = {"mice": "mouse", "geese": "goose", "men": "man", "women": "woman", "children": "child",
             "people": "person", "teeth": "tooth", "feet": "foot", "knives": "knife", "leaves": "leaf",
             "wolves": "wolf", "shelves": "shelf", "buses": "bus", "cacti": "cactus", "fungi": "fungus"}
REASONS = ("class", "no class", "several", "negation", "alternative")
REFUSALS = ("negation", "alternative")  # a class named, but denied or offered as one of several


def tokens(text: str) -> list[str]:
    """The words of a text in any script: NFKC, case folded, "n't" read as "not"; every character that is not a
    letter, mark or digit (punctuation, markdown, "_", "-") separates words."""
    text = _NOT.sub(" not", unicodedata.normalize("NFKC", text).casefold())
    text = _UNSPACED.sub(r" \1 ", text)
    return "".join(c if unicodedata.category(c)[0] in "LMN" else " " for c in text).split()


def stem(word: str) -> str:
    """One form for a word's variants: number words as digits, plurals as their singular (s, es, ies and a few
    irregular ones), British spellings as American. Lossy ("movie" and "movies" both become "movy") but the same on
    both sides, which is all matching needs."""
    if word in NUMBER_WORDS:
        return NUMBER_WORDS[word]
    word = IRREGULAR.get(word, word)
    if word.endswith("ies") and len(word) >= 5:
        word = word[:-3] + "y"
    elif word.endswith(("sses", "shes", "ches", "xes", "zes")):
        word = word[:-2]
    elif word.endswith("s") and not word.endswith(("ss", "us", "is")) and len(word) >= 4:
        word = word[:-1]
    if word.endswith("ie"):
        word = word[:-2] + "y"
    elif word.endswith("oe"):
        word = word[:-1]
    return SPELLINGS.get(word, word)


@dataclass(frozen=True)
class Parsed:
    """What an answer says: `pred` the class (None: an abstention) and why (one of REASONS)."""

    pred: int | None
    reason: str


class AnswerParser:
    """Answer parser version 2 for one class list.

    A class is found as a run of words whose letters, joined without spaces, are its name's: exactly ("golf
    course" and "Golf-Course" name `golfcourse`, "sea lion" names `sea_lion`), else through `stem` (plurals,
    British spellings, number words zero..twenty for digit names). In order: markdown stripped; the part after the
    last "answer/class/label is:" marker (if any) taken on its own; the whole of that part, the whole answer or
    its first line (a leading article aside) naming one class; then the classes named inside that part, less a
    name inside a longer one named at the same place ("a wild cat" names `wild cat`, not `cat`). It abstains when
    none is named, when two are (or one run of words fits two classes), when the answer denies one ("not 3",
    "isn't a cat", "no, ..."): reason `negation`, or offers alternatives ("3 or 8"): reason `alternative`.
    Class names that read the same (`sea_lion` and `sea lion`) are refused: no answer could tell them apart."""

    def __init__(self, class_names: Sequence[str]):
        self.exact: dict[str, int] = {}
        self.stemmed: dict[str, set[int]] = {}
        for i, name in enumerate(class_names):
            words = tokens(str(name))
            key = "".join(words)
            if not key:
                raise ApiError(f"class name {name!r} has no letter or digit: no answer can name it")
            if key in self.exact:
                raise ApiError(f"class names {class_names[self.exact[key]]!r} and {name!r} read the same to the "
                               f"answer parser (case, punctuation and spaces aside): rename one of them")
            self.exact[key] = i
            self.stemmed.setdefault("".join(map(stem, words)), set()).add(i)
        self._longest = max(map(len, self.exact), default=0), max(map(len, self.stemmed), default=0)

    def _whole(self, words: list[str]) -> int | None:
        """The class that all of `words` (a leading article aside) names, if exactly one does."""
        while words and words[0] in ARTICLES:
            words = words[1:]
        key = "".join(words)
        if key in self.exact:
            return self.exact[key]
        fits = self.stemmed.get("".join(map(stem, words)), set())
        return next(iter(fits)) if len(fits) == 1 else None

    def _spans(self, words: list[str]) -> list[tuple[int, int, set[int]]]:
        """(start, end, classes) of every run of words naming a class (an exact reading beats a stemmed one)."""
        stems = [stem(w) for w in words]
        spans = []
        for start in range(len(words)):
            exact = stemmed = ""
            for end in range(start, len(words)):
                exact, stemmed = exact + words[end], stemmed + stems[end]
                if len(exact) > self._longest[0] and len(stemmed) > self._longest[1]:
                    break
                fits = {self.exact[exact]} if exact in self.exact else self.stemmed.get(stemmed)
                if fits:
                    spans.append((start, end + 1, fits))
        return [s for s in spans if not any(o[0] <= s[0] and s[1] <= o[1] and o[:2] != s[:2] for o in spans)]

    def parse(self, text: str | None) -> Parsed:
        if not text or not text.strip():
            return Parsed(None, "no class")
        stripped = _MARKDOWN.sub(" ", text)
        marks = list(_ANSWER_MARK.finditer(stripped))
        candidates = [marks[-1].group(1).splitlines()[0]] if marks else []
        candidates += [stripped, stripped.strip().splitlines()[0]]
        for candidate in candidates:
            found = self._whole(tokens(candidate))
            if found is not None:
                return Parsed(found, "class")
        words = tokens(candidates[0])
        spans = self._spans(words)
        if not spans:
            return Parsed(None, "no class")
        named = set().union(*(s[2] for s in spans))
        covered = {i for s in spans for i in range(s[0], s[1])}
        rest = {w for i, w in enumerate(words) if i not in covered}
        if rest & NEGATIONS:
            return Parsed(None, "negation")
        if rest & ALTERNATIVES:
            return Parsed(None, "alternative")
        return Parsed(next(iter(named)), "class") if len(named) == 1 else Parsed(None, "several")


def parse_answer(text: str | None, class_names: Sequence[str]) -> int | None:
    """The class an answer names, or None (an abstention): `AnswerParser` (version 2)."""
    return AnswerParser(class_names).parse(text).pred


# ------------------------------------------------------------------------------------------------ the settings
def _text(v) -> bool:
    return isinstance(v, str) and bool(v.strip())


# The rules of the model config's values (rgb.core.values), checked when the settings are made: by train.py
# model=api_chat and by every load of a model.json, so a bad value is one line wherever it comes from.
API_RULES: dict[str, Rule] = {
    "model.base_url": (lambda v: isinstance(v, str) and re.match(r"(?i)^https?://[^/\s]", v) is not None,
                       "an http(s) URL ending in /v1"),
    "model.api_model": (_text, "the endpoint's model name (e.g. gpt-4o-mini)"),
    "model.prompt": (lambda v: isinstance(v, str), "a text"),
    "model.temperature": NON_NEGATIVE, "model.max_tokens": POSITIVE_INT,
}
CLIENT_RULES: dict[str, Rule] = {
    "model.api_key_env": (_text, "the name of an environment variable"),
    "model.max_concurrency": POSITIVE_INT, "model.requests_per_minute": optional(POSITIVE),
    "model.tokens_per_minute": optional(POSITIVE), "model.timeout_s": POSITIVE, "model.max_retries": NON_NEGATIVE_INT,
    "model.backoff_s": NON_NEGATIVE, "model.backoff_max_s": NON_NEGATIVE,
}


def _check(settings, rules: dict[str, Rule]) -> None:
    found = problems({f"model.{f.name}": getattr(settings, f.name) for f in fields(settings)}, rules)
    if found:
        raise ConfigValueError("invalid value: " + "; ".join(found))


@dataclass(frozen=True)
class ApiSettings:
    """What identifies the model's answers (model.json `api`): a change of any of these is another model. The
    answer parser is not among them: it maps the cached answer texts, and the version that scored them is
    recorded with the scores (a model.json of an older parser still loads; its answers are re-parsed)."""

    base_url: str
    api_model: str
    prompt: str = DEFAULT_PROMPT
    temperature: float = 0.0
    max_tokens: int = 16
    image_encoding: str = IMAGE_ENCODING

    def __post_init__(self):
        _check(self, API_RULES)
        if self.image_encoding != IMAGE_ENCODING:
            raise ConfigValueError(f"image_encoding {self.image_encoding!r}: only {IMAGE_ENCODING} keeps the stored "
                                   f"pixels")
        object.__setattr__(self, "base_url", self.base_url.rstrip("/"))

    @property
    def decoding(self) -> dict:
        return {"temperature": self.temperature, "max_tokens": self.max_tokens}


@dataclass(frozen=True)
class ClientSettings:
    """How politely to ask (model.json `client`): none of it changes an answer, so none of it is in the cache key."""

    api_key_env: str = "OPENAI_API_KEY"
    max_concurrency: int = 4
    requests_per_minute: float | None = None
    tokens_per_minute: float | None = None
    timeout_s: float = 60.0
    max_retries: int = 6
    backoff_s: float = 1.0
    backoff_max_s: float = 60.0

    def __post_init__(self):
        _check(self, CLIENT_RULES)


def split_config(config: dict) -> tuple[ApiSettings, ClientSettings]:
    """Both settings from one flat mapping (the model config, or model.json's two sections merged)."""
    names = {f.name for f in fields(ApiSettings)}, {f.name for f in fields(ClientSettings)}
    return (ApiSettings(**{k: v for k, v in config.items() if k in names[0] and v is not None}),
            ClientSettings(**{k: v for k, v in config.items() if k in names[1] and v is not None}))


# ---------------------------------------------------------------------------------------------------- the cache
class CacheError(UserError, RuntimeError):
    """An answer cache with a damaged record that is not the torn last line of an interrupted write."""


class AnswerCache:
    """Append-only JSONL of {"key", "answer", "usage"}; each record fsynced as it is written. A torn last line
    (kill -9 in the middle of a write) is cut off when the cache is opened; anything else unreadable is refused."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.answers: dict[str, dict] = {}
        self._lock = threading.Lock()
        self._file = None
        if self.path.is_file():
            self._load()

    def _load(self) -> None:
        data = self.path.read_bytes()
        whole = data[: data.rfind(b"\n") + 1]
        for number, line in enumerate(whole.splitlines(), start=1):
            try:
                record = json.loads(line)
                lacking = [k for k in ("key", "answer") if not isinstance(record.get(k), str)]
            except (ValueError, AttributeError) as err:
                lacking = [f"JSON: {err}"]
            if lacking:
                raise CacheError(f"{self.path} line {number} is not an answer record (no {', '.join(lacking)}); "
                                 f"move the file away to start a fresh cache")
            self.answers[record["key"]] = record
        if len(whole) < len(data):  # the torn tail of an interrupted append: never a whole answer
            with open(self.path, "r+b") as handle:
                handle.truncate(len(whole))

    def __contains__(self, key: str) -> bool:
        return key in self.answers

    def get(self, key: str) -> dict | None:
        return self.answers.get(key)

    def add(self, record: dict) -> None:
        line = (json.dumps(record, sort_keys=True) + "\n").encode()
        with self._lock:
            if self._file is None:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._file = open(self.path, "ab")
            self._file.write(line)
            self._file.flush()
            os.fsync(self._file.fileno())
            self.answers[record["key"]] = record

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None


# --------------------------------------------------------------------------------------------- manners and stats
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
class RequestStats:
    """What asking cost, per call of `ApiClassifier.answer` (one split)."""

    images: int = 0
    requests: int = 0      # new answers received from the endpoint
    cached: int = 0        # images answered from the cache (other splits, earlier runs, duplicates in the split)
    retries: int = 0
    abstained: int = 0     # answers that name no class (counted wrong), of which:
    negations: int = 0     #   a class named but denied ("not 3")
    alternatives: int = 0  #   a class offered as one of several ("3 or 8")
    unanswered: int = 0    # not asked: max_requests reached
    prompt_tokens: int = 0
    completion_tokens: int = 0
    backoff_s: float = 0.0

    def add(self, other: RequestStats) -> None:
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))


@dataclass
class RequestBudget:
    """`max_requests`: new requests left to this evaluation (None: no limit)."""

    remaining: int | None = None

    def __post_init__(self):
        found = problems({"max_requests": self.remaining}, {"max_requests": optional(POSITIVE_INT)})
        if found:
            raise ConfigValueError(f"invalid value: {found[0]} (null: no limit)")

    def take(self, wanted: int) -> int:
        granted = wanted if self.remaining is None else min(wanted, self.remaining)
        if self.remaining is not None:
            self.remaining -= granted
        return granted


@dataclass(frozen=True)
class Answer:
    text: str
    pred: int | None  # None: an abstention
    reason: str       # AnswerParser's: why pred is what it is


# ---------------------------------------------------------------------------------------------------- the model
def _retry_after(value: str | None) -> float | None:
    """Retry-After in seconds (a number or an HTTP date)."""
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
    def __init__(self, reason: str, retry_after: float | None = None):
        super().__init__(reason)
        self.retry_after = retry_after


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
        self._sleep = sleep
        identity = {"base_url": settings.base_url, "api_model": settings.api_model, "prompt": self.prompt,
                    "decoding": settings.decoding, "image_encoding": settings.image_encoding}
        self._identity = json.dumps(identity, sort_keys=True)
        self.identity_sha256 = hashlib.sha256(self._identity.encode()).hexdigest()

    def request_key(self, image: bytes) -> str:
        """sha256 of (image bytes, prompt, model identity, decoding parameters)."""
        return hashlib.sha256(hashlib.sha256(image).digest() + self._identity.encode()).hexdigest()

    def describe(self) -> dict:
        return {"api": asdict(self.settings), "client": asdict(self.client_settings),
                "class_names": self.class_names, "num_classes": len(self.class_names), "dataset": self.dataset,
                "api_model": self.settings.api_model}

    # ------------------------------------------------------------------------------------------ one request
    def _body(self, image: bytes) -> dict:
        if not image.startswith(PNG_MAGIC):
            raise ApiError("an image of the split is not PNG: it is sent as stored or not at all (no re-encoding)")
        url = "data:image/png;base64," + base64.b64encode(image).decode("ascii")
        content = [{"type": "text", "text": self.prompt}, {"type": "image_url", "image_url": {"url": url}}]
        return {"model": self.settings.api_model, "messages": [{"role": "user", "content": content}],
                **self.settings.decoding}

    def _refused(self, what: str, key: str | None) -> ApiError:
        message = _one_line(what)
        if key:
            message = message.replace(key, "[key]")
        return ApiError(f"{self.settings.base_url} (model {self.settings.api_model!r}): {message}")

    def _post_once(self, http, body: dict, key: str | None) -> dict:
        import httpx

        headers = {"Authorization": f"Bearer {key}"} if key else {}
        try:
            response = http.post(f"{self.settings.base_url}/chat/completions", json=body, headers=headers,
                                 timeout=self.client_settings.timeout_s)
        except httpx.TimeoutException:
            raise _Transient(f"timeout after {self.client_settings.timeout_s:g} s") from None
        except httpx.TransportError as err:
            raise _Transient(f"connection error ({type(err).__name__})") from None
        if response.status_code in RETRY_STATUS:
            raise _Transient(f"HTTP {response.status_code}", _retry_after(response.headers.get("retry-after")))
        if response.status_code != 200:
            hint = {401: f"; is {self.client_settings.api_key_env} set to a valid key?"}.get(response.status_code, "")
            raise self._refused(f"HTTP {response.status_code}: {_error_message(response)}{hint}", key)
        try:
            reply = response.json()
            text = reply["choices"][0]["message"]["content"]
        except (ValueError, KeyError, IndexError, TypeError):
            raise _Transient("malformed response (no choices[0].message.content)") from None
        usage = reply.get("usage") or {}
        return {"answer": text if isinstance(text, str) else json.dumps(text),
                "usage": {k: int(usage.get(k) or 0) for k in ("prompt_tokens", "completion_tokens")}}

    def _ask(self, http, limiter: RateLimiter, image: bytes, stats: RequestStats, lock) -> dict:
        """One answer, retried with exponential backoff and jitter (or the server's Retry-After)."""
        key = os.environ.get(self.client_settings.api_key_env) or None
        body = self._body(image)
        attempts, attempt = self.client_settings.max_retries + 1, 0
        while True:
            event = limiter.acquire()
            try:
                reply = self._post_once(http, body, key)
            except _Transient as err:
                limiter.settle(event, 0)
                if attempt == attempts - 1:
                    raise self._refused(f"gave up after {attempts} attempts, last: {err}", key) from None
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

    def _parse(self, record: dict) -> Parsed:
        return self.parser.parse(record["answer"])

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
        import httpx

        budget = budget or RequestBudget()
        keys = [self.request_key(b) for b in images]
        uses = Counter(keys)
        first_image: dict[str, int] = {}
        for i, k in enumerate(keys):
            first_image.setdefault(k, i)
        todo = [k for k in uses if k not in cache]
        todo = todo[: budget.take(len(todo))]
        stats, lock = RequestStats(images=len(images)), threading.Lock()
        limiter = RateLimiter(self.client_settings.requests_per_minute, self.client_settings.tokens_per_minute,
                              sleep=self._sleep)
        with tqdm(total=len(images), desc=desc, unit="img", leave=False) as bar, \
                httpx.Client(limits=httpx.Limits(max_connections=self.client_settings.max_concurrency)) as http, \
                ThreadPoolExecutor(self.client_settings.max_concurrency) as pool:
            cached = sum(uses[k] for k in uses if k in cache)
            bar.update(cached)
            abstained = [sum(uses[k] for k in uses if k in cache and self._parse(cache.get(k)).pred is None)]

            def one(k: str) -> None:
                reply = self._ask(http, limiter, images[first_image[k]], stats, lock)
                cache.add({"key": k, **reply})
                with lock:
                    stats.requests += 1
                    stats.prompt_tokens += reply["usage"]["prompt_tokens"]
                    stats.completion_tokens += reply["usage"]["completion_tokens"]
                    abstained[0] += uses[k] if self._parse(reply).pred is None else 0
                    bar.update(uses[k])
                    bar.set_postfix(sent=stats.requests, cached=cached, retried=stats.retries,
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
        parsed = {k: self._parse(cache.get(k)) for k in uses if k in cache}
        answers = [Answer(cache.get(k)["answer"], parsed[k].pred, parsed[k].reason) if k in parsed else None
                   for k in keys]
        answered = [a for a in answers if a is not None]
        stats.cached = len(answered) - stats.requests
        stats.unanswered = len(images) - len(answered)
        stats.abstained = sum(a.pred is None for a in answered)
        stats.negations = sum(a.reason == "negation" for a in answered)
        stats.alternatives = sum(a.reason == "alternative" for a in answered)
        return answers, stats


def _error_message(response) -> str:
    """The error message of an OpenAI-style error body, else the start of the body."""
    try:
        error = response.json().get("error")
        return str(error.get("message") if isinstance(error, dict) else error)
    except (ValueError, AttributeError):
        return response.text[:200] or response.reason_phrase


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

__all__ = ["AnswerParser", "ApiClassifier", "ApiError", "ApiSettings", "AnswerCache", "ClientSettings", "FAMILY",
           "PARSER_VERSION", "Parsed", "RateLimiter", "RequestBudget", "RequestStats", "parse_answer", "split_config"]
