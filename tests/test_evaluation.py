"""Scores, integrity checks, class-wise metrics, leaderboards, plots and W&B files of the evaluation."""

import json
import math
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rgb.attacks.autoattack import ATTACK_ORDER, PLUS_ORDER
from rgb.data import RGBDataModule
from rgb.evaluation.leaderboard import build_leaderboard, find_records, write_leaderboard
from rgb.evaluation.metrics import Accuracy, class_wise_summary, per_class_accuracy, worst_k_count
from rgb.evaluation.model_eval import EvalOptions, EvaluationError, evaluate_model, format_table, read_attack
from rgb.evaluation.scores import (
    WHITE_BOX_SETTINGS,
    black_box_settings,
    borda_scores,
    dataset_score,
    strongest_surrogate,
    sum_score,
)
from rgb.models import create_model, export_model

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
    summary = class_wise_summary(labels, correct, num_classes=4, worst_k=(1, 2, "50%"))
    assert summary["per_class"][:3] == [0.5, 0.75, 1.0] and math.isnan(summary["per_class"][3])  # absent: NaN
    assert summary["worst_1"] == 0.5 and summary["worst_2"] == pytest.approx(0.625)
    assert summary["worst_50%"] == pytest.approx(0.625)  # 50% of 3 present classes -> 2
    assert summary["harmonic_mean"] == pytest.approx(3 / (2 + 4 / 3 + 1))
    assert summary["geometric_mean"] == pytest.approx((0.5 * 0.75 * 1.0) ** (1 / 3))
    assert summary["worst_classes"][:3] == [0, 1, 2]
    zero = class_wise_summary([0, 0, 1, 1], [0, 0, 1, 1], num_classes=2)
    assert zero["harmonic_mean"] == 0.0 and zero["geometric_mean"] == 0.0 and zero["worst_1"] == 0.0
    assert worst_k_count("10%", 101) == 11 and worst_k_count(0.1, 21) == 3 and worst_k_count(3, 10) == 3
    with pytest.raises(ValueError, match="worst-k"):
        worst_k_count(11, 10)
    assert np.allclose(per_class_accuracy([1, 1], [1, 0], 2), [np.nan, 0.5], equal_nan=True)


# -- scores --------------------------------------------------------------------------------------------------


def settings(values):
    return {s: (Accuracy(round(v * 100), 100) if v is not None else None) for s, v in zip(WHITE_BOX_SETTINGS, values)}


def test_dataset_and_sum_scores_report_missing_settings():
    full = dataset_score(settings([0.9, 0.7, 0.1, 0.2, 0.3]))
    assert full["score"] == pytest.approx(2.2) and full["max"] == 5 and full["missing"] == []
    gap = dataset_score(settings([0.9, 0.7, None, 0.2, 0.3]))
    assert gap["score"] is None and gap["missing"] == ["autoattack_l1"] and gap["partial_sum"] == pytest.approx(2.1)
    total = sum_score({"a": settings([1, 1, 1, 1, 1]), "b": settings([0.5] * 5)}, ["a", "b", "c"])
    assert total["score"] is None and total["max"] == 15 and len(total["missing"]) == 5
    assert total["partial_sum"] == pytest.approx(7.5)
    assert sum_score({"a": settings([1, 1, 1, 1, 1])}, ["a"])["score"] == 5


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
    transfer = {"linf_4": {"s1": Accuracy(60, 100), "s2": Accuracy(40, 100), "s3": None},
                "l2_2": {"s1": None}}
    chosen_settings, chosen = black_box_settings(Accuracy(90, 100), Accuracy(70, 100), transfer)
    assert chosen["linf_4"] == "s2" and chosen_settings["linf_4"].value == 0.4
    assert chosen["l2_2"] is None and chosen_settings["l2_2"] is None  # missing, not 0
    assert dataset_score(chosen_settings, "black_box")["max"] == 9
    assert strongest_surrogate({"b": Accuracy(1, 2), "a": Accuracy(1, 2)})[0] == "a"


# -- leaderboard ---------------------------------------------------------------------------------------------


def record(model, dataset, values):
    return {
        "model": {"run_name": model, "timm_name": "t", "loss": "ce", "strategy": "fft", "weights_sha256": "0"},
        "dataset": dataset, "eps": {}, "versions": {},
        "white_box": {"settings": {k: (v.to_dict() if v else None) for k, v in settings(values).items()},
                      **dataset_score(settings(values))},
    }


def test_leaderboard_sum_borda_and_files(tmp_path):
    records = [
        record("ce", "d1", [0.9, 0.8, 0.0, 0.1, 0.0]), record("ce", "d2", [0.8, 0.7, 0.0, 0.0, 0.0]),
        record("trades", "d1", [0.8, 0.7, 0.3, 0.4, 0.3]), record("trades", "d2", [0.7, 0.6, 0.2, 0.3, 0.2]),
        record("half", "d1", [0.5, 0.5, 0.5, 0.5, 0.5]),
    ]
    for r in records:
        path = tmp_path / "eval" / r["dataset"] / r["model"]["run_name"] / "scores.json"
        path.parent.mkdir(parents=True)
        path.write_text(json.dumps(r))
    found = find_records([tmp_path / "eval"])
    board = write_leaderboard(found, tmp_path / "board")
    assert [row["model"] for row in board["rows"]] == ["trades", "ce", "half"]
    assert board["rows"][0]["sum"] == pytest.approx(4.5) and board["rows"][0]["max"] == 10
    half = board["rows"][2]
    assert half["sum"] is None and half["d2/test"] is None and len(half["missing"]) == 5
    assert board["borda_pairs"] == 5 and len(board["borda_excluded_pairs"]) == 5
    markdown = (tmp_path / "board" / "leaderboard.md").read_text()
    assert "| trades | 4.5000 |" in markdown and "missing" in markdown and "incomplete" in markdown
    assert (tmp_path / "board" / "leaderboard.csv").read_text().startswith("model,sum,partial_sum")
    assert json.loads((tmp_path / "board" / "leaderboard.json").read_text())["rows"][0]["model"] == "trades"
    info = json.loads((tmp_path / "board" / "model_info" / "d1" / "trades.json").read_text())
    assert info["clean_acc"] == 0.8 and info["autoattack_acc"]["l2"] == 0.4
    assert (tmp_path / "board" / "leaderboard.png").stat().st_size > 5000
    with pytest.raises(ValueError, match="two records for model 'ce'"):
        build_leaderboard(found + [found[0]])


# -- one model on the mini benchmark -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory, mini_dir):
    model = create_model("test_resnet", num_classes=10, pretrained=False)
    out = tmp_path_factory.mktemp("train") / "tiny-ce"
    export_model(model, out, {"dataset": "digits", "run_name": "tiny-ce", "loss": "ce", "strategy": "fft",
                              "image_size": 32})
    return out


def datamodule(mini_dir):
    return RGBDataModule(source=str(mini_dir), dataset="digits", image_size=32, num_classes=10,
                         budgets={"l1": 1.5306, "l2": 0.2857, "linf": 4 / 255}, eval_batch_size=128)


def write_attack(folder: Path, norm: str, run: Path, dm, robust, **overrides):
    from rgb.evaluation.attack_run import file_sha256, split_sha256

    folder = folder / norm
    folder.mkdir(parents=True, exist_ok=True)
    n = len(robust)
    summary = {"weights_sha256": file_sha256(run / "model.safetensors"), "dataset": "digits", "split": "test",
               "split_sha256": split_sha256(dm.split("test")), "n": n, "eps": dm.budgets[norm],
               "version": "standard", "attacks": list(ATTACK_ORDER), "complete": True, "seed": 0,
               "precision": "fp32", "robust_accuracy": float(np.mean(robust)), "n_robust": int(np.sum(robust)),
               "accuracy_after": {"clean": 0.9, "apgd-ce": 0.5, "apgd-t": 0.4, "fab-t": 0.4, "square": 0.4},
               "forward_rows_per_image": 1.0, "backward_rows_per_image": 1.0, "versions": {}}
    summary.update(overrides)
    (folder / "summary.json").write_text(json.dumps(summary))
    pq.write_table(pa.table({"image_id": np.arange(n), "robust": np.asarray(robust, dtype=bool)}),
                   folder / "results.parquet")


def test_model_evaluation_writes_scores_plots_and_table(tmp_path, mini_dir, tiny_run):
    dm = datamodule(mini_dir)
    robust = np.zeros(450, dtype=bool)
    robust[:45] = True
    write_attack(tmp_path / "attack", "linf", tiny_run, dm, robust)
    write_attack(tmp_path / "attack", "l2", tiny_run, dm, robust)
    options = EvalOptions(attack_dir=tmp_path / "attack", out_dir=tmp_path / "eval")
    from rgb.models import load_with_meta

    model, meta = load_with_meta(tiny_run)
    result = evaluate_model(model, meta, tiny_run / "model.safetensors", dm, options)
    wb = result["white_box"]
    assert wb["settings"]["test"]["total"] == 450 and wb["settings"]["common"]["total"] == 450
    assert wb["settings"]["autoattack_linf"] == {"accuracy": 0.1, "correct": 45, "total": 450, "partial": False}
    assert wb["settings"]["autoattack_l1"] is None and wb["score"] is None and wb["missing"] == ["autoattack_l1"]
    assert sum(a["total"] for a in result["common_by_corruption"].values()) == 450
    assert len(result["common_by_corruption"]) == 11
    assert set(result["class_wise"]) == {"test", "common", "autoattack_l2", "autoattack_linf"}
    for plot in ("settings.png", "attack_stages.png", "class_accuracy.png"):
        assert (tmp_path / "eval" / plot).stat().st_size > 5000
    assert json.loads((tmp_path / "eval" / "scores.json").read_text())["white_box"]["missing"] == ["autoattack_l1"]
    assert pq.read_table(tmp_path / "eval" / "predictions.parquet").num_rows == 450
    table = format_table(result)
    assert "autoattack_l1        missing" in table and "45/450" in table and "incomplete" in table


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"weights_sha256": "f" * 64}, "another model's weights"),
        ({"dataset": "flowers-102"}, "dataset 'flowers-102'"),
        ({"eps": 0.5}, "eps 0.5 instead of"),
        ({"attacks": ["apgd-ce"]}, "not the standard AutoAttack"),
        ({"version": "plus", "attacks": list(PLUS_ORDER)}, r"not the standard AutoAttack \(plus"),
        ({"complete": False}, "an incomplete run"),
        ({"split_sha256": "0" * 64}, "other test images"),
    ],
)
def test_mismatched_attack_results_are_refused(tmp_path, mini_dir, tiny_run, overrides, message):
    dm = datamodule(mini_dir)
    write_attack(tmp_path, "linf", tiny_run, dm, np.ones(450, dtype=bool), **overrides)
    from rgb.evaluation.attack_run import file_sha256, split_sha256

    expected = {"weights_sha256": file_sha256(tiny_run / "model.safetensors"), "dataset": "digits",
                "split_sha256": split_sha256(dm.split("test")), "eps": dm.budgets, "n_test": 450}
    with pytest.raises(EvaluationError, match=message):
        read_attack("linf", EvalOptions(attack_dir=tmp_path, out_dir=tmp_path / "o"), expected)


def test_partial_results_need_consent_and_are_marked(tmp_path, mini_dir, tiny_run):
    dm = datamodule(mini_dir)
    write_attack(tmp_path, "linf", tiny_run, dm, np.ones(300, dtype=bool))
    from rgb.evaluation.attack_run import file_sha256, split_sha256

    expected = {"weights_sha256": file_sha256(tiny_run / "model.safetensors"), "dataset": "digits",
                "split_sha256": split_sha256(dm.split("test")), "eps": dm.budgets, "n_test": 450}
    with pytest.raises(EvaluationError, match="300 of 450 images; pass allow_partial=true"):
        read_attack("linf", EvalOptions(attack_dir=tmp_path, out_dir=tmp_path / "o"), expected)
    accuracy, _, _ = read_attack("linf", EvalOptions(attack_dir=tmp_path, out_dir=tmp_path / "o",
                                                     allow_partial=True), expected)
    assert accuracy.partial and accuracy.total == 300
    (tmp_path / "l2").mkdir()
    with pytest.raises(EvaluationError, match="not merged/complete"):
        read_attack("l2", EvalOptions(attack_dir=tmp_path, out_dir=tmp_path / "o"), expected)


def test_wandb_offline_files_contain_the_summary(tmp_path, mini_dir, tiny_run, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    from rgb.evaluation.wandb_report import log_evaluation
    from rgb.models import load_with_meta

    model, meta = load_with_meta(tiny_run)
    options = EvalOptions(attack_dir=tmp_path / "none", out_dir=tmp_path / "eval")
    result = evaluate_model(model, meta, tiny_run / "model.safetensors", datamodule(mini_dir), options)
    run_dir = log_evaluation(result, options.out_dir, project="rgb-tests")
    # Offline runs keep everything in the .wandb record file (synced later with `wandb sync`).
    records = next(run_dir.rglob("*.wandb")).read_bytes()
    for key in (b"white_box/test", b"white_box/score", b"class_wise/test/harmonic_mean", b"settings"):
        assert key in records
    assert len(list(run_dir.rglob("media/images/plots/*.png"))) == len(result["plots"])
