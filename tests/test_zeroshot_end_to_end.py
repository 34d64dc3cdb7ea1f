"""A zero-shot CLIP run through every command, as a fine-tuned model goes: train.py strategy=zeroshot prompts=cpe
exports it, rgb.models.load gives an nn.Module on [0,1] images, attack.py (three norms) and evaluate.py score it
(five settings, class-wise metrics) and it takes a named row on the leaderboard. On the embedded architecture
with random weights (the real, trained one: docs/performance.md, "Zero-shot")."""

import csv
import json
import sys
from pathlib import Path

import pytest
import torch

from consumers import clip_benchmark_cli
from rgb.commands.evaluate import run_evaluation
from rgb.core.files import distinct_name
from rgb.models import load_with_meta
from rgb.models.embedded_clip import EMBEDDED_ARCH
from rgb.commands.attack import attack_from_config
from rgb.commands.train import train
from helpers import compose_rooted

RUN_NAME = "zs_cpe"
WIDE_BUDGETS = ("data.budgets.linf=0.5", "data.budgets.l2=16", "data.budgets.l1=400")
SETTINGS = ("test", "common", "autoattack_l1", "autoattack_l2", "autoattack_linf")


def zero_shot_run(root: Path, mini_dir: Path) -> Path:
    """train.py model=openclip_mini strategy=zeroshot prompts=cpe run_name=zs_cpe, the tower untrained."""
    run = root / "outputs" / "train" / "digits" / RUN_NAME  # hydra.run.dir of train.py, set here without Hydra
    train(compose_rooted("train", root, mini_dir, "model=openclip_mini", "model.random_init=true", "strategy=zeroshot",
                         "prompts=cpe", f"run_name={RUN_NAME}", f"run_dir={run}", "threads=1"))
    return run


def scores_and_leaderboard(root: Path, mini_dir: Path, run: Path, *overrides: str) -> tuple[dict, dict]:
    run_evaluation(compose_rooted("evaluate", root, mini_dir, f"run={run}", *overrides))
    scores = json.loads((root / "outputs" / "eval" / "digits" / RUN_NAME / "scores.json").read_text())
    run_evaluation(compose_rooted("evaluate", root, mini_dir, f"pool=[{root / 'outputs' / 'eval'}]",
                                  "leaderboard_datasets=[digits]"))
    board = json.loads((root / "outputs" / "leaderboard" / "model_info" / "digits" / f"{distinct_name(RUN_NAME)}.json").read_text())
    return scores, board


def test_zero_shot_export_loads_and_is_scored_without_attacks(tmp_path, mini_dir, monkeypatch):
    run = zero_shot_run(tmp_path, mini_dir)
    model, meta = load_with_meta(run)
    assert isinstance(model, torch.nn.Module) and not model.training and meta["family"] == "openclip"
    with torch.no_grad():
        logits = model(torch.rand(3, 3, 32, 32))
    assert logits.shape == (3, 10) and torch.isfinite(logits).all()
    scores, board = scores_and_leaderboard(tmp_path, mini_dir, run)
    settings = scores["white_box"]["settings"]
    assert list(settings) == list(SETTINGS)
    assert settings["test"]["total"] == 200 and all(settings[s] is None for s in SETTINGS[2:])  # missing, not 0
    class_wise = scores["class_wise"]["test"]
    assert len(class_wise["per_class"]) == 10 and set(class_wise["worst"]) == {"1", "5", "10"}
    # the zero-shot report's row of the exported head: the same ClassWise record, computed from features
    run_evaluation(compose_rooted("evaluate", tmp_path, mini_dir, f"run={run}", "zeroshot_report=true"))
    report = json.loads((tmp_path / "outputs" / "eval" / "digits" / RUN_NAME / "zeroshot_report" /
                         "comparison.json").read_text())
    exported = report["rows"][-1]
    assert exported["ensemble"] == "exported (cpe (weights))"
    assert exported["overall"] == settings["test"]["correct"] / 200
    assert exported["class_wise"] == class_wise  # one rule, one module: the same numbers
    assert (scores["model"]["family"], scores["model"]["name"], scores["model"]["strategy"]) == (
        "openclip", EMBEDDED_ARCH, "zeroshot")
    assert (board["name"], board["architecture"], board["family"]) == (RUN_NAME, EMBEDDED_ARCH, "openclip")
    # its CLIP_benchmark export (rgb.evaluation.exports): the same numbers, as fractions, no acc5
    folder = tmp_path / "outputs" / "leaderboard" / "clip_benchmark"
    export, = folder.glob("*.json")
    clip = json.loads(export.read_text())
    assert (clip["dataset"], clip["model"], clip["task"]) == ("digits", EMBEDDED_ARCH, "zeroshot_classification")
    assert clip["metrics"] == {"acc1": settings["test"]["correct"] / 200, "mean_per_class_recall": class_wise["mean"]}
    # read by CLIP_benchmark's own `clip_benchmark build <folder>`: one row, named by rgb's weights (was "")
    monkeypatch.setattr(sys, "argv", ["clip_benchmark", "build", str(folder), "--output", str(tmp_path / "b.csv")])
    clip_benchmark_cli().main()
    row, = csv.DictReader((tmp_path / "b.csv").open())
    assert row["model_fullname"] == f"{EMBEDDED_ARCH} rgb-{scores['model']['weights_sha256'][:8]}"
    assert float(row["acc1"]) == settings["test"]["correct"] / 200


@pytest.mark.slow
def test_zero_shot_run_is_attacked_in_three_norms_and_scored_in_five_settings(tmp_path, mini_dir):
    """The standard cascade on all 200 test images in three norms, at budgets wide enough that every image the
    untrained model gets right falls to the first attack (at the mini's own budgets it resists: ~6 min a norm)."""
    run = zero_shot_run(tmp_path, mini_dir)
    summaries = attack_from_config(compose_rooted("attack", tmp_path, mini_dir, f"run={run}", "threads=1",
                                                  *WIDE_BUDGETS))
    assert sorted(summaries) == ["l1", "l2", "linf"]
    for summary in summaries.values():
        assert summary.standard and summary.n == 200 and summary.robust_accuracy <= summary.clean_accuracy
    scores, board = scores_and_leaderboard(tmp_path, mini_dir, run, *WIDE_BUDGETS)
    settings = scores["white_box"]["settings"]
    assert all(settings[s] is not None and settings[s]["total"] == 200 for s in SETTINGS)
    for norm, summary in summaries.items():
        assert settings[f"autoattack_{norm}"]["correct"] == round(summary.robust_accuracy * 200)
    assert scores["white_box"]["score"] is not None and set(SETTINGS) <= set(scores["class_wise"])
    # wide budgets are another protocol: its model_info entry carries no card score (#51.5), scores.json its sum
    assert board["score"] is None and board["architecture"] == EMBEDDED_ARCH
