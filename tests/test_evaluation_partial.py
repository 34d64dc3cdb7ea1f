"""Issue 19 items 1, 10, 15, 16, 24: a Sum is a Sum only over whole splits and every setting; partial or incomplete
entries are shown as such and ranked apart; a partial evaluation never replaces a complete record; the plots show
what the tables show."""

import csv
import io
import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from helpers import REPO, card_protocol, datamodule, record, scoring, write_attack
from rgb.core.files import distinct_name
from rgb.evaluation.leaderboard import board_figure, build_leaderboard, find_records, to_markdown, write_leaderboard
from rgb.evaluation.model_eval import evaluate_model, format_table
from rgb.evaluation.plots import attack_stages_figure, class_accuracy_figure, instability_distance_figure
from rgb.evaluation.records import WHITE_BOX_SETTINGS, Accuracy, ModelIdentity, ProtocolScore, ScoresRecord
from rgb.evaluation.scores import sum_score
from rgb.models import load_with_meta


def partial_record(model, dataset, values, n=250, of=1000):
    """A record scored with allow_partial on the first `n` of `of` test images."""
    settings = {s: Accuracy(round(v * n), n, partial=True) for s, v in zip(WHITE_BOX_SETTINGS, values)}
    return ScoresRecord(
        model=ModelIdentity(model, "timm", "t", "ce", "fft", "0"), dataset=dataset, source="s", n_test=of, eps={},
        white_box=ProtocolScore("white_box", settings), common_by_corruption={}, class_wise={}, attacks={},
        max_images=n, protocol=card_protocol(dataset),
    )


# -- 1: a partial accuracy makes its Sum incomplete -----------------------------------------------------------


def test_a_partial_accuracy_is_no_full_number():
    score = partial_record("p", "d", [0.9, 0.8, 0.7, 0.6, 0.5]).white_box
    assert score.score is None and not score.complete and score.scored == {}
    assert score.incomplete == list(WHITE_BOX_SETTINGS) and score.partial_settings == list(WHITE_BOX_SETTINGS)
    assert score.partial_sum == pytest.approx(3.5) and score.covered == 5
    assert score.describe().startswith("PARTIAL (3.5000 over 5 of 5 settings; over part of the split: test,")
    total = sum_score({"d": score}, ["d"])
    assert total.score is None and total.partial and not total.complete and total.covered == 5
    assert total.partial_sum == pytest.approx(3.5) and total.describe() == "3.50 / 5 PARTIAL (5 over part of a split)"
    assert total.to_json()["score"] is None and total.to_json()["partial"] is True


def test_a_partial_model_is_never_ranked_with_complete_ones_nor_in_their_borda(tmp_path):
    records = [record("a", "d", [0.5] * 5), record("b", "d", [0.4] * 5),
               partial_record("p", "d", [0.9, 0.8, 0.7, 0.6, 0.5])]  # the best numbers, on 250 of 1000 images
    pool = {Path(f"{r.model.run_name}.json"): r for r in records}
    for rank_by in ("borda", "sum"):
        board = write_leaderboard(pool, tmp_path / rank_by, datasets=["d"], rank_by=rank_by)
        assert [(r.model, r.rank, r.status) for r in board.rows] == [
            ("a", 1, "complete"), ("b", 2, "complete"), ("p", 3, "PARTIAL")]
        assert [r.borda for r in board.rows] == [5, 0, 0]  # p takes no point from a and b
        assert board.rows[2].sum.score is None
        markdown = (tmp_path / rank_by / "leaderboard.md").read_text()
        ranked, apart = markdown.split("## Incomplete entries")
        assert "| 1 | a | 5 | 2.50 | 2.50 |" in ranked and "| p |" not in ranked.split("## Accuracy")[0]
        assert "| 3 | p | 0 | 3.50 / 5 PARTIAL (5 over part of a split) | 3.50 (5/5, PARTIAL) |" in apart
        assert "| p | d | 0.9000 PARTIAL (225/250) |" in markdown  # the per-setting table
        rows = list(csv.DictReader(io.StringIO((tmp_path / rank_by / "leaderboard.csv").read_text())))
        assert [(r["model"], r["status"]) for r in rows] == [("a", "complete"), ("b", "complete"), ("p", "PARTIAL")]
        assert float(rows[0]["sum"]) == pytest.approx(2.5) and rows[2]["sum"] == ""
        assert rows[2]["partial"].split(";") == [f"d/{s}" for s in WHITE_BOX_SETTINGS]
        saved = json.loads((tmp_path / rank_by / "leaderboard.json").read_text())["rows"][2]
        assert saved["status"] == "PARTIAL" and saved["sum"]["score"] is None and saved["sum"]["partial"]
        assert saved["per_dataset"]["d"]["partial_settings"] == list(WHITE_BOX_SETTINGS)
        info = json.loads((tmp_path / rank_by / "model_info" / "d" / f"{distinct_name('p')}.json").read_text())
        assert info["partial"] and info["max_images"] == 250 and info["score"] is None


def test_one_partial_setting_among_full_ones_is_marked_and_left_out_of_borda():
    base = record("x", "d", [0.9, 0.7, 0.1, 0.2, 0.3])
    settings = {**base.white_box.settings, "autoattack_linf": Accuracy(30, 100, partial=True)}
    x = replace(base, white_box=ProtocolScore("white_box", settings))
    score = x.white_box
    assert score.partial_settings == ["autoattack_linf"] and list(score.scored) == list(WHITE_BOX_SETTINGS[:4])
    assert x.partial and x.file_name == "scores.partial.json"
    board = build_leaderboard({Path("x"): x, Path("y"): record("y", "d", [0.1] * 5)}, datasets=["d"])
    assert [r.model for r in board.rows] == ["y", "x"] and board.rows[1].sum.partial_settings == ["d/autoattack_linf"]


# -- 15: complete entries first; incomplete ones apart ----------------------------------------------------------


def test_an_incomplete_entry_never_ranks_above_a_complete_one():
    # The demo: `demo` has all five settings; `demo_zeroshot` 3 of 5 (Linf only), better on the three it has.
    records = [record("demo", "digits", [0.9, 0.6, 0.1, 0.1, 0.1]),
               record("demo_zeroshot", "digits", [0.95, 0.8, None, None, 0.3])]
    pool = {Path(r.model.run_name): r for r in records}
    for rank_by in ("borda", "sum"):
        board = build_leaderboard(pool, datasets=["digits"], rank_by=rank_by)
        assert [r.model for r in board.rows] == ["demo", "demo_zeroshot"]
        assert board.rows[0].complete and not board.rows[1].complete and board.rows[1].status == "incomplete"
        ranked, apart = to_markdown(board).split("## Incomplete entries: ranked apart, below every complete entry")
        assert "| 1 | demo | 0 | 1.80 | 1.80 |" in ranked and "demo_zeroshot" not in ranked
        assert "| 2 | demo_zeroshot | 0 | 2.05 / 3 (partial, of 5) | 2.05 (3/5) |" in apart
    # Among incomplete entries only (a pool over fewer datasets than the card's), Borda over the pairs they share.
    alone = build_leaderboard({Path("z"): records[1], Path("w"): record("w", "digits", [0.1, 0.1, 0.1, None, 0.1])},
                              datasets=["digits"])
    assert [r.model for r in alone.rows] == ["demo_zeroshot", "w"] and alone.incomplete_borda_pairs == 3
    assert "No complete entry in this pool." in to_markdown(alone)


# -- 10: the partial Sum of a record with settings missing ------------------------------------------------------


def test_a_record_with_settings_missing_gives_its_partial_sum_of_n():
    score = record("m", "d", [0.9, 0.7, None, None, 0.1]).white_box
    assert score.score is None and (score.partial_sum, score.covered, score.max) == (pytest.approx(1.7), 3, 5)
    assert str(score) == "incomplete (1.7000 over 3 of 5 settings; missing: autoattack_l1, autoattack_l2)"
    assert score.to_json()["covered"] == 3 and str(record("m", "d", [0.5] * 5).white_box) == "2.5000 / 5"
    readme = (REPO / "README.md").read_text()
    assert "print(record.white_box)  " in readme and "n_examples=100)" in readme


def test_benchmark_n_examples_scores_a_labelled_partial_subset(mini_dir, tmp_path):
    import rgb
    from user_models import trained_small_cnn

    model = trained_small_cnn(mini_dir)
    result = rgb.benchmark(model, "mini", source=str(mini_dir), settings=("test", "common", "linf"), name="cnn",
                           output_dir=tmp_path, progress=False, budgets={"linf": 0.2}, n_examples=40)
    assert result.partial and result.max_images == 40 and result.white_box.score is None
    assert {a.total for a in result.white_box.present.values()} == {40}
    assert result.white_box.partial_settings == ["test", "common", "autoattack_linf"]
    saved = tmp_path / "eval" / "digits" / "cnn" / "partial" / "scores.partial.json"
    assert ScoresRecord.load(saved) == result and not (saved.parents[1] / "scores.json").exists()
    summary = json.loads((tmp_path / "attack" / "digits" / "cnn" / "first-40" / "linf" / "summary.json").read_text())
    assert summary["n"] == 40 and summary["n_robust"] == result.white_box.settings["autoattack_linf"].correct
    with pytest.raises(rgb.evaluation.model_eval.EvaluationError, match="n_examples must be a positive integer"):
        rgb.benchmark(model, "mini", source=str(mini_dir), output_dir=tmp_path, n_examples=0)


# -- 24: a partial evaluation is written beside the complete record ------------------------------------------


def test_a_partial_evaluation_keeps_the_complete_record(tmp_path, mini_dir, tiny_run, clean_pred):
    dm = datamodule(mini_dir)
    write_attack(tmp_path / "attack", "linf", tiny_run, dm, np.ones(200, dtype=bool), clean_pred)
    model, meta = load_with_meta(tiny_run)
    out = tmp_path / "eval"
    full = evaluate_model(model, meta, tiny_run / "model.safetensors", dm,
                          scoring(tmp_path / "attack", out))
    kept = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    assert not full.partial and "scores.json" in kept and "settings.png" in kept
    part = evaluate_model(model, meta, tiny_run / "model.safetensors", dm,
                          scoring(tmp_path / "attack", out, allow_partial=True, max_images=100))
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == kept  # untouched
    saved = json.loads((out / "partial" / "scores.partial.json").read_text())
    assert saved["partial"] is True and saved["max_images"] == 100 and saved["white_box"]["score"] is None
    assert part.common_by_corruption and all(a.partial for a in part.common_by_corruption.values())
    assert (out / "partial" / "settings.png").is_file() and part.title.endswith("(PARTIAL)")
    assert "(test n=200; PARTIAL: the first 100 images of each split)" in format_table(part)
    assert list(find_records([out])) == [out / "scores.json"]  # a pool collects the complete record only
    with pytest.raises(FileNotFoundError, match="PARTIAL records such as .*scores.partial.json enter only when named"):
        find_records([out / "partial"])
    named = build_leaderboard(find_records([out / "partial" / "scores.partial.json"]), datasets=["digits"])
    assert named.rows[0].status == "PARTIAL"


# -- 16: plots agree with the tables and hide nothing ----------------------------------------------------------


def _boxes_overlap(fig, a, b) -> bool:
    renderer = fig.canvas.get_renderer()
    return a.get_window_extent(renderer).overlaps(b.get_window_extent(renderer))


def test_leaderboard_figure_shows_the_markdown_cells_and_its_legend_clears_the_axis_label():
    records = [record("demo", "d1", [0.9, 0.6, 0.1, 0.1, 0.1]), record("demo", "d2", [0.5] * 5),
               record("demo_zeroshot", "d1", [0.95, 0.8, None, None, 0.3])]
    board = build_leaderboard({Path(f"{r.model.run_name}{r.dataset}"): r for r in records}, datasets=["d1", "d2"])
    fig = board_figure(board)
    ranked, apart = fig.axes  # an incomplete sum is never drawn beside a ranked one as if comparable
    shown = [t.get_text() for ax in fig.axes for t in ax.texts]
    head = to_markdown(board).split("## Accuracy per setting")[0]
    cells = {c.strip() for line in head.splitlines() if line.startswith("| ") for c in line.split("|")}
    assert sorted(shown) == sorted(["1.80", "2.50", "2.05 (3/5)", "missing"]) and set(shown) <= cells
    assert [t.get_text() for t in ranked.get_yticklabels()] == ["1. demo"]
    assert [t.get_text() for t in apart.get_yticklabels()] == ["2. demo_zeroshot"]
    assert "incomplete" in apart.get_title() and "ranked (complete" in ranked.get_title()
    fig.canvas.draw()
    for ax in fig.axes:
        assert not _boxes_overlap(fig, ax.get_legend(), ax.xaxis.label)


def test_coinciding_attack_stage_curves_stay_visible():
    stages = {"clean": 0.9, "apgd-ce": 0.4, "apgd-t": 0.3, "fab-t": 0.3, "square": 0.3}
    fig = attack_stages_figure({"linf": stages, "l2": dict(stages), "l1": dict(stages)}, "t")
    lines = fig.axes[0].get_lines()
    assert len({tuple(line.get_xdata()) for line in lines}) == 3  # offset sideways
    assert len({line.get_marker() for line in lines}) == 3 and len({line.get_linestyle() for line in lines}) == 3
    assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == list(stages)
    # the values in a table under the axes (a row per norm), never written at the points, where they overlapped
    assert not fig.axes[0].texts
    table = fig.axes[0].tables[0]
    cells = table.get_celld()
    assert [cells[row, 0].get_text().get_text() for row in (1, 2, 3)] == ["linf", "l2", "l1"]
    assert [cells[1, col].get_text().get_text() for col in range(1, 6)] == ["0.90", "0.40", "0.30", "0.30", "0.30"]
    fig.canvas.draw()
    assert not _boxes_overlap(fig, table, fig.axes[0].xaxis.label)


def test_attack_stages_with_long_labels_keep_their_ticks_and_cells_apart(tmp_path):
    """A run under another implementation is labelled "linf [impl ...]": its name sits in the table's first column,
    so the axes keep their width (tick labels apart) and five rows' values stay in their cells once saved."""
    from rgb.evaluation.plots import save

    stages = {"clean": 0.9, "apgd-ce": 0.4, "apgd-t": 0.3, "fab-t": 0.3, "square": 0.3}
    names = ["linf", "l2", "l1", "linf [impl autoattack 0.1]", "l2 [impl autoattack 0.1]"]
    fig = attack_stages_figure({name: dict(stages) for name in names}, "t")
    ax = fig.axes[0]
    fig.tight_layout()  # what save() does before writing
    fig.canvas.draw()
    ticks = ax.get_xticklabels()
    assert not any(_boxes_overlap(fig, a, b) for a, b in zip(ticks, ticks[1:]))
    cells = ax.tables[0].get_celld()
    renderer = fig.canvas.get_renderer()
    for row in range(1, 6):
        for col in range(6):
            text = cells[row, col].get_text().get_window_extent(renderer)
            cell = cells[row, col].get_window_extent(renderer)
            assert cell.x0 - 1 <= text.x0 and text.x1 <= cell.x1 + 1, (row, col)
    assert save(fig, tmp_path / "attack_stages.png").stat().st_size > 0


def test_class_accuracy_names_the_classes_and_writes_nothing_on_the_bars():
    names = ["cat", "dog", "owl", "eel"]
    fig = class_accuracy_figure({"test": [0.5, 0.0, None, 1.0], "common": [1.0, 0.2, 0.4, 0.6]}, names, "t")
    first, second = fig.axes
    assert not first.texts and not second.texts
    assert [t.get_text() for t in first.get_xticklabels()] == ["dog", "cat", "eel"]  # worst first; owl absent
    assert [t.get_text() for t in second.get_xticklabels()] == ["dog", "owl", "eel", "cat"]
    many = [f"class-{i}" for i in range(60)]
    values = [i / 60 for i in range(60)][::-1]
    big = class_accuracy_figure({"test": values}, many, "t")
    assert not big.axes[0].texts and "class-59: 0.00" in big.axes[0].get_xlabel()
    assert "class-55: 0.07" in big.axes[0].get_xlabel() and "class-54" not in big.axes[0].get_xlabel()


def test_instability_figure_has_one_panel_per_perturbation_type():
    rng = np.random.default_rng(0)
    points = {t: (rng.random(1400), rng.random(1400)) for t in ("keyboard_typo", "char_swap", "punctuation")}
    fig = instability_distance_figure(points, "t")
    visible = [ax for ax in fig.axes if ax.get_visible()]
    assert [ax.get_title() for ax in visible] == [f"{t} (n=1400)" for t in points]
    assert all(len(ax.collections) == 1 for ax in visible)
    assert len({ax.get_xlim() for ax in visible}) == 1 and len({ax.get_ylim() for ax in visible}) == 1
