"""An API run dir (`train.py model=api_chat`) keeps the identity it was made for, as train and zero-shot run dirs do
(issue 33): a re-run under its name with another endpoint, decoding or prompt is refused in one line and leaves its
model.json alone; the same identity re-runs; the default name tells endpoints apart; the dir is locked while written."""

import json
from pathlib import Path

import pytest
import torch

import helpers
from helpers import raises_one_line
from rgb.core.files import flock
from rgb.core.values import path_name
from rgb.data.mini import DATASET
from rgb.endpoints.client import EndpointError
from rgb.serve import ModelServer, ServeRequest
from rgb.commands.train import train
from rgb.training.config import TrainingError

URL = "http://127.0.0.1:1/v1"  # nothing listens there: these runs skip the endpoint check (model.check_endpoint)


def api_config(root: Path, mini_dir: Path, *overrides: str):
    return helpers.compose_config("train", f"paths.root_dir={root}", f"paths.mini_dir={mini_dir}", "model=api_chat",
                                  "model.api_model=tiny", *overrides)


def api_run(root: Path, mini_dir: Path, *overrides: str) -> Path:
    run = root / "outputs" / "train" / DATASET / "api_tiny"
    train(api_config(root, mini_dir, f"model.base_url={URL}", f"run_dir={run}", "model.check_endpoint=false",
                     *overrides))
    return run


def one_line_refusal(err) -> str:
    message = str(err.value)
    assert "another run_name" in message
    return message


@pytest.mark.parametrize("change, key", [
    ("model.temperature=0.5", "api.temperature"),
    ("model.base_url=http://127.0.0.1:2/v1", "api.base_url"),
    ("model.prompt='Which digit? {classes}'", "api.prompt"),
    ("model.max_tokens=4", "api.max_tokens"),
    ("model.answer_format=text", "api.answer_format"),  # a run made before choice became the default, and back
])
def test_another_identity_under_the_same_name_is_refused_and_model_json_kept(change, key, tmp_path, mini_dir):
    run = api_run(tmp_path, mini_dir)
    before = (run / "model.json").read_bytes()
    with raises_one_line(TrainingError) as err:
        api_run(tmp_path, mini_dir, change)
    assert key in one_line_refusal(err)
    assert (run / "model.json").read_bytes() == before


def test_the_same_identity_re_runs_and_manners_may_change(tmp_path, mini_dir):
    run = api_run(tmp_path, mini_dir)
    first = json.loads((run / "model.json").read_text())
    api_run(tmp_path, mini_dir)
    api_run(tmp_path, mini_dir, "model.max_concurrency=2", "model.timeout_s=5")  # client settings: no new model
    again = json.loads((run / "model.json").read_text())
    assert again["api"] == first["api"] and again["client"]["max_concurrency"] == 2
    assert json.loads((run / "run.json").read_text())["task"] == "api"


def test_a_model_json_without_run_json_is_not_overwritten(tmp_path, mini_dir):
    """A dir made before run.json (or by hand): the config behind its model.json is unknown, so it is kept."""
    run = api_run(tmp_path, mini_dir)
    (run / "run.json").unlink()
    before = (run / "model.json").read_bytes()
    with raises_one_line(TrainingError) as err:
        api_run(tmp_path, mini_dir, "model.temperature=0.5")
    assert "no run.json" in one_line_refusal(err)
    assert (run / "model.json").read_bytes() == before


def test_a_train_run_dir_is_not_taken_for_an_api_run(tmp_path, mini_dir):
    run = tmp_path / "outputs" / "train" / DATASET / "api_tiny"
    run.mkdir(parents=True)
    (run / "run.json").write_text(json.dumps({"task": "train", "identity": {"model.name": "tiny"}, "starts": []}))
    with raises_one_line(TrainingError) as err:
        api_run(tmp_path, mini_dir)
    assert "not an API run record" in one_line_refusal(err) and not (run / "model.json").exists()


def test_a_run_dir_being_written_is_refused(tmp_path, mini_dir):
    run = tmp_path / "outputs" / "train" / DATASET / "api_tiny"
    run.mkdir(parents=True)
    holder = flock(run / "run.lock")  # another process writing this run dir (flock: per open file)
    try:
        with raises_one_line(TrainingError) as err:
            api_run(tmp_path, mini_dir)
    finally:
        holder.close()
    assert "in use" in str(err.value) and not (run / "model.json").exists()


def test_the_default_run_name_tells_endpoints_apart(tmp_path, mini_dir):
    names = [str(api_config(tmp_path, mini_dir, f"model.base_url={url}").run_name) for url in
             ("http://127.0.0.1:8000/v1", "http://127.0.0.1:8001/v1", "https://user:secret@api.example.com/v1")]
    assert names == ["api-tiny@127.0.0.1_8000", "api-tiny@127.0.0.1_8001", "api-tiny@api.example.com"]
    assert all(path_name(name) == name for name in names)


def test_a_model_json_written_before_the_move_to_rgb_endpoints_loads_as_the_same_model(tmp_path):
    """tests/records/chat_model_before_issue45/model.json was written by export_model before the family moved from
    rgb/models/api.py to rgb/models/chat.py (and its settings to rgb.endpoints): family `api`, the same settings,
    the same answer-cache identity, and written back as it was, plus the reader its answers are now read by
    (`client.answer_parser`: strict, the default; no part of the identity)."""
    from rgb.models import export_model, load_with_meta

    old = helpers.REPO / "tests" / "records" / "chat_model_before_issue45"
    model, meta = load_with_meta(old)
    assert meta["family"] == "api" and model.family == "api" and model.class_names == ["bright", "dark"]
    assert (model.settings.answer_format, model.settings.request, model.client_settings.max_concurrency) == (
        "choice", {"seed": 7}, 2)
    assert model.identity_sha256 == "ff78c0a8518d5498c2e917dd84de92c0e2002db68e9ba871bb820b98198890f3"
    written = export_model(model, tmp_path, {"task": meta["task"], "run_name": meta["run_name"]})
    before = json.loads((old / "model.json").read_text())
    assert json.loads(written.read_text()) == {**before, "versions": json.loads(written.read_text())["versions"],
                                               "client": {**before["client"], "answer_parser": "strict"}}


# -- the endpoint check: train.py asks GET /models before it makes the run dir ---------------------------------

KEY_ENV = "RGB_TEST_CHECK_KEY"


def checked_run(root: Path, mini_dir: Path, base_url: str, *overrides: str) -> Path:
    run = root / "api_checked"
    train(api_config(root, mini_dir, f"model.base_url={base_url}", f"run_dir={run}", *overrides))
    return run


def test_an_endpoint_that_serves_the_model_is_checked_and_the_run_dir_made(tmp_path, mini_dir):
    tiny = ServeRequest(image_size=8, served_name="tiny")
    with helpers.serving(ModelServer(torch.nn.Flatten(), ["a", "b"], tiny)) as served:
        run = checked_run(tmp_path, mini_dir, served.base_url)
    assert (run / "model.json").is_file()


@pytest.mark.parametrize("served_name, api_key, pattern", [
    ("other-model", None, r"does not serve model 'tiny'; it serves: other-model \(model.check_endpoint=false"),
    ("tiny", "sk-check", rf"GET /models: HTTP 401: invalid API key; is {KEY_ENV} set to a valid key\?"),
])
def test_a_refusing_endpoint_is_one_line_and_no_run_dir(served_name, api_key, pattern, tmp_path, mini_dir,
                                                         monkeypatch):
    monkeypatch.delenv(KEY_ENV, raising=False)
    server = ModelServer(torch.nn.Flatten(), ["a", "b"],
                         ServeRequest(image_size=8, served_name=served_name, api_key=api_key))
    with helpers.serving(server) as served, raises_one_line(EndpointError, match=pattern):
        checked_run(tmp_path, mini_dir, served.base_url, f"model.api_key_env={KEY_ENV}")
    assert not (tmp_path / "api_checked").exists()


def test_an_unreachable_endpoint_is_one_line_unless_the_check_is_skipped(tmp_path, mini_dir):
    with raises_one_line(EndpointError, match=r"127.0.0.1:1/v1 .*GET /models: cannot reach the endpoint .*"
                                         r"model.check_endpoint=false skips this check"):
        checked_run(tmp_path, mini_dir, URL)
    assert (checked_run(tmp_path, mini_dir, URL, "model.check_endpoint=false") / "model.json").is_file()
