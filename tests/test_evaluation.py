"""Scores, integrity checks, class-wise metrics, leaderboards, plots and W&B files of the evaluation."""

import json

import numpy as np
import pyarrow.parquet as pq
import pytest

from helpers import datamodule, expectation, record, save_pool, scoring, white_box_settings, write_attack
from rgb.core.classwise import check_worst_k, class_wise_summary, per_class_accuracy, worst_k_count
from rgb.core.files import distinct_name
from rgb.evaluation.leaderboard import LeaderboardError, build_leaderboard, find_records, write_leaderboard
from rgb.evaluation.model_eval import EvaluationError, evaluate_model, format_table, read_attack
from rgb.evaluation.records import Accuracy, ClassWise, ProtocolScore, ScoresRecord
from rgb.evaluation.scores import black_box_score, borda_scores, strongest_surrogate, sum_score
from rgb.models import load_with_meta

# -- metrics -------------------------------------------------------------------------------------------------


def test_accuracy_carries_counts_and_refuses_nonsense():
    acc = Accuracy.of([True, False, True, True])
    assert (acc.correct, acc.total, acc.value) == (3, 4, 0.75)
    assert str(Accuracy(1, 3, partial=True)) == "0.3333 (1/3, PARTIAL)"
    with pytest.raises(ValueError):
        Accuracy(5, 4)
    with pytest.raises(ValueError):
        Accuracy(0, 0)


def test_class_wise_metrics_on_hand_made_predictions():
    labels = [0, 0, 1, 1, 1, 1, 2, 2]
    correct = [1, 0, 1, 1, 1, 0, 1, 1]  # per class: 0.5, 0.75, 1.0
    summary = class_wise_summary(labels, correct, num_classes=4, worst_k=(1, 2, "50%", 5))
    assert summary.per_class == [0.5, 0.75, 1.0, None]  # absent class: None (null in JSON), never 0
    assert summary.worst["1"] == 0.5 and summary.worst["2"] == pytest.approx(0.625)
    assert summary.worst["50%"] == pytest.approx(0.625)  # 50% of 3 present classes -> 2
    assert summary.worst["5"] is None  # fewer present classes than k: not a number
    assert summary.harmonic_mean == pytest.approx(3 / (2 + 4 / 3 + 1))
    assert summary.geometric_mean == pytest.approx((0.5 * 0.75 * 1.0) ** (1 / 3))
    assert summary.worst_classes[:3] == [0, 1, 2]
    assert ClassWise.from_json(json.loads(json.dumps(summary.to_json()))) == summary
    zero = class_wise_summary([0, 0, 1, 1], [0, 0, 1, 1], num_classes=2)
    assert zero.harmonic_mean == 0.0 and zero.geometric_mean == 0.0 and zero.worst["1"] == 0.0
    assert worst_k_count("10%", 101) == 11 and worst_k_count(0.1, 21) == 3 and worst_k_count(3, 10) == 3
    assert worst_k_count(11, 10) is None
    with pytest.raises(ValueError, match="worst-k"):
        worst_k_count(0, 10)
    assert np.allclose(per_class_accuracy([1, 1], [1, 0], 2), [np.nan, 0.5], equal_nan=True)


@pytest.mark.parametrize("k", ["100%", "200%", "0%", "nan%", "inf%", "ten%", "10", 1.0, 2.0, 0.0, True, 0, -1, None])
def test_worst_k_has_one_rule_which_the_command_line_check_calls(k):
    """worst@k's entries are read and checked in rgb.core.classwise alone: what the class-wise metrics refuse the
    commands refuse before anything runs ("100%" included: worst@100% is the mean, not a worst-k)."""
    from rgb.commands.schema import command_schema
    from rgb.core.classwise import WORST_K

    assert command_schema("evaluate")["worst_k"] is WORST_K  # the command line checks by the one rule
    admits = WORST_K[0]
    with pytest.raises(ValueError, match="worst-k needs a class count >= 1 or a percentage below 100%"):
        worst_k_count(k, 10)
    with pytest.raises(ValueError):
        check_worst_k([1, k])
    assert not admits([1, k])
    assert admits([1, "99.5%", 0.5, 20]) and check_worst_k([1, "99.5%", 0.5, 20]) == (1, "99.5%", 0.5, 20)
    assert not admits([]) and not admits("10%") and not admits(5)


# -- scores --------------------------------------------------------------------------------------------------


def test_dataset_and_sum_scores_report_missing_settings():
    full = ProtocolScore("white_box", white_box_settings([0.9, 0.7, 0.1, 0.2, 0.3]))
    assert full.score == pytest.approx(2.2) and full.max == 5 and full.missing == []
    gap = ProtocolScore("white_box", white_box_settings([0.9, 0.7, None, 0.2, 0.3]))
    assert gap.score is None and gap.missing == ["autoattack_l1"] and gap.partial_sum == pytest.approx(2.1)
    assert ProtocolScore.from_json(json.loads(json.dumps(gap.to_json()))) == gap
    total = sum_score({"a": ProtocolScore("white_box", white_box_settings([1, 1, 1, 1, 1])),
                       "b": ProtocolScore("white_box", white_box_settings([0.5] * 5))}, ["a", "b", "c"])
    assert total.score is None and total.max == 15 and len(total.missing) == 5 and total.covered == 10
    assert total.partial_sum == pytest.approx(7.5) and total.describe() == "7.50 / 10 (partial, of 15)"
    assert sum_score({"a": ProtocolScore("white_box", white_box_settings([1, 1, 1, 1, 1]))}, ["a"]).score == 5


def test_borda_shares_ties_and_excludes_incomplete_pairs():
    pool = {
        "A": {("d", "x"): 0.9, ("d", "y"): 0.5, ("d", "z"): 0.1},
        "B": {("d", "x"): 0.9, ("d", "y"): 0.4},
        "C": {("d", "x"): 0.1, ("d", "y"): 0.6},
    }
    result = borda_scores(pool)
    # x: A and B tie above C -> 1.5, 1.5, 0; y: C > A > B -> A 1, B 0, C 2.
    assert result["points"] == {"A": 2.5, "B": 1.5, "C": 2.0}
    assert result["excluded_pairs"] == [("d", "z")]
    assert sum(result["points"].values()) == 2 * 3  # n(n-1)/2 points per pair


def test_transfer_protocol_picks_the_strongest_surrogate():
    transfer = {"linf_4": {"s1": Accuracy(60, 100), "s2": Accuracy(40, 100)}, "l2_2": {}}
    score = black_box_score(Accuracy(90, 100), Accuracy(70, 100), transfer, card=None)
    assert score.strongest_surrogate["linf_4"] == "s2" and score.settings["linf_4"].value == 0.4
    assert score.strongest_surrogate["l2_2"] is None and score.settings["l2_2"] is None  # missing, not 0
    assert score.max == 9 and "l2_2" in score.missing and score.score is None
    assert strongest_surrogate({"b": Accuracy(1, 2), "a": Accuracy(1, 2)})[0] == "a"


# -- leaderboard ---------------------------------------------------------------------------------------------


def test_leaderboard_sum_borda_and_files(tmp_path):
    records = [
        record("ce", "d1", [0.9, 0.8, 0.0, 0.1, 0.0]), record("ce", "d2", [0.8, 0.7, 0.0, 0.0, 0.0]),
        record("trades", "d1", [0.8, 0.7, 0.3, 0.4, 0.3]), record("trades", "d2", [0.7, 0.6, 0.2, 0.3, 0.2]),
        record("half", "d1", [0.5, 0.5, 0.5, 0.5, 0.5]),
    ]
    save_pool(records, tmp_path / "eval")
    found = find_records([tmp_path / "eval"])
    assert ScoresRecord.load(next(iter(found))) in records  # the record survives the round trip through JSON
    board = write_leaderboard(found, tmp_path / "board", datasets=["d1", "d2"], rank_by="sum")
    assert [row.model for row in board.rows] == ["trades", "ce", "half"]
    assert board.rows[0].sum.score == pytest.approx(4.5) and board.rows[0].sum.max == 10
    half = board.rows[2]
    assert half.sum.score is None and half.per_dataset["d2"] is None and len(half.sum.missing) == 5
    # Borda among the complete entries over all 10 pairs; the incomplete one apart, over its own 5 pairs.
    assert board.borda_pairs == 10 and board.incomplete_borda_pairs == 5 and board.borda_excluded_pairs == []
    markdown = (tmp_path / "board" / "leaderboard.md").read_text()
    assert "| 1 | trades | " in markdown and "missing" in markdown and "(partial, of 10)" in markdown
    assert (tmp_path / "board" / "leaderboard.csv").read_text().startswith("rank,model,borda,sum,partial_sum")
    assert json.loads((tmp_path / "board" / "leaderboard.json").read_text())["rows"][0]["model"] == "trades"
    info = json.loads((tmp_path / "board" / "model_info" / "d1" / f"{distinct_name('trades')}.json").read_text())
    assert info["clean_acc"] == 0.8 and info["autoattack_acc"]["l2"] == 0.4
    assert (tmp_path / "board" / "leaderboard.png").stat().st_size > 5000
    with pytest.raises(LeaderboardError, match="two records for model 'ce'"):
        build_leaderboard({**found, tmp_path / "copy.json": next(iter(found.values()))})


# -- one model on the mini benchmark (the conftest fixtures tiny_run and clean_pred) ----------------------------


def test_model_evaluation_writes_scores_plots_and_table(tmp_path, mini_dir, tiny_run, clean_pred):
    dm = datamodule(mini_dir)
    n_robust = write_attack(tmp_path / "attack", "linf", tiny_run, dm, np.arange(200) % 2 == 0, clean_pred)
    write_attack(tmp_path / "attack", "l2", tiny_run, dm, np.ones(200), clean_pred)
    options = scoring(tmp_path / "attack", tmp_path / "eval")
    model, meta = load_with_meta(tiny_run)
    result = evaluate_model(model, meta, tiny_run / "model.safetensors", dm, options)
    wb = result.white_box
    assert wb.settings["test"].total == 200 and wb.settings["common"].total == 200
    assert wb.settings["autoattack_linf"] == Accuracy(n_robust, 200)
    assert wb.settings["autoattack_l1"] is None and wb.score is None and wb.missing == ["autoattack_l1"]
    assert sum(a.total for a in result.common_by_corruption.values()) == 200
    assert len(result.common_by_corruption) == 11
    assert set(result.class_wise) == {"test", "common", "autoattack_l2", "autoattack_linf", "random_linf_30"}
    assert set(result.class_wise["test"].worst) == {"1", "5", "10"}  # the default worst-k
    control = result.control  # the card's control, never summed
    flags = pq.read_table(tmp_path / "eval" / "predictions.parquet").column("correct_random_linf_30").to_pylist()
    assert control.total == 200 and control.correct == sum(flags)
    assert f"random_linf_30     {control.value:9.4f}" in format_table(result)
    assert "random_linf_30" not in result.white_box.settings and result.protocol.is_card
    for plot in ("settings.png", "attack_stages.png", "class_accuracy.png"):
        assert (tmp_path / "eval" / plot).stat().st_size > 5000
    saved = ScoresRecord.load(tmp_path / "eval" / "scores.json")
    assert saved == result and saved.white_box.missing == ["autoattack_l1"]
    assert json.loads((tmp_path / "eval" / "scores.json").read_text())["white_box"]["missing"] == ["autoattack_l1"]
    assert pq.read_table(tmp_path / "eval" / "predictions.parquet").num_rows == 200
    table = format_table(result)
    assert "autoattack_l1        missing" in table and f"{n_robust}/200" in table and "incomplete" in table


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"weights_sha256": "f" * 64}, "another model's weights"),
        ({"dataset": "flowers-102"}, "dataset 'flowers-102'"),
        ({"eps": 0.5}, "eps 0.5 instead of"),
        ({"complete": False}, r"200 rows for n=200 \(complete=False\)"),
        ({"n_robust": 0}, "differ from the summary"),
        ({"split_sha256": "0" * 64}, "other test images"),
    ],
)
def test_mismatched_attack_results_are_refused(tmp_path, mini_dir, tiny_run, clean_pred, overrides, message):
    dm = datamodule(mini_dir)
    write_attack(tmp_path, "linf", tiny_run, dm, np.ones(200, dtype=bool), clean_pred, **overrides)
    with pytest.raises(EvaluationError, match=message):
        read_attack("linf", scoring(tmp_path, tmp_path / "o"),
                    expectation(tiny_run, dm, clean_pred))


def test_partial_results_need_consent_and_are_marked(tmp_path, mini_dir, tiny_run, clean_pred):
    dm = datamodule(mini_dir)
    write_attack(tmp_path, "linf", tiny_run, dm, np.ones(120, dtype=bool), clean_pred)
    expected = expectation(tiny_run, dm, clean_pred)
    with pytest.raises(EvaluationError, match="120 of 200 images; pass allow_partial=true"):
        read_attack("linf", scoring(tmp_path, tmp_path / "o"), expected)
    found = read_attack("linf", scoring(tmp_path, tmp_path / "o", allow_partial=True),
                        expected)
    assert found.summary.robust.partial and found.summary.robust.total == 120 and found.standard
    (tmp_path / "l2").mkdir()
    with pytest.raises(EvaluationError, match="not merged/complete"):
        read_attack("l2", scoring(tmp_path, tmp_path / "o"), expected)


def test_wandb_offline_files_contain_the_summary(tmp_path, mini_dir, tiny_run, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    from rgb.evaluation.wandb_report import log_evaluation

    model, meta = load_with_meta(tiny_run)
    options = scoring(tmp_path / "none", tmp_path / "eval")
    result = evaluate_model(model, meta, tiny_run / "model.safetensors", datamodule(mini_dir), options)
    metrics = result.metrics()
    assert metrics["white_box/settings/test"] == result.white_box.settings["test"].value
    assert metrics["class_wise/test/worst/1"] == result.class_wise["test"].worst["1"]
    run_dir = log_evaluation(result, options.model.output_dir, project="rgb-tests")
    import wandb

    wandb.teardown()  # the service may still be writing the record file after finish() under load
    # Offline runs keep everything in the .wandb record file (synced later with `wandb sync`).
    records = next(run_dir.rglob("*.wandb")).read_bytes()
    for key in (b"white_box/settings/test", b"white_box/partial_sum", b"class_wise/test/harmonic_mean", b"settings"):
        assert key in records
    assert len(list(run_dir.rglob("media/images/plots/*.png"))) == len(result.plots)


def test_attack_wandb_offline_run_logs_stages_and_names_the_train_run(tmp_path, mini_dir, tiny_run, clean_pred,
                                                                       monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    from rgb.core.files import stable_id
    from rgb.runs.store import read_run
    from rgb.runs.wandb_report import log_attack

    write_attack(tmp_path / "attack", "linf", tiny_run, datamodule(mini_dir), np.arange(200) % 2 == 0, clean_pred)
    summary = read_run(tmp_path / "attack" / "linf").summary
    run_dir = log_attack({"linf": summary}, tmp_path / "attack", project="rgb-tests")
    import wandb

    wandb.teardown()
    assert run_dir.name.endswith(stable_id(tmp_path / "attack"))  # a requeued merge continues this run
    records = next(run_dir.rglob("*.wandb")).read_bytes()
    train_dir = tiny_run if tiny_run.is_dir() else tiny_run.parent
    for key in (b"linf/accuracy_after/apgd-ce", b"linf/images_per_second", b"linf/robust_accuracy",
                str(train_dir.resolve()).encode(), summary.weights_sha256.encode()):  # the train run it attacked
        assert key in records
    assert stable_id(train_dir).encode() not in records  # trained without W&B: no id of a run that does not exist
