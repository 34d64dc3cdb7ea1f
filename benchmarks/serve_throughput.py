"""rgb-serve throughput with the official `openai` client: requests/s, sync (threads sharing one `OpenAI`) vs
async (`AsyncOpenAI`, gathered), at 1 and 8 requests in flight, plain and streamed.

The server runs in its own process (spawned, 127.0.0.1, a free port), so the client's and the server's Python do
not share a GIL. It serves the benchmarks' tiny MLP (rgb.models.toy.train_mlp, 10 classes, 8x8 images): the forward
costs microseconds, so the numbers are what the HTTP layer, JSON, the data-URL decode and the SDK cost per request,
the ceiling rgb-serve puts on any model. Writes JSON (default benchmarks/results/serve_throughput_cpu.json) with
the machine's load before and after.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import io
import json
import multiprocessing
import os
import platform
import threading
import time
from pathlib import Path

import openai
from PIL import Image

from rgb.models.toy import separable_data, train_mlp

RESULTS = Path(__file__).resolve().parent / "results"
NAME = "toy_mlp"
CLASSES = [str(i) for i in range(10)]


def serve(port_out) -> None:
    """The server process: the tiny MLP behind rgb-serve until killed."""
    from rgb.serve import Limits, ModelServer, ServeRequest

    request = ServeRequest(image_size=8, served_name=NAME, limits=Limits(max_concurrency=8))
    server = ModelServer(train_mlp(), CLASSES, request)
    port_out.put(server.server_address[1])
    server.serve_forever()


def data_urls(count: int) -> list[str]:
    x, _ = separable_data(count, seed=1)
    urls = []
    for image in x:
        out = io.BytesIO()
        Image.fromarray((image.permute(1, 2, 0) * 255).round().byte().numpy()).save(out, format="PNG")
        urls.append("data:image/png;base64," + base64.b64encode(out.getvalue()).decode())
    return urls


def request(url: str, stream: bool) -> dict:
    content = [{"type": "text", "text": "Which class?"}, {"type": "image_url", "image_url": {"url": url}}]
    return {"model": NAME, "messages": [{"role": "user", "content": content}], "temperature": 0, "stream": stream}


def run_sync(base_url: str, urls: list[str], in_flight: int, stream: bool) -> tuple[float, int]:
    """Seconds for all requests from `in_flight` threads sharing one client; answers received."""
    client = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=60)
    answers, lock = [], threading.Lock()
    chunks = [urls[i::in_flight] for i in range(in_flight)]

    def worker(mine: list[str]) -> None:
        for url in mine:
            reply = client.chat.completions.create(**request(url, stream))
            text = "".join(c.choices[0].delta.content or "" for c in reply if c.choices) if stream else \
                reply.choices[0].message.content
            with lock:
                answers.append(text)

    threads = [threading.Thread(target=worker, args=(chunk,)) for chunk in chunks]
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    seconds = time.perf_counter() - start
    client.close()
    return seconds, len(answers)


def run_async(base_url: str, urls: list[str], in_flight: int, stream: bool) -> tuple[float, int]:
    async def main() -> tuple[float, int]:
        async with openai.AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=60) as client:
            turns = asyncio.Semaphore(in_flight)

            async def one(url: str) -> str:
                async with turns:
                    reply = await client.chat.completions.create(**request(url, stream))
                    if stream:
                        return "".join([c.choices[0].delta.content or "" async for c in reply if c.choices])
                    return reply.choices[0].message.content

            start = time.perf_counter()
            answers = await asyncio.gather(*(one(url) for url in urls))
            return time.perf_counter() - start, len(answers)

    return asyncio.run(main())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=400, help="requests per measurement")
    parser.add_argument("--out", type=Path, default=RESULTS / "serve_throughput_cpu.json")
    args = parser.parse_args()
    load_before = os.getloadavg()
    context = multiprocessing.get_context("spawn")
    port_out = context.Queue()
    server = context.Process(target=serve, args=(port_out,), daemon=True)
    server.start()
    try:
        base_url = f"http://127.0.0.1:{port_out.get(timeout=120)}/v1"
        urls = data_urls(args.requests)
        run_sync(base_url, urls[:20], 1, False)  # warm up both sides
        rows = []
        for client, runner in (("sync", run_sync), ("async", run_async)):
            for stream in (False, True):
                for in_flight in (1, 8):
                    seconds, answered = runner(base_url, urls, in_flight, stream)
                    rows.append({"client": client, "stream": stream, "in_flight": in_flight,
                                 "requests": answered, "seconds": round(seconds, 3),
                                 "requests_per_s": round(answered / seconds, 1)})
                    print(rows[-1])
    finally:
        server.kill()
        server.join(10)
    result = {
        "benchmark": "serve_throughput", "served": f"{NAME} (rgb.models.toy.train_mlp) via rgb-serve, "
                                                    f"FastAPI on uvicorn, max_concurrency 8",
        "client": f"openai {openai.__version__}", "runs": rows,
        "machine": {"platform": platform.platform(), "cpu_count": os.cpu_count(), "load_avg_before": load_before,
                    "load_avg_after": os.getloadavg(), "shared": True},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
