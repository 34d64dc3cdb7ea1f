"""The online path of a chat-completions requester (rgb.endpoints.requester): the distinct uncached images of a
split asked one request each, `max_concurrency` at a time, under the rate limits and the budget's caps; each answer
enters the cache as it arrives. Its twin is the Batch path (rgb.endpoints.batch): the same requests, the same
cache records.

A request holds a bound of its tokens and cost in the budget until its usage is known. An answer cut by the token
limit (whatever its text) is asked once more with `retry_max_tokens` (when set); one still cut is not an answer: left
unanswered (the split PARTIAL) and asked again by the next run. An answer naming no class is followed by one
clarifying turn when the requester asks for it (`model.clarify=true`); a clarification cut by the limit leaves the
image unanswered the same way. An endpoint refusing the response format is asked in text.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import FIRST_COMPLETED, FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from typing import NamedTuple

from tqdm import tqdm

from rgb.core.values import ConfigValueError
from rgb.endpoints.cache import AnswerCache
from rgb.endpoints.client import FormatRefused, Hold, RateLimiter, RequestBudget, RequestStats
from rgb.endpoints.cost import combined
from rgb.endpoints.requester import Requester

log = logging.getLogger(__name__)


class Request(NamedTuple):
    """The first request of a key: its image, body and estimated (prompt, completion) tokens."""

    key: str
    image: bytes
    body: dict
    prompt_tokens: int
    completion_tokens: int


class OnlineRun:
    """One split's online requests: each distinct uncached key asked once (`ask`: its first request, asked again
    in text, after a cut, or to clarify as the requester says), what it cost (`stats`, under `lock`, shared by the
    threads of the pool) and the progress bar."""

    def __init__(self, model: Requester, images: Sequence[bytes], keys: list[str], cache: AnswerCache,
                 budget: RequestBudget, desc: str, sleep=time.sleep):
        self.model, self.images, self.cache, self.budget, self.desc = model, images, cache, budget, desc
        self.uses = Counter(keys)
        self.first_image: dict[str, int] = {}
        for i, k in enumerate(keys):
            self.first_image.setdefault(k, i)
        if budget.caps_usage and model.completion_limit() is None:
            raise ConfigValueError("max_tokens_total and max_cost bound each request by the completion limit it "
                                   "sends: set model.max_tokens (or max_completion_tokens in model.request)")
        self.stats, self.lock = RequestStats(images=len(images)), threading.Lock()
        settings = model.client_settings
        self.limiter = RateLimiter(settings.requests_per_minute, settings.tokens_per_minute, sleep=sleep)
        self.cached = sum(n for k, n in self.uses.items() if k in cache)
        self.unparsed_count = sum(n for k, n in self.uses.items() if k in cache and model.unparsed(cache.get(k)))
        self.started = time.monotonic()
        self.bar = None

    def reserve(self, prompt_tokens: int, completion_tokens: int) -> Hold | None:
        """The budget's hold of one request (None: a cap reached, said once per evaluation)."""
        with self.lock:
            first = self.budget.stopped_by is None
            held = self.budget.reserve(prompt_tokens, completion_tokens)
            if held is None and first:
                log.warning("%s: %s reached, no new request (the answers so far are cached; re-run to continue)",
                            self.desc, self.budget.stopped_by)
        return held

    def send(self, sdk, body: dict, held: Hold) -> dict:
        """One request, its hold settled with what it was billed (nothing when it failed)."""
        try:
            reply = self.model.endpoint.ask(sdk, self.limiter, body, self.stats, self.lock)
        except BaseException:
            with self.lock:
                self.budget.settle(held, None)
            raise
        with self.lock:
            self.stats.requests += 1
            self.stats.prompt_tokens += reply["usage"]["prompt_tokens"]
            self.stats.completion_tokens += reply["usage"]["completion_tokens"]
            self.budget.settle(held, reply["billed"])
        return reply

    def request(self, key: str) -> Request:
        """The first request of a key: its image's body and estimate."""
        image = self.images[self.first_image[key]]
        return Request(key, image, self.model.body(image), *self.model.estimate(image))

    def ask(self, sdk, request: Request, held: Hold) -> None:
        """The answer of one key into the cache: its first request (held), asked again once when cut
        (`retry_max_tokens`, its own hold)."""
        key = request.key
        asked = self.first_reply(sdk, request, held)
        if asked is None:
            return
        request, reply = asked
        if self.model.cut(reply):
            reply = self.ask_again(sdk, request, reply)
        if self.model.cut(reply):  # not an answer: left unanswered (PARTIAL), asked again by the next run
            with self.lock:
                self.bar.update(self.uses[key])
            return
        if self.model.unparsed(reply):
            reply = self.clarify(sdk, request, reply)
        if self.model.cut(reply.get("clarification", {})):  # a cut clarification is no final answer either
            with self.lock:
                self.stats.truncated += self.uses[key]
                self.bar.update(self.uses[key])
            return
        self.cache.add({"key": key, **reply, **self.model.format_note(request.body)})
        with self.lock:
            self.unparsed_count += self.uses[key] if self.model.unparsed(reply) else 0
            self.bar.update(self.uses[key])
            self.show()

    def first_reply(self, sdk, request: Request, held: Hold) -> tuple[Request, dict] | None:
        """The request sent and its reply: asked once more in text when the endpoint refuses its response_format
        (the requester falls back for good; None: no room left under the caps for the second request)."""
        try:
            return request, self.send(sdk, request.body, held)
        except FormatRefused:
            with self.lock:
                if not self.model.fall_back_to_text():
                    raise
        request = request._replace(body=self.model.body(request.image))
        held = self.reserve(request.prompt_tokens, request.completion_tokens)
        return None if held is None else (request, self.send(sdk, request.body, held))

    def ask_again(self, sdk, request: Request, reply: dict) -> dict:
        """A cut answer, counted truncated, asked once more with `retry_max_tokens` when set and the caps allow
        (counted reasked): the second reply, billed for both; else the cut one."""
        retry = self.model.retry_body(request.body)
        held = None if retry is None else self.reserve(request.prompt_tokens,
                                                       self.model.client_settings.retry_max_tokens)
        with self.lock:
            self.stats.truncated += self.uses[request.key]
            self.stats.reasked += 0 if held is None else self.uses[request.key]
        if held is None:
            return reply
        again = self.send(sdk, retry, held)
        return {**again, "max_tokens_retried": self.model.client_settings.retry_max_tokens,
                "billed": combined(reply["billed"], again["billed"])}

    def clarify(self, sdk, request: Request, reply: dict) -> dict:
        """An answer naming no class followed by the requester's clarifying turn (`model.clarify=true`), its own
        request under the caps: the answer with its `clarification` (the second reply's record), billed for both;
        else the answer as it is (clarify off, or no room left under the caps)."""
        clarification = self.model.clarification(request.body, reply)
        held = None if clarification is None else self.reserve(request.prompt_tokens + clarification[1],
                                                               request.completion_tokens)
        if held is None:
            return reply
        second = self.send(sdk, clarification[0], held)
        return {**reply, "clarification": {k: v for k, v in second.items() if k != "billed"},
                "billed": combined(reply["billed"], second["billed"])}

    def show(self) -> None:
        """The progress bar's counts: sent, rate, cached, retried, tokens, USD (when priced), unparsed."""
        rate = self.stats.requests / max(time.monotonic() - self.started, 1e-9)
        money = {} if self.budget.price is None else {"usd": f"{self.budget.cost:.4f}"}
        self.bar.set_postfix(sent=self.stats.requests, req_s=f"{rate:.2f}", cached=self.cached,
                             retried=self.stats.retries, tokens=self.stats.prompt_tokens + self.stats.completion_tokens,
                             **money, unparsed=self.unparsed_count, refresh=False)

    def narrow(self, pending: list[Future]) -> list[Future]:
        """Of the keys being asked (`pending`), those still asked once fewer are than the budget lets be in flight
        now (RequestBudget.in_flight: under a usage cap, one until the first answer or after an answer counted
        above its hold's scale, and near the cap)."""
        most = self.model.client_settings.max_concurrency
        while True:
            pending = [f for f in pending if not f.done()]
            with self.lock:
                allowed = self.budget.in_flight(most)
            if len(pending) < allowed:
                return pending
            wait(pending, return_when=FIRST_COMPLETED)

    def run(self) -> RequestStats:
        """Ask every key still to ask, in order, each first request reserved before it is handed to a free thread
        (so the caps stop at a prefix of the keys), as many at a time as the budget's bounds allow (`narrow`). A
        refusal for good stops the asking (the answers so far are cached)."""
        todo = [k for k in self.uses if k not in self.cache]
        free = threading.Semaphore(self.model.client_settings.max_concurrency)
        failed = threading.Event()

        def done(future: Future) -> None:
            if future.exception() is not None:
                failed.set()
            free.release()

        futures, pending = [], []
        with tqdm(total=len(self.images), desc=self.desc, unit="img", leave=False) as self.bar, \
                self.model.endpoint.session() as sdk, \
                ThreadPoolExecutor(self.model.client_settings.max_concurrency) as pool:
            self.bar.update(self.cached)
            try:
                for key in todo:
                    pending = self.narrow(pending)
                    free.acquire()
                    request = None if failed.is_set() else self.request(key)
                    held = None if request is None else self.reserve(request.prompt_tokens, request.completion_tokens)
                    if held is None:
                        free.release()
                        break
                    futures.append(pool.submit(self.ask, sdk, request, held))
                    futures[-1].add_done_callback(done)
                    pending.append(futures[-1])
                finished, _ = wait(futures, return_when=FIRST_EXCEPTION)
            except BaseException:  # Ctrl-C: ask nothing more; the requests in flight finish into the cache
                pool.shutdown(wait=False, cancel_futures=True)
                raise
            error = next((f.exception() for f in finished if f.exception() is not None), None)
            if error is not None:  # refused for good: stop asking (the answers so far are in the cache)
                pool.shutdown(wait=True, cancel_futures=True)
                raise error
        return self.stats


def ask_online(model: Requester, images: Sequence[bytes], keys: list[str], cache: AnswerCache,
               budget: RequestBudget, desc: str, sleep=time.sleep) -> RequestStats:
    """The answers of `images` (their request `keys`) into `cache`, one request per distinct uncached image. What
    it cost is returned; the requester reads its answers from the cache."""
    return OnlineRun(model, images, keys, cache, budget, desc, sleep).run()
