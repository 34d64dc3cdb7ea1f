"""`rgb-serve run=DIR port=8000`: any rgb model (timm, openclip zero-shot, factory) behind an OpenAI-compatible
endpoint (FastAPI on uvicorn) that answers with a class name, so a local model and an API model are compared on
identical terms (an `api` run pointed at it scores what evaluate.py scores of the model directly).

What a client of OpenAI's chat-completions API gets here, and where it differs:
- `POST /v1/chat/completions` classifies the first image of the last message that has one; the image is a
  PNG, JPEG or WebP data URL, decoded exactly as the benchmark loader decodes a split. http(s) image URLs are
  refused with a 400 (`image_url_not_supported`): the server fetches nothing from the network.
- The answer is the model's prediction (argmax of its logits). A request with `temperature` > 0 samples each of
  its `n` choices from softmax(logits / temperature) instead, from a generator seeded by the request's `seed`
  (the same seed: the same choices). A missing temperature is 0 here, not OpenAI's 1: the served model is a
  classifier whose answer is its prediction. So `n` without a temperature gives n identical choices, as OpenAI
  does at temperature 0.
- `logprobs=true`: the answer's logprob is the log-softmax over the classes of the model's logits at the chosen
  class (the class name is one "token"); `top_logprobs=k` lists the k most likely class names.
- `response_format` of type `json_schema` whose schema has a property with an `enum` of class names (OpenAI
  structured outputs, as `model.answer_format=choice` asks): the answer is the JSON object {property: class}, the
  class chosen (argmax or sampled) among the enum's classes only. Any other response format (`json_object`) is a
  400 `unsupported_value`, as are the fields a classifier cannot honour (`tools`, `tool_choice`, `functions`,
  `logit_bias`, `audio`, ...: UNSUPPORTED, a 400 `unsupported_parameter`) rather than being ignored.
- `stream=true`: server-sent events, one `chat.completion.chunk` per role, content and finish of each choice,
  a last chunk with the usage when `stream_options.include_usage`, then `data: [DONE]`.
- `usage` is counted from the request, tokenizer-free, so it approximates OpenAI's counts: a text is
  ceil(characters / 4) tokens (OpenAI's rule of thumb); an image is OpenAI's GPT-4o tile rule on its real size
  (85 tokens with `detail: low`, else 85 + 170 per 512-pixel tile after fitting it into 2048x2048 and its
  shorter side into 768, never upscaling). The completion is the answers' text by the same rule.
  `max_tokens`/`max_completion_tokens` below an answer's count cut it (`finish_reason: length`).
- Every malformed request is answered with OpenAI's error shape
  (`{"error": {"message", "type", "param", "code"}}`): 400 for a body that is not a JSON object or breaks the
  request's schema, 404 `model_not_found` for another model name, 401 without the key, 413 over MAX_BODY_BYTES.
- For operators: `GET /health` is 200 once the model is loaded (it is before the socket answers; no key needed, as
  launch scripts and k8s probes poll it); one access line per request (client, method, path, status, latency,
  tokens) on the `rgb.serve.access` logger; every `log_interval_s` a throughput line (requests/s, prompt and
  generation tokens/s, as vLLM's "Avg prompt throughput"); `/v1/models` gives the server's start time as `created`.
- At most `limits.max_concurrency` requests are worked on at once; up to `limits.max_queue` more wait their turn
  (first come, first served); beyond that a request gets 429 `rate_limit_exceeded` with Retry-After: 1.

- The Batch API: `/v1/files` (upload, retrieve, content) and `/v1/batches` (create, retrieve, cancel) run a JSONL
  of chat-completions requests in the background through the same handler (rgb.serve.batch), so a client's
  Batch path is rehearsed locally; the files live in `batch_dir` (default: a temporary directory).

For the tests it can misbehave on purpose (`faults`: 429 with Retry-After, 500, slow answers, malformed answers).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import hashlib
import io
import json
import logging
import re
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from PIL import Image, UnidentifiedImageError
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from rgb.core.errors import UserError
from rgb.data.benchmark import decode_image, to_tensor
from rgb.models import load_with_meta
from rgb.endpoints.cost import image_tokens, text_tokens
from rgb.serve.batch import BatchRoutes, BatchStore

log = logging.getLogger(__name__)
access_log = logging.getLogger("rgb.serve.access")
# A body declared longer is refused (413) unread: a benchmark image is a few hundred KiB as a data URL.
MAX_BODY_BYTES = 32 * 2**20
IMAGE_FORMATS = {"image/png": "PNG", "image/jpeg": "JPEG", "image/jpg": "JPEG", "image/webp": "WEBP"}
DATA_URL = re.compile(r"data:(?P<mime>[\w/+.-]+);base64,(?P<data>.*)", re.DOTALL)
MALFORMED_ANSWER = "I cannot tell from this image."
SHUTDOWN_WAIT_S = 30


@dataclass(frozen=True)
class Faults:
    """Misbehaviour on every k-th request (0: never), counted over all requests; the first that applies wins."""

    rate_limit_every: int = 0     # 429 with Retry-After: retry_after_s
    retry_after_s: float = 1.0
    error_every: int = 0          # 500
    slow_every: int = 0           # answer after slow_s seconds
    slow_s: float = 2.0
    malformed_every: int = 0      # 200 whose answer names no class

    def pick(self, number: int) -> str | None:
        for name, every in (("rate_limit", self.rate_limit_every), ("error", self.error_every),
                            ("slow", self.slow_every), ("malformed", self.malformed_every)):
            if every and number % every == 0:
                return name
        return None


@dataclass(frozen=True)
class Limits:
    """Requests worked on at once, and how many more may wait for a turn (beyond both: 429)."""

    max_concurrency: int = 8
    max_queue: int = 1024

    def __post_init__(self):
        if self.max_concurrency < 1 or self.max_queue < 0:
            raise ServeError(f"limits: max_concurrency must be >= 1 and max_queue >= 0, not "
                             f"{self.max_concurrency} and {self.max_queue}")


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


class AccessLog:
    """ASGI middleware: one line per HTTP request once its answer is sent (client, method, path, status, latency
    and, for a completion, its tokens, which the route leaves in the scope's `rgb.usage`). /health polls are
    logged at DEBUG only, so a probe every few seconds does not bury the requests."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        start, status, usage = time.perf_counter(), [500], scope.setdefault("rgb.usage", {})

        async def sending(message):
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            client = "%s:%s" % tuple(scope["client"]) if scope.get("client") else "-"
            tokens = "".join(f" {key}={value}" for key, value in usage.items())
            access_log.log(logging.DEBUG if scope["path"] == "/health" else logging.INFO,
                           '%s "%s %s" %d %.1f ms%s', client, scope["method"], scope["path"], status[0],
                           (time.perf_counter() - start) * 1000, tokens)


class ServeError(UserError, ValueError):
    """A model or setting rgb-serve cannot serve (one line)."""


class ErrorReply(Exception):
    """Raised to end a request with an answer in OpenAI's error shape: what the HTTP client did wrong (or, for
    faults, what the server pretends). Not a UserError: it is answered to the client, never shown by a command."""

    def __init__(self, status: int, message: str, code: str | None, param: str | None = None,
                 kind: str = "invalid_request_error", headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.code, self.param, self.kind = status, message, code, param, kind
        self.headers = headers

    def response(self) -> JSONResponse:
        error = {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}
        return JSONResponse({"error": error}, self.status, headers=self.headers)


# The request's schema: only what rgb-serve reads is checked; a field asking for what a classifier cannot do
# (UNSUPPORTED) is a 400, any other field OpenAI knows (penalties, stop, user, ...) is accepted and changes nothing.
UNSUPPORTED = {
    "tools": "calls no tools", "tool_choice": "calls no tools", "functions": "calls no functions",
    "function_call": "calls no functions", "logit_bias": "answers with class names, not tokens",
    "audio": "answers in text only", "prediction": "takes no predicted output",
    "web_search_options": "searches nothing",
}
RESPONSE_FORMATS = ("text", "json_schema")
class Message(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Any = None


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow")
    include_usage: bool = False


class ChatRequest(BaseModel):
    model_config = ConfigDict(extra="allow")
    model: str
    messages: list[Message] = Field(min_length=1)
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    n: int | None = Field(1, ge=1, le=128)
    temperature: float | None = Field(None, ge=0, le=2)
    seed: int | None = None
    logprobs: bool | None = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    response_format: dict | None = None


@dataclass(frozen=True)
class ImagePart:
    data: bytes
    width: int
    height: int
    detail: str


@dataclass(frozen=True)
class Prompt:
    """What a chat request gives the classifier: the image it classifies and the tokens of all its parts."""

    image: bytes
    prompt_tokens: int


def _image_part(value: Any, param: str) -> ImagePart:
    if not isinstance(value, dict) or not isinstance(value.get("url"), str):
        raise ErrorReply(400, f"Invalid '{param}': expected an object with a string 'url'", "invalid_type", param)
    detail = value.get("detail", "auto")
    if detail not in ("auto", "low", "high"):
        raise ErrorReply(400, f"Invalid '{param}.detail': expected 'auto', 'low' or 'high'", "invalid_value",
                         f"{param}.detail")
    url = value["url"]
    if url.startswith(("http://", "https://")):
        raise ErrorReply(400, "rgb-serve fetches no image URLs: send the image as a base64 data URL",
                         "image_url_not_supported", f"{param}.url")
    found = DATA_URL.fullmatch(url)
    if not found or found["mime"] not in IMAGE_FORMATS:
        raise ErrorReply(400, "image not supported: send a PNG, JPEG or WebP image as a base64 data URL",
                         "image_not_supported", f"{param}.url")
    try:
        data = base64.b64decode(found["data"], validate=True)
        with Image.open(io.BytesIO(data)) as image:
            if image.format not in IMAGE_FORMATS.values():
                raise UnidentifiedImageError(image.format)
            width, height = image.size
    except (binascii.Error, ValueError, OSError) as err:  # UnidentifiedImageError is an OSError
        raise ErrorReply(400, f"image not supported: the data URL holds no PNG, JPEG or WebP image "
                                f"({type(err).__name__})", "image_not_supported", f"{param}.url") from None
    return ImagePart(data, width, height, detail)


def read_prompt(request: ChatRequest) -> Prompt:
    """The image to classify (the first of the last message that has one) and the request's prompt tokens."""
    tokens, images_by_message = 0, []
    for m, message in enumerate(request.messages):
        content, images = message.content, []
        parts = [{"type": "text", "text": content}] if isinstance(content, str) else content
        if not isinstance(parts, list | None):
            raise ErrorReply(400, f"Invalid 'messages[{m}].content': expected a string or an array of parts",
                             "invalid_type", f"messages[{m}].content")
        for p, part in enumerate(parts or []):
            param = f"messages[{m}].content[{p}]"
            kind = part.get("type") if isinstance(part, dict) else None
            if kind == "text" and isinstance(part.get("text"), str):
                tokens += text_tokens(part["text"])
            elif kind == "image_url":
                images.append(_image_part(part.get("image_url"), f"{param}.image_url"))
                tokens += image_tokens(images[-1].width, images[-1].height, images[-1].detail)
            else:
                raise ErrorReply(400, f"Invalid '{param}': expected a text part ({{'type': 'text', 'text': ...}}) "
                                      "or an image_url part", "invalid_type", param)
        images_by_message.append(images)
    for images in reversed(images_by_message):
        if images:
            return Prompt(images[0].data, tokens)
    raise ErrorReply(400, "the request has no image: rgb-serve classifies the image of the last message that has "
                            "one (an image_url part)", "image_missing", "messages")


def _param_of(location: tuple) -> str | None:
    """pydantic's error location as OpenAI names a parameter: ('messages', 0, 'role') -> 'messages[0].role'."""
    param = ""
    for item in location:
        param += f"[{item}]" if isinstance(item, int) else f".{item}" if param else str(item)
    return param or None


def parse_request(raw: bytes) -> ChatRequest:
    try:
        request = ChatRequest.model_validate_json(raw)
    except ValidationError as err:
        first = err.errors(include_url=False)[0]
        param = _param_of(tuple(first["loc"]))
        if first["type"] == "json_invalid":
            raise ErrorReply(400, "the body is not valid JSON", "invalid_json") from None
        if param is None:
            raise ErrorReply(400, "the body must be a JSON object", "invalid_request_body") from None
        code = "missing_required_parameter" if first["type"] == "missing" else "invalid_value"
        raise ErrorReply(400, f"Invalid '{param}': {first['msg']}", code, param) from None
    if request.top_logprobs is not None and not request.logprobs:
        raise ErrorReply(400, "top_logprobs needs logprobs=true", "invalid_value", "top_logprobs")
    extra = request.model_extra or {}
    for name, why in UNSUPPORTED.items():  # in this order: `tools` is named before the `tool_choice` it comes with
        value = extra.get(name)
        if value not in (None, [], {}) and not (name == "tool_choice" and value == "none"):
            raise ErrorReply(400, f"Unsupported parameter: '{name}': rgb-serve serves a classifier, which {why}",
                             "unsupported_parameter", name)
    kind = (request.response_format or {}).get("type", "text")
    if kind not in RESPONSE_FORMATS:
        raise ErrorReply(400, f"Unsupported value: 'response_format.type' {kind!r}: rgb-serve answers 'text' or a "
                              f"'json_schema' with an enum of class names", "unsupported_value", "response_format.type")
    return request


def _listening_socket(host: str, port: int) -> socket.socket:
    """A TCP socket listening on host:port, made with proto IPPROTO_TCP: asyncio sets TCP_NODELAY only on
    connections accepted from such a socket (socket.create_server's proto 0 left Nagle on, and every answer
    waited ~40 ms for the client's delayed ACK)."""
    check_port(port)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(2048)
    except OSError as err:  # in use, or a host this machine does not have: the user's to change
        sock.close()
        raise ServeError(f"cannot listen on host={host} port={port}: {err.strerror or err} (choose another port, or "
                         f"port=0 for any free one)") from err
    return sock


def check_port(port) -> None:
    """A TCP port number: 0 (any free one) to 65535."""
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise ServeError(f"port={port!r}: a port is an integer from 0 (any free one) to 65535")


class ModelServer:
    """The model behind the endpoint, on a socket bound at construction (so `base_url` is known at once);
    `serve_forever` runs uvicorn until `shutdown` (from another thread, or Ctrl-C in the main one)."""

    def __init__(self, model, class_names: list[str], image_size: int, served_name: str, host: str = "127.0.0.1",
                 port: int = 0, faults: Faults | None = None, api_key: str | None = None, device: str = "cpu",
                 limits: Limits | None = None, batch_dir: str | Path | None = None, log_interval_s: float = 10.0):
        self.started = int(time.time())  # `created` of /v1/models
        self.model, self.class_names, self.image_size = model.to(device).eval(), class_names, image_size
        self.served_name, self.faults, self.api_key, self.device = served_name, faults or Faults(), api_key, device
        self.limits = limits or Limits()
        self.requests = ServerLog()
        self.throughput, self.log_interval_s = Throughput(), log_interval_s  # 0: no throughput lines
        self.batches = BatchStore(batch_dir)  # the Files and Batches endpoints' files (None: a temp dir)
        self._model_lock = threading.Lock()
        self.socket = _listening_socket(host, port)
        self.server_address: tuple[str, int] = self.socket.getsockname()[:2]  # still known once it is closed
        # log_config=None: the caller's logging stays as it is; uvicorn's access log is off (AccessLog's has tokens)
        config = uvicorn.Config(AccessLog(build_app(self)), log_config=None, access_log=False, lifespan="off",
                                timeout_graceful_shutdown=5)
        self._uvicorn = uvicorn.Server(config)
        self._stopped = threading.Event()

    @property
    def base_url(self) -> str:
        host, port = self.server_address
        return f"http://{host}:{port}/v1"

    def serve_forever(self) -> None:
        if self.log_interval_s:
            threading.Thread(target=self._report_throughput, name="rgb-serve-throughput", daemon=True).start()
        try:
            self._uvicorn.run(sockets=[self.socket])
        finally:
            self._stopped.set()

    def _report_throughput(self) -> None:
        while not self._stopped.wait(self.log_interval_s):
            with self.requests.lock:
                active, waiting = self.requests.active, self.requests.waiting
            line = self.throughput.report(active, waiting)
            if line:
                log.info("%s", line)

    def shutdown(self) -> None:
        """Stop serve_forever (requests in flight get up to 5 s) and wait for it to return."""
        self._uvicorn.should_exit = True
        self._stopped.wait(SHUTDOWN_WAIT_S)

    def server_close(self) -> None:
        self.socket.close()

    def logits(self, image: bytes) -> torch.Tensor:
        """The model's class scores for a stored image, decoded as rgb.data.ImageSplit decodes it."""
        x = to_tensor(decode_image({"bytes": image}, self.image_size))[None].to(self.device)
        with self._model_lock, torch.inference_mode():
            return self.model(x)[0].float().cpu()

    def classify(self, image: bytes) -> str:
        return self.class_names[int(self.logits(image).argmax())]


def make_server(run: str | Path, host: str = "127.0.0.1", port: int = 0, served_name: str | None = None,
                faults: Faults | None = None, api_key: str | None = None, device: str = "cpu",
                image_size: int | None = None, limits: Limits | None = None,
                batch_dir: str | Path | None = None, log_interval_s: float = 10.0) -> ModelServer:
    """A server for the model of a run dir (not started: call serve_forever, e.g. in a thread)."""
    check_port(port)  # before the model loads
    model, meta = load_with_meta(run)
    if not isinstance(model, torch.nn.Module):
        raise ServeError(f"{run} holds a model of family {meta.get('family')!r}: rgb-serve serves models it runs itself")
    size = image_size or meta.get("image_size")
    if not size or not meta.get("class_names"):
        raise ServeError(f"{run}/model.json names no image_size or class_names: pass image_size= (and export the "
                         f"model with its class names)")
    return ModelServer(model, list(meta["class_names"]), int(size), served_name or Path(run).name, host, port,
                       faults, api_key, device, limits, batch_dir, log_interval_s)


def _logprob_entry(name: str, logprob: float) -> dict:
    return {"token": name, "logprob": logprob, "bytes": list(name.encode())}


def _enum_choice(server: ModelServer, request: ChatRequest) -> tuple[str, list[bool]] | None:
    """A json_schema response format's enum property and which classes it allows (None: a free-text answer)."""
    answer_format = request.response_format or {}
    if answer_format.get("type") != "json_schema":
        return None
    schema = (answer_format.get("json_schema") or {}).get("schema") or {}
    properties = schema.get("properties") if isinstance(schema, dict) else None
    found = [(k, v["enum"]) for k, v in (properties or {}).items() if isinstance(v, dict) and "enum" in v]
    allowed = [name in found[0][1] for name in server.class_names] if len(found) == 1 else []
    if not any(allowed):
        raise ErrorReply(400, "rgb-serve answers a json_schema response format with one property whose enum names "
                              "served classes", "invalid_value", "response_format")
    return found[0][0], allowed


def _choices(server: ModelServer, request: ChatRequest, logits: torch.Tensor | None) -> list[dict]:
    """The n choices: the argmax, or samples at the request's temperature, among the classes a response format's
    enum allows (as JSON then); None logits: the malformed fault."""
    n, limit = request.n or 1, request.max_completion_tokens or request.max_tokens
    enum = _enum_choice(server, request)
    if logits is not None and enum is not None:
        logits = logits.masked_fill(~torch.tensor(enum[1]), float("-inf"))
    if logits is None:
        picked, logprobs = [None] * n, None
    else:
        logprobs = torch.log_softmax(logits.double(), 0)
        if request.temperature:
            generator = torch.Generator().manual_seed(request.seed if request.seed is not None else
                                                      int(torch.randint(2**62, (1,))))
            probs = torch.softmax(logits.double() / request.temperature, 0)
            picked = torch.multinomial(probs, n, replacement=True, generator=generator).tolist()
        else:
            picked = [int(logits.argmax())] * n
    choices = []
    for index, label in enumerate(picked):
        content = MALFORMED_ANSWER if label is None else server.class_names[label]
        if label is not None and enum is not None:
            content = json.dumps({enum[0]: content}, ensure_ascii=False)
        finish = "stop"
        if limit is not None and text_tokens(content) > limit:
            content, finish = content[:4 * limit], "length"
        choice = {"index": index, "message": {"role": "assistant", "content": content, "refusal": None},
                  "logprobs": None, "finish_reason": finish}
        if request.logprobs and label is not None:
            entry = _logprob_entry(content, float(logprobs[label]))
            top = logprobs.topk(min(request.top_logprobs or 0, int(logprobs.isfinite().sum())))
            entry["top_logprobs"] = [_logprob_entry(server.class_names[int(i)], float(v))
                                     for v, i in zip(top.values, top.indices)]
            choice["logprobs"] = {"content": [entry], "refusal": None}
        choices.append(choice)
    return choices


def _chunks(completion: dict, include_usage: bool) -> Iterator[str]:
    """A completion as OpenAI streams it: server-sent `chat.completion.chunk` events, then `[DONE]`."""
    head = {key: completion[key] for key in ("id", "created", "model", "system_fingerprint")}
    head["object"] = "chat.completion.chunk"

    def event(choices: list, **extra) -> str:
        return f"data: {json.dumps({**head, 'choices': choices, **extra})}\n\n"

    for choice in completion["choices"]:
        index, message = choice["index"], choice["message"]
        yield event([{"index": index, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                      "finish_reason": None}])
        yield event([{"index": index, "delta": {"content": message["content"]}, "logprobs": choice["logprobs"],
                      "finish_reason": None}])
        yield event([{"index": index, "delta": {}, "logprobs": None, "finish_reason": choice["finish_reason"]}])
    if include_usage:
        yield event([], usage=completion["usage"])
    yield "data: [DONE]\n\n"


async def _read_body(request: Request) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        raise ErrorReply(413, f"the body ({declared} bytes) is over the limit of {MAX_BODY_BYTES} bytes",
                         "request_too_large", headers={"Connection": "close"})
    body = bytearray()
    try:
        async for chunk in request.stream():
            body += chunk
            if len(body) > MAX_BODY_BYTES:
                raise ErrorReply(413, f"the body is over the limit of {MAX_BODY_BYTES} bytes",
                                 "request_too_large", headers={"Connection": "close"})
    except ClientDisconnect:  # gone before its body was whole: the answer reaches no one, and nothing is logged
        raise ErrorReply(400, "the client left before sending the whole body", "incomplete_body") from None
    return bytes(body)


def build_app(server: ModelServer) -> FastAPI:
    """The OpenAI-shaped routes of `server`: /v1/models (and /v1/models/{id}), /v1/chat/completions, the Files
    and Batches endpoints (rgb.serve.batch), and /health."""
    app = FastAPI(title="rgb-serve", docs_url=None, redoc_url=None, openapi_url=None)
    turns = asyncio.Semaphore(server.limits.max_concurrency)

    @app.exception_handler(ErrorReply)
    async def error_reply(_request: Request, err: ErrorReply) -> JSONResponse:
        return err.response()

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, err: StarletteHTTPException) -> JSONResponse:
        return ErrorReply(err.status_code, f"{err.detail}: {request.method} {request.url.path}",
                          "not_found" if err.status_code == 404 else None).response()

    @app.exception_handler(Exception)
    async def server_error(_request: Request, err: Exception) -> JSONResponse:
        log.exception("rgb-serve failed on a request")
        return ErrorReply(500, f"the server failed: {type(err).__name__}", "server_error",
                          kind="server_error").response()

    def authorize(request: Request) -> None:
        if server.api_key and request.headers.get("authorization") != f"Bearer {server.api_key}":
            raise ErrorReply(401, "invalid API key", "invalid_api_key")

    def model_entry() -> dict:
        return {"id": server.served_name, "object": "model", "created": server.started, "owned_by": "rgb"}

    @app.get("/health")
    async def health() -> dict:
        """200 once the model is loaded, which it is before the server answers anything (no key needed)."""
        return {"status": "ok", "model": server.served_name}

    @app.get("/v1/models")
    async def list_models(request: Request) -> dict:
        authorize(request)
        return {"object": "list", "data": [model_entry()]}

    @app.get("/v1/models/{model_id:path}")
    async def retrieve_model(model_id: str, request: Request) -> dict:
        authorize(request)
        if model_id != server.served_name:
            raise ErrorReply(404, f"The model '{model_id}' does not exist", "model_not_found", "model")
        return model_entry()

    async def complete_chat(raw: bytes) -> tuple[ChatRequest, dict]:
        """One chat-completions body answered (or an ErrorReply): the route's and every Batch line's handler."""
        chat = parse_request(raw)
        if chat.model != server.served_name:
            raise ErrorReply(404, f"The model '{chat.model}' does not exist (served: {server.served_name!r})",
                             "model_not_found", "model")
        prompt = read_prompt(chat)
        _enum_choice(server, chat)  # a response format it cannot honour is refused before the model is asked
        async with _turn(server, turns):
            return chat, await _complete(server, chat, prompt)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        authorize(request)
        chat, completion = await complete_chat(await _read_body(request))
        request.scope["rgb.usage"].update(
            {key: completion["usage"][key] for key in ("prompt_tokens", "completion_tokens")})
        if chat.stream:
            include_usage = bool(chat.stream_options and chat.stream_options.include_usage)
            return StreamingResponse(_chunks(completion, include_usage), media_type="text/event-stream")
        return completion

    BatchRoutes(server.batches, authorize, complete_chat, ErrorReply).add_to(app)
    return app


@contextlib.asynccontextmanager
async def _turn(server: ModelServer, turns: asyncio.Semaphore):
    """Hold one of the server's max_concurrency turns, waiting in line if the queue has room (else 429)."""
    counts, limits = server.requests, server.limits
    with counts.lock:
        if counts.active + counts.waiting >= limits.max_concurrency + limits.max_queue:
            raise ErrorReply(429, "rgb-serve is at its concurrency limit, retry later", "rate_limit_exceeded",
                             kind="requests", headers={"Retry-After": "1"})
        counts.waiting += 1
    try:
        await turns.acquire()
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
        turns.release()


async def _complete(server: ModelServer, chat: ChatRequest, prompt: Prompt) -> dict:
    """The chat.completion for a parsed request (faults applied)."""
    with server.requests.lock:
        server.requests.images.append(hashlib.sha256(prompt.image).hexdigest())
        number = len(server.requests.images)
        fault = server.faults.pick(number)
        if fault:
            server.requests.faults[fault] = server.requests.faults.get(fault, 0) + 1
    if fault == "rate_limit":
        raise ErrorReply(429, "rate limit reached", "rate_limit_exceeded", kind="requests",
                         headers={"Retry-After": f"{server.faults.retry_after_s:g}"})
    if fault == "error":
        raise ErrorReply(500, "injected server error", "server_error", kind="server_error")
    if fault == "slow":
        await asyncio.sleep(server.faults.slow_s)
    logits = None if fault == "malformed" else await run_in_threadpool(server.logits, prompt.image)
    choices = _choices(server, chat, logits)
    completion_tokens = sum(text_tokens(choice["message"]["content"]) for choice in choices)
    server.throughput.add(prompt.prompt_tokens, completion_tokens)
    return {
        "id": f"chatcmpl-{number}", "object": "chat.completion", "created": int(time.time()),
        "model": server.served_name, "system_fingerprint": f"rgb-{server.served_name}", "choices": choices,
        "usage": {"prompt_tokens": prompt.prompt_tokens, "completion_tokens": completion_tokens,
                  "total_tokens": prompt.prompt_tokens + completion_tokens},
    }
