"""Every file rgb reads back has one reader that validates it (issue 51.6): scores.json, summary.json, model.json,
answer cache lines, the Batch state file and rgb-serve's batch objects. Each malformation (a list where an object
belongs, a null, a value of another type, a list where an object field belongs, invalid JSON, a directory where
the file belongs) read through the public entry is one line naming the file and what to do: never a traceback,
never a wrong number."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import pytest
from helpers import compose_config, datamodule, expectation, raises_one_line, record, save_pool, scoring, write_attack

from rgb.core.errors import UserError
from rgb.evaluation.model_eval import EvaluationError, read_attack


@dataclass
class Kind:
    """A file kind: how to write a valid one (returns its path), the fields each malformation changes (a path of
    keys), how rgb reads it back (its public entry), and the error and advice a bad one gives."""

    write: Callable[[Path, dict], Path]
    null: list
    other_type: tuple[list, object]
    list_for_object: list
    read: Callable[[Path, dict], object]
    error: type[Exception]
    advice: str


def _scores(tmp: Path, _) -> Path:
    save_pool([record("m", "d1", [0.9, 0.8, 0.3, 0.2, 0.1])], tmp / "eval")
    return tmp / "eval" / "d1" / "m" / "scores.json"


def _pool(tmp: Path, _):
    from rgb.commands.evaluate import run_evaluation

    return run_evaluation(compose_config("evaluate", f"pool=[{tmp / 'eval'}]", "leaderboard_datasets=[d1]",
                                         f"leaderboard_dir={tmp / 'board'}"))


def _summary(tmp: Path, fixtures: dict) -> Path:
    write_attack(tmp / "attack", "linf", fixtures["run"], fixtures["dm"], np.ones(200, dtype=bool),
                 fixtures["clean_pred"])
    return tmp / "attack" / "linf" / "summary.json"


def _attack(tmp: Path, fixtures: dict):
    return read_attack("linf", scoring(tmp / "attack", tmp / "o"),
                       expectation(fixtures["run"], fixtures["dm"], fixtures["clean_pred"]))


def _model(tmp: Path, fixtures: dict) -> Path:
    shutil.copytree(fixtures["run"], tmp / "run")
    return tmp / "run" / "model.json"


def _load_model(tmp: Path, _):
    from rgb.models import load_with_meta

    return load_with_meta(tmp / "run")


def _cache(tmp: Path, _) -> Path:
    path = tmp / "answers.jsonl"
    path.write_text(json.dumps({"key": "a", "answer": "one", "usage": {"prompt_tokens": 3, "completion_tokens": 1},
                                "finish_reason": "stop"}) + "\n")
    return path


def _reread_cache(tmp: Path, _):
    from rgb.endpoints.cache import AnswerCache

    return AnswerCache(tmp / "answers.jsonl")


def _state(tmp: Path, _) -> Path:
    path = tmp / "cache.jsonl.batches.json"
    path.write_text(json.dumps({"pending": [{"input_file_id": "file-1", "batch_id": "batch-1", "keys": ["k"]}]}))
    return path


def _resume_batches(tmp: Path, _):
    from rgb.endpoints.batch import BatchState

    return BatchState(tmp / "cache.jsonl")


def _served_batch(tmp: Path, _) -> Path:
    (tmp / "batches").mkdir()
    path = tmp / "batches" / "batch_1.json"
    path.write_text(json.dumps({"id": "batch_1", "object": "batch", "status": "completed"}))
    return path


def _restart_server_store(tmp: Path, _):
    from rgb.serve.batch import BatchStore

    return BatchStore(tmp / "batches")


def _kinds() -> dict[str, Kind]:
    from rgb.endpoints.cache import CacheError
    from rgb.models.io import ExportFileError
    from rgb.serve.batch import BatchStoreError

    return {
        "scores.json": Kind(_scores, ["n_test"], (["white_box", "settings", "test", "correct"], "87"),
                            ["white_box"], _pool, EvaluationError, "re-run evaluate.py"),
        "summary.json": Kind(_summary, ["n_robust"], (["n_robust"], "12"), ["accuracy_after"], _attack,
                             EvaluationError, "merge_only=true"),
        "model.json": Kind(_model, ["num_classes"], (["num_classes"], "10"), ["card"], _load_model, ExportFileError,
                           "export the model again"),
        "answer cache": Kind(_cache, ["answer"], (["usage", "prompt_tokens"], "12"), ["usage"], _reread_cache,
                             CacheError, "fresh cache"),
        "batch state": Kind(_state, ["pending", 0, "keys"], (["pending", 0, "batch_id"], 12), ["pending", 0],
                            _resume_batches, CacheError, "move it away"),
        "serve batch": Kind(_served_batch, ["status"], (["id"], 12), [], _restart_server_store, BatchStoreError,
                            "move it out of"),
    }


def _set(data, keys: list, value):
    if not keys:
        return value
    target = data
    for key in keys[:-1]:
        target = target[key]
    target[keys[-1]] = value
    return data


def _malform(path: Path, how: str, kind: Kind) -> None:
    text = path.read_text()
    lines = text.endswith("\n")  # the answer cache: one JSON value per line
    data = json.loads(text)
    if how == "a directory":
        path.unlink()
        path.mkdir()
        return
    if how == "invalid JSON":
        changed = text[: len(text) // 2].rstrip("\n")
    else:
        value = {"a list for the file": lambda: [data],
                 "a null": lambda: _set(data, kind.null, None),
                 "another type": lambda: _set(data, kind.other_type[0], kind.other_type[1]),
                 "a list for an object": lambda: _set(data, kind.list_for_object, [])}[how]()
        changed = json.dumps(value)
    path.write_text(changed + ("\n" if lines else ""))


MALFORMATIONS = ["a list for the file", "a null", "another type", "a list for an object", "invalid JSON",
                 "a directory"]


@pytest.fixture(scope="module")
def fixtures(tiny_run, mini_dir, clean_pred):
    return {"run": tiny_run, "dm": datamodule(mini_dir), "clean_pred": clean_pred}


@pytest.mark.parametrize("how", MALFORMATIONS)
@pytest.mark.parametrize("name", ["scores.json", "summary.json", "model.json", "answer cache", "batch state",
                                  "serve batch"])
def test_a_malformed_file_is_one_line_naming_it(tmp_path, fixtures, name, how):
    kind = _kinds()[name]
    path = kind.write(tmp_path, fixtures)
    kind.read(tmp_path, fixtures)  # the valid file reads
    _malform(path, how, kind)
    with raises_one_line(kind.error) as refused:
        kind.read(tmp_path, fixtures)
    message = str(refused.value)
    assert isinstance(refused.value, UserError) and str(path) in message and kind.advice in message, message


def test_a_number_is_never_coerced_from_another_type(tmp_path):
    """`true` where a count belongs was read as 1, "87" as 87: a record either holds numbers or is refused."""
    from rgb.evaluation.records import RecordError, ScoresRecord

    path = _scores(tmp_path, None)
    for value in (True, "87", 87.5, [87]):
        data = json.loads(path.read_text())
        data["white_box"]["settings"]["test"]["correct"] = value
        path.write_text(json.dumps(data))
        with raises_one_line(RecordError, "white_box.settings.test.correct is"):
            ScoresRecord.load(path)
    data["white_box"]["settings"]["test"]["correct"] = 87.0  # a whole number written as a float is that number
    path.write_text(json.dumps(data))
    assert ScoresRecord.load(path).white_box.settings["test"].correct == 87
