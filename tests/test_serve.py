"""rgb-serve's faults (issue 33): every request gets an answer in the OpenAI error shape (a body that is not an
object, an `image_url` of the older string form or of no form, a malformed or huge Content-Length), 64 requests at
once are all answered, and `python -m rgb.serve` is the `rgb-serve` command. The served model is a two-class
module on 8x8 images: no training, no benchmark."""

import base64
import io
import json
import os
import socket
import subprocess
import sys
import threading

import httpx
import pytest
import torch
from PIL import Image

from helpers import REPO
from rgb.serve import ModelServer

NAME = "tiny"
TIMEOUT = 20  # seconds a request may take here (a dropped connection ends sooner, as an error)


class Brightness(torch.nn.Module):
    """Class 1 ("bright") when the image's mean is above 1/2."""

    def forward(self, x):
        mean = x.mean((1, 2, 3))
        return torch.stack([0.5 - mean, mean - 0.5], 1)


def png(value: int) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (8, 8), (value, value, value)).save(out, format="PNG")
    return out.getvalue()


def data_url(value: int) -> str:
    return "data:image/png;base64," + base64.b64encode(png(value)).decode()


def chat(image_url) -> dict:
    content = [{"type": "text", "text": "Which class?"}, {"type": "image_url", "image_url": image_url}]
    return {"model": NAME, "messages": [{"role": "user", "content": content}], "temperature": 0}


@pytest.fixture(scope="module")
def server():
    served = ModelServer(Brightness(), ["dark", "bright"], 8, NAME)
    thread = threading.Thread(target=served.serve_forever, daemon=True)
    thread.start()
    yield served
    served.shutdown()
    served.server_close()
    thread.join(timeout=10)


def post(server, body) -> httpx.Response:
    return httpx.post(f"{server.base_url}/chat/completions", json=body, timeout=TIMEOUT)


def error_of(reply: httpx.Response, status: int) -> dict:
    assert reply.status_code == status, reply.text
    error = reply.json()["error"]
    assert set(error) == {"message", "type", "code"} and "\n" not in error["message"]
    return error


def raw_request(server, head: bytes) -> bytes:
    """Send `head` (request line and headers, no body) on a fresh connection; what comes back before the server
    closes it or TIMEOUT passes."""
    host, port = server.server_address[:2]
    with socket.create_connection((host, port), timeout=TIMEOUT) as conn:
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
            if b"\r\n\r\n" in received and b"}}" in received:  # the whole error answer
                break
        return received


def head_with_length(length: str) -> bytes:
    return (f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {length}\r\n\r\n").encode()


def test_a_chat_request_is_answered_with_the_class(server):
    reply = post(server, chat({"url": data_url(250)}))
    assert reply.status_code == 200 and reply.json()["choices"][0]["message"]["content"] == "bright"


def test_an_image_url_given_as_a_string_is_the_url(server):
    """The older OpenAI form: `"image_url": "data:..."`."""
    reply = post(server, chat(data_url(5)))
    assert reply.status_code == 200 and reply.json()["choices"][0]["message"]["content"] == "dark"


@pytest.mark.parametrize("body", [[chat({"url": data_url(250)})], "just a string", None, 42])
def test_a_body_that_is_not_a_json_object_is_a_400(server, body):
    reply = httpx.post(f"{server.base_url}/chat/completions", content=json.dumps(body).encode(), timeout=TIMEOUT)
    assert error_of(reply, 400)["code"] == "invalid_request_body"


@pytest.mark.parametrize("body", [
    chat(7),                                      # image_url neither an object nor a string
    chat({"url": 7}),                             # a url that is not a string
    chat(["data:image/png;base64,"]),
    {"model": NAME, "messages": 5},               # messages not a list
    {"model": NAME, "messages": [{"role": "user", "content": [7, None, "text"]}]},
])
def test_a_malformed_image_part_is_a_400(server, body):
    assert error_of(post(server, body), 400)["code"] == "image_not_supported"


@pytest.mark.parametrize("length", ["abc", "-5", "1e3", "12, 12", "0x10"])
def test_a_malformed_content_length_is_a_400(server, length):
    answer = raw_request(server, head_with_length(length))
    assert answer.startswith(b"HTTP/1.1 400 ") and b'"code": "invalid_content_length"' in answer


def test_a_body_over_the_limit_is_a_413_without_reading_it(server):
    """A declared length of 1 TB, and no body sent: the answer comes at once (nothing is read or allocated)."""
    answer = raw_request(server, head_with_length(str(10**12)))
    assert answer.startswith(b"HTTP/1.1 413 ") and b'"code": "request_too_large"' in answer


def test_64_simultaneous_requests_are_all_answered(server):
    start = threading.Barrier(64, timeout=TIMEOUT)
    replies: list = [None] * 64

    def one(i: int) -> None:
        with httpx.Client(timeout=TIMEOUT) as client:
            start.wait()
            try:
                replies[i] = client.post(f"{server.base_url}/chat/completions", json=chat({"url": data_url(i)})).status_code
            except httpx.HTTPError as err:
                replies[i] = type(err).__name__

    threads = [threading.Thread(target=one, args=(i,)) for i in range(64)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=3 * TIMEOUT)
    assert replies == [200] * 64


@pytest.mark.slow
def test_python_m_rgb_serve_is_the_rgb_serve_command(tmp_path):
    """`python -m rgb.serve` runs rgb-serve's main: without run= it says so in one line and fails."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-m", "rgb.serve", f"paths.root_dir={tmp_path}"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "error: no model given: pass run=" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
