"""Integrity of what evaluate.py reports (issue 13): nothing relabelled, nothing silently partial, the card's
aggregation exactly; and readable outputs (plots, leaderboard.md)."""

import logging
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from omegaconf import OmegaConf

from helpers import CONF, compose_config, datamodule, expectation, record, save_pool, scoring, write_attack
from rgb.attacks.registry import VERSIONS
from rgb.data.catalog import CORRUPTIONS, DATASETS, TRANSFER_SPLITS
from rgb.evaluation.leaderboard import LeaderboardError, build_leaderboard, find_records, to_markdown
from rgb.evaluation.model_eval import (
    EvaluationError,
    corruption_key,
    corruption_keys,
    evaluate_model,
    format_table,
    predict,
    read_attack,
)
from rgb.evaluation.plots import class_accuracy_figure, leaderboard_figure, settings_figure
from rgb.evaluation.records import Accuracy, BlackBoxScore
from rgb.commands.evaluate import run_evaluation
from rgb.evaluation.scores import black_box_score
from rgb.models import load_with_meta

CARD = list(DATASETS)


def options(tmp_path, **kwargs):
    return scoring(tmp_path / "attack", tmp_path / "eval", **kwargs)


# -- 9: attack results must be this model's -------------------------------------------------------------------


def test_attack_run_with_other_clean_predictions_is_refused(tmp_path, mini_dir, tiny_run, clean_pred):
    dm = datamodule(mini_dir)
    other = clean_pred.copy()
    other[7] = (other[7] + 1) % 10  # a run made with another model (or other images) predicts image 7 otherwise
    write_attack(tmp_path / "attack", "linf", tiny_run, dm, np.ones(200), other)
    with pytest.raises(EvaluationError, match=r"clean predictions differ from this model's on 1 of 200 test "
                                              r"images \(first: image_id 7"):
        read_attack("linf", options(tmp_path), expectation(tiny_run, dm, clean_pred))


def test_edited_summary_or_results_are_refused(tmp_path, mini_dir, tiny_run, clean_pred):
    dm = datamodule(mini_dir)
    write_attack(tmp_path / "attack", "linf", tiny_run, dm, np.ones(200), clean_pred, robust_accuracy=0.99)
    with pytest.raises(EvaluationError, match=r"robust_accuracy 0.99 is not \d+/200"):
        read_attack("linf", options(tmp_path), expectation(tiny_run, dm, clean_pred))
    write_attack(tmp_path / "attack", "l2", tiny_run, dm, np.zeros(200), clean_pred)
    results = tmp_path / "attack" / "l2" / "results.parquet"
    table = pq.read_table(results)
    pq.write_table(table.set_column(table.column_names.index("robust"), "robust",
                                    pa.array(np.ones(200, dtype=bool))), results)  # all robust, by hand
    with pytest.raises(EvaluationError, match="refusing"):
        read_attack("l2", options(tmp_path), expectation(tiny_run, dm, clean_pred))


# -- 10: a model whose logits are not finite is not scored -----------------------------------------------------


class NonFinite(torch.nn.Module):
    def __init__(self, value: float):
        super().__init__()
        self.value = value

    def forward(self, x):
        logits = torch.zeros(len(x), 10)
        logits[3:, 0] = self.value
        return logits


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_model_with_non_finite_logits_is_refused(tmp_path, mini_dir, value):
    with pytest.raises(EvaluationError, match="NaN/inf logits on test \\(first at image_id 3\\)"):
        predict(NonFinite(value), datamodule(mini_dir).split("test"), options(tmp_path), "test")


# -- 11, 12: the card's surrogates, and only those, make the black-box score -----------------------------------


def test_absent_card_surrogate_makes_the_black_box_score_partial_and_named():
    card = {"a": TRANSFER_SPLITS, "b": TRANSFER_SPLITS}
    transfer = {split: {"a": Accuracy(50, 100), "b": Accuracy(40, 100)} for split in TRANSFER_SPLITS}
    complete = black_box_score(Accuracy(90, 100), Accuracy(70, 100), transfer, card)
    assert complete.complete and complete.score == pytest.approx(0.9 + 0.7 + 7 * 0.4)
    del transfer["linf_4"]["b"]  # the strongest surrogate is missing from the snapshot: 0.5 is an upper bound
    partial = black_box_score(Accuracy(90, 100), Accuracy(70, 100), transfer, card)
    assert partial.score is None and not partial.complete
    assert partial.absent_surrogates == {"linf_4": ["b"]} and partial.incomplete == ["linf_4"]
    assert "upper bound" in partial.describe() and "absent surrogates: b (linf_4)" in partial.describe()
    assert BlackBoxScore.from_json(partial.to_json()) == partial


def test_surrogates_outside_the_card_are_reported_beside_the_score():
    card = {"a": TRANSFER_SPLITS}
    transfer = {split: {"a": Accuracy(50, 100), "mine": Accuracy(10, 100)} for split in TRANSFER_SPLITS}
    score = black_box_score(Accuracy(90, 100), Accuracy(70, 100), transfer, card)
    assert set(score.strongest_surrogate.values()) == {"a"}  # "mine" is stronger but not the card's
    assert score.score == pytest.approx(0.9 + 0.7 + 7 * 0.5)
    assert score.other_surrogates["linf_4"] == {"mine": Accuracy(10, 100)}
    assert all("mine" not in by for by in score.by_surrogate.values())


# -- 13, 17, 24: leaderboard over the benchmark's datasets, ranked by Borda or Sum, readable ----------------------


def test_sum_is_over_six_datasets_and_borda_over_the_same_list(tmp_path):
    full = [0.5] * 5
    records = [record("a", d, full) for d in CARD[:3]] + [record("b", d, [0.4] * 5) for d in CARD[:3]]
    records += [record("a", "digits", [0.0] * 5), record("b", "digits", [1.0] * 5)]  # outside the benchmark
    save_pool(records, tmp_path / "eval")
    board = build_leaderboard(find_records([tmp_path / "eval"]))
    assert board.datasets == CARD and board.rows[0].model == "a"
    top = board.rows[0].sum
    assert top.score is None and top.max == 30 and top.covered == 15 and len(top.missing) == 15
    assert top.describe() == "7.50 / 15 (partial, of 30)"
    assert board.rows[0].borda == 15 and board.rows[1].borda == 0  # digits, where b wins, is not counted
    assert board.ignored == ["a@digits", "b@digits"]
    assert "Not counted (dataset outside this leaderboard's list): a@digits, b@digits" in to_markdown(board)
    only_digits = build_leaderboard(find_records([tmp_path / "eval"]), datasets=["digits"])
    assert only_digits.rows[0].model == "b" and only_digits.rows[0].sum.score == 5
    assert "Outside the card's six datasets" in to_markdown(only_digits)
    assert "Outside the card's six" not in to_markdown(board)


def test_rank_by_borda_or_sum_and_both_shown():
    # "narrow" wins four settings by a hair and loses the fifth badly: first by Borda (the paper), second by Sum.
    records = [record("narrow", "d", [0.51, 0.51, 0.51, 0.51, 0.0]), record("broad", "d", [0.5] * 4 + [0.9])]
    pool = {Path(f"{r.model.run_name}.json"): r for r in records}
    by_borda = build_leaderboard(pool, datasets=["d"])
    by_sum = build_leaderboard(pool, datasets=["d"], rank_by="sum")
    assert by_borda.rank_by == "borda" and [r.model for r in by_borda.rows] == ["narrow", "broad"]
    assert [r.model for r in by_sum.rows] == ["broad", "narrow"]
    assert [r.borda for r in by_borda.rows] == [4, 1]
    markdown = to_markdown(by_borda)
    assert "| rank | model | Borda | Sum (/5) | d (/5) |" in markdown and "ranked by borda" in markdown
    assert "| 1 | narrow | 4 | 2.04 | 2.04 |" in markdown and "| 2 | broad | 1 | 2.90 | 2.90 |" in markdown
    with pytest.raises(LeaderboardError, match="rank_by must be one of"):
        build_leaderboard(pool, datasets=["d"], rank_by="mean")


def test_leaderboard_markdown_leads_with_one_row_per_model(tmp_path):
    records = [record(m, d, [v] * 5) for m, v in (("x", 0.3), ("y", 0.6)) for d in CARD]
    board = build_leaderboard({Path(f"{r.model.run_name}{r.dataset}"): r for r in records})
    markdown = to_markdown(board)
    head = markdown.split("## Accuracy per setting")[0]
    rows = [line for line in head.splitlines() if line.startswith("| ")]
    assert len(rows) == 1 + 2 and rows[0].count("|") == 4 + len(CARD) + 1  # rank, model, Borda, Sum, 6 datasets
    assert rows[1].startswith("| 1 | y | 30 | 18.00 | 3.00 |")  # Borda as points, not 30.0000
    assert "30.0000" not in markdown and "| y | caltech101 | 0.6000 |" in markdown


# -- 15: non-standard results are shown beside, never scored ---------------------------------------------------


@pytest.mark.parametrize("overrides, label", [
    ({"version": "plus", "attacks": list(VERSIONS["plus"].attacks), "standard": False}, "plus"),
    ({"precision": "bf16", "standard": False}, "bf16"),
    ({"attacks": ["apgd-ce"], "standard": False}, "attacks apgd-ce"),
    ({"version": "rand", "attacks": ["apgd-ce", "apgd-dlr"], "standard": False}, "rand"),
])
def test_non_standard_results_are_labelled_not_scored(tmp_path, mini_dir, tiny_run, clean_pred, overrides, label):
    dm = datamodule(mini_dir)
    write_attack(tmp_path / "attack", "linf", tiny_run, dm, np.ones(200), clean_pred, **overrides)
    found = read_attack("linf", options(tmp_path), expectation(tiny_run, dm, clean_pred))
    assert not found.standard and found.summary.label() == label


def test_non_standard_result_in_the_record_table_and_leaderboard(tmp_path, mini_dir, tiny_run, clean_pred):
    dm = datamodule(mini_dir)
    write_attack(tmp_path / "attack", "linf", tiny_run, dm, np.ones(200), clean_pred, precision="bf16",
                 standard=False)
    model, meta = load_with_meta(tiny_run)
    result = evaluate_model(model, meta, tiny_run / "model.safetensors", dm, options(tmp_path))
    assert result.white_box.settings["autoattack_linf"] is None and "autoattack_linf" in result.white_box.missing
    assert result.non_standard["linf"].precision == "bf16" and result.attacks == {}
    table = format_table(result)
    assert "autoattack_linf      missing" in table and "[non-standard: bf16; not in the score]" in table
    board = build_leaderboard({tmp_path / "eval" / "scores.json": result}, datasets=["digits"])
    assert board.rows[0].sum.score is None and "(bf16)" in to_markdown(board)


# -- 16: corruption names in one spelling ----------------------------------------------------------------------


def test_corruption_names_are_normalised_once_and_unknown_ones_refused():
    assert corruption_key("Shot Noise") == corruption_key("shot-noise") == corruption_key(" SHOT_NOISE ") == "shot_noise"
    keys = corruption_keys(["JPEG Compression", "elastic-transform", "snow"])
    assert keys.tolist() == ["jpeg_compression", "elastic_transform", "snow"]
    assert set(corruption_keys([c.replace("_", " ").title() for c in CORRUPTIONS])) == set(CORRUPTIONS)
    with pytest.raises(EvaluationError, match="unknown corruption 'Gaussian Noise' in the common split"):
        corruption_keys(["snow", "Gaussian Noise"])
    with pytest.raises(EvaluationError, match="unknown corruption None"):
        corruption_keys([None])


# -- 18: worst-k as the CPE paper -----------------------------------------------------------------------------


def test_worst_k_defaults_to_1_5_10():
    cfg = OmegaConf.load(CONF / "evaluate.yaml")
    assert list(cfg.worst_k) == [1, 5, 10] and scoring(Path(), Path()).worst_k == (1, 5, 10)
    assert cfg.rank_by == "borda" and cfg.leaderboard_datasets is None


# -- 21: what evaluate.py reports goes through logging (so Hydra writes it to evaluate.log) --------------------


def test_pool_mode_reports_through_logging(tmp_path, caplog):
    save_pool([record("m", "d", [0.5] * 5)], tmp_path / "eval")
    cfg = compose_config("evaluate", f"pool=[{tmp_path / 'eval'}]", f"leaderboard_dir={tmp_path / 'board'}",
                         "protocol=white_box", "rank_by=borda", "leaderboard_datasets=[d]")
    with caplog.at_level(logging.INFO, logger="rgb.evaluation"):
        assert run_evaluation(cfg) is None
    assert "| 1 | m | 0 | 2.50 | 2.50 |" in caplog.text and "leaderboard written to" in caplog.text
    cfg.rank_by = "best"
    with pytest.raises(EvaluationError, match="rank_by must be one of"):
        run_evaluation(cfg)


# -- 23: plots readable at a glance ----------------------------------------------------------------------------


def _texts(ax) -> list[str]:
    return [t.get_text() for t in ax.texts]


def test_zero_bars_are_visible_and_every_bar_labelled():
    fig = settings_figure({"digits": {"test": 0.9, "common": 0.0, "autoattack_l1": None}}, "t")
    ax = fig.axes[0]
    heights = [p.get_height() for p in ax.patches]
    assert len(heights) == 3 and min(heights) > 0  # the zero and the missing bar are drawn
    assert {"0.9000", "0.0000", "missing"} <= set(_texts(ax))


def test_class_ticks_are_integers_and_model_names_get_their_own_rows():
    fig = class_accuracy_figure({"test": [0.5, 0.0, None, 1.0]}, ["a", "b", "c", "d"], "t")
    fig.canvas.draw()
    ticks = fig.axes[0].get_xticks()
    visible = [t for t in ticks if 0.4 <= t <= 3.6]
    assert visible and all(float(t).is_integer() for t in visible)
    names = [f"a-long-model-name-{i}" for i in range(12)]
    small = leaderboard_figure({"ranked": {n: {"d": (2.5, "2.50", True)} for n in names[:2]}}, "t", 5)
    large = leaderboard_figure({"ranked": {n: {"d": (2.5, "2.50", True), "e": (None, "missing", False)}
                                           for n in names}}, "t", 5)
    assert [t.get_text() for t in large.axes[0].get_yticklabels()] == names  # one row each, on the y axis
    assert large.get_size_inches()[1] > small.get_size_inches()[1]  # the figure grows with the pool


def test_black_box_from_transfer_splits_on_disk_and_sweep_are_plotted(tmp_path, mini_dir, tiny_run, monkeypatch):
    from rgb.data import BenchmarkData
    from rgb.data.layout import readme_title
    from rgb.data.snapshot import write_readme
    from rgb.evaluation import model_eval

    source = tmp_path / "mini"
    shutil.copytree(mini_dir, source)
    (source / "data" / "digits" / "mine").mkdir()
    for split in ("linf_4", "l2_2"):  # a user's surrogate (rows aligned with test, like every transfer split)
        shutil.copy(source / "data" / "digits" / "random_linf_30.parquet", source / "data" / "digits" / "mine" /
                    f"{split}.parquet")
    write_readme(source, readme_title(source))
    dm = BenchmarkData(source=str(source), dataset="digits", image_size=32, num_classes=10,
                       budgets=datamodule(mini_dir).budgets, eval_batch_size=256)
    sweep = {c: {s: Accuracy(100 - 10 * s, 100) for s in range(1, 6)} for c in CORRUPTIONS}
    monkeypatch.setattr(model_eval, "severity_sweep", lambda *args: sweep)  # the real one corrupts 24750 images
    model, meta = load_with_meta(tiny_run)
    result = evaluate_model(model, meta, tiny_run / "model.safetensors", dm,
                            options(tmp_path, transfer=True, severity_sweep=True))
    bb = result.black_box
    assert bb.strongest_surrogate["linf_4"] == "mine" and bb.by_surrogate["l2_2"]["mine"].total == 200
    assert bb.settings["linf_8"] is None and "linf_8" in bb.missing and bb.score is None  # missing, never 0
    assert {"severity_sweep.png", "black_box.png"} <= set(result.plots)
    for plot in result.plots:
        assert (tmp_path / "eval" / plot).stat().st_size > 5000
    assert "black-box score    incomplete" in format_table(result)
