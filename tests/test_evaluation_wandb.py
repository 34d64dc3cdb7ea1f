"""W&B artifacts in offline mode, read back from the run files W&B writes: a pool's leaderboard (its table and
its files, the site too) and an evaluation's scores.json, whose metadata names the weights and the train run."""

from __future__ import annotations

import json
import logging
import re
from dataclasses import replace

import pytest
from helpers import card_protocol, compose_config, record, save_pool

from rgb.commands.evaluate import run_evaluation
from rgb.evaluation.leaderboard import find_records, write_leaderboard
from rgb.evaluation.wandb_report import SKIPPED, log_evaluation, log_leaderboard


@pytest.fixture
def offline(monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    import wandb

    yield
    wandb.teardown()  # the service may still be writing the record file after finish() under load


def _logged(folder) -> bytes:
    import wandb

    wandb.teardown()
    return b"".join(f.read_bytes() for f in folder.rglob("*.wandb"))


def test_the_pool_leaderboard_as_a_table_and_an_artifact(tmp_path, offline, caplog):
    """evaluate.py pool=[...] site=true wandb.enabled=true, through its config half."""
    records = [record("ce", "d1", [0.9, 0.8, 0.0, 0.1, 0.0]), record("trades", "d1", [0.8, 0.7, 0.3, 0.4, 0.3])]
    save_pool(records, tmp_path / "eval")
    out = tmp_path / "leaderboard"
    cfg = compose_config("evaluate", f"pool=[{tmp_path / 'eval'}]", "leaderboard_datasets=[d1]", "site=true",
                         f"leaderboard_dir={out}", "wandb.enabled=true", "wandb.project=rgb-tests")
    with caplog.at_level(logging.INFO):
        run_evaluation(cfg)
    assert f"open {(out / 'site' / 'index.html').resolve().as_uri()} in a browser" in caplog.text
    logged = _logged(out / "wandb")
    board = json.loads((out / "leaderboard.json").read_text())
    assert [row["model"] for row in board["rows"]] == ["trades", "ce"]
    for key in (b"leaderboard-white_box", b"leaderboard.json", b"leaderboard.csv", b"site/index.html",
                b"site/models/trades-", b"trades/borda"):
        assert key in logged, key
    # the table: W&B writes it as a JSON file of the run's media, columns and rows as leaderboard.csv's
    (table_file,) = (out / "wandb").rglob("leaderboard_*.table.json")
    table = json.loads(table_file.read_text())
    assert table["columns"][:2] == ["rank", "model"] and table["data"][0][1] == "trades"
    assert table["data"][0][table["columns"].index("d1/autoattack_linf")] == board["rows"][0]["per_dataset"]["d1"][
        "settings"]["autoattack_linf"]["accuracy"]
    assert caplog.text.count(SKIPPED) == 1


def test_an_evaluation_logs_its_scores_json_as_an_artifact(tmp_path, offline):
    scored = record("ce", "d1", [0.9, 0.8, 0.0, 0.1, 0.0])
    save_pool([scored], tmp_path / "eval")
    folder = tmp_path / "eval" / "d1" / "ce"
    train = {"run_dir": "/runs/ce", "wandb_id": "train-id-123", "weights_sha256": "0"}
    run_dir = log_evaluation(scored, folder, project="rgb-tests", train=train)
    logged = _logged(run_dir)
    for key in (b"scores-ce-d1", b"scores.json", b"train-id-123", b"/runs/ce"):
        assert key in logged, key


def test_runs_whose_names_differ_only_in_unsafe_characters_log_distinct_artifacts(tmp_path, offline):
    # `x 1` and `x_1` were both logged as the artifact scores-x_1-d1 (both scores-x-1-d1-<hash of the name> now): two models' scores as versions of one
    names = set()
    for model in ("x 1", "x_1"):
        scored = record(model, "d1", [0.9, 0.8, 0.0, 0.1, 0.0])
        save_pool([scored], tmp_path / "eval")
        run_dir = log_evaluation(scored, tmp_path / "eval" / "d1" / model, project="rgb-tests")
        names |= set(re.findall(rb"scores-x-1-d1-[0-9a-f]{10}", _logged(run_dir)))
    assert len(names) == 2, names


def test_a_run_under_another_protocol_is_marked_in_its_summary_and_settings_table(tmp_path, offline):
    # an L2 1 (card 2) evaluation logged white_box/score and a settings table with no eps and no status
    scored = replace(record("easy", "caltech101", [0.8, 0.6, 0.3, 0.5, 0.1],
                            protocol=card_protocol("caltech101", l2=1.0)), eps={"l1": 75.0, "l2": 1.0, "linf": 4 / 255})
    save_pool([scored], tmp_path / "eval")
    run_dir = log_evaluation(scored, tmp_path / "eval" / "caltech101" / "easy", project="rgb-tests")
    logged = _logged(run_dir)
    assert b"white_box/status" in logged and b"other protocol (caltech101: L2 1, card 2)" in logged
    (table_file,) = run_dir.rglob("settings_*.table.json")
    table = json.loads(table_file.read_text())
    rows = {row[0]: dict(zip(table["columns"], row)) for row in table["data"]}
    assert rows["autoattack_l2"]["eps"] == 1.0 and rows["test"]["eps"] is None
    assert {row["status"] for row in rows.values()} == {"other protocol (caltech101: L2 1, card 2)"}


def test_a_pool_logs_each_models_status_beside_its_sum(tmp_path, offline):
    records = [record("card", "d1", [0.9, 0.8, 0.0, 0.1, 0.0]),
               record("easy", "d1", [0.9, 0.8, 0.3, 0.5, 0.1], protocol=card_protocol("d1", l2=1.0))]
    save_pool(records, tmp_path / "eval")
    out = tmp_path / "leaderboard"
    board = write_leaderboard(find_records([tmp_path / "eval"]), out, datasets=["d1"])
    logged = _logged(log_leaderboard(board, out, project="rgb-tests"))
    for key in (b"easy/status", b"other protocol (d1: L2 1, card 2)", b"card/status"):
        assert key in logged, key
