"""The `api` family's Batch path (rgb/endpoints/batch.py, `model.batch=true`) against a real rgb-serve on 127.0.0.1
and its Files and Batches endpoints: the same predictions and the same cache records as the online path; a run
killed after the upload or after the batch's creation resumes it without submitting an image twice; lines the
batch failed and answers cut by the token limit are not cached (unanswered, asked again by the next run); requests
above a batch's limit go in several batches. The served model is a two-class module on 8x8 images, in a thread of
this process."""

import io
import json

import pytest
import torch
from PIL import Image

from helpers import raises_one_line, serving
from rgb.endpoints import batch as api_batch
from rgb.endpoints.settings import EndpointSettings, ClientSettings
from rgb.models.chat import ChatClassifier
from rgb.endpoints.cache import AnswerCache, CacheError
from rgb.endpoints.client import EndpointError, RequestBudget
from rgb.endpoints.cost import Price
from rgb.serve import Faults, ModelServer, ServeRequest

NAME = "tiny"
CLASSES = ["dark", "bright"]
TIMEOUT = 20
VALUES = [10, 250, 30, 240, 10, 200, 60, 180, 250]  # 7 distinct images, two of them twice


class Brightness(torch.nn.Module):
    """Class 1 ("bright") when the image's mean is above 1/2."""

    def forward(self, x):
        mean = x.mean((1, 2, 3))
        return torch.stack([0.5 - mean, mean - 0.5], 1)


def png(value: int) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (8, 8), (value, value, value)).save(out, format="PNG")
    return out.getvalue()


IMAGES = [png(v) for v in VALUES]
EXPECTED = [int(v > 127) for v in VALUES]


def running(tmp_path, **kwargs):
    """The served model in a thread until the block ends; its batch files under tmp_path."""
    request = ServeRequest(image_size=8, served_name=NAME, batch_dir=tmp_path / "served", **kwargs)
    return serving(ModelServer(Brightness(), CLASSES, request), TIMEOUT)


def classifier(server: ModelServer, batch: bool, **api) -> ChatClassifier:
    settings = EndpointSettings(base_url=server.base_url, api_model=NAME, **api)
    client = ClientSettings(batch=batch, batch_poll_s=0.02, batch_wait_s=TIMEOUT, max_retries=0, timeout_s=TIMEOUT)
    return ChatClassifier(settings, client, CLASSES, "tiny")


def records(path) -> dict:
    return {r["key"]: r for r in map(json.loads, path.read_text().splitlines())}


def inputs_and_batches(server: ModelServer) -> tuple[int, int]:
    """The input files uploaded to the server and the batches created on it."""
    store = server.batches
    return sum(f["purpose"] == "batch" for f in store.files.values()), len(store.batches)


@pytest.mark.slow
def test_the_batch_path_caches_the_online_paths_records_and_predictions(tmp_path):
    with running(tmp_path) as server:
        online, online_stats = classifier(server, False).answer(IMAGES, AnswerCache(tmp_path / "online.jsonl"))
        cache = AnswerCache(tmp_path / "batch.jsonl")
        batched, stats = classifier(server, True).answer(IMAGES, cache)
        cache.close()
        assert [a.pred for a in batched] == [a.pred for a in online] == EXPECTED
        batch_records, online_records = records(tmp_path / "batch.jsonl"), records(tmp_path / "online.jsonl")
        billed = {key: record.pop("billed") for key, record in batch_records.items()}
        assert {r.pop("billed")["batch"] for r in online_records.values()} == {False}
        assert batch_records == online_records  # keys and whole records, less how they were billed
        assert {b["batch"] for b in billed.values()} == {True}
        # a priced batch is billed half its list price; the online path its list price
        price = Price(input=1000.0, output=1000.0)
        batch_records = records(tmp_path / "batch.jsonl").values()
        list_cost = sum(map(price.list_cost, batch_records))
        assert sum(map(price.spent, batch_records)) == pytest.approx(list_cost / 2) and list_cost > 0
        assert sum(map(price.spent, records(tmp_path / "online.jsonl").values())) == pytest.approx(list_cost)
        assert (stats.requests, stats.cached, stats.unanswered) == (7, 2, 0) == (online_stats.requests,
                                                                                 online_stats.cached, 0)
        assert (stats.prompt_tokens, stats.completion_tokens) == (online_stats.prompt_tokens,
                                                                  online_stats.completion_tokens)
        assert server.requests.count() == 14 and inputs_and_batches(server) == (1, 1)
        assert not (tmp_path / "batch.jsonl.batches.json").exists()  # a finished, cached batch leaves the state
        again, again_stats = classifier(server, True).answer(IMAGES, AnswerCache(tmp_path / "batch.jsonl"))
        assert [a.pred for a in again] == EXPECTED and again_stats.requests == 0
        assert server.requests.count() == 14 and inputs_and_batches(server) == (1, 1)
        # the re-run's totals: the tokens of the cached answers it used, as the online path counts them
        assert (again_stats.cached_prompt_tokens, again_stats.cached_completion_tokens) == (
            stats.prompt_tokens, stats.completion_tokens)


@pytest.mark.slow
def test_token_and_money_caps_are_refused_with_a_batch(tmp_path):
    """A Batch is billed when it is done: max_tokens_total / max_cost cannot stop it midway, so they are refused
    before anything is uploaded (max_requests caps it)."""
    with running(tmp_path) as server:
        with raises_one_line(EndpointError, "cap it by max_requests"):
            classifier(server, True).answer(IMAGES, AnswerCache(tmp_path / "c.jsonl"), RequestBudget(max_tokens_total=1000))
        assert inputs_and_batches(server) == (0, 0)


class Killed(BaseException):
    """Stands in for a kill at one point of the round trip."""


def kill(*_args, **_kwargs):
    raise Killed


@pytest.mark.slow
@pytest.mark.parametrize("point", ["create", "wait"])  # after the upload / after the batch's creation
def test_a_run_killed_midway_resumes_its_batch_without_submitting_anything_twice(tmp_path, monkeypatch, point):
    with running(tmp_path) as server:
        with monkeypatch.context() as patched:
            patched.setattr(api_batch.BatchRun, point, kill)
            with pytest.raises(Killed):
                classifier(server, True).answer(IMAGES, AnswerCache(tmp_path / "cache.jsonl"))
        state = json.loads((tmp_path / "cache.jsonl.batches.json").read_text())["pending"]
        assert len(state) == 1 and len(state[0]["keys"]) == 7
        assert (state[0]["batch_id"] is None) == (point == "create")
        assert inputs_and_batches(server) == (1, 0 if point == "create" else 1)
        answers, stats = classifier(server, True).answer(IMAGES, AnswerCache(tmp_path / "cache.jsonl"))
        assert [a.pred for a in answers] == EXPECTED and stats.requests == 7
        assert inputs_and_batches(server) == (1, 1) and server.requests.count() == 7
        assert not (tmp_path / "cache.jsonl.batches.json").exists()


@pytest.mark.slow
def test_failed_lines_are_not_cached_and_are_asked_by_the_next_run(tmp_path):
    with running(tmp_path, faults=Faults(error_every=3)) as server:  # every 3rd request: a 500
        answers, stats = classifier(server, True).answer(IMAGES, AnswerCache(tmp_path / "cache.jsonl"))
        failed = {i for i, a in enumerate(answers) if a is None}
        assert len({IMAGES[i] for i in failed}) == 2 and stats.unanswered == len(failed)
        assert stats.requests == 5 and len(records(tmp_path / "cache.jsonl")) == 5
        answers, stats = classifier(server, True).answer(IMAGES, AnswerCache(tmp_path / "cache.jsonl"))
        assert server.requests.count() == 7 + 2 and inputs_and_batches(server) == (2, 2)  # request 9: a 500
        assert stats.requests == 1 and stats.unanswered == sum(a is None for a in answers) > 0
        answers, stats = classifier(server, True).answer(IMAGES, AnswerCache(tmp_path / "cache.jsonl"))
        assert server.requests.count() == 7 + 2 + 1 and inputs_and_batches(server) == (3, 3)
        assert stats.requests == 1 and [a.pred for a in answers] == EXPECTED and len(records(tmp_path /
                                                                                            "cache.jsonl")) == 7


@pytest.mark.slow
def test_answers_cut_by_the_token_limit_are_counted_truncated_not_cached(tmp_path):
    with running(tmp_path) as server:  # max_tokens 1 of free text: "dark" fits, "bright" (2 tokens) is cut to "brig"
        answers, stats = classifier(server, True, max_tokens=1, answer_format="text").answer(
            IMAGES, AnswerCache(tmp_path / "c.jsonl"))
        assert [a is None for a in answers] == [bool(e) for e in EXPECTED]
        assert stats.truncated == sum(EXPECTED) and stats.unanswered == sum(EXPECTED)
        assert {r["answer"] for r in records(tmp_path / "c.jsonl").values()} == {"dark"}


@pytest.mark.slow
def test_requests_above_a_batchs_limit_go_in_several_batches(tmp_path, monkeypatch):
    monkeypatch.setattr(api_batch, "MAX_REQUESTS", 3)  # OpenAI's 50,000, made small
    with running(tmp_path) as server:
        answers, stats = classifier(server, True).answer(IMAGES, AnswerCache(tmp_path / "cache.jsonl"))
        assert [a.pred for a in answers] == EXPECTED and stats.requests == 7
        assert inputs_and_batches(server) == (3, 3) and server.requests.count() == 7


def test_a_damaged_state_file_is_one_line(tmp_path):
    (tmp_path / "cache.jsonl.batches.json").write_text('{"pending": [{"batch_id": "b"}]}')
    with raises_one_line(CacheError, "move it away"):
        api_batch.BatchState(tmp_path / "cache.jsonl")
