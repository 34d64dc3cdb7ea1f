"""rgb-serve (rgb/serve/, FastAPI on uvicorn) as a drop-in OpenAI endpoint, driven by the official `openai`
client, sync and async, streaming and not: the class answer, `n`, `logprobs`, usage by its stated rule, PNG/JPEG/
WebP data URLs, `/v1/models`; every malformed body (sent with httpx, which the SDK would never produce) answered
with a 400 in OpenAI's error shape while the server keeps serving; the concurrency limit; the Files and Batches
endpoints (a JSONL run in the background into OpenAI's output and error files, a broken input failing the batch,
a cancel); `python -m rgb.serve` is the `rgb-serve` command; for operators, /metrics read by prometheus_client's own
parser, /version, HEAD on every GET route and an x-request-id on every reply. The served model is a two-class
module on 8x8 images: no training, no benchmark. Each server runs in a thread of this process on 127.0.0.1 (port 0:
a free one)."""

import asyncio
import base64
import io
import json
import logging
import os
import re
import socket
import subprocess
import sys
import threading
import time

import httpx
import openai
import pytest
import torch
from PIL import Image

from helpers import REPO, compose_config, raises_one_line, serving
from rgb.endpoints.answers import choice_format
from rgb.endpoints.cost import image_tokens, text_tokens
from rgb.serve import Faults, Limits, ModelServer, ServeError, ServeRequest
from rgb.serve.operations import Throughput
from rgb.serve.batch import BatchStore, BatchStoreError

NAME = "tiny"
CLASSES = ["dark", "bright"]
TIMEOUT = 20  # seconds a request may take here (a dropped connection ends sooner, as an error)
QUESTION = "Which class?"


class Brightness(torch.nn.Module):
    """Class 1 ("bright") when the image's mean is above 1/2; the logits are mean - 1/2 and its negative."""

    def forward(self, x):
        mean = x.mean((1, 2, 3))
        return torch.stack([0.5 - mean, mean - 0.5], 1)


class GatedBrightness(Brightness):
    """Brightness whose forward waits for `gate` (bounded), so a test holds a request inside the server."""

    def __init__(self):
        super().__init__()
        self.gate = threading.Event()

    def forward(self, x):
        self.gate.wait(TIMEOUT)
        return super().forward(x)


def image_bytes(value: int, fmt: str = "PNG", size: int = 8) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (size, size), (value, value, value)).save(out, format=fmt)
    return out.getvalue()


def data_url(value: int, fmt: str = "PNG", mime: str = "image/png") -> str:
    return f"data:{mime};base64," + base64.b64encode(image_bytes(value, fmt)).decode()


def messages(image_url) -> list[dict]:
    content = [{"type": "text", "text": QUESTION}, {"type": "image_url", "image_url": image_url}]
    return [{"role": "user", "content": content}]


def chat(image_url) -> dict:
    return {"model": NAME, "messages": messages(image_url), "temperature": 0}


def served(**settings) -> ServeRequest:
    """The request of the tests' servers: 8x8 images, served as NAME on a free port of 127.0.0.1, `settings` on top."""
    return ServeRequest(image_size=8, served_name=NAME, **settings)


def running(model: torch.nn.Module, **settings):
    """A ModelServer of `model` serving in a thread until the block ends."""
    return serving(ModelServer(model, CLASSES, served(**settings)), TIMEOUT)


@pytest.fixture(scope="module")
def server():
    with running(Brightness()) as served:
        yield served


@pytest.fixture
def client(server):
    with openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=TIMEOUT) as sdk:
        yield sdk


def post(server, body) -> httpx.Response:
    return httpx.post(f"{server.base_url}/chat/completions", json=body, timeout=TIMEOUT)


def error_of(reply: httpx.Response, status: int) -> dict:
    """The OpenAI-shaped error of a reply, checked for its status and its four fields."""
    assert reply.status_code == status, reply.text
    error = reply.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and "\n" not in error["message"]
    assert error["type"] == "invalid_request_error"
    return error


def still_serving(server) -> None:
    reply = post(server, chat({"url": data_url(250)}))
    assert reply.status_code == 200 and reply.json()["choices"][0]["message"]["content"] == "bright"


def wait_until(condition, what: str) -> None:
    """Poll `condition` (bounded: TIMEOUT seconds) until it holds."""
    deadline = time.monotonic() + TIMEOUT
    while not condition():
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.01)


def access_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "rgb.serve.access"]


# -- the usage rule --------------------------------------------------------------------------------------------

def test_the_token_rule_is_openais_rule_of_thumb_and_tile_count():
    assert [text_tokens(t) for t in ("", "a", "abcd", "abcde")] == [0, 1, 1, 2]
    assert image_tokens(8, 8) == 85 + 170  # small: one tile, never upscaled
    assert image_tokens(1024, 1024) == 85 + 170 * 4  # shorter side to 768: 2x2 tiles (OpenAI's example)
    assert image_tokens(2048, 4096) == 85 + 170 * 6  # fit into 2048, shorter side to 768: 768x1536, 2x3 tiles
    assert image_tokens(4096, 4096, "low") == 85


# -- the official client ---------------------------------------------------------------------------------------

def test_the_sdk_gets_the_class_n_choices_and_the_usage(client):
    reply = client.chat.completions.create(model=NAME, messages=messages({"url": data_url(250)}), n=3)
    assert [c.message.content for c in reply.choices] == ["bright"] * 3  # no temperature: the prediction each time
    assert [c.index for c in reply.choices] == [0, 1, 2] and {c.finish_reason for c in reply.choices} == {"stop"}
    prompt = text_tokens(QUESTION) + image_tokens(8, 8)
    assert reply.usage.prompt_tokens == prompt and reply.usage.completion_tokens == 3 * text_tokens("bright")
    assert reply.usage.total_tokens == prompt + 3 * text_tokens("bright") and reply.model == NAME


def test_a_json_schema_enum_is_answered_with_a_json_object_naming_one_of_its_classes(client, server):
    """model.answer_format=choice's request (rgb.endpoints.answers.choice_format) as the SDK sends it: the answer is
    the object asked for, the class chosen among the enum's only; an enum naming no served class is a 400."""
    reply = client.chat.completions.create(model=NAME, messages=messages({"url": data_url(250)}),
                                           response_format=choice_format(CLASSES))
    assert json.loads(reply.choices[0].message.content) == {"answer": "bright"}
    dark_only = client.chat.completions.create(model=NAME, messages=messages({"url": data_url(250)}), n=2,
                                               temperature=1.5, seed=0, response_format=choice_format(["dark"]),
                                               logprobs=True, top_logprobs=2)
    assert [json.loads(c.message.content) for c in dark_only.choices] == [{"answer": "dark"}] * 2
    assert [t.token for t in dark_only.choices[0].logprobs.content[0].top_logprobs] == ["dark"]
    before = server.requests.count()
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model=NAME, messages=messages({"url": data_url(250)}),
                                       response_format=choice_format(["cat", "dog"]))
    assert refused.value.body["param"] == "response_format" and server.requests.count() == before


def test_usage_counts_every_text_and_image_of_the_request(client):
    system = "You label images with one of: dark, bright."
    big = Image.new("RGB", (1024, 1024), (9, 9, 9))
    out = io.BytesIO()
    big.save(out, format="PNG")
    big_url = "data:image/png;base64," + base64.b64encode(out.getvalue()).decode()
    content = [{"type": "text", "text": QUESTION}, {"type": "image_url", "image_url": {"url": big_url}},
               {"type": "image_url", "image_url": {"url": data_url(250), "detail": "low"}}]
    reply = client.chat.completions.create(model=NAME, messages=[{"role": "system", "content": system},
                                                                 {"role": "user", "content": content}])
    assert reply.choices[0].message.content == "dark"  # the first image of the last message with one
    assert reply.usage.prompt_tokens == text_tokens(system) + text_tokens(QUESTION) + image_tokens(1024, 1024) + 85


def test_logprobs_are_the_log_softmax_of_the_models_logits(client):
    reply = client.chat.completions.create(model=NAME, messages=messages({"url": data_url(200)}), logprobs=True,
                                           top_logprobs=2)
    expected = torch.log_softmax(Brightness()(torch.full((1, 3, 8, 8), 200 / 255)).double(), 1)[0]
    answer = reply.choices[0].logprobs.content[0]
    assert answer.token == "bright" and answer.logprob == pytest.approx(float(expected[1]), abs=1e-6)
    assert [(t.token, round(t.logprob, 6)) for t in answer.top_logprobs] == [
        ("bright", round(float(expected[1]), 6)), ("dark", round(float(expected[0]), 6))]
    plain = client.chat.completions.create(model=NAME, messages=messages({"url": data_url(200)}))
    assert plain.choices[0].logprobs is None


def test_a_temperature_samples_the_softmax_reproducibly_by_seed(client):
    """At mid-grey the two classes are about equally likely: 32 samples show both; the same seed the same ones."""
    def sample(seed: int) -> list[str]:
        reply = client.chat.completions.create(model=NAME, messages=messages({"url": data_url(128)}), n=32,
                                               temperature=2.0, seed=seed)
        return [c.message.content for c in reply.choices]

    first = sample(7)
    assert first == sample(7) and set(first) == set(CLASSES)


def test_max_tokens_below_the_answer_cuts_it_with_finish_reason_length(client):
    reply = client.chat.completions.create(model=NAME, messages=messages({"url": data_url(250)}), max_tokens=1)
    assert reply.choices[0].finish_reason == "length" and reply.choices[0].message.content == "brig"


def test_max_completion_tokens_cuts_the_answer_as_max_tokens_does(client):
    reply = client.chat.completions.create(model=NAME, messages=messages({"url": data_url(250)}), n=2,
                                           max_completion_tokens=1)
    assert [(c.message.content, c.finish_reason) for c in reply.choices] == [("brig", "length")] * 2
    assert reply.usage.completion_tokens == 2 * text_tokens("brig")
    whole = client.chat.completions.create(model=NAME, messages=messages({"url": data_url(250)}),
                                           max_completion_tokens=2)
    assert (whole.choices[0].message.content, whole.choices[0].finish_reason) == ("bright", "stop")


TOOL = {"type": "function", "function": {"name": "label", "parameters": {"type": "object", "properties": {}}}}


@pytest.mark.parametrize(("asked", "param", "code"), [
    ({"tools": [TOOL]}, "tools", "unsupported_parameter"),
    ({"tools": [TOOL], "tool_choice": "required"}, "tools", "unsupported_parameter"),
    ({"tool_choice": {"type": "function", "function": {"name": "label"}}}, "tool_choice", "unsupported_parameter"),
    ({"logit_bias": {"42": 10}}, "logit_bias", "unsupported_parameter"),
    ({"functions": [TOOL["function"]]}, "functions", "unsupported_parameter"),
    ({"response_format": {"type": "json_object"}}, "response_format.type", "unsupported_value"),
])
def test_what_a_classifier_cannot_honour_is_an_openai_400_not_ignored(client, server, asked, param, code):
    before = server.requests.count()
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model=NAME, messages=messages({"url": data_url(250)}), **asked)
    error = refused.value.body
    assert (error["type"], error["param"], error["code"]) == ("invalid_request_error", param, code)
    assert set(error) == {"message", "type", "param", "code"} and server.requests.count() == before


def test_fields_that_change_nothing_for_a_classifier_are_accepted(client):
    reply = client.chat.completions.create(model=NAME, messages=messages({"url": data_url(250)}), tool_choice="none",
                                           presence_penalty=0.5, stop=["\n"], user="u1",
                                           response_format={"type": "text"})
    assert reply.choices[0].message.content == "bright"


def test_streaming_gives_chunks_the_sdk_reads_then_the_usage(client):
    stream = client.chat.completions.create(model=NAME, messages=messages({"url": data_url(250)}), stream=True,
                                            n=2, stream_options={"include_usage": True})
    chunks = list(stream)
    text = {0: "", 1: ""}
    finish = {}
    for chunk in chunks[:-1]:
        for choice in chunk.choices:
            text[choice.index] += choice.delta.content or ""
            if choice.finish_reason:
                finish[choice.index] = choice.finish_reason
    assert text == {0: "bright", 1: "bright"} and finish == {0: "stop", 1: "stop"}
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 2 * text_tokens("bright")
    assert {c.object for c in chunks} == {"chat.completion.chunk"}


def test_the_async_client_streaming_and_not(server):
    async def both() -> tuple[list[str], str]:
        async with openai.AsyncOpenAI(base_url=server.base_url, api_key="unused", max_retries=0,
                                      timeout=TIMEOUT) as sdk:
            replies = await asyncio.gather(*(sdk.chat.completions.create(
                model=NAME, messages=messages({"url": data_url(v)})) for v in (10, 250, 20, 240)))
            stream = await sdk.chat.completions.create(model=NAME, messages=messages({"url": data_url(5)}),
                                                       stream=True)
            streamed = "".join([chunk.choices[0].delta.content or "" async for chunk in stream if chunk.choices])
        return [r.choices[0].message.content for r in replies], streamed

    answers, streamed = asyncio.run(both())
    assert answers == ["dark", "bright", "dark", "bright"] and streamed == "dark"


@pytest.mark.parametrize(("fmt", "mime"), [("PNG", "image/png"), ("JPEG", "image/jpeg"), ("WEBP", "image/webp")])
def test_png_jpeg_and_webp_data_urls_are_read(client, fmt, mime):
    for value, name in ((240, "bright"), (15, "dark")):
        reply = client.chat.completions.create(model=NAME, messages=messages({"url": data_url(value, fmt, mime)}))
        assert reply.choices[0].message.content == name


def test_models_lists_and_retrieves_the_served_model(client):
    assert [m.id for m in client.models.list()] == [NAME]
    assert client.models.retrieve(NAME).id == NAME
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-4o")


def test_models_created_is_the_servers_start_time(server, client):
    assert client.models.list().data[0].created == client.models.retrieve(NAME).created == server.started > 0


def test_health_is_200_without_the_key_for_probes():
    with running(Brightness(), api_key="sk-serve") as secured:
        reply = httpx.get(secured.base_url.removesuffix("/v1") + "/health", timeout=TIMEOUT)
        assert reply.status_code == 200 and reply.json() == {"status": "ok", "model": NAME}
        assert httpx.get(f"{secured.base_url}/models", timeout=TIMEOUT).status_code == 401


def test_each_request_gets_an_access_line_and_a_busy_interval_a_throughput_line(caplog):
    with caplog.at_level(logging.INFO, logger="rgb.serve"), running(Brightness(), log_interval_s=0.05) as served:
        with openai.OpenAI(base_url=served.base_url, api_key="unused", max_retries=0, timeout=TIMEOUT) as sdk:
            reply = sdk.chat.completions.create(model=NAME, messages=messages({"url": data_url(250)}))
            with pytest.raises(openai.NotFoundError):
                sdk.models.retrieve("other")
        wait_until(lambda: any(r.getMessage().startswith("throughput:") for r in caplog.records), "a throughput line")
        wait_until(lambda: len(access_lines(caplog)) >= 2, "two access lines")
    access = access_lines(caplog)
    usage = reply.usage
    assert re.fullmatch(r'127\.0\.0\.1:\d+ "POST /v1/chat/completions" 200 [\d.]+ ms '
                        f"prompt_tokens={usage.prompt_tokens} completion_tokens={usage.completion_tokens} "
                        f"request_id={reply._request_id}", access[0])
    assert re.fullmatch(r'127\.0\.0\.1:\d+ "GET /v1/models/other" 404 [\d.]+ ms request_id=[0-9a-f]{32}', access[1])
    line = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("throughput:"))
    assert re.fullmatch(r"throughput: [\d.]+ requests/s, prompt [\d.]+ tokens/s, generation [\d.]+ tokens/s, "
                        r"running \d+, waiting \d+ \(last [\d.]+ s\)", line)


def test_throughput_is_the_rates_since_the_last_report_and_nothing_when_idle():
    now = [100.0]
    throughput = Throughput(clock=lambda: now[0])
    throughput.add(255, 2)
    throughput.add(255, 1)
    now[0] = 102.0
    assert throughput.report(1, 0) == ("throughput: 1.00 requests/s, prompt 255.0 tokens/s, generation 1.5 tokens/s, "
                                       "running 1, waiting 0 (last 2.0 s)")
    now[0] = 104.0
    assert throughput.report(0, 0) is None


def test_another_model_name_is_a_404_model_not_found(client):
    with pytest.raises(openai.NotFoundError) as caught:
        client.chat.completions.create(model="gpt-4o", messages=messages({"url": data_url(250)}))
    assert caught.value.code == "model_not_found" and caught.value.param == "model"


def test_a_wrong_key_is_a_401():
    with running(Brightness(), api_key="right-key") as served:
        with openai.OpenAI(base_url=served.base_url, api_key="wrong", max_retries=0, timeout=TIMEOUT) as sdk:
            with pytest.raises(openai.AuthenticationError):
                sdk.chat.completions.create(model=NAME, messages=messages({"url": data_url(250)}))
        with openai.OpenAI(base_url=served.base_url, api_key="right-key", max_retries=0, timeout=TIMEOUT) as sdk:
            reply = sdk.chat.completions.create(model=NAME, messages=messages({"url": data_url(250)}))
        assert reply.choices[0].message.content == "bright"


# -- malformed bodies: each a 400 in OpenAI's shape, and the server keeps serving ------------------------------

@pytest.mark.parametrize("body", [[chat({"url": data_url(250)})], "just a string", None, 42])
def test_a_body_that_is_not_a_json_object_is_a_400(server, body):
    reply = httpx.post(f"{server.base_url}/chat/completions", content=json.dumps(body).encode(), timeout=TIMEOUT)
    assert error_of(reply, 400)["code"] == "invalid_request_body"
    still_serving(server)


def test_a_body_that_is_not_json_is_a_400(server):
    reply = httpx.post(f"{server.base_url}/chat/completions", content=b"{not json", timeout=TIMEOUT)
    assert error_of(reply, 400)["code"] == "invalid_json"
    still_serving(server)


@pytest.mark.parametrize(("body", "param", "code"), [
    (chat(data_url(250)), "messages[0].content[1].image_url", "invalid_type"),  # a string image_url
    (chat(7), "messages[0].content[1].image_url", "invalid_type"),
    (chat({"url": 7}), "messages[0].content[1].image_url", "invalid_type"),
    (chat({"url": data_url(250), "detail": "max"}), "messages[0].content[1].image_url.detail", "invalid_value"),
    ({"model": NAME, "messages": [{"role": "user", "content": [7, None, "text"]}]}, "messages[0].content[0]",
     "invalid_type"),
    ({"model": NAME, "messages": [{"role": "user", "content": 5}]}, "messages[0].content", "invalid_type"),
    ({"model": NAME, "messages": 5}, "messages", "invalid_value"),
    ({"model": NAME, "messages": []}, "messages", "invalid_value"),
    ({"model": NAME}, "messages", "missing_required_parameter"),
    ({"messages": messages({"url": data_url(250)})}, "model", "missing_required_parameter"),
    ({"model": NAME, "messages": [{"role": "robot", "content": "hi"}]}, "messages[0].role", "invalid_value"),
    ({"model": NAME, "messages": [{"role": "user", "content": QUESTION}]}, "messages", "image_missing"),
    ({**chat({"url": data_url(250)}), "n": 0}, "n", "invalid_value"),
    ({**chat({"url": data_url(250)}), "top_logprobs": 2}, "top_logprobs", "invalid_value"),
    (chat({"url": "https://example.com/cat.png"}), "messages[0].content[1].image_url.url", "image_url_not_supported"),
    (chat({"url": data_url(250, "GIF", "image/gif")}), "messages[0].content[1].image_url.url", "image_not_supported"),
    (chat({"url": "data:image/png;base64,bm90IGFuIGltYWdl"}), "messages[0].content[1].image_url.url",
     "image_not_supported"),
    (chat({"url": "data:image/png;base64,%%%"}), "messages[0].content[1].image_url.url", "image_not_supported"),
])
def test_a_malformed_request_is_a_400_naming_the_parameter(server, body, param, code):
    error = error_of(post(server, body), 400)
    assert (error["param"], error["code"]) == (param, code)
    still_serving(server)


def raw_request(server, head: bytes) -> bytes:
    """Send `head` (request line and headers, no body) on a fresh connection; what comes back before the server
    closes it or TIMEOUT passes."""
    with socket.create_connection(server.server_address, timeout=TIMEOUT) as conn:
        conn.sendall(head)
        received = b""
        while True:
            try:
                chunk = conn.recv(65536)
            except (TimeoutError, ConnectionResetError):
                break
            if not chunk:
                break
            received += chunk
        return received


def head_with_length(length: str) -> bytes:
    return (f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {length}\r\n\r\n").encode()


@pytest.mark.parametrize("length", ["abc", "-5", "1e3", "12, 13", "0x10"])
def test_a_malformed_content_length_is_a_400(server, length):
    """uvicorn's HTTP parser answers these before the app sees them (a plain 400, then the connection closes).
    ("12, 12" is no longer among them: RFC 9110 reads repeated equal values as one length, as h11 does.)"""
    assert raw_request(server, head_with_length(length)).startswith(b"HTTP/1.1 400 ")
    still_serving(server)


def test_a_body_over_the_limit_is_a_413_without_reading_it(server):
    """A declared length of 1 TB, and no body sent: the answer comes at once (nothing is read or allocated)."""
    answer = raw_request(server, head_with_length(str(10**12)))
    assert answer.startswith(b"HTTP/1.1 413 ") and b'"code":"request_too_large"' in answer
    still_serving(server)


# -- concurrency -----------------------------------------------------------------------------------------------

def test_64_simultaneous_requests_are_all_answered(server):
    """64 at once against max_concurrency 8: the rest wait their turn in the queue."""
    start = threading.Barrier(64, timeout=TIMEOUT)
    replies: list = [None] * 64

    def one(i: int) -> None:
        with httpx.Client(timeout=TIMEOUT) as http:
            start.wait()
            try:
                replies[i] = http.post(f"{server.base_url}/chat/completions", json=chat({"url": data_url(i)})).status_code
            except httpx.HTTPError as err:
                replies[i] = type(err).__name__

    threads = [threading.Thread(target=one, args=(i,)) for i in range(64)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=3 * TIMEOUT)
    assert replies == [200] * 64


def test_beyond_the_concurrency_limit_and_the_queue_a_request_is_a_429():
    """max_concurrency 1, max_queue 1: one request held inside the model, one waiting, the third refused."""
    model = GatedBrightness()
    with running(model, limits=Limits(max_concurrency=1, max_queue=1)) as served:
        replies: dict = {}

        def send(key: str, value: int) -> None:
            replies[key] = post(served, chat({"url": data_url(value)}))

        first = threading.Thread(target=send, args=("first", 250))
        first.start()
        wait_until(lambda: served.requests.active == 1, "the first request is being worked on")
        second = threading.Thread(target=send, args=("second", 5))
        second.start()
        wait_until(lambda: served.requests.waiting == 1, "the second request waits its turn")
        refused = post(served, chat({"url": data_url(250)}))
        model.gate.set()
        first.join(TIMEOUT)
        second.join(TIMEOUT)
    assert refused.status_code == 429 and refused.headers["retry-after"] == "1"
    assert refused.json()["error"]["code"] == "rate_limit_exceeded"
    assert [replies[k].json()["choices"][0]["message"]["content"] for k in ("first", "second")] == ["bright", "dark"]


def test_limits_are_checked():
    with raises_one_line(ServeError, r"limits.max_concurrency must be an integer >= 1, got 0"):
        Limits(max_concurrency=0)
    with raises_one_line(ServeError, r"faults.slow_s must be a finite number >= 0, got -1"):
        served(faults={"slow_s": -1})


# -- the command -----------------------------------------------------------------------------------------------

@pytest.mark.slow
def test_python_m_rgb_serve_is_the_rgb_serve_command(tmp_path):
    """`python -m rgb.serve` runs rgb-serve's main: without run= it says so in one line and fails."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-m", "rgb.serve", f"paths.root_dir={tmp_path}"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "error: no model given: pass run=" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_a_port_in_use_is_one_line_naming_it(server):
    port = server.socket.getsockname()[1]
    with raises_one_line(ServeError, f"cannot listen on host=127.0.0.1 port={port}: .*in use.*port=0"):
        ModelServer(Brightness(), CLASSES, served(port=port))


@pytest.mark.parametrize("port", [70000, -1, "eighty"])
def test_a_port_out_of_range_is_one_line_before_the_model_loads(port, tmp_path):
    import rgb.commands.serve as serve_command

    cfg = compose_config("serve", f"run={tmp_path / 'no-run'}", f"paths.root_dir={tmp_path}", f"port={port}")
    with raises_one_line(ServeError, r"port must be an integer from 0 \(any free one\) to 65535, got"):
        serve_command.serve_from_config(cfg)


def test_the_listening_socket_is_tcp_so_answers_go_out_without_nagle(server):
    """asyncio sets TCP_NODELAY only on connections accepted from a socket whose proto is IPPROTO_TCP; with
    socket.create_server's proto 0 every answer waited ~40 ms for the client's delayed ACK."""
    assert server.socket.proto == socket.IPPROTO_TCP


def test_without_the_serve_extra_the_command_names_the_pip_line(monkeypatch, tmp_path):
    """FastAPI or uvicorn missing (a base install): one line with the extra to install, before any model loads."""
    import rgb.commands.serve as serve_command

    monkeypatch.setattr(serve_command, "find_spec", lambda name: None if name == "uvicorn" else object())
    cfg = compose_config("serve", f"run={tmp_path / 'no-run'}", f"paths.root_dir={tmp_path}")
    with raises_one_line(serve_command.ServeExtraMissing, r"pip install 'robustgenbench\[serve\]'"):
        serve_command.serve_from_config(cfg)


# -- the Files and Batches endpoints (rgb/serve/batch.py) ---------------------------------------------------

POLL_S = 0.05


def jsonl(lines: list[dict]) -> io.BytesIO:
    out = io.BytesIO("".join(json.dumps(line) + "\n" for line in lines).encode())
    out.name = "input.jsonl"
    return out


def request_line(custom_id: str, value: int) -> dict:
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions",
            "body": chat({"url": data_url(value)})}


def finished(client: openai.OpenAI, batch_id: str):
    """The batch once it is no longer validating or running (bounded: TIMEOUT seconds)."""
    deadline = time.monotonic() + TIMEOUT
    while True:
        batch = client.batches.retrieve(batch_id)
        if batch.status in ("completed", "failed", "cancelled", "expired"):
            return batch
        assert time.monotonic() < deadline, f"batch still {batch.status}"
        time.sleep(POLL_S)


def lines_of(client: openai.OpenAI, file_id: str | None) -> list[dict]:
    return [] if file_id is None else [json.loads(x) for x in client.files.content(file_id).text.splitlines()]


@pytest.fixture
def sdk_of():
    opened = []

    def make(server) -> openai.OpenAI:
        opened.append(openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=TIMEOUT))
        return opened[-1]

    yield make
    for client in opened:
        client.close()


@pytest.mark.slow
def test_a_batch_answers_each_line_as_the_chat_route_does_and_failed_lines_go_to_the_error_file(sdk_of, tmp_path):
    # every 3rd request an injected 500: a line of the error file, never of the output
    with running(Brightness(), faults=Faults(error_every=3), batch_dir=tmp_path) as server:
        client = sdk_of(server)
        values = [10, 250, 30, 240, 50, 200, 5]
        uploaded = client.files.create(file=jsonl([request_line(f"r{i}", v) for i, v in enumerate(values)]),
                                       purpose="batch")
        assert (uploaded.object, uploaded.purpose, uploaded.status) == ("file", "batch", "processed")
        assert client.files.retrieve(uploaded.id).bytes == uploaded.bytes == (tmp_path / uploaded.id).stat().st_size
        created = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions",
                                        completion_window="24h")
        assert created.status in ("validating", "in_progress", "completed")
        batch = finished(client, created.id)
        assert batch.status == "completed" and batch.completed_at is not None
        output, errors = lines_of(client, batch.output_file_id), lines_of(client, batch.error_file_id)
        counts = batch.request_counts
        assert (counts.total, counts.completed, counts.failed) == (7, len(output), len(errors)) == (7, 5, 2)
        assert {line["custom_id"] for line in output + errors} == {f"r{i}" for i in range(7)}
        for line in output:
            body = line["response"]["body"]
            expected = "bright" if values[int(line["custom_id"][1:])] > 127 else "dark"
            assert line["response"]["status_code"] == 200 and line["error"] is None
            assert openai.types.chat.ChatCompletion.model_validate(body).choices[0].message.content == expected
        for line in errors:
            assert line["response"]["status_code"] == 500
            assert line["response"]["body"]["error"]["code"] == "server_error"
        assert server.requests.count() == 7  # each line asked once, through the chat handler


@pytest.mark.slow
def test_a_broken_input_fails_the_batch_and_unknown_ids_are_openai_404s(sdk_of, tmp_path):
    with running(Brightness(), batch_dir=tmp_path) as server:
        client = sdk_of(server)
        broken = [request_line("a", 10), {"custom_id": "b", "method": "GET", "url": "/v1/models", "body": {}},
                  request_line("a", 20)]
        uploaded = client.files.create(file=jsonl(broken), purpose="batch")
        batch = finished(client, client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions",
                                                       completion_window="24h").id)
        assert batch.status == "failed" and [e.line for e in batch.errors.data] == [2, 3]
        assert server.requests.count() == 0
        with pytest.raises(openai.NotFoundError):
            client.batches.retrieve("batch_nothing")
        with pytest.raises(openai.NotFoundError):
            client.files.content("file-nothing")
        with pytest.raises(openai.BadRequestError):
            client.batches.create(input_file_id=uploaded.id, endpoint="/v1/embeddings", completion_window="24h")
        with pytest.raises(openai.BadRequestError, match="purpose"):
            client.files.create(file=jsonl([request_line("a", 10)]), purpose="fine-tune")
        assert error_of(httpx.post(f"{server.base_url}/files", json={"purpose": "batch"}, timeout=TIMEOUT),
                        400)["param"] == "file"  # no multipart body: OpenAI's error shape, not FastAPI's 422


@pytest.mark.slow
def test_a_cancelled_batch_ends_cancelled_with_what_it_answered(sdk_of, tmp_path):
    model = GatedBrightness()  # holds the first requests inside the server until the batch is cancelled
    with running(model, batch_dir=tmp_path) as server:
        client = sdk_of(server)
        uploaded = client.files.create(file=jsonl([request_line(f"r{i}", 250) for i in range(40)]), purpose="batch")
        created = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions",
                                        completion_window="24h")
        assert client.batches.cancel(created.id).status == "cancelling"
        model.gate.set()
        batch = finished(client, created.id)
        assert batch.status == "cancelled" and batch.request_counts.completed < 40
        assert len(lines_of(client, batch.output_file_id)) == batch.request_counts.completed


def test_files_and_batches_are_listed_in_openais_pages_and_a_file_is_deleted(sdk_of, tmp_path):
    """The SDK's cursor pagers walk every page (`after` = the last id while `has_more`), newest first;
    DELETE /v1/files/{id} removes the object and its content."""
    with running(Brightness(), batch_dir=tmp_path) as server:
        client = sdk_of(server)
        uploaded = [client.files.create(file=jsonl([request_line(f"r{i}", 250)]), purpose="batch") for i in range(3)]
        first = client.files.list(limit=2)
        assert len(first.data) == 2 and first.has_more and first.last_id == first.data[-1].id
        newest_first = sorted(uploaded, key=lambda f: (f.created_at, f.id), reverse=True)
        assert [f.id for f in client.files.list(limit=2)] == [f.id for f in newest_first]  # both pages
        assert [f.id for f in client.files.list(limit=1, order="asc")] == [f.id for f in newest_first[::-1]]
        assert list(client.files.list(purpose="batch_output")) == []
        batches = [client.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions",
                                         completion_window="24h") for f in uploaded[:2]]
        listed = [b.id for b in client.batches.list(limit=1)]
        assert sorted(listed) == sorted(b.id for b in batches) and len(listed) == 2
        page = client.batches.list(limit=1)
        assert page.has_more and page.first_id == page.last_id == page.data[0].id
        deleted = client.files.delete(uploaded[2].id)
        assert (deleted.id, deleted.deleted) == (uploaded[2].id, True) and not (tmp_path / uploaded[2].id).exists()
        with pytest.raises(openai.NotFoundError):
            client.files.retrieve(uploaded[2].id)
        with pytest.raises(openai.NotFoundError):
            client.files.delete(uploaded[2].id)
        with pytest.raises(openai.BadRequestError, match="limit"):
            client.batches.list(limit=101)
        for batch in batches:
            finished(client, batch.id)


def test_a_restarted_server_on_the_same_batch_dir_lists_and_retrieves_earlier_batches(sdk_of, tmp_path):
    with running(Brightness(), batch_dir=tmp_path) as server:
        client = sdk_of(server)
        uploaded = client.files.create(file=jsonl([request_line("r0", 250), request_line("r1", 10)]),
                                       purpose="batch")
        batch = finished(client, client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions",
                                                       completion_window="24h").id)
        output = client.files.content(batch.output_file_id).text
    with running(Brightness(), batch_dir=tmp_path) as restarted:
        client = sdk_of(restarted)
        assert [b.id for b in client.batches.list()] == [batch.id]
        assert client.batches.retrieve(batch.id) == batch
        assert client.files.content(batch.output_file_id).text == output
        assert {f.id for f in client.files.list()} == {uploaded.id, batch.output_file_id}


def test_a_batch_running_when_the_server_stopped_is_failed_on_restart(tmp_path):
    store = BatchStore(tmp_path)
    running_batch = {"id": "batch_1", "object": "batch", "status": "in_progress", "created_at": 1}
    store.add_batch(running_batch)
    restarted = BatchStore(tmp_path).batches["batch_1"]
    assert restarted["status"] == "failed" and restarted["errors"]["data"][0]["code"] == "server_restarted"
    (tmp_path / "notes.json").write_text("[1, 2]")
    with raises_one_line(BatchStoreError, "notes.json"):
        BatchStore(tmp_path)


# -- for operators: /metrics, /version, HEAD, x-request-id -----------------------------------------------------

def metrics_of(server) -> dict:
    """/metrics read by Prometheus's own parser: {family name: {(sample name, sorted labels): value}}."""
    from prometheus_client.parser import text_string_to_metric_families

    reply = httpx.get(server.base_url.removesuffix("/v1") + "/metrics", timeout=TIMEOUT)
    assert reply.status_code == 200 and reply.headers["content-type"].startswith("text/plain; version=")
    return {family.name: {(s.name, tuple(sorted(s.labels.items()))): s.value for s in family.samples}
            for family in text_string_to_metric_families(reply.text)}


def test_metrics_count_requests_errors_latency_and_tokens_for_prometheus():
    with running(Brightness()) as served:
        with openai.OpenAI(base_url=served.base_url, api_key="unused", max_retries=0, timeout=TIMEOUT) as sdk:
            reply = sdk.chat.completions.create(model=NAME, messages=messages({"url": data_url(250)}))
            with pytest.raises(openai.NotFoundError):
                sdk.models.retrieve("other")
        found = metrics_of(served)
    chat_route = (("method", "POST"), ("route", "/v1/chat/completions"), ("status", "200"))
    model_route = (("method", "GET"), ("route", "/v1/models/{model_id:path}"), ("status", "404"))
    assert found["rgb_serve_requests"][("rgb_serve_requests_total", chat_route)] == 1
    assert found["rgb_serve_requests"][("rgb_serve_requests_total", model_route)] == 1
    assert found["rgb_serve_request_errors"] == {("rgb_serve_request_errors_total", model_route): 1}
    latency = found["rgb_serve_request_duration_seconds"]
    assert latency[("rgb_serve_request_duration_seconds_count", chat_route[:2])] == 1
    assert latency[("rgb_serve_request_duration_seconds_sum", chat_route[:2])] > 0
    assert found["rgb_serve_prompt_tokens"] == {("rgb_serve_prompt_tokens_total", ()): reply.usage.prompt_tokens}
    assert found["rgb_serve_generation_tokens"] == {
        ("rgb_serve_generation_tokens_total", ()): reply.usage.completion_tokens}
    assert found["rgb_serve_completions"] == {("rgb_serve_completions_total", ()): 1}


def test_metrics_give_the_queue_depth_and_the_requests_running():
    """max_concurrency 1: one request held inside the model, two waiting in line: the gauges say 1 and 2."""
    model = GatedBrightness()
    with running(model, limits=Limits(max_concurrency=1)) as served:
        assert metrics_of(served)["rgb_serve_requests_waiting"] == {("rgb_serve_requests_waiting", ()): 0}
        sent = [threading.Thread(target=post, args=(served, chat({"url": data_url(250)}))) for _ in range(3)]
        for thread in sent:
            thread.start()
        wait_until(lambda: (served.requests.active, served.requests.waiting) == (1, 2), "one running, two waiting")
        found = metrics_of(served)
        model.gate.set()
        for thread in sent:
            thread.join(TIMEOUT)
    assert found["rgb_serve_requests_waiting"] == {("rgb_serve_requests_waiting", ()): 2}
    assert found["rgb_serve_requests_running"] == {("rgb_serve_requests_running", ()): 1}


def test_version_is_rgbs_version(server):
    import rgb

    reply = httpx.get(server.base_url.removesuffix("/v1") + "/version", timeout=TIMEOUT)
    assert reply.status_code == 200 and reply.json() == {"version": rgb.__version__}


def test_every_get_route_answers_head_with_its_headers_and_no_body(sdk_of, tmp_path):
    with running(Brightness(), batch_dir=tmp_path) as served:
        sdk = sdk_of(served)
        uploaded = sdk.files.create(file=jsonl([request_line("a", 250)]), purpose="batch")
        batch = sdk.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions",
                                   completion_window="24h")
        root = served.base_url.removesuffix("/v1")
        paths = {"/health": "/health", "/metrics": "/metrics", "/version": "/version", "/v1/models": "/v1/models",
                 "/v1/models/{model_id:path}": f"/v1/models/{NAME}", "/v1/files": "/v1/files",
                 "/v1/files/{file_id}": f"/v1/files/{uploaded.id}",
                 "/v1/files/{file_id}/content": f"/v1/files/{uploaded.id}/content", "/v1/batches": "/v1/batches",
                 "/v1/batches/{batch_id}": f"/v1/batches/{batch.id}"}
        assert {route.path for route in served.app.routes if "GET" in route.methods} == set(paths)
        for path in paths.values():
            got, head = httpx.get(root + path, timeout=TIMEOUT), httpx.head(root + path, timeout=TIMEOUT)
            assert (head.status_code, head.content) == (got.status_code, b"") and got.status_code == 200, path
            if path != "/metrics":  # a scrape counts itself: the next one is longer
                same = ("content-type", "content-length")
                assert [head.headers.get(h) for h in same] == [got.headers.get(h) for h in same], path
        length = len(httpx.get(root + "/health", timeout=TIMEOUT).content)
        on_the_wire = raw_request(served, b"HEAD /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    headers, body = on_the_wire.split(b"\r\n\r\n", 1)  # what came before the server closed the connection
    assert headers.startswith(b"HTTP/1.1 200") and f"content-length: {length}".encode() in headers and body == b""


def test_every_reply_carries_an_x_request_id_the_clients_own_when_given(client, server, caplog):
    with caplog.at_level(logging.INFO, logger="rgb.serve.access"):
        raw = client.chat.completions.with_raw_response.create(
            model=NAME, messages=messages({"url": data_url(250)}), extra_headers={"x-request-id": "job-7:line-3"})
        fresh = client.chat.completions.create(model=NAME, messages=messages({"url": data_url(250)}))
        with pytest.raises(openai.NotFoundError) as refused:
            client.models.retrieve("other")
        # the server thread logs a request after its reply has gone: wait for the third line while the capture is
        # still at INFO (leaving at_level drops a line logged after it)
        wait_until(lambda: len(access_lines(caplog)) >= 3, "three access lines")
    access = access_lines(caplog)
    assert raw.headers["x-request-id"] == raw.parse()._request_id == "job-7:line-3"
    assert re.fullmatch("[0-9a-f]{32}", fresh._request_id) and re.fullmatch("[0-9a-f]{32}", refused.value.request_id)
    assert fresh._request_id != refused.value.request_id
    assert [line.rsplit(" request_id=", 1)[1] for line in access] == [
        "job-7:line-3", fresh._request_id, refused.value.request_id]
    for unsafe in ("two words", "x" * 200):  # not echoed into a header and a log line: a fresh one instead
        reply = httpx.get(server.base_url + "/models", headers={"x-request-id": unsafe}, timeout=TIMEOUT)
        assert re.fullmatch("[0-9a-f]{32}", reply.headers["x-request-id"])


def test_a_serve_request_is_conf_serve_yaml_by_field_name(tmp_path, monkeypatch):
    """Every field of ServeRequest but the key itself is a key of conf/serve.yaml, made into the request by name
    (sections too), and its rules are the command's schema."""
    import rgb.commands.serve as serve_command
    from rgb.commands import schema
    from rgb.core.values import ConfigValueError

    monkeypatch.setenv("RGB_SERVE_TEST_KEY", "sk-local")
    run = tmp_path / "run"
    run.mkdir()
    cfg = compose_config("serve", f"run={run}", f"paths.root_dir={tmp_path}", "port=8123", "limits.max_queue=3",
                         "faults.error_every=2", "api_key_env=RGB_SERVE_TEST_KEY", "served_name=tiny")
    request = serve_command.serve_request(cfg)
    assert set(ServeRequest.names()) - {"api_key"} <= set(cfg)
    assert (request.run, request.port, request.served_name, request.api_key) == (str(run), 8123, "tiny", "sk-local")
    assert request.limits == Limits(max_queue=3) and request.faults == Faults(error_every=2)
    assert "sk-local" not in repr(request)
    bad = compose_config("serve", f"run={run}", f"paths.root_dir={tmp_path}", "limits.max_queue=-1")
    with raises_one_line(ConfigValueError, r"limits.max_queue must be an integer >= 0, got -1"):
        schema.check("serve", bad)


@pytest.mark.parametrize("argv", [["--port", "8000"], ["run=x", "--port=8000"]])
def test_a_dashed_option_is_one_line_naming_the_override(argv, monkeypatch, capsys):
    """`rgb-serve --port 8000` (argparse's way) is one line naming port=8000, not Hydra's lexer error."""
    from rgb.commands.main import serve_main

    monkeypatch.setattr(sys, "argv", ["rgb-serve", *argv])
    with pytest.raises(SystemExit) as stopped:
        serve_main()
    line = str(stopped.value.code)
    assert "\n" not in line and re.fullmatch(r"rgb-serve: error: '--port[ =]8000' is not an option: .*port=8000", line)
