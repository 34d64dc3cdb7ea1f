"""rgb-serve's side of OpenAI's chat-completions protocol: a request's body read and checked (`parse_request`,
`read_prompt`), the answer's choices made from the model's logits (`choices`), streamed as OpenAI streams them
(`chunks`), and every refusal in OpenAI's error shape (`ErrorReply`). No server here: rgb.serve.app routes to it.

What a client of OpenAI's chat-completions API gets, and where it differs:
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
"""

from __future__ import annotations

import base64
import binascii
import io
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

import torch
from fastapi import Request
from fastapi.responses import JSONResponse
from PIL import Image, UnidentifiedImageError
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.requests import ClientDisconnect

from rgb.endpoints.cost import image_tokens, text_tokens

# A body declared longer is refused (413) unread: a benchmark image is a few hundred KiB as a data URL.
MAX_BODY_BYTES = 32 * 2**20
IMAGE_FORMATS = {"image/png": "PNG", "image/jpeg": "JPEG", "image/jpg": "JPEG", "image/webp": "WEBP"}
DATA_URL = re.compile(r"data:(?P<mime>[\w/+.-]+);base64,(?P<data>.*)", re.DOTALL)
MALFORMED_ANSWER = "I cannot tell from this image."


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
    """A chat-completions body checked against the request's schema and what a classifier can honour."""
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


def _logprob_entry(name: str, logprob: float) -> dict:
    return {"token": name, "logprob": logprob, "bytes": list(name.encode())}


def enum_choice(class_names: list[str], request: ChatRequest) -> tuple[str, list[bool]] | None:
    """A json_schema response format's enum property and which classes it allows (None: a free-text answer)."""
    answer_format = request.response_format or {}
    if answer_format.get("type") != "json_schema":
        return None
    schema = (answer_format.get("json_schema") or {}).get("schema") or {}
    properties = schema.get("properties") if isinstance(schema, dict) else None
    found = [(k, v["enum"]) for k, v in (properties or {}).items() if isinstance(v, dict) and "enum" in v]
    allowed = [name in found[0][1] for name in class_names] if len(found) == 1 else []
    if not any(allowed):
        raise ErrorReply(400, "rgb-serve answers a json_schema response format with one property whose enum names "
                              "served classes", "invalid_value", "response_format")
    return found[0][0], allowed


def choices(class_names: list[str], request: ChatRequest, logits: torch.Tensor | None) -> list[dict]:
    """The n choices: the argmax, or samples at the request's temperature, among the classes a response format's
    enum allows (as JSON then); None logits: the malformed fault."""
    n, limit = request.n or 1, request.max_completion_tokens or request.max_tokens
    enum = enum_choice(class_names, request)
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
    made = []
    for index, label in enumerate(picked):
        content = MALFORMED_ANSWER if label is None else class_names[label]
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
            entry["top_logprobs"] = [_logprob_entry(class_names[int(i)], float(v))
                                     for v, i in zip(top.values, top.indices)]
            choice["logprobs"] = {"content": [entry], "refusal": None}
        made.append(choice)
    return made


def chunks(completion: dict, include_usage: bool) -> Iterator[str]:
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


async def read_body(request: Request) -> bytes:
    """The request's body, refused (413) once over MAX_BODY_BYTES, declared or sent."""
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
