"""`rgb-serve run=DIR port=8000`: any rgb model (timm, openclip zero-shot, factory) behind an OpenAI-compatible
`POST /v1/chat/completions` that answers with a class name, so a local model and an API model are compared on
identical terms (an `api` run pointed at it scores what evaluate.py scores of the model directly).

The image is read from the request's PNG data URL and decoded exactly as the benchmark loader decodes a split.
For the tests it can misbehave on purpose (`faults`: 429 with Retry-After, 500, slow answers, malformed answers).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import logging
import re
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import torch

from rgb.core.errors import UserError
from rgb.data.benchmark import decode_image, to_tensor
from rgb.models import load_with_meta

log = logging.getLogger(__name__)
DATA_URL_PREFIX = "data:image/png;base64,"
# A body declared longer is refused (413) unread: a benchmark image is a few hundred KiB as a data URL, and a
# declared length is never allocated before it is checked.
MAX_BODY_BYTES = 32 * 2**20


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


@dataclass
class ServerLog:
    """What the server was asked (sha256 of each image, in order) and which faults it served."""

    images: list[str] = field(default_factory=list)
    faults: dict[str, int] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def count(self) -> int:
        with self.lock:
            return len(self.images)


class ServeError(UserError, ValueError):
    """A model or setting rgb-serve cannot serve (one line)."""


class ModelServer(ThreadingHTTPServer):
    daemon_threads = True
    # The listen backlog (socketserver's default is 5): connections beyond it are dropped or reset, so a client with
    # more requests in flight than that (max_concurrency=64) would see failures instead of queued requests.
    request_queue_size = 1024

    def __init__(self, model, class_names: list[str], image_size: int, served_name: str, host: str = "127.0.0.1",
                 port: int = 0, faults: Faults | None = None, api_key: str | None = None, device: str = "cpu"):
        super().__init__((host, port), _Handler)
        self.model, self.class_names, self.image_size = model.to(device).eval(), class_names, image_size
        self.served_name, self.faults, self.api_key, self.device = served_name, faults or Faults(), api_key, device
        self.requests = ServerLog()
        self._model_lock = threading.Lock()

    @property
    def base_url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host}:{port}/v1"

    def classify(self, png: bytes) -> str:
        """The class name the model predicts for a stored image, decoded as rgb.data.ImageSplit decodes it."""
        x = to_tensor(decode_image({"bytes": png}, self.image_size))[None].to(self.device)
        with self._model_lock, torch.inference_mode():
            return self.class_names[int(self.model(x).argmax(1))]


def make_server(run: str | Path, host: str = "127.0.0.1", port: int = 0, served_name: str | None = None,
                faults: Faults | None = None, api_key: str | None = None, device: str = "cpu",
                image_size: int | None = None) -> ModelServer:
    """A server for the model of a run dir (not started: call serve_forever, e.g. in a thread)."""
    model, meta = load_with_meta(run)
    if not isinstance(model, torch.nn.Module):
        raise ServeError(f"{run} holds a model of family {meta.get('family')!r}: rgb-serve serves models it runs itself")
    size = image_size or meta.get("image_size")
    if not size or not meta.get("class_names"):
        raise ServeError(f"{run}/model.json names no image_size or class_names: pass image_size= (and export the "
                         f"model with its class names)")
    return ModelServer(model, list(meta["class_names"]), int(size), served_name or Path(run).name, host, port,
                       faults, api_key, device)


def _url_of(part) -> str:
    """The URL of a content part's `image_url`: `{"url": ...}`, or the URL itself (the older OpenAI form)."""
    image_url = part.get("image_url") if isinstance(part, dict) else None
    if isinstance(image_url, dict):
        image_url = image_url.get("url")
    return image_url if isinstance(image_url, str) else ""


def _png_of(body: dict) -> bytes | None:
    """The PNG bytes of the (first) image_url of the last user message, or None (also for parts of no known form)."""
    messages = body.get("messages")
    for message in reversed(messages if isinstance(messages, list) else []):
        content = message.get("content") if isinstance(message, dict) else None
        for part in content if isinstance(content, list) else []:
            url = _url_of(part)
            if url.startswith(DATA_URL_PREFIX):
                try:
                    return base64.b64decode(url[len(DATA_URL_PREFIX):], validate=True)
                except (binascii.Error, ValueError):
                    return None
    return None


class _Handler(BaseHTTPRequestHandler):
    server: ModelServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format, *args):  # noqa: A002 (the base class's name): requests are logged at debug
        log.debug("%s " + format, self.address_string(), *args)

    def _send(self, status: int, payload: dict | bytes, headers: dict | None = None) -> None:
        data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    def _error(self, status: int, message: str, code: str, headers: dict | None = None) -> None:
        self._send(status, {"error": {"message": message, "type": "invalid_request_error", "code": code}}, headers)

    def do_GET(self):  # noqa: N802 (http.server's naming)
        if self.path.rstrip("/") == "/v1/models":
            self._send(200, {"object": "list", "data": [{"id": self.server.served_name, "object": "model"}]})
        else:
            self._error(404, f"no route {self.path}", "not_found")

    def _read_body(self) -> bytes | None:
        """The request body; None once a malformed length (400) or one over MAX_BODY_BYTES (413) was answered.
        Such a body is left unread, so that answer closes the connection."""
        declared = self.headers.get("Content-Length", "0").strip()
        if not re.fullmatch(r"[0-9]+", declared):
            self._error(400, f"malformed Content-Length {declared[:40]!r}", "invalid_content_length",
                        {"Connection": "close"})
            return None
        if int(declared) > MAX_BODY_BYTES:
            self._error(413, f"the body ({declared} bytes) is over the limit of {MAX_BODY_BYTES} bytes",
                        "request_too_large", {"Connection": "close"})
            return None
        return self.rfile.read(int(declared))

    def do_POST(self):  # noqa: N802
        raw = self._read_body()
        if raw is None:
            return None
        if self.path.rstrip("/") != "/v1/chat/completions":
            return self._error(404, f"no route {self.path}", "not_found")
        server = self.server
        if server.api_key and self.headers.get("Authorization") != f"Bearer {server.api_key}":
            return self._error(401, "invalid API key", "invalid_api_key")
        try:
            body = json.loads(raw)
        except ValueError:
            return self._error(400, "the body is not JSON", "invalid_json")
        if not isinstance(body, dict):
            return self._error(400, "the body must be a JSON object", "invalid_request_body")
        if body.get("model") != server.served_name:
            return self._error(404, f"the model {body.get('model')!r} does not exist (served: "
                                    f"{server.served_name!r})", "model_not_found")
        png = _png_of(body)
        if png is None:
            return self._error(400, "image not supported: send one PNG as a data:image/png;base64 URL",
                               "image_not_supported")
        with server.requests.lock:
            server.requests.images.append(hashlib.sha256(png).hexdigest())
            number = len(server.requests.images)
            fault = server.faults.pick(number)
            if fault:
                server.requests.faults[fault] = server.requests.faults.get(fault, 0) + 1
        if fault == "rate_limit":
            return self._error(429, "rate limit reached", "rate_limit_exceeded",
                               {"Retry-After": f"{server.faults.retry_after_s:g}"})
        if fault == "error":
            return self._error(500, "injected server error", "server_error")
        if fault == "slow":
            time.sleep(server.faults.slow_s)
        try:
            answer = "I cannot tell from this image." if fault == "malformed" else server.classify(png)
        except Exception as err:  # PIL's errors for bytes that are no image: the client's problem, said as 400
            return self._error(400, f"image not supported: {type(err).__name__}", "image_not_supported")
        self._send(200, {
            "id": f"chatcmpl-{number}", "object": "chat.completion", "created": int(time.time()),
            "model": server.served_name,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": answer}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": len(raw) // 4, "completion_tokens": 1, "total_tokens": len(raw) // 4 + 1},
        })


if __name__ == "__main__":  # `python -m rgb.serve`: the rgb-serve command
    from rgb.commands.main import serve_main

    serve_main()
