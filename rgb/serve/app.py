"""`rgb-serve run=DIR port=8000`: any rgb model (timm, openclip zero-shot, factory) behind an OpenAI-compatible
endpoint (FastAPI on uvicorn) that answers with a class name, so a local model and an API model are compared on
identical terms (an `api` run pointed at it scores what evaluate.py scores of the model directly).

The server and its routes; what it is asked (`ServeRequest`) is rgb.serve.request, the chat-completions protocol
(what a client gets and where it differs from OpenAI's) rgb.serve.protocol, its operation (limits, faults, logs,
metrics) rgb.serve.operations, the Files and Batches endpoints rgb.serve.batch.

- `POST /v1/chat/completions`, `GET /v1/models` and `/v1/models/{id}`, the Batch API (`/v1/files`, `/v1/batches`:
  a JSONL of chat-completions requests run in the background through the same handler, its files in `batch_dir`).
- For operators, none needing the key: `GET /health` is 200 once the model is loaded (it is before the socket
  answers, as launch scripts and k8s probes poll it); `GET /metrics` is Prometheus's text format
  (rgb.serve.operations.Metrics); `GET /version` is rgb's version, as vLLM's. Every GET route answers HEAD too
  (its headers, no body), and every reply carries an `x-request-id`.
- For the tests it can misbehave on purpose (`faults`: 429 with Retry-After, 500, slow answers, malformed answers).
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import socket
import threading
import time
from pathlib import Path

import torch
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

import rgb
from rgb.data.benchmark import decode_image, to_tensor
from rgb.endpoints.cost import text_tokens
from rgb.models import family_of_record, load_with_meta
from rgb.serve.batch import BatchRoutes, BatchStore
from rgb.serve.operations import AccessLog, Metrics, Queue, ServerLog, Throughput, misbehave
from rgb.serve.protocol import (
    ChatRequest,
    ErrorReply,
    Prompt,
    choices,
    chunks,
    enum_choice,
    parse_request,
    read_body,
    read_prompt,
)
from rgb.serve.request import ServeError, ServeRequest

log = logging.getLogger(__name__)
SHUTDOWN_WAIT_S = 30


def _listening_socket(host: str, port: int) -> socket.socket:
    """A TCP socket listening on host:port, made with proto IPPROTO_TCP: asyncio sets TCP_NODELAY only on
    connections accepted from such a socket (socket.create_server's proto 0 left Nagle on, and every answer
    waited ~40 ms for the client's delayed ACK)."""
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



class ModelServer:
    """The model behind the endpoint, on a socket bound at construction (so `base_url` is known at once);
    `serve_forever` runs uvicorn until `shutdown` (from another thread, or Ctrl-C in the main one)."""

    def __init__(self, model: torch.nn.Module, class_names: list[str], request: ServeRequest):
        """Serve `model` (its classes named by `class_names`) as `request` says.

        Args:
            model: A module mapping [0,1] images to logits over `class_names`.
            class_names: The class names, in the model's output order: the answers.
            request: How to serve it; its `image_size` and `served_name` must be set (`make_server` reads them
                from the run) and its `run` is not read.

        Raises:
            ServeError: The request names no image_size or served_name, or its host and port cannot be listened on.
        """
        if request.image_size is None or request.served_name is None:
            raise ServeError("a ModelServer needs its request's image_size and served_name (make_server reads them "
                             "from the run)")
        self.request, self.started = request, int(time.time())  # `created` of /v1/models
        self.model, self.class_names = model.to(request.device).eval(), class_names
        self.requests = ServerLog()
        self.queue = Queue(request.limits, self.requests)
        self.throughput, self.metrics = Throughput(), Metrics(self.requests)
        self.batches = BatchStore(request.batch_dir)  # the Files and Batches endpoints' files (None: a temp dir)
        self._model_lock = threading.Lock()
        self.socket = _listening_socket(request.host, request.port)
        self.server_address: tuple[str, int] = self.socket.getsockname()[:2]  # still known once it is closed
        self.app = build_app(self)
        # log_config=None: the caller's logging stays as it is; uvicorn's access log is off (AccessLog's has tokens)
        config = uvicorn.Config(AccessLog(self.app, self.metrics), log_config=None, access_log=False,
                                lifespan="off", timeout_graceful_shutdown=5)
        self._uvicorn = uvicorn.Server(config)
        self._stopped = threading.Event()

    @property
    def served_name(self) -> str:
        return self.request.served_name

    @property
    def base_url(self) -> str:
        host, port = self.server_address
        return f"http://{host}:{port}/v1"

    def serve_forever(self) -> None:
        if self.request.log_interval_s:
            threading.Thread(target=self._report_throughput, name="rgb-serve-throughput", daemon=True).start()
        try:
            self._uvicorn.run(sockets=[self.socket])
        finally:
            self._stopped.set()

    def _report_throughput(self) -> None:
        while not self._stopped.wait(self.request.log_interval_s):
            with self.requests.lock:
                active, waiting = self.requests.active, self.requests.waiting
            line = self.throughput.report(active, waiting)
            if line:
                log.info("%s", line)

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
        x = to_tensor(decode_image({"bytes": image}, self.request.image_size))[None].to(self.request.device)
        with self._model_lock, torch.inference_mode():
            return self.model(x)[0].float().cpu()

    def classify(self, image: bytes) -> str:
        return self.class_names[int(self.logits(image).argmax())]



def make_server(request: ServeRequest) -> ModelServer:
    """A server for the model of `request.run` (not started: call serve_forever, e.g. in a thread).

    Args:
        request: What to serve and how; its image_size and served_name default to the run's model.json
            image_size and the run's name.

    Returns:
        The server, its socket bound (`base_url` is known), its model loaded.

    Raises:
        ServeError: The request names no run, or a model rgb-serve cannot run itself (an API model), or one whose
            model.json has no image size or class names; or the port cannot be listened on.
    """
    if request.run is None:
        raise ServeError("make_server serves a run: pass ServeRequest(run=<train output dir or .safetensors file>)")
    model, meta = load_with_meta(request.run)
    if not isinstance(model, torch.nn.Module):
        raise ServeError(f"{request.run} holds a model of family {family_of_record(meta).name!r}: rgb-serve serves models it "
                         f"runs itself")
    size = request.image_size or meta.get("image_size")
    if not size or not meta.get("class_names"):
        raise ServeError(f"{request.run}/model.json names no image_size or class_names: pass image_size= (and export "
                         f"the model with its class names)")
    request = dataclasses.replace(request, image_size=int(size),
                                  served_name=request.served_name or Path(request.run).name)
    return ModelServer(model, list(meta["class_names"]), request)


def build_app(server: ModelServer) -> FastAPI:
    """The OpenAI-shaped routes of `server`: /v1/models (and /v1/models/{id}), /v1/chat/completions, the Files
    and Batches endpoints (rgb.serve.batch); /health, /metrics and /version; HEAD on every GET route."""
    app = FastAPI(title="rgb-serve", docs_url=None, redoc_url=None, openapi_url=None)

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
        if server.request.api_key and request.headers.get("authorization") != f"Bearer {server.request.api_key}":
            raise ErrorReply(401, "invalid API key", "invalid_api_key")

    def model_entry() -> dict:
        return {"id": server.served_name, "object": "model", "created": server.started, "owned_by": "rgb"}

    @app.get("/health")
    async def health() -> dict:
        """200 once the model is loaded, which it is before the server answers anything (no key needed)."""
        return {"status": "ok", "model": server.served_name}

    @app.get("/metrics")
    async def metrics() -> Response:
        """The server's Prometheus metrics (no key needed, as vLLM's: scrapers carry none)."""
        body, content_type = server.metrics.exposition()
        return Response(body, media_type=content_type)

    @app.get("/version")
    async def version() -> dict:
        """rgb's version (vLLM's /version)."""
        return {"version": rgb.__version__}

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
        enum_choice(server.class_names, chat)  # a response format it cannot honour is refused before the model is asked
        async with server.queue.turn():
            return chat, await _complete(server, chat, prompt)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        authorize(request)
        chat, completion = await complete_chat(await read_body(request))
        request.scope["rgb.usage"].update(
            {key: completion["usage"][key] for key in ("prompt_tokens", "completion_tokens")})
        if chat.stream:
            include_usage = bool(chat.stream_options and chat.stream_options.include_usage)
            return StreamingResponse(chunks(completion, include_usage), media_type="text/event-stream")
        return completion

    BatchRoutes(server.batches, authorize, complete_chat, ErrorReply).add_to(app)
    for route in app.routes:  # HEAD: the GET's status and headers, no body (uvicorn sends none for HEAD)
        if "GET" in getattr(route, "methods", ()):
            route.methods.add("HEAD")
    return app



async def _complete(server: ModelServer, chat: ChatRequest, prompt: Prompt) -> dict:
    """The chat.completion for a parsed request (faults applied)."""
    number, fault = server.requests.record(hashlib.sha256(prompt.image).hexdigest(), server.request.faults)
    await misbehave(server.request.faults, fault)
    logits = None if fault == "malformed" else await run_in_threadpool(server.logits, prompt.image)
    made = choices(server.class_names, chat, logits)
    completion_tokens = sum(text_tokens(choice["message"]["content"]) for choice in made)
    server.throughput.add(prompt.prompt_tokens, completion_tokens)
    server.metrics.completed(prompt.prompt_tokens, completion_tokens)
    return {
        "id": f"chatcmpl-{number}", "object": "chat.completion", "created": int(time.time()),
        "model": server.served_name, "system_fingerprint": f"rgb-{server.served_name}", "choices": made,
        "usage": {"prompt_tokens": prompt.prompt_tokens, "completion_tokens": completion_tokens,
                  "total_tokens": prompt.prompt_tokens + completion_tokens},
    }
