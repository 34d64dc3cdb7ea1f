"""What the `api` family sends and records, against a local FastAPI endpoint whose answers are built with the
official `openai` SDK's response types: request fields passed through, a system prompt, headers, no token limit
when there is none, the finish reason and the served model recorded, an answer cut by the token limit never cached
as an abstention, OpenAI's retry-after-ms honoured, the token and cost caps (never passed by the requests in
flight), and what an answer was billed (the provider's prompt cache at the cached price)."""

from __future__ import annotations

import asyncio
import io
import json
import time
import uuid

import pytest
from PIL import Image

fastapi = pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")  # helpers.asgi_on_localhost serves the stand-in
openai_types = pytest.importorskip("openai.types.chat")

import helpers  # noqa: E402
from helpers import raises_one_line  # noqa: E402
from rgb.core.values import ConfigValueError  # noqa: E402
from rgb.evaluation.records import EndpointUsage  # noqa: E402
from rgb.endpoints.settings import EndpointSettings, ClientSettings  # noqa: E402
from rgb.models.chat import COMPLETION_ESTIMATE, ChatClassifier  # noqa: E402
from rgb.endpoints.cache import AnswerCache  # noqa: E402
from rgb.endpoints.client import EndpointError, RequestBudget, RequestCaps, RequestStats  # noqa: E402
from rgb.endpoints.cost import Price, image_tokens, model_price, png_size, text_tokens  # noqa: E402

CLASSES = ["cat", "dog", "three"]
PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(64))  # sent as stored: the endpoint never decodes it here


def completion(content: str | None, finish_reason: str = "stop", served: str = "served-2026-01-01",
               prompt_tokens: int = 20, cached_tokens: int | None = None) -> dict:
    """A chat completion as the openai SDK defines it (3 completion tokens; `cached_tokens`: of the prompt, served
    from the provider's prompt cache)."""
    details = {} if cached_tokens is None else {"prompt_tokens_details": {"cached_tokens": cached_tokens}}
    return openai_types.ChatCompletion(
        id="chatcmpl-1", object="chat.completion", created=int(time.time()), model=served,
        choices=[{"index": 0, "finish_reason": finish_reason,
                  "message": {"role": "assistant", "content": content}}],
        usage={"prompt_tokens": prompt_tokens, "completion_tokens": 3, "total_tokens": prompt_tokens + 3,
               **details},
    ).model_dump(mode="json", exclude_unset=True)


def png(value: int, size: int = 8) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (size, size), (value, value, value)).save(out, format="PNG")
    return out.getvalue()


class Endpoint:
    """A FastAPI app on 127.0.0.1 that records each request and answers from `replies` (a list of
    (status, headers, body) consumed in order, the last one repeated), each after `delay_s` (the requests of a
    client overlap)."""

    def __init__(self, replies, delay_s: float = 0.0):
        self.replies, self.seen = list(replies), []
        app = fastapi.FastAPI()

        @app.post("/v1/chat/completions")
        async def chat(request: fastapi.Request):
            self.seen.append({"body": await request.json(), "headers": dict(request.headers),
                              "query": list(request.query_params.multi_items())})
            await asyncio.sleep(delay_s)
            status, headers, body = self.replies.pop(0) if len(self.replies) > 1 else self.replies[0]
            return fastapi.responses.JSONResponse(body, status_code=status, headers=headers)

        self.app = app

    def __enter__(self):
        self._serving = helpers.asgi_on_localhost(self.app)
        self.base_url = self._serving.__enter__()
        return self

    def __exit__(self, *exc):
        self._serving.__exit__(*exc)


def classifier(base_url: str, api: dict | None = None, **client) -> ChatClassifier:
    return ChatClassifier(EndpointSettings(base_url, "vlm", **(api or {})), ClientSettings(**client), CLASSES, "toy")


def test_request_fields_system_prompt_and_headers_reach_the_endpoint(tmp_path):
    request = {"max_completion_tokens": 64, "reasoning_effort": "low", "top_k": 1}
    with Endpoint([(200, {}, completion("dog"))]) as endpoint:
        model = classifier(endpoint.base_url, {"max_tokens": None, "system_prompt": "Be brief.", "request": request},
                           headers={"X-Team": "robustness"})
        answers, stats = model.answer([PNG], AnswerCache(tmp_path / "c.jsonl"))
    body, headers = endpoint.seen[0]["body"], endpoint.seen[0]["headers"]
    assert answers[0].pred == 1 and stats.requests == 1
    assert body["messages"][0] == {"role": "system", "content": "Be brief."}
    assert body["messages"][1]["role"] == "user" and "max_tokens" not in body  # null: no limit sent
    assert {k: body[k] for k in request} == request and headers["x-team"] == "robustness"
    assert model.describe()["api"]["request"] == request and model.describe()["api"]["max_tokens"] is None


def test_the_request_carries_exactly_the_declared_query_and_headers(tmp_path, monkeypatch):
    """What the endpoint sees: the public query (base_url's api-version, model.query) and headers as typed, the
    secret ones (random names) read from their variables, the API key only as the Authorization bearer, nothing
    else; a variable unset is one line naming it, before anything is sent."""
    tag = uuid.uuid4().hex[:10]
    param, header, public = f"p{tag}", f"X-H{tag}", f"X-P{tag}"
    monkeypatch.setenv("RGB_TEST_KEY", f"sk-{tag}")
    monkeypatch.setenv("RGB_TEST_QUERY_SECRET", f"MARKQ{tag}")
    monkeypatch.setenv("RGB_TEST_HEADER_SECRET", f"MARKH{tag}")
    declared = {"api_key_env": "RGB_TEST_KEY", "headers": {"X-Team": "robustness", public: "Basic typed"},
                "query_env": {param: "RGB_TEST_QUERY_SECRET"}, "header_env": {header: "RGB_TEST_HEADER_SECRET"}}
    with Endpoint([(200, {}, completion("dog"))]) as endpoint:
        model = classifier(f"{endpoint.base_url}?api-version=2024", {"query": {"deployment": "eu"}}, **declared)
        model.answer([PNG], AnswerCache(tmp_path / "a.jsonl"))
        unset = classifier(endpoint.base_url, **{**declared, "header_env": {header: "RGB_TEST_UNSET_VARIABLE"}})
        with raises_one_line(EndpointError, match="header .* RGB_TEST_UNSET_VARIABLE, which is not set"):
            unset.answer([PNG], AnswerCache(tmp_path / "b.jsonl"))
    assert len(endpoint.seen) == 1
    seen = endpoint.seen[0]
    assert sorted(seen["query"]) == sorted([("api-version", "2024"), ("deployment", "eu"), (param, f"MARKQ{tag}")])
    headers = seen["headers"]
    assert (headers["x-team"], headers[public.lower()], headers[header.lower()]) == (
        "robustness", "Basic typed", f"MARKH{tag}")
    assert headers["authorization"] == f"Bearer sk-{tag}"
    assert [k for k, v in headers.items() if f"sk-{tag}" in v] == ["authorization"]
    record = json.dumps(model.describe())
    assert f"MARK" not in record and "RGB_TEST_QUERY_SECRET" in record and "RGB_TEST_HEADER_SECRET" in record


def test_requests_go_through_the_openai_sdk_with_the_key_read_per_request(tmp_path, monkeypatch):
    """The official SDK sends (its User-Agent), its own retries off (one request for one 500 with max_retries=0
    is ours to count), the key from the environment when set and no Authorization header at all when not."""
    monkeypatch.delenv("RGB_TEST_KEY", raising=False)
    with Endpoint([(200, {}, completion("dog"))]) as endpoint:
        model = classifier(endpoint.base_url, api_key_env="RGB_TEST_KEY")
        model.answer([PNG], AnswerCache(tmp_path / "a.jsonl"))
        monkeypatch.setenv("RGB_TEST_KEY", "sk-test-1")
        model.answer([PNG], AnswerCache(tmp_path / "b.jsonl"))
    without, with_key = (seen["headers"] for seen in endpoint.seen)
    assert without["user-agent"].startswith("OpenAI/Python") and "authorization" not in without
    assert with_key["authorization"] == "Bearer sk-test-1"
    with Endpoint([(500, {}, {"error": {"message": "boom"}})]) as failing:
        with raises_one_line(EndpointError, match="gave up after 1 attempts, last: HTTP 500"):
            classifier(failing.base_url, max_retries=0).answer([PNG], AnswerCache(tmp_path / "c.jsonl"))
    assert len(failing.seen) == 1


def test_unset_extras_keep_the_identity_and_set_ones_change_it():
    plain = classifier("http://127.0.0.1:1/v1")
    assert "request" not in plain.describe()["api"] and "system_prompt" not in plain.describe()["api"]
    assert plain.identity_sha256 != classifier("http://127.0.0.1:1/v1", {"request": {"seed": 1}}).identity_sha256
    assert plain.identity_sha256 != classifier("http://127.0.0.1:1/v1", {"system_prompt": "x"}).identity_sha256
    with raises_one_line(ConfigValueError, match="model.request must be a mapping of request fields other than"):
        classifier("http://127.0.0.1:1/v1", {"request": {"messages": []}})


def test_the_finish_reason_and_the_served_model_are_cached(tmp_path):
    with Endpoint([(200, {}, completion("three", served="vlm-2026-11-30"))]) as endpoint:
        cache = AnswerCache(tmp_path / "c.jsonl")
        classifier(endpoint.base_url).answer([PNG], cache)
    record = next(iter(cache.answers.values()))
    assert record["finish_reason"] == "stop" and record["served_model"] == "vlm-2026-11-30"


def test_an_answer_cut_by_the_token_limit_is_asked_again_never_cached_as_an_abstention(tmp_path):
    cut = (200, {}, completion(None, finish_reason="length"))  # a reasoning model that spent its limit thinking
    with Endpoint([cut]) as endpoint:
        cache = AnswerCache(tmp_path / "c.jsonl")
        answers, stats = classifier(endpoint.base_url, {"request": {"max_completion_tokens": 8}},
                                    retry_max_tokens=256).answer([PNG], cache)
        sent = [seen["body"]["max_completion_tokens"] for seen in endpoint.seen]
    assert answers == [None] and stats.truncated == 1 and stats.unanswered == 1 and stats.unparsed == 0
    assert sent == [8, 256] and len(cache.answers) == 0  # asked once more with the user's limit, nothing cached
    with Endpoint([cut, (200, {}, completion("cat"))]) as endpoint:  # the next run asks it again
        answers, stats = classifier(endpoint.base_url, {"request": {"max_completion_tokens": 8}},
                                    retry_max_tokens=256).answer([PNG], cache)
    assert answers[0].pred == 0 and (stats.truncated, stats.reasked, stats.requests, stats.cached) == (1, 1, 2, 0)
    record = next(iter(cache.answers.values()))
    assert record["max_tokens_retried"] == 256 and record["billed"]["prompt_tokens"] == 40  # both requests billed


@pytest.mark.parametrize("answer_format", ["text", "choice"])
def test_an_answer_cut_by_the_token_limit_is_no_answer_whatever_its_text(tmp_path, answer_format):
    """"cat" cut by the token limit may be the start of "cat shark" (before: read as cat, because its prefix named
    a class): counted truncated, asked again with retry_max_tokens when set, else left unanswered, never cached;
    a cached cut record (an older cache) is read as no class."""
    text = "cat" if answer_format == "text" else '{"answer": "cat"}'
    cut = (200, {}, completion(text, finish_reason="length"))
    with Endpoint([cut]) as endpoint:
        cache = AnswerCache(tmp_path / "c.jsonl")
        answers, stats = classifier(endpoint.base_url, {"answer_format": answer_format}).answer([PNG], cache)
    assert answers == [None] and (stats.truncated, stats.unanswered, len(cache.answers)) == (1, 1, 0)
    with Endpoint([cut, (200, {}, completion(text))]) as endpoint:
        answers, stats = classifier(endpoint.base_url, {"answer_format": answer_format},
                                    retry_max_tokens=256).answer([PNG], cache)
    assert answers[0].pred == 0 and (stats.truncated, stats.reasked, len(endpoint.seen)) == (1, 1, 2)
    model = classifier("http://127.0.0.1:1/v1", {"answer_format": answer_format})
    assert model.unparsed({"answer": text, "finish_reason": "length"})


def test_a_clarification_cut_by_the_token_limit_is_not_cached_as_final(tmp_path):
    """model.clarify=true: a clarifying reply cut by the limit ("dog" of "dog sled") is no answer: the image is left
    unanswered (PARTIAL, truncated), asked again by the next run (before: cached as dog for good)."""
    unsure, cut = (200, {}, completion("I am not sure")), (200, {}, completion("dog", finish_reason="length"))
    with Endpoint([unsure, cut]) as endpoint:
        cache = AnswerCache(tmp_path / "c.jsonl")
        answers, stats = classifier(endpoint.base_url, {"clarify": True}).answer([PNG], cache)
    assert answers == [None] and len(endpoint.seen) == 2 and len(cache.answers) == 0
    assert (stats.truncated, stats.unanswered, stats.requests) == (1, 1, 2)


def test_answers_cut_then_answered_count_truncated_and_reasked_and_cached_is_never_negative(tmp_path):
    """Five images, each answer cut then answered when asked again, and a sixth, a duplicate of the first: ten
    requests, six images truncated and reasked (counted per image, as every count), one image from the cache (the
    duplicate). Before: truncated 0 and cached 6 - 10 = -4 (answered images minus requests sent)."""
    cut, ok = (200, {}, completion(None, finish_reason="length")), (200, {}, completion("cat"))
    images = [png(v) for v in range(5)] + [png(0)]
    with Endpoint([cut, ok] * 5) as endpoint:
        answers, stats = classifier(endpoint.base_url, retry_max_tokens=256, max_concurrency=1).answer(
            images, AnswerCache(tmp_path / "c.jsonl"))
    assert [a.pred for a in answers] == [0] * 6 and len(endpoint.seen) == 10
    assert (stats.requests, stats.truncated, stats.reasked, stats.cached, stats.unanswered) == (10, 6, 6, 1, 0)


def test_retry_after_ms_is_the_wait(tmp_path):
    busy = (429, {"retry-after-ms": "70", "retry-after": "30"}, {"error": {"message": "slow down"}})
    with Endpoint([busy, (200, {}, completion("cat"))]) as endpoint:
        answers, stats = classifier(endpoint.base_url, backoff_s=5).answer([PNG], AnswerCache(tmp_path / "c.jsonl"))
    assert answers[0].pred == 0 and stats.retries == 1 and stats.backoff_s == pytest.approx(0.07)


def test_a_price_costs_its_tokens_and_a_bad_one_is_one_line():
    price = Price(input=2.0, output=8.0, cached_input=0.5)
    assert price.cost(1_000_000, 0) == 2.0
    assert price.cost(1_000_000, 500_000, cached_tokens=1_000_000) == 0.5 + 4.0
    assert Price.of({"input": 1, "output": 1}).cost(10, 0, cached_tokens=10) == 10 / 1e6  # uncached rate
    assert model_price(None, "gpt-4o-mini", {"gpt-4o-mini": {"input": 0.15, "output": 0.6}}).input == 0.15
    assert model_price({"input": 1, "output": 2}, "gpt-4o-mini", {"gpt-4o-mini": {"input": 9, "output": 9}}).input == 1
    assert model_price(None, "vlm", {}) is None
    with raises_one_line(ConfigValueError, "model.price"):
        ClientSettings(price={"input": 1})
    with raises_one_line(ConfigValueError, "max_cost needs the model's price"):
        RequestBudget(max_cost=1.0)


PRICE = Price(1000.0, 1000.0)  # a token costs 1/1000 USD, prompt or completion


def caps(tokens: int) -> list[dict]:
    """A token cap and the same in USD (half a token more: sums of floats are not exact)."""
    return [{"max_tokens_total": tokens}, {"max_cost": (tokens + 0.5) * 1000 / 1e6, "price": PRICE}]


def spent_tokens(budget: RequestBudget, cap: dict) -> float:
    """What a run billed, in the cap's unit."""
    return budget.tokens if "max_tokens_total" in cap else budget.cost


@pytest.mark.parametrize("cap", range(2))
def test_a_token_or_cost_cap_stops_new_requests_and_a_rerun_continues(tmp_path, cap):
    """Each request holds its estimate (here above the 23 tokens billed) until its answer comes: with room for
    one estimate and 30 tokens more, the third request would not fit."""
    images = [png(v) for v in range(3)]
    estimate = sum(classifier("http://127.0.0.1:1/v1").estimate(images[0]))
    cap = caps(estimate + 30)[cap]
    with Endpoint([(200, {}, completion("dog"))]) as endpoint:
        model = classifier(endpoint.base_url, max_concurrency=1)
        answers, stats = model.answer(images, AnswerCache(tmp_path / "c.jsonl"), RequestBudget(**cap))
        assert [a is not None for a in answers] == [True, True, False]
        assert (stats.requests, stats.unanswered) == (2, 1)
        answers, stats = model.answer(images, AnswerCache(tmp_path / "c.jsonl"), RequestBudget(**cap))
        assert all(a is not None for a in answers) and (stats.requests, stats.cached) == (1, 2)
        # the resumed split totals the tokens of all three answers, as one uninterrupted run would
        assert (stats.prompt_tokens, stats.cached_prompt_tokens, stats.cached_completion_tokens) == (20, 40, 6)
        uninterrupted = model.answer(images, AnswerCache(tmp_path / "c.jsonl"))[1]
        assert uninterrupted.cached_prompt_tokens + uninterrupted.prompt_tokens == 60
    assert len(endpoint.seen) == 3


@pytest.mark.parametrize("cap", range(2))
def test_requests_in_flight_never_take_a_run_past_its_cap(tmp_path, cap):
    """Four requests at a time, each answered after a while, billed their estimate's prompt: a cap of three
    estimates lets three go and none after them (before: the four in flight went past it)."""
    images = [png(v) for v in range(8)]
    prompt, completion_limit = classifier("http://127.0.0.1:1/v1").estimate(images[0])
    cap = caps(3 * (prompt + completion_limit))[cap]
    reply = completion("dog", prompt_tokens=prompt)
    with Endpoint([(200, {}, reply)], delay_s=0.3) as endpoint:
        budget = RequestBudget(**cap)
        answers, stats = classifier(endpoint.base_url, max_concurrency=4).answer(
            images, AnswerCache(tmp_path / "c.jsonl"), budget)
    assert budget.stopped_by and len(endpoint.seen) == stats.requests == 3 and stats.unanswered == 5
    billed = stats.prompt_tokens + stats.completion_tokens
    assert billed == 3 * (prompt + 3) and spent_tokens(budget, cap) <= next(iter(cap.values()))
    assert budget.held_tokens == 0 and budget.held_cost == pytest.approx(0.0)  # every hold released


def test_prompt_cached_tokens_are_billed_at_the_cached_price_and_recorded_per_answer(tmp_path):
    """The provider's prompt cache (usage.prompt_tokens_details.cached_tokens) is billed at `cached_input`: what
    the budget counts and what the answer's record says it was billed; its list price counts them in full."""
    price = Price(input=1000.0, output=2000.0, cached_input=250.0)
    with Endpoint([(200, {}, completion("cat", cached_tokens=16))]) as endpoint:
        cache, budget = AnswerCache(tmp_path / "c.jsonl"), RequestBudget(price=price)
        classifier(endpoint.base_url).answer([png(1), png(2)], cache, budget)
    billed = (4 * 1000 + 16 * 250 + 3 * 2000) / 1e6  # 20 prompt tokens, 16 of them cached, 3 completion
    assert budget.cost == pytest.approx(2 * billed)
    records = list(AnswerCache(tmp_path / "c.jsonl").answers.values())
    assert [price.spent(r) for r in records] == pytest.approx([billed, billed])
    assert [price.list_cost(r) for r in records] == pytest.approx([(20 * 1000 + 3 * 2000) / 1e6] * 2)
    assert Price(1000.0, 2000.0).spent(records[0]) == pytest.approx(price.list_cost(records[0]))  # no cached rate


def test_the_usage_record_totals_spent_and_list_cost_and_reads_back():
    counts = RequestStats(images=3, requests=1, cached=2, retries=0, unparsed=0, unanswered=0, prompt_tokens=20,
                          completion_tokens=3, backoff_s=0.0, cached_prompt_tokens=40, cached_completion_tokens=6,
                          spent=0.05, list_cost=0.08)
    usage = EndpointUsage("http://127.0.0.1:1/v1", "vlm", {"test": counts, "common": counts}, None, 2,
                     {"input": 1000.0, "output": 2000.0, "cached_input": None})
    assert (usage.spent, usage.list_cost) == pytest.approx((0.1, 0.16))
    assert EndpointUsage.from_json(usage.to_json()) == usage
    assert EndpointUsage("u", "vlm", {"test": counts}, None).spent is None  # unknown price: no money
    before = RequestStats(**{**counts.to_json(), "spent": None, "list_cost": None})  # recorded before it was kept
    assert EndpointUsage("u", "vlm", {"test": counts, "old": before}, None, 2, usage.price).spent is None


def test_a_request_is_estimated_from_its_texts_image_size_and_completion_limit():
    image = io.BytesIO()
    Image.new("RGB", (32, 48)).save(image, format="PNG")
    png = image.getvalue()
    assert png_size(png) == (32, 48)
    prompt = text_tokens(classifier("http://127.0.0.1:1/v1").prompt) + image_tokens(32, 48)
    assert classifier("http://127.0.0.1:1/v1").estimate(png) == (prompt, 16)  # max_tokens: 16
    reasoning = classifier("http://127.0.0.1:1/v1", {"max_tokens": None, "request": {"max_completion_tokens": 64}})
    assert reasoning.estimate(png) == (prompt, 64)
    assert classifier("http://127.0.0.1:1/v1", {"max_tokens": None}).estimate(png) == (prompt, COMPLETION_ESTIMATE)


@pytest.mark.parametrize("completion_tokens, first", [(3, 10), (160, 10), (3, 1)],
                         ids=["prompt_10x", "both_10x", "rising_1x_then_10x"])
@pytest.mark.parametrize("cap", ["max_tokens_total", "max_cost", "max_requests"])
def test_caps_hold_with_eight_in_flight_when_the_endpoint_counts_ten_times_the_estimate(tmp_path, cap,
                                                                                        completion_tokens, first):
    """An endpoint that counts 10x the estimated prompt tokens (and, `both_10x`, 10x the completion limit sent:
    160 for 16), eight requests at a time: the first answer calibrates the bound every later request holds, so no
    cap is passed (before: the eight first requests held a tenth of what they cost and took the run past its cap).
    `rising_1x_then_10x`: the first answer counted as estimated, every later one 10x: the scale rises after the
    first answer, so the requests after it go one at a time until one kept to its hold (before: eight went at the
    first answer's scale and spent 1.8x the cap). The overshoot measured is 0."""
    images = [png(v) for v in range(24)]
    prompt, limit = classifier("http://127.0.0.1:1/v1").estimate(images[0])
    actual = 10 * prompt + completion_tokens  # what each answer is billed (the first: `first` x the prompt)
    value = {"max_tokens_total": 5 * actual + 7, "max_cost": (5 * actual + 7) * 1000 / 1e6, "max_requests": 5}[cap]

    def reply(scale):
        made = completion("dog", prompt_tokens=scale * prompt)
        made["usage"] = {**made["usage"], "completion_tokens": completion_tokens,
                         "total_tokens": scale * prompt + completion_tokens}
        return 200, {}, made

    with Endpoint([reply(first), reply(10)], delay_s=0.2) as endpoint:
        budget = RequestBudget.of(RequestCaps(**{cap: value}), PRICE)
        answers, stats = classifier(endpoint.base_url, max_concurrency=8).answer(
            images, AnswerCache(tmp_path / "c.jsonl"), budget)
    spent = {"max_tokens_total": budget.tokens, "max_cost": budget.cost, "max_requests": len(endpoint.seen)}[cap]
    overshoot = max(0.0, spent - value)
    assert overshoot == 0 and stats.requests == len(endpoint.seen) == stats.images - stats.unanswered
    assert budget.stopped_by == f"{cap}={value:g}" and stats.requests >= 4  # the cap, not the calibration, stopped it
    assert [a is not None for a in answers] == [True] * stats.requests + [False] * stats.unanswered  # in order


def test_a_capped_budget_opens_one_request_more_per_answer_kept_to_its_hold_and_one_after_a_rise():
    """RequestBudget.in_flight under max_tokens_total: one until an answer, one more for each later answer billed
    within its hold, back to one when an answer is billed above the ratio its hold used, one near the cap."""
    budget = RequestBudget(max_tokens_total=100_000)

    def answer(ratio):
        held = budget.reserve(100, 10)
        budget.settle(held, {"prompt_tokens": int(100 * ratio), "completion_tokens": 3})

    assert budget.in_flight(8) == 1
    answer(1)
    assert budget.in_flight(8) == 1  # the first answer alone calibrates nothing it could confirm
    for expected in (2, 3, 4):
        answer(1)
        assert budget.in_flight(8) == expected
    answer(10)  # the ratio rose: those in flight settle before the next, held at 10x
    assert budget.in_flight(8) == 1 and budget.prompt_scale == 10
    answer(10)
    assert budget.in_flight(8) == 2
    budget.tokens = 100_000 - 7 * 1010  # room for fewer than eight holds of 10x: one at a time
    assert budget.in_flight(8) == 1 and RequestBudget().in_flight(8) == 8  # no usage cap: all


def test_max_requests_counts_every_request_an_answer_asked_again_included(tmp_path):
    """An answer cut by the token limit and asked again takes two requests: max_requests=3 sends three."""
    cut = (200, {}, completion(None, finish_reason="length"))
    with Endpoint([cut]) as endpoint:
        budget = RequestBudget(3)
        answers, stats = classifier(endpoint.base_url, retry_max_tokens=64, max_concurrency=4).answer(
            [png(v) for v in range(4)], AnswerCache(tmp_path / "c.jsonl"), budget)
    assert len(endpoint.seen) == stats.requests == 3 and budget.stopped_by == "max_requests=3"
    assert answers == [None] * 4


def test_a_usage_cap_needs_a_completion_limit_sent(tmp_path):
    """Without a completion limit no request's tokens are bounded before it is sent: a token or cost cap refuses
    the run in one line, before anything is asked."""
    model = classifier("http://127.0.0.1:1/v1", {"max_tokens": None})
    with raises_one_line(ConfigValueError, "bound each request by the completion limit it sends"):
        model.answer([PNG], AnswerCache(tmp_path / "c.jsonl"), RequestBudget(max_tokens_total=10_000))


def test_the_partial_line_names_the_cap_that_stopped_the_run():
    counts = RequestStats(images=3, requests=1, unanswered=2)
    usage = EndpointUsage("u", "vlm", {"test": counts}, None, 3, None, stopped_by="max_tokens_total=5000")
    assert usage.waiting() == "2 images not asked yet (max_tokens_total=5000 reached)"
    assert EndpointUsage.from_json(usage.to_json()) == usage
    legacy = EndpointUsage("u", "vlm", {"test": counts}, 7)  # recorded before the cap was
    assert legacy.waiting() == "2 images not asked yet (max_requests=7, or max_tokens_total / max_cost)"


REFUSES_FORMAT = (400, {}, {"error": {"message": "Invalid parameter: 'response_format' of type 'json_schema' is not "
                                                 "supported with this model.", "type": "invalid_request_error"}})


def test_an_endpoint_refusing_response_format_is_asked_in_text_said_once_and_recorded(tmp_path, caplog):
    """answer_format=choice against an endpoint that refuses response_format (a 400 naming it): the refused request
    is asked again in text, and every later one in text; one warning; each record says it was answered in text."""
    with Endpoint([REFUSES_FORMAT, (200, {}, completion("cat"))]) as endpoint:
        model = classifier(endpoint.base_url, {"answer_format": "choice"}, max_concurrency=1)
        cache = AnswerCache(tmp_path / "c.jsonl")
        with caplog.at_level("WARNING"):
            answers, stats = model.answer([png(1), png(2)], cache)
    assert [a.pred for a in answers] == [0, 0] and "response_format" in endpoint.seen[0]["body"]
    assert not any("response_format" in seen["body"] for seen in endpoint.seen[1:]) and len(endpoint.seen) == 3
    assert [r.getMessage().count("refuses response_format") for r in caplog.records] == [1]
    assert [r["answer_format_used"] for r in cache.answers.values()] == ["text", "text"]
    assert (stats.answered_in_text, stats.requests, model.answer_format_used) == (2, 2, "text")  # 2 answered
    with Endpoint([REFUSES_FORMAT]) as endpoint:  # a text request refused for its format: a refusal for good
        with raises_one_line(EndpointError, "HTTP 400: Invalid parameter: 'response_format'"):
            classifier(endpoint.base_url, {"request": {"response_format": {"type": "json_object"}}}).answer(
                [png(1)], AnswerCache(tmp_path / "t.jsonl"))


def test_clarify_asks_one_more_turn_for_an_answer_naming_no_class_counted_priced_and_capped(tmp_path):
    """model.clarify=true: an unparsed answer is followed, in the same conversation, by "Reply with exactly one
    of: ..."; its answer read as any answer (one still naming no class stays unparsed), its own request (counted,
    billed into the record, under max_requests). Part of the identity only when true."""
    unsure, dog, either = (200, {}, completion("I am not sure")), (200, {}, completion("dog")), \
        (200, {}, completion("cat or dog"))
    with Endpoint([unsure, dog, unsure, either]) as endpoint:
        model = classifier(endpoint.base_url, {"clarify": True}, max_concurrency=1)
        cache = AnswerCache(tmp_path / "c.jsonl")
        answers, stats = model.answer([png(1), png(2)], cache)
    follow_up = endpoint.seen[1]["body"]["messages"]
    assert follow_up[:1] == endpoint.seen[0]["body"]["messages"] and follow_up[1:] == [
        {"role": "assistant", "content": "I am not sure"},
        {"role": "user", "content": "Reply with exactly one of: cat; dog; three"}]
    assert [a.pred for a in answers] == [1, None] and answers[0].text == "I am not sure\n[clarified] dog"
    assert (stats.requests, stats.clarified, stats.unparsed, stats.prompt_tokens) == (4, 2, 1, 80)
    assert [r["billed"]["prompt_tokens"] for r in cache.answers.values()] == [40, 40]  # both turns priced
    with Endpoint([unsure]) as endpoint:  # no room for the clarification: the answer as it came, unparsed
        budget = RequestBudget(1)
        answers, stats = classifier(endpoint.base_url, {"clarify": True}).answer(
            [png(3)], AnswerCache(tmp_path / "d.jsonl"), budget)
    assert len(endpoint.seen) == 1 and answers[0].pred is None and budget.stopped_by == "max_requests=1"
    plain = classifier("http://127.0.0.1:1/v1")
    assert classifier("http://127.0.0.1:1/v1", {"clarify": False}).identity_sha256 == plain.identity_sha256
    assert model.identity_sha256 != classifier(model.settings.base_url).identity_sha256
    assert model.describe()["api"]["clarify"] is True and "clarify" not in plain.describe()["api"]
    with raises_one_line(ConfigValueError, "model.clarify=true asks a follow-up turn"):
        classifier("http://127.0.0.1:1/v1", {"clarify": True}, batch=True)
    with raises_one_line(ConfigValueError, "model.clarify must be true or false"):
        classifier("http://127.0.0.1:1/v1", {"clarify": "yes"})
