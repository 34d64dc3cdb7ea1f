"""The `api` model family against a real `rgb-serve` on 127.0.0.1 (its answer parser: test_endpoints_answers_lenient.py): the
settings and their one-line refusals, the answer cache, re-reading cached answers under another reader, the
manners (retries, Retry-After, rate limit, one-line refusals), the black-box protocol image by image equal to
evaluate.py of the served model, dry_run / max_requests, and a key that never reaches a file."""

import hashlib
import json
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import datasets
import numpy as np
import pandas as pd
import pytest

import helpers
from helpers import REPO, compose_rooted, raises_one_line
from rgb.data import ImageSplit, load_split
from rgb.data.catalog import CONTROL_SPLIT, TRANSFER_SPLITS
from rgb.data.mini import CLASS_NAMES, DATASET
from rgb.data.snapshot import write_readme, write_split
from rgb.evaluation.endpoint_eval import cache_path, split_images
from rgb.evaluation.leaderboard import build_leaderboard, find_records, to_markdown
from rgb.evaluation.model_eval import format_table
from rgb.evaluation.records import PARTIAL_SCORES_FILE, SCORES_FILE, ScoresRecord
from rgb.commands.evaluate import request_caps, run_evaluation
from rgb.models import load_with_meta
from rgb.endpoints.settings import EndpointSettings, ClientSettings, split_config
from rgb.models.chat import ChatClassifier
from rgb.endpoints.cache import AnswerCache, CacheError
from rgb.endpoints.client import EndpointError, RateLimiter, RequestBudget, RequestCaps
from rgb.commands import main as cli
from rgb.core.errors import UserError
from rgb.core.values import ConfigValueError
from rgb.runs.store import AttackRunError, partial_dir
from rgb.serve import MALFORMED_ANSWER, Faults, ServeRequest, make_server
from rgb.commands.train import train
from rgb.data.export import noise_transfer_splits

N_IMAGES = 24
SURROGATE = "noise"
KEY_ENV = "RGB_TEST_API_KEY"


# ------------------------------------------------------------------------------------------------ the cache
def test_cache_cuts_a_torn_last_line_and_refuses_damage_elsewhere(tmp_path):
    path = tmp_path / "answers.jsonl"
    cache = AnswerCache(path)
    cache.add({"key": "a", "answer": "one", "usage": {}})
    cache.add({"key": "b", "answer": "two", "usage": {}})
    cache.close()
    with open(path, "ab") as handle:  # kill -9 in the middle of a write
        handle.write(b'{"key": "c", "ans')
    reopened = AnswerCache(path)
    assert set(reopened.answers) == {"a", "b"} and path.read_bytes().endswith(b"}\n")
    reopened.add({"key": "c", "answer": "three", "usage": {}})
    reopened.close()
    assert set(AnswerCache(path).answers) == {"a", "b", "c"}
    lines = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(lines[0] + b"garbage\n" + b"".join(lines[1:]))
    with pytest.raises(CacheError, match="line 2"):
        AnswerCache(path)


def test_a_record_without_its_answer_is_one_line_naming_the_file_and_line(tmp_path):
    path = tmp_path / "answers.jsonl"
    path.write_text('{"key": "a", "answer": "one", "usage": {}}\n{"key": "b", "usage": {}}\n["c"]\n')
    with raises_one_line(CacheError) as refused:
        AnswerCache(path)
    assert str(refused.value).startswith(f"{path} line 2 is not an answer record (no answer)")


# ----------------------------------------------------------------------------------------------- the settings
@pytest.mark.parametrize("settings, message", [
    (dict(base_url="ftp://host/v1"), "model.base_url must be an http(s) URL ending in /v1"),
    (dict(base_url="ftp://host/v1"), "got 'ftp://host/v1'"),
    (dict(base_url="127.0.0.1:8000/v1"), "model.base_url must be an http(s) URL"),
    (dict(base_url="http://"), "model.base_url must be an http(s) URL"),
    (dict(api_model=""), "model.api_model must be the endpoint's model name"),
    (dict(api_model="  "), "model.api_model must be the endpoint's model name"),
    (dict(max_tokens=0), "model.max_tokens must be null or an integer >= 1, got 0"),
    (dict(temperature=-1.0), "model.temperature must be null or a finite number >= 0"),
    (dict(answer_format="json"), "model.answer_format must be text or choice, got 'json'"),
])
def test_bad_api_settings_are_one_line_naming_the_key(settings, message):
    with raises_one_line(ConfigValueError) as refused:
        EndpointSettings(**{"base_url": "http://127.0.0.1:1/v1", "api_model": "tiny", **settings})
    assert message in str(refused.value)


@pytest.mark.parametrize("settings, message", [
    (dict(max_concurrency=0), "model.max_concurrency must be an integer >= 1, got 0"),
    (dict(max_concurrency=-3), "model.max_concurrency must be an integer >= 1, got -3"),
    (dict(max_retries=-1), "model.max_retries must be an integer >= 0, got -1"),
    (dict(timeout_s=0), "model.timeout_s must be a finite number > 0, got 0"),
    (dict(requests_per_minute=0), "model.requests_per_minute must be null or a finite number > 0"),
    (dict(api_key_env=""), "model.api_key_env must be the name of an environment variable"),
])
def test_bad_client_settings_are_one_line_naming_the_key(settings, message):
    with raises_one_line(ConfigValueError) as refused:
        ClientSettings(**settings)
    assert message in str(refused.value)


@pytest.mark.parametrize("value", [-1, 0, 2.5])
def test_max_requests_below_one_is_refused_in_one_line(value):
    with pytest.raises(ConfigValueError, match=f"max_requests must be null or an integer >= 1, got {value}"):
        RequestBudget(value)
    assert RequestBudget(None).take(5) == 5 and RequestBudget(3).take(5) == 3


def test_request_caps_are_the_evaluate_config_keys_read_by_name():
    """A cap is a RequestCaps field and its key of conf/evaluate.yaml (null: no limit), nothing else: every field is
    a key, every `max_` key but max_images (a part of each split, not an API cap) is a field, and evaluate.py reads
    each into its request."""
    conf = helpers.compose_config("evaluate")
    caps = RequestCaps.names()
    assert {key for key in conf if key.startswith("max_")} - {"max_images"} == set(caps)
    assert all(conf[name] is None for name in caps) and not request_caps(conf).capped
    overrides = {"max_requests": 3, "max_tokens_total": 500, "max_cost": 0.25}
    assert set(overrides) == set(caps)
    assert request_caps(helpers.compose_config("evaluate", *(f"{k}={v}" for k, v in overrides.items()))) == \
        RequestCaps(**overrides)


def test_a_prompt_with_an_unknown_placeholder_is_one_line():
    with pytest.raises(ConfigValueError, match=r"model.prompt may hold only \{dataset\} and \{classes\}"):
        ChatClassifier(EndpointSettings("http://127.0.0.1:1/v1", "tiny", prompt="Which {thing}?"), ClientSettings(),
                      CLASS_NAMES, DATASET)


def test_rate_limiter_holds_requests_to_the_window():
    now = [0.0]
    slept = []

    def sleep(seconds):
        slept.append(seconds)
        now[0] += seconds

    limiter = RateLimiter(requests_per_minute=3, tokens_per_minute=None, clock=lambda: now[0], sleep=sleep)
    for _ in range(7):
        limiter.settle(limiter.acquire(), 10)
    assert now[0] >= 120 and len(limiter._events) <= 3  # 7 requests at 3 a minute: two full windows waited

    now[0], slept[:] = 0.0, []
    tokens = RateLimiter(requests_per_minute=None, tokens_per_minute=100, clock=lambda: now[0], sleep=sleep)
    for _ in range(3):
        tokens.settle(tokens.acquire(), 60)  # the second waits for the first's 60 tokens to leave the window
    assert now[0] >= 120


# ------------------------------------------------------------------------------------------- the offline bench
def _bench(mini_dir: Path, out: Path) -> Path:
    """The first N test images with their common and control rows, and the 7 transfer splits of a surrogate `noise`
    (random perturbations within each budget on every other image; the rest unmodified, i.e. the clean test PNG)."""
    for name in ("test", "common", CONTROL_SPLIT):
        split = load_split(str(mini_dir), DATASET, name).select(range(N_IMAGES))
        rows = split.cast_column("image", datasets.Image(decode=False))[:]
        rows["image"] = [image["bytes"] for image in rows["image"]]
        write_split(out / "data" / DATASET / f"{name}.parquet", CLASS_NAMES, rows)
    write_readme(out, "api test bench")
    clean_split = ImageSplit(load_split(str(out), DATASET, "test"), 32)
    noise_transfer_splits(out, clean_split, [i % 2 == 0 for i in range(N_IMAGES)], SURROGATE)
    return out


@pytest.fixture(scope="module")
def bench(mini_dir, tmp_path_factory):
    return _bench(mini_dir, tmp_path_factory.mktemp("api_bench") / "bench")


@pytest.fixture(scope="module")
def served_run(surrogate):
    """A small trained model (the attack tests' tiny ViT, trained once per session)."""
    return surrogate


class Running:
    """rgb-serve in a thread of this process on 127.0.0.1 (port 0: any free port)."""

    def __init__(self, run: Path, **kwargs):
        self.server = make_server(ServeRequest(run=run, served_name="tiny", **kwargs))
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self.server

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=10)


@pytest.fixture(scope="module")
def server(served_run):
    with Running(served_run) as running:
        yield running


def api_run(root: Path, bench: Path, base_url: str, name: str = "api_tiny", *overrides: str) -> Path:
    """train.py model=api_chat model.base_url=... model.api_model=tiny (no training: model.json only)."""
    run = root / "outputs" / "train" / DATASET / name
    train(compose_rooted("train", root, bench, "model=api_chat", f"model.base_url={base_url}",
                         "model.api_model=tiny", f"model.name={name}", f"run_dir={run}", *overrides))
    return run


def evaluate(root: Path, bench: Path, run: Path, *overrides: str) -> ScoresRecord:
    run_evaluation(compose_rooted("evaluate", root, bench, f"run={run}", "protocol=black_box", *overrides))
    out = root / "outputs" / "eval" / DATASET / run.name
    written = [p for p in (out / SCORES_FILE, partial_dir(out) / PARTIAL_SCORES_FILE) if p.is_file()]
    return ScoresRecord.load(max(written, key=lambda p: p.stat().st_mtime_ns))  # a partial one goes apart


def stored_images(bench: Path, split: str = "test", surrogate: str | None = None) -> list[bytes]:
    data = ImageSplit(load_split(str(bench), DATASET, split, surrogate=surrogate), 32)
    return split_images(data, len(data))


def all_images(bench: Path) -> list[bytes]:
    splits = [("test", None), ("common", None), (CONTROL_SPLIT, None)] + [(s, SURROGATE) for s in TRANSFER_SPLITS]
    return [image for split, surrogate in splits for image in stored_images(bench, split, surrogate)]


def distinct_images(bench: Path) -> int:
    return len(set(all_images(bench)))


# ------------------------------------------------------------------------------------- the black-box protocol
def test_api_model_scores_what_the_served_model_scores_image_by_image(tmp_path, bench, served_run, server):
    run = api_run(tmp_path, bench, server.base_url, "api_tiny", "model.answer_format=text")  # choice: below
    model, meta = load_with_meta(run)
    assert isinstance(model, ChatClassifier) and meta["family"] == "api" and not (run / "model.safetensors").exists()
    assert meta["api"]["base_url"] == server.base_url and meta["class_names"] == CLASS_NAMES

    before = server.requests.count()
    record = evaluate(tmp_path, bench, run)
    asked = server.requests.images[before:]
    # one request per distinct image: the unmodified transfer rows are the test images, asked once
    assert len(asked) == len(set(asked)) == distinct_images(bench) < N_IMAGES * 9
    direct = evaluate(tmp_path, bench, served_run)
    assert record.black_box.complete and record.black_box.score == pytest.approx(direct.black_box.score)
    for setting in record.black_box.names:
        assert record.black_box.settings[setting] == direct.black_box.settings[setting], setting
    ours = pd.read_parquet(tmp_path / "outputs" / "eval" / DATASET / run.name / "predictions.parquet")
    theirs = pd.read_parquet(tmp_path / "outputs" / "eval" / DATASET / served_run.name / "predictions.parquet")
    assert len(set(theirs["pred_test"])) > 2  # a model that tells images apart, so the comparison means something
    for column in ["pred_test", "pred_common"] + [f"correct_{SURROGATE}_{s}" for s in TRANSFER_SPLITS]:
        assert ours[column].tolist() == theirs[column].tolist(), column
    assert ours["parsed_test"].tolist() == [CLASS_NAMES[p] for p in theirs["pred_test"]]
    assert ours["answer_test"].tolist() == ours["parsed_test"].tolist()  # rgb-serve answers with the class name

    # white-box settings are n/a, never 0; the record keeps what the requests cost
    assert all(record.white_box.settings[f"autoattack_{n}"] is None for n in ("l1", "l2", "linf"))
    assert record.white_box_na == "API model" and record.api.total["requests"] == len(asked)
    assert record.api.total["unparsed"] == 0 and not record.api.partial
    table = format_table(record)
    assert "n/a (API model)" in table and "0 unparsed (0.0% of" in table and f"{len(asked)} sent" in table

    # a re-run asks nothing and scores the same
    again = evaluate(tmp_path, bench, run)
    assert server.requests.count() == before + len(asked)
    assert again.black_box.score == record.black_box.score and again.api.total["requests"] == 0

    # leaderboards: black-box ranks both by their own Sum; white-box never mixes the API model in
    pool = find_records([tmp_path / "outputs" / "eval"])
    black = build_leaderboard(pool, "black_box", [DATASET], "sum")
    assert {r.model for r in black.rows} == {run.name, served_run.name}
    white = build_leaderboard(pool, "white_box", [DATASET])
    assert [r.model for r in white.rows] == [served_run.name] and white.not_applicable == {run.name: "n/a (API model)"}
    assert "n/a (API model)" in to_markdown(white)


def test_an_api_model_cannot_be_attacked(tmp_path, bench, server):
    from rgb.commands.attack import attack_from_config

    run = api_run(tmp_path, bench, server.base_url)
    with pytest.raises(AttackRunError, match="cannot be white-box attacked"):
        attack_from_config(compose_rooted("attack", tmp_path, bench, f"run={run}", "progress=false"), threads=1)


# -------------------------------------------------------------------------------------------------- manners
def classifier(base_url: str, **client) -> ChatClassifier:
    return ChatClassifier(EndpointSettings(base_url, "tiny"), ClientSettings(**client), CLASS_NAMES, DATASET)


def test_faults_drive_retries_and_abstentions(tmp_path, bench, served_run):
    images = stored_images(bench)
    faults = Faults(rate_limit_every=3, retry_after_s=0.05, error_every=5, slow_every=7, slow_s=1.5,
                    malformed_every=11)
    with Running(served_run, faults=faults) as running:
        model = classifier(running.base_url, max_concurrency=1, timeout_s=0.5, backoff_s=0.01, max_retries=5)
        cache = AnswerCache(tmp_path / "cache.jsonl")
        answers, stats = model.answer(images, cache)
        served = running.requests.faults
        assert served["rate_limit"] and served["error"] and served["slow"] and served["malformed"]
        assert stats.retries == served["rate_limit"] + served["error"] + served["slow"]
        assert stats.backoff_s >= 0.05 * served["rate_limit"]  # Retry-After honoured
        assert stats.requests == len(images) and stats.unparsed == served["malformed"]
        assert sum(a.pred is None for a in answers) == served["malformed"]
        assert running.requests.count() == len(images) + stats.retries
        count = running.requests.count()
        again, stats = model.answer(images, cache)  # everything cached, abstentions included: nothing asked
        assert running.requests.count() == count and stats.requests == 0 and stats.cached == len(images)
        assert [a.text for a in again] == [a.text for a in answers]


def test_refusals_are_one_line_naming_endpoint_and_model_never_the_key(tmp_path, bench, served_run, monkeypatch):
    image = stored_images(bench)[0]
    secret = "sk-test-0123456789abcdef"
    with Running(served_run, api_key="right-key") as running:
        monkeypatch.setenv(KEY_ENV, secret)
        model = classifier(running.base_url, api_key_env=KEY_ENV, max_retries=0)
        with raises_one_line(EndpointError) as refused:
            model.answer([image], AnswerCache(tmp_path / "a.jsonl"))
        message = str(refused.value)
        assert running.base_url in message and "'tiny'" in message and "401" in message
        assert secret not in message and KEY_ENV in message
        monkeypatch.setenv(KEY_ENV, "right-key")
        other = ChatClassifier(EndpointSettings(running.base_url, "gpt-nothing"), ClientSettings(api_key_env=KEY_ENV),
                              CLASS_NAMES, DATASET)
        with pytest.raises(EndpointError, match="404.*does not exist"):
            other.answer([image], AnswerCache(tmp_path / "b.jsonl"))
    # the server is gone now: nothing answers, so one quick second try and one line, whatever max_retries says
    dead = classifier(running.base_url, max_retries=6, backoff_s=0.01, timeout_s=1)
    with raises_one_line(EndpointError, match=r"gave up after 2 attempts, last: cannot connect \(.*refused"):
        dead.answer([image], AnswerCache(tmp_path / "c.jsonl"))


def test_the_key_never_reaches_a_file(tmp_path, bench, served_run, monkeypatch):
    secret = "sk-never-written-5f2c9e"
    monkeypatch.setenv(KEY_ENV, secret)
    with Running(served_run, api_key=secret) as running:
        run = api_run(tmp_path, bench, running.base_url, "api_keyed", f"model.api_key_env={KEY_ENV}")
        record = evaluate(tmp_path, bench, run, "max_images=4", "allow_partial=true")
        assert record.api.total["requests"] > 0
    written = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert any(p.suffix == ".jsonl" for p in written) and any(p.name == "model.json" for p in written)
    assert not [p for p in written if secret.encode() in p.read_bytes()]


# ------------------------------------------------------------------------------------ dry run, max_requests
def test_dry_run_counts_and_max_requests_stops_partial_then_resumes(tmp_path, bench, served_run, caplog):
    with Running(served_run) as running:
        run = api_run(tmp_path, bench, running.base_url)
        distinct = distinct_images(bench)
        with caplog.at_level("INFO"):
            assert run_evaluation(compose_rooted("evaluate", tmp_path, bench, f"run={run}", "dry_run=true")) is None
        assert f": {distinct} distinct requests to send" in caplog.text and running.requests.count() == 0
        plan = json.loads(next(tmp_path.rglob("*.dry_run.json")).read_text())
        assert plan["requests"] == distinct == sum(row["requests"] for row in plan["splits"].values())
        assert plan["prompt_tokens"] > 0 and plan["usd"] is None and "no price known" in caplog.text
        assert not (tmp_path / "outputs" / "eval").exists()

        caplog.clear()
        with caplog.at_level("INFO"):
            partial = evaluate(tmp_path, bench, run, "max_requests=30")
        assert running.requests.count() == 30 and partial.api.partial
        assert partial.white_box.settings["test"].partial is False  # test's 24 images came first, all answered
        assert partial.white_box.settings["common"].partial and partial.white_box.settings["common"].total == 6
        unanswered = int(partial.api.total["unanswered"])
        header = format_table(partial).splitlines()[0]  # what made it partial: the cap, never "the first None"
        assert header.endswith(f"PARTIAL: {unanswered} images not asked yet (max_requests=30 reached))")
        assert partial.api.stopped_by == "max_requests=30" and "None" not in header
        warning = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("PARTIAL evaluation"))
        named = Path(warning.split(": written to ")[1].split(";")[0])
        assert named.is_file() and named == partial_dir(tmp_path / "outputs" / "eval" / DATASET / run.name) / \
            PARTIAL_SCORES_FILE  # a file that exists, not the staging copy it was written in
        caplog.clear()
        with caplog.at_level("INFO"):
            run_evaluation(compose_rooted("evaluate", tmp_path, bench, f"run={run}", "dry_run=true"))
        assert f": {distinct - 30} distinct requests to send" in caplog.text

        whole = evaluate(tmp_path, bench, run)
        assert running.requests.count() == distinct == len(set(running.requests.images))  # nothing asked twice
        assert not whole.api.partial and whole.black_box.complete


def test_max_requests_below_one_sends_nothing(tmp_path, bench, server):
    run = api_run(tmp_path, bench, server.base_url)
    before = server.requests.count()
    with pytest.raises(ConfigValueError) as refused:
        evaluate(tmp_path, bench, run, "max_requests=-1")
    assert cli._error_line(refused.value).startswith("invalid value: max_requests must be null")
    assert server.requests.count() == before and not (tmp_path / "outputs" / "api_cache").exists()


def test_max_cost_needs_a_price(tmp_path, bench, server):
    run = api_run(tmp_path, bench, server.base_url)
    before = server.requests.count()
    with raises_one_line(ConfigValueError, "max_cost needs the model's price"):
        evaluate(tmp_path, bench, run, "max_cost=1")
    assert server.requests.count() == before and not (tmp_path / "outputs" / "api_cache").exists()


def test_spent_is_what_was_sent_each_answer_once_and_a_resumed_run_totals_as_an_uninterrupted_one(tmp_path, bench,
                                                                                                  server):
    """The bench's transfer splits repeat test images (asked once, used twice): `spent` is the price of the
    requests sent, never of an answer per use. A run stopped by max_cost (never passed, 4 requests in flight)
    and resumed totals what the uninterrupted run does: each answer's bill is in its cache record."""
    priced = api_run(tmp_path, bench, server.base_url, "api_priced", "model.price={input: 1000.0, output: 1000.0}",
                     "model.max_concurrency=4")
    whole = evaluate(tmp_path, bench, priced, "api_cache_dir=" + str(tmp_path / "whole"))
    total = whole.api.total
    sent = (total["prompt_tokens"] + total["completion_tokens"]) * 1000 / 1e6
    assert total["requests"] == distinct_images(bench) < len(all_images(bench)) and not whole.api.partial
    assert whole.api.spent == pytest.approx(sent) and whole.api.list_cost == pytest.approx(sent)
    assert f"${whole.api.spent:.4f} spent" in format_table(whole)

    resumed_cache = "api_cache_dir=" + str(tmp_path / "resumed")
    partial = evaluate(tmp_path, bench, priced, f"max_cost={sent / 3:.6f}", resumed_cache)
    partial_total = partial.api.total
    assert partial.api.partial and 0 < partial_total["requests"] < total["requests"]
    assert (partial_total["prompt_tokens"] + partial_total["completion_tokens"]) * 1000 / 1e6 <= sent / 3
    resumed = evaluate(tmp_path, bench, priced, resumed_cache)
    assert not resumed.api.partial and 0 < resumed.api.total["requests"] < total["requests"]
    assert (resumed.api.spent, resumed.api.list_cost) == pytest.approx((whole.api.spent, whole.api.list_cost))
    saved = json.loads((tmp_path / "outputs" / "eval" / DATASET / priced.name / SCORES_FILE).read_text())
    assert saved["api"]["spent"] == pytest.approx(sent) and saved["api"]["per_split"]["test"]["spent"] > 0


# ------------------------------------------------------------------------------ answer_format=choice
def test_answer_format_choice_asks_rgb_serve_for_an_enum_and_scores_what_the_served_model_scores(
        tmp_path, bench, served_run, server):
    """model.answer_format=choice through the SDK path evaluate.py uses: each request carries the class names'
    json_schema enum, rgb-serve answers the JSON object, read without parsing; another identity (and answer cache)
    than the free-text model's; a reply that ignores the format falls back to the text parser."""
    text_run = api_run(tmp_path, bench, server.base_url, "api_tiny", "model.answer_format=text")
    run = api_run(tmp_path, bench, server.base_url, "api_tiny_choice")  # choice: the default
    model, meta = load_with_meta(run)
    text_model, _ = load_with_meta(text_run)
    assert meta["api"]["answer_format"] == "choice" and "answer_format" not in text_model.describe()["api"]
    assert model.identity_sha256 != text_model.identity_sha256
    enum = model.body(stored_images(bench)[0])["response_format"]["json_schema"]["schema"]["properties"]["answer"]
    assert enum["enum"] == CLASS_NAMES and "response_format" not in text_model.body(stored_images(bench)[0])

    record = evaluate(tmp_path, bench, run)
    direct = evaluate(tmp_path, bench, served_run)
    assert record.black_box.complete and record.black_box.score == pytest.approx(direct.black_box.score)
    assert record.api.total["unparsed"] == 0 and record.api.total["requests"] == distinct_images(bench)
    ours = pd.read_parquet(tmp_path / "outputs" / "eval" / DATASET / run.name / "predictions.parquet")
    theirs = pd.read_parquet(tmp_path / "outputs" / "eval" / DATASET / served_run.name / "predictions.parquet")
    assert [json.loads(a) for a in ours["answer_test"]] == [{"answer": CLASS_NAMES[p]} for p in theirs["pred_test"]]
    assert ours["pred_test"].tolist() == theirs["pred_test"].tolist()

    with Running(served_run, faults=Faults(malformed_every=2)) as running:  # every other reply ignores the format
        fallback = ChatClassifier(EndpointSettings(running.base_url, "tiny", answer_format="choice"),
                                 ClientSettings(max_concurrency=1), CLASS_NAMES, DATASET)
        answers, _ = fallback.answer(stored_images(bench)[:4], AnswerCache(tmp_path / "fallback.jsonl"))
    assert [a.reason for a in answers] == ["class", "unparsed"] * 2 and answers[1].text == MALFORMED_ANSWER


# --------------------------------------------------------------------------------- re-parsing cached answers
def test_a_cache_written_under_parser_1_is_rescored_by_the_chosen_reader_without_a_request(tmp_path, bench, server):
    """An API run made by parser version 1 (its model.json says so) with every answer cached: scoring it again
    re-reads the cached texts with the reader model.answer_parser names (lenient: v3; then strict, the default: v4),
    asks nothing, and records the reader that scored; the lenient one's numbers are under another protocol."""
    run = api_run(tmp_path, bench, server.base_url, "api_tiny", "model.answer_parser=lenient")
    meta = json.loads((run / "model.json").read_text())
    assert "parser_version" not in meta["api"]  # the parser is no part of the model's (or its answers') identity
    meta["api"]["parser_version"] = 1
    (run / "model.json").write_text(json.dumps(meta))
    model, _ = load_with_meta(run)
    # v1: seven, none, none, eight, one (v2 too: "one"; v3: the pronoun names no class; strict: only eight)
    texts = ["It is not seven.", "3", "seven or three", "Answer: **Eight**", "This one is blurry."]
    images = list(dict.fromkeys(all_images(bench)))
    answer_of = {model.request_key(image): texts[i % len(texts)] for i, image in enumerate(images)}
    cache = AnswerCache(cache_path(tmp_path / "outputs" / "api_cache", model))
    for key, text in answer_of.items():
        cache.add({"key": key, "answer": text, "usage": {"prompt_tokens": 1, "completion_tokens": 1}})
    cache.close()

    before = server.requests.count()
    record = evaluate(tmp_path, bench, run)
    assert server.requests.count() == before and record.api.total["requests"] == 0
    assert (record.api.answer_parser, record.api.parser_version) == ("lenient", 3) and record.black_box.complete
    assert record.differences_for("black_box") == ["answer parser lenient v3, card strict"]
    asked = [answer_of[model.request_key(image)] for image in all_images(bench)]
    assert record.api.total["negations"] == asked.count(texts[0]) > 0
    assert record.api.total["alternatives"] == asked.count(texts[2]) > 0
    assert record.api.total["unparsed"] == asked.count(texts[0]) + asked.count(texts[2]) + asked.count(texts[4])
    ours = pd.read_parquet(tmp_path / "outputs" / "eval" / DATASET / run.name / "predictions.parquet")
    parsed = {texts[0]: None, texts[1]: "three", texts[2]: None, texts[3]: "eight", texts[4]: None}
    assert [None if pd.isna(p) else p for p in ours["parsed_test"]] == [parsed[t] for t in ours["answer_test"]]
    negated, offered = asked.count(texts[0]), asked.count(texts[2])
    assert f"{negated} denying a class, {offered} alternatives; answer parser lenient v3; answer format choice)" \
        in format_table(record)
    saved = json.loads((tmp_path / "outputs" / "eval" / DATASET / run.name / SCORES_FILE).read_text())
    assert saved["api"]["parser_version"] == 3 and saved["api"]["per_split"]["test"]["negations"] > 0

    meta["client"]["answer_parser"] = "strict"
    (run / "model.json").write_text(json.dumps(meta))
    strict = evaluate(tmp_path, bench, run)
    assert server.requests.count() == before and (strict.api.answer_parser, strict.api.parser_version) == ("strict", 4)
    assert strict.api.total["unparsed"] == len(asked) - asked.count(texts[3]) and strict.api.total["negations"] == 0
    assert strict.differences_for("black_box") == []


# ------------------------------------------------------------------------------------------ kill -9, resume
@pytest.mark.slow
def test_kill_9_mid_run_then_resume_asks_nothing_twice(tmp_path, bench, served_run):
    with Running(served_run, faults=Faults(slow_every=1, slow_s=0.05)) as running:
        run = api_run(tmp_path, bench, running.base_url, "api_tiny", "model.max_concurrency=2")
        model, _ = load_with_meta(run)
        cache_file = cache_path(tmp_path / "outputs" / "api_cache", model)
        env = {**os.environ, "PYTHONPATH": str(REPO), "RGB_THREADS": "1"}
        child = subprocess.Popen(
            [sys.executable, str(REPO / "evaluate.py"), f"run={run}", "protocol=black_box",
             f"paths.root_dir={tmp_path}", f"paths.mini_dir={bench}"],
            cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and child.poll() is None:
            if cache_file.is_file() and cache_file.read_bytes().count(b"\n") >= 40:
                break
            time.sleep(0.05)
        assert child.poll() is None, "the evaluation ended before it could be killed"
        os.killpg(child.pid, signal.SIGKILL)
        child.wait(timeout=30)
        killed_at = running.requests.count()
        kept = AnswerCache(cache_file).answers  # readable: at most a torn last line, cut off
        assert 40 <= len(kept) <= killed_at
        record = evaluate(tmp_path, bench, run)
        after = running.requests.images[killed_at:]
        key_of = {hashlib.sha256(image).hexdigest(): model.request_key(image) for image in all_images(bench)}
        answered_before = {h for h in running.requests.images[:killed_at] if key_of[h] in kept}
        assert not answered_before & set(after)  # no answer the cache held was asked again
        assert len(after) == len(set(after)) and len(after) <= distinct_images(bench) - len(kept) + 2
    assert record.black_box.complete and not record.api.partial
    direct = evaluate(tmp_path, bench, served_run)
    assert record.black_box.score == pytest.approx(direct.black_box.score)
    assert np.array_equal(
        pd.read_parquet(tmp_path / "outputs" / "eval" / DATASET / run.name / "predictions.parquet")["pred_test"],
        pd.read_parquet(tmp_path / "outputs" / "eval" / DATASET / served_run.name / "predictions.parquet")["pred_test"])
    assert json.loads((run / "model.json").read_text())["family"] == "api"


@pytest.mark.slow
def test_rgb_serve_command_answers_on_localhost(tmp_path, bench, served_run):
    """The console script's code path (rgb.commands.main.serve_main) in a subprocess, port 0, one real request."""
    import httpx

    env = {**os.environ, "PYTHONPATH": str(REPO), "RGB_THREADS": "1"}
    child = subprocess.Popen(
        [sys.executable, "-c", "from rgb.commands.main import serve_main; serve_main()", f"run={served_run}", "port=0",
         "served_name=tiny", f"paths.root_dir={tmp_path}"],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    guard = threading.Timer(180, lambda: os.killpg(child.pid, signal.SIGKILL))
    guard.start()
    try:
        line = ""
        while "serving" not in line and child.poll() is None:
            line = child.stdout.readline()
        url = line.split(" at ")[1].split()[0]
        assert url.startswith("http://127.0.0.1:") and url.endswith("/chat/completions")
        image = stored_images(bench)[0]
        reply = httpx.post(url, json=classifier(url.removesuffix("/chat/completions")).body(image), timeout=30)
        content = reply.json()["choices"][0]["message"]["content"]  # answer_format=choice, the default
        assert reply.status_code == 200 and json.loads(content)["answer"] in CLASS_NAMES
    finally:
        guard.cancel()
        os.killpg(child.pid, signal.SIGTERM)
        child.wait(timeout=30)


def test_the_reasoning_preset_sends_no_temperature_nor_max_tokens(tmp_path, bench):
    """model=api_reasoning: max_completion_tokens and reasoning_effort in every request, recorded in model.json."""
    import json

    from rgb.models import load

    run = tmp_path / "outputs" / "train" / DATASET / "reasoning"
    train(compose_rooted("train", tmp_path, bench, "model=api_reasoning", "model.base_url=http://127.0.0.1:9/v1",
                         "model.api_model=o-tiny", "model.name=reasoning", f"run_dir={run}",
                         "model.check_endpoint=false"))  # nothing listens on port 9
    api = json.loads((run / "model.json").read_text())["api"]
    assert api["request"] == {"max_completion_tokens": 2048, "reasoning_effort": "low"}
    assert api["temperature"] is None and api["max_tokens"] is None
    model = load(run)
    body = model.body(stored_images(bench)[0])
    assert "temperature" not in body and "max_tokens" not in body and body["reasoning_effort"] == "low"
    assert model.client_settings.retry_max_tokens == 8192


# ---------------------------------------------------------------- no secret on disk (issues 44, 51: admitted)
SECRET = "SECRET123"


def marked_names() -> tuple[str, str, str, str]:
    """A query parameter and a header named at random (so no list of secret names can know them), and a marker
    value for each."""
    tag = uuid.uuid4().hex[:10]
    return f"p{tag}", f"X-H{tag}", f"MARKQ{tag}", f"MARKH{tag}"


def test_secrets_declared_by_their_variables_are_sent_and_never_written(tmp_path, bench, served_run, monkeypatch,
                                                                        caplog):
    """A real API run end to end with a query parameter and a header of random names declared secret
    (`model.query_env` / `model.header_env`: read from the environment) beside public ones (`?api-version=`,
    `model.query`, `model.headers`): train, evaluate with W&B offline, the pool's leaderboard and site (of a
    scores.json written before these rules with secrets in its base_url's query, too). The request carries them;
    model.json records the variables' names only; no file written and no log line holds a secret."""
    param, header, query_mark, header_mark = marked_names()
    monkeypatch.setenv(KEY_ENV, SECRET)
    monkeypatch.setenv("RGB_TEST_QUERY_SECRET", query_mark)
    monkeypatch.setenv("RGB_TEST_HEADER_SECRET", header_mark)
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.chdir(tmp_path)
    import wandb

    with Running(served_run, api_key=SECRET) as running, caplog.at_level(logging.DEBUG):
        url = f"{running.base_url}?api-version=2024"
        # quoted: Hydra's override grammar reads '=' and '&'
        run = api_run(tmp_path, bench, f"'{url}'", "api_query", f"model.api_key_env={KEY_ENV}",
                      "model.headers={X-Team: vision}", "model.query={deployment: eu}",
                      f"model.query_env={{{param}: RGB_TEST_QUERY_SECRET}}",
                      f"model.header_env={{{header}: RGB_TEST_HEADER_SECRET}}")
        model, meta = load_with_meta(run)
        assert meta["api"]["base_url"] == url and meta["api"]["query"] == {"deployment": "eu"}
        assert meta["client"]["headers"] == {"X-Team": "vision"}
        assert meta["client"]["query_env"] == {param: "RGB_TEST_QUERY_SECRET"}
        assert meta["client"]["header_env"] == {header: "RGB_TEST_HEADER_SECRET"}
        assert model.endpoint.address() == (running.base_url,
                                            {"api-version": "2024", "deployment": "eu", param: query_mark},
                                            {"X-Team": "vision", header: header_mark})
        record = evaluate(tmp_path, bench, run, "max_images=4", "allow_partial=true", "wandb.enabled=true",
                          "wandb.project=rgb-tests")
        assert record.api.total["requests"] > 0  # rgb-serve took the key: the Authorization bearer
        scored = partial_dir(tmp_path / "outputs" / "eval" / DATASET / run.name) / PARTIAL_SCORES_FILE
        wandb.teardown()
        marks = (SECRET, query_mark, header_mark)
        assert not [p for p in tmp_path.rglob("*") if p.is_file() and any(m.encode() in p.read_bytes() for m in marks)]
        # a record written before these rules (secrets in its base_url's query) is published without them
        scored.write_text(scored.read_text().replace(f"{url}", f"{url}&key={SECRET}&{param}={query_mark}"))
        assert query_mark in scored.read_text()
        run_evaluation(compose_rooted("evaluate", tmp_path, bench, f"pool=[{scored}]",
                                      "protocol=black_box", f"leaderboard_datasets=[{DATASET}]", "site=true",
                                      "allow_partial=true", "wandb.enabled=true", "wandb.project=rgb-tests"))
    wandb.teardown()  # W&B's service has written its files
    written = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert any(p.name == "index.html" for p in written) and any(p.suffix == ".wandb" for p in written)
    assert any(p.name == "model.json" for p in written) and any(p.name == SCORES_FILE for p in written)
    assert not [p for p in written if p != scored and any(m.encode() in p.read_bytes() for m in marks)]
    assert not [m for m in marks if m in caplog.text]


def test_a_secret_recorded_as_redacted_is_refused_with_how_to_declare_it(tmp_path):
    """A model.json written before issue 51 recorded a secret query parameter or header as REDACTED and sent the
    API key in its place; rgb no longer does: its load is one line naming the file, the parameter and
    model.query_env / model.header_env (only the user knows which variable holds that secret, so it is not mapped)."""
    from rgb.models import load

    old = json.loads((REPO / "tests" / "records" / "chat_model_before_issue45" / "model.json").read_text())
    for api, client, where in (({"base_url": "http://127.0.0.1:1/v1?key=REDACTED&api-version=1"}, {},
                                "model.query_env={key: ENV_VAR}"),
                               ({}, {"headers": {"X-Api-Key": "REDACTED"}}, "model.header_env={X-Api-Key: ENV_VAR}")):
        (tmp_path / "model.json").write_text(json.dumps({**old, "api": {**old["api"], **api},
                                                         "client": {**old["client"], **client}}))
        with raises_one_line(ConfigValueError, match=re.escape(f"{tmp_path / 'model.json'}: ")) as refused:
            load(tmp_path)
        assert where in str(refused.value) and "recorded as REDACTED" in str(refused.value)


def test_a_query_parameter_not_known_public_is_refused_before_anything_is_written(tmp_path, bench, monkeypatch):
    """`model.base_url` with a parameter of a random name (a key under a name no list has: Azure Functions'
    `?code=`, `?pass=`, ...), or `model.headers` with a header whose name says secret: train.py stops in one line
    that says where it goes, without its value, and writes no model.json; `api-version` (public) is kept."""
    param, _, mark, _ = marked_names()
    base = "http://127.0.0.1:1/v1"
    monkeypatch.chdir(tmp_path)
    for override, where in ((f"model.base_url='{base}?api-version=1&{param}={mark}'",
                             f"model.query_env={{{param}: ENV_VAR}}"),
                            (f"model.base_url='{base}?code={mark}'", "model.query_env={code: ENV_VAR}"),
                            (f"model.headers={{X-Pass: {mark}}}", "model.header_env={X-Pass: ENV_VAR}"),
                            (f"model.headers={{Proxy-Authorization: Basic {mark}}}",
                             "model.header_env={Proxy-Authorization: ENV_VAR}")):
        run = tmp_path / "outputs" / "r"
        cfg = compose_rooted("train", tmp_path, bench, "model=api_chat", f"model.base_url={base}",
                             "model.api_model=tiny", override, f"run_dir={run}", "model.check_endpoint=false")
        with raises_one_line(UserError, match=re.escape(where)) as refused:
            train(cfg)
        assert mark not in str(refused.value)
        assert not [p for p in tmp_path.rglob("*") if p.is_file() and mark.encode() in p.read_bytes()]
        assert not (run / "model.json").exists()
    assert EndpointSettings(f"{base}?api-version=1", "tiny").base_url == f"{base}?api-version=1"


@pytest.mark.slow
@pytest.mark.parametrize("given, where", [
    ("model.base_url=http://user:{mark}@127.0.0.1:1/v1", "user:password@"),
    ("model.base_url='http://127.0.0.1:1/v1?{param}={mark}'", "model.query_env={{{param}: ENV_VAR}}"),
    ("model.headers={{X-Pass: {mark}}}", "model.header_env={{X-Pass: ENV_VAR}}"),
])
def test_credentials_in_the_url_are_refused_in_one_line_without_showing_them(tmp_path, bench, given, where):
    """`train.py model=api_chat` with credentials in the URL, a query parameter of a random name (not known
    public), or a typed header whose name says secret, the real command: one line naming the key and where the
    value belongs, the value not shown, nothing written holds it (Hydra's log of the composed config included)."""
    param, _, mark, _ = marked_names()
    shown = subprocess.run([sys.executable, str(REPO / "train.py"), "model=api_chat", "model.api_model=tiny",
                            "model.base_url=http://127.0.0.1:1/v1", given.format(mark=mark, param=param),
                            f"paths.mini_dir={bench}", f"paths.output_dir={tmp_path / 'out'}"],
                           cwd=tmp_path, capture_output=True, text=True,
                           timeout=600, env={**os.environ, "PYTHONPATH": str(REPO)})
    lines = [line for line in (shown.stdout + shown.stderr).splitlines() if line.strip()]
    assert shown.returncode != 0 and len(lines) == 1, lines[-5:]
    assert where.format(param=param) in lines[0] and mark not in lines[0]
    assert not [p for p in tmp_path.rglob("*") if p.is_file() and mark.encode() in p.read_bytes()]
    assert not list(tmp_path.rglob("model.json"))
    # the log was written (and holds no secret), but for a URL with credentials: its rule is train.py's schema's,
    # so it is refused before Hydra starts, where nothing at all is written
    logs = [p for p in tmp_path.rglob("*.log") if "composed config" in p.read_text()]
    assert bool(logs) == ("user:" not in given), logs


def test_credentials_in_a_model_json_url_are_refused_without_showing_them():
    with raises_one_line(ConfigValueError, match="without user:password@") as refused:  # on a model.json's load
        EndpointSettings(f"https://key:{SECRET}@api.example.com/v1", "tiny")
    assert SECRET not in str(refused.value)


@pytest.mark.parametrize("overrides, message", [
    (["model.max_concurrency=0"], "model.max_concurrency must be an integer >= 1, got 0"),
    (["model.base_url=ftp://host/v1"], "model.base_url must be an http(s) URL"),
    (["model.api_model=''"], "model.api_model must be the endpoint's model name"),
])
def test_train_py_refuses_a_bad_model_value_as_a_user_error(overrides, message, tmp_path, bench):
    """The entry point prints only a UserError as one line (anything else keeps its traceback)."""
    given = {o.split("=")[0] for o in overrides}
    defaults = [o for o in ("model.base_url=http://127.0.0.1:1/v1", "model.api_model=tiny")
                if o.split("=")[0] not in given]
    cfg = compose_rooted("train", tmp_path, bench, "model=api_chat", *defaults, *overrides, f"run_dir={tmp_path / 'r'}")
    with raises_one_line(UserError, match=re.escape(message)):
        train(cfg)


def test_the_readmes_request_and_headers_overrides_compose():
    """README's `model.request='{...}'` and `model.headers='{...}'` (the shell drops the quotes), through the
    command's own compose check and then Hydra's compose."""
    argv = ["model=api_chat", "model.base_url=http://127.0.0.1:8000/v1", "model.api_model=zs_cpe",
            "model.request={max_completion_tokens: 2048, reasoning_effort: low}", "model.headers={X-Team: vision}",
            "model.header_env={X-Functions-Key: FN_KEY}", "model.query={deployment: eu}",
            "model.query_env={code: FN_CODE}"]
    assert cli._compose_error("train", argv) is None
    cfg = helpers.compose_config("train", *argv)
    settings, client = split_config(helpers.resolved(cfg.model))
    assert settings.request == {"max_completion_tokens": 2048, "reasoning_effort": "low"}
    assert client.headers == {"X-Team": "vision"} and client.header_env == {"X-Functions-Key": "FN_KEY"}
    assert settings.query == {"deployment": "eu"} and client.query_env == {"code": "FN_CODE"}
    plain = split_config(helpers.resolved(helpers.compose_config("train", *argv[:3]).model))
    assert plain[0].request == {} and plain[1].headers == {}  # the defaults: none
