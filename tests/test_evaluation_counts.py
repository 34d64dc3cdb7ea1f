"""Counts that mean what they say: a record made at other budgets has no score (printed, W&B, model_info); rows
outside a ranking have no rank and no Borda; a model with nothing measured under a protocol shows and logs no
partial Sum (issue 51.5)."""

from __future__ import annotations

import csv
import io
from pathlib import Path

import pytest
from helpers import card_protocol, record

from rgb.data.catalog import TRANSFER_SPLITS
from rgb.evaluation.leaderboard import NOT_MEASURED_HEADING, build_leaderboard, table_rows, to_csv, to_markdown
from rgb.evaluation.model_eval import format_table
from rgb.evaluation.records import Accuracy
from rgb.evaluation.scores import black_box_score
from rgb.evaluation.site import SiteEntry, write_site
from rgb.evaluation.wandb_report import log_evaluation, log_leaderboard

VALUES = [0.9, 0.8, 0.3, 0.2, 0.1]


@pytest.fixture
def offline(monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    import wandb

    yield
    wandb.teardown()


def _logged(run_dir: Path) -> bytes:
    """What W&B wrote offline: the run's records (its summary keys among them)."""
    import wandb

    wandb.teardown()
    return b"".join(f.read_bytes() for f in run_dir.rglob("*.wandb"))


def _black_box(value: float):
    transfer = {split: {"s": Accuracy(round(value * 100), 100)} for split in TRANSFER_SPLITS}
    return black_box_score(Accuracy(90, 100), Accuracy(80, 100), transfer, None)


@pytest.mark.parametrize("budgets,scored", [({}, True), ({"l2": 1.0}, False)])
def test_a_record_at_other_budgets_has_no_score_printed_or_logged(tmp_path, offline, budgets, scored):
    made = record("m", "caltech101", VALUES, protocol=card_protocol("caltech101", **budgets))
    table = format_table(made)
    score_line = next(line for line in table.splitlines() if line.startswith("score"))
    assert ("2.3000 / 5" in score_line) is scored, score_line
    assert scored or "other protocol" in score_line and "2.3000" in score_line  # the sum, said to be no score
    assert ("white_box/score" in made.metrics()) is scored
    assert made.card_score("white_box") == (pytest.approx(2.3) if scored else None)
    made.save(tmp_path / "scores.json")
    logged = _logged(log_evaluation(made, tmp_path, project="rgb-tests"))
    assert (b"white_box/score" in logged) is scored and b"white_box/partial_sum" in logged


def test_rows_outside_a_ranking_have_no_rank_and_no_borda(tmp_path, offline):
    pool = {Path("a"): record("a", "caltech101", [0.5] * 5), Path("b"): record("b", "caltech101", [0.8] * 5),
            Path("easy"): record("easy", "caltech101", VALUES, protocol=card_protocol("caltech101", l2=1.0))}
    board = build_leaderboard(pool, datasets=["caltech101"])
    assert [(r.model, r.rank, r.borda) for r in board.rows] == [("b", 1, 5.0), ("a", 2, 0.0), ("easy", None, None)]
    (easy,) = [row for row in csv.DictReader(io.StringIO(to_csv(board))) if row["model"] == "easy"]
    assert easy["rank"] == "" and easy["borda"] == ""
    assert board.to_json()["rows"][2]["rank"] is None and board.to_json()["rows"][2]["borda"] is None
    logged = _logged(log_leaderboard(board, tmp_path, "rgb-tests"))
    assert b"a/borda" in logged and b"easy/borda" not in logged and b"easy/partial_sum" in logged


def test_a_model_with_nothing_measured_under_a_protocol_shows_no_partial_sum(tmp_path, offline):
    """`with` was evaluated with transfer, `without` was not: on the black-box board `without` has no number; its
    clean and common accuracies (the white-box board's) are shown on the site, never beside a Sum of 0."""
    pool = {Path("with"): record("with", "digits", VALUES, protocol=card_protocol("digits", 32),
                                 black_box=_black_box(0.5)),
            Path("without"): record("without", "digits", VALUES, protocol=card_protocol("digits", 32))}
    board = build_leaderboard(pool, protocol="black_box", datasets=["digits"])
    assert [(r.model, r.rank, r.status) for r in board.rows] == [("with", 1, "complete"),
                                                                ("without", None, "not measured")]
    without = board.rows[1]
    assert without.borda is None and without.sum.partial_sum is None and without.sum.score is None
    assert board.not_measured_rows == [without] and board.incomplete_rows == []
    markdown = to_markdown(board)
    assert "0.00 / 0" not in markdown and f"## {NOT_MEASURED_HEADING}" in markdown
    assert "| without |" not in markdown  # no ranking row of its own
    columns, rows = table_rows(board)
    assert rows[1]["partial_sum"] is None and rows[1]["rank"] is None and rows[1]["borda"] is None
    logged = _logged(log_leaderboard(board, tmp_path, "rgb-tests"))
    assert b"with/partial_sum" in logged and b"without/status" in logged
    assert b"without/partial_sum" not in logged and b"without/borda" not in logged
    white = build_leaderboard(pool, datasets=["digits"])
    page = write_site([board, white], [SiteEntry(file, r) for file, r in pool.items()], tmp_path / "site").read_text()
    assert "0.00 / 0" not in page and "not measured" in page
