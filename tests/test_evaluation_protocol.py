"""Every score carries its protocol: records made under budgets, image sizes or surrogates other than the card's are
shown apart and labelled, never summed or ranked with card entries; a black-box setting is complete only when every
card surrogate of it was asked over its whole split; pools never read staging copies."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from helpers import card_protocol, datamodule, record, save_pool, scoring
from rgb.core.files import distinct_name, is_staging, remove_dead_staging, replaced_whole
from rgb.data.protocol import Protocol
from rgb.evaluation.leaderboard import (
    OTHER_PROTOCOL,
    board_figure,
    build_leaderboard,
    find_records,
    to_csv,
    to_markdown,
    write_leaderboard,
    write_seed_spread,
)
from rgb.evaluation.model_eval import evaluate_model, format_table
from rgb.evaluation.plots import settings_figure
from rgb.evaluation.records import Accuracy, RecordError, ScoresRecord
from rgb.evaluation.scores import black_box_score
from rgb.models import load_with_meta


def test_the_card_protocol_of_each_kind_of_dataset():
    real = Protocol.of("caltech101", 224, {"l1": 75.0, "l2": 2.0, "linf": 4 / 255})
    assert real.is_card and real.card_image_size == 224 and real.differences == []
    mini = Protocol.of("digits", 32, card_protocol("digits", 32).budgets)  # its scaled budgets are its card
    assert mini.is_card and mini.card_image_size == 32
    smaller = Protocol.of("caltech101", 112, card_protocol("x", 112).budgets)  # budgets follow, images do not
    assert smaller.differences_for("white_box")[0] == "image size 112, card 224"
    assert smaller.differences_for("black_box") == ["image size 112, card 224"]
    other = Protocol.of("caltech101", 224, {"l1": 75.0, "l2": 1.0, "linf": 8 / 255})
    assert other.differences == ["L2 1, card 2", "Linf 8/255, card 4/255"] and not other.is_card
    assert other.differences_for("black_box") == []  # the transfer splits carry their own budgets


def test_a_record_under_other_budgets_is_shown_apart_never_in_the_sum_or_borda(tmp_path):
    # the audit's pool: an entry attacked at L2 1.0 ranked first (10.02 / 30) above the card-budget model
    card = record("card", "caltech101", [0.8, 0.6, 0.3, 0.2, 0.1])
    easier = record("easy", "caltech101", [0.8, 0.6, 0.3, 0.5, 0.1],
                    protocol=card_protocol("caltech101", l2=1.0))
    board = write_leaderboard({Path("a"): card, Path("b"): easier}, tmp_path, datasets=["caltech101"])
    assert [(r.model, r.rank, r.status) for r in board.rows] == [("card", 1, "complete"), ("easy", 0, OTHER_PROTOCOL)]
    assert board.complete_rows == [board.rows[0]] and board.other_protocol_rows == [board.rows[1]]
    assert board.rows[0].borda == 0 and board.borda_pairs == 5  # alone among card entries: nobody to beat
    assert board.rows[1].protocol_differences == {"caltech101": ["L2 1, card 2"]}
    markdown = to_markdown(board)
    ranked, apart = markdown.split("## Under another protocol")
    assert "| 1 | card |" in ranked and "| easy |" not in ranked.split("## Accuracy")[0]
    assert "| easy | caltech101: L2 1, card 2 |" in apart
    assert "other protocol" in to_csv(board) and "L2 1, card 2" in to_csv(board)
    saved = json.loads((tmp_path / "leaderboard.json").read_text())
    assert saved["rows"][1]["status"] == OTHER_PROTOCOL and saved["rows"][1]["card_protocol"] is False
    info = json.loads((tmp_path / "model_info" / "caltech101" / f"{distinct_name('easy')}.json").read_text())
    assert info["protocol"]["differences"] == ["L2 1, card 2"]
    fig = board_figure(board)
    assert [[t.get_text() for t in ax.get_yticklabels()] for ax in fig.axes] == [["1. card"], ["easy"]]
    assert "L2 1, card 2" in fig.axes[1].get_title()


def test_an_evaluation_records_its_protocol_and_says_what_differs(tmp_path, mini_dir, tiny_run):
    model, meta = load_with_meta(tiny_run)
    options = scoring(tmp_path / "attack", tmp_path / "eval")
    result = evaluate_model(model, meta, tiny_run / "model.safetensors", datamodule(mini_dir, l2=0.1), options)
    assert result.protocol.budgets["l2"] == 0.1 and result.protocol.whole_splits
    assert result.differences_for("white_box") == ["L2 0.1, card 0.2857"]
    assert "protocol           not the card's (L2 0.1, card 0.2857)" in format_table(result)
    saved = json.loads((tmp_path / "eval" / "scores.json").read_text())
    assert saved["schema"] == 3 and saved["protocol"]["is_card"] is False
    assert saved["protocol_differences"]["white_box"] == ["L2 0.1, card 0.2857"]
    assert ScoresRecord.load(tmp_path / "eval" / "scores.json") == result


def test_a_record_of_an_older_schema_or_without_protocol_is_refused(tmp_path):
    data = record("m", "d", [0.5] * 5).to_json()
    (tmp_path / "old.json").write_text(json.dumps({**data, "schema": 2}))
    with pytest.raises(RecordError, match="scores schema 2 .*re-run evaluate.py"):
        ScoresRecord.load(tmp_path / "old.json")
    with pytest.raises(RecordError, match="without its protocol"):
        record("m", "d", [0.5] * 5, protocol=None)


def _acc(correct, total, partial=False):
    return Accuracy(correct, total, partial)


CARD = {"a": ("linf_30",), "b": ("linf_30",)}


def test_a_black_box_setting_is_partial_while_one_card_surrogate_is_partly_asked():
    # the audit's run: 150 of 200 images of b's linf_30 asked, a (complete) gives the minimum
    score = black_box_score(_acc(180, 200), _acc(150, 200), {"linf_30": {"a": _acc(40, 200),
                                                                         "b": _acc(120, 150, partial=True)}}, CARD)
    assert score.strongest_surrogate["linf_30"] == "a"
    assert score.settings["linf_30"] == _acc(40, 200, partial=True) and "linf_30" in score.partial_settings
    assert score.score is None and not score.complete
    assert score.surrogate_status["linf_30"] == {"a": "whole split", "b": "PARTIAL (150 asked)"}


def test_a_card_surrogate_not_asked_yet_is_named_so_not_absent():
    score = black_box_score(_acc(180, 200), _acc(150, 200), {"linf_30": {"a": _acc(40, 200), "b": None}}, CARD)
    assert score.not_asked == {"linf_30": ["b"]} and score.absent_surrogates == {}
    assert score.settings["linf_30"].partial and score.score is None
    assert "not asked yet: b (linf_30)" in score.describe() and "absent" not in score.describe()
    assert score.surrogate_status["linf_30"]["b"] == "not asked yet"
    absent = black_box_score(_acc(180, 200), _acc(150, 200), {"linf_30": {"a": _acc(40, 200)}}, CARD)
    assert absent.absent_surrogates == {"linf_30": ["b"]} and "absent surrogates: b (linf_30)" in absent.describe()
    whole = black_box_score(_acc(180, 200), _acc(150, 200), {"linf_30": {"a": _acc(40, 200), "b": _acc(90, 200)}},
                            CARD)
    assert not whole.settings["linf_30"].partial and whole.surrogate_status["linf_30"]["b"] == "whole split"


def test_a_transfer_score_on_the_models_own_adversarial_examples_is_labelled_and_apart():
    transfer = {"linf_4": {"m": _acc(10, 100), "other": _acc(50, 100)}}
    score = black_box_score(_acc(90, 100), _acc(80, 100), transfer, None, own=["m"])
    assert score.own_surrogates == ["m"] and "own adversarial examples (m)" in score.describe()
    own = record("m", "d", [0.9, 0.8, None, None, None], black_box=score)
    assert own.differences_for("black_box") == ["own adversarial examples as transfer (m)"]
    assert own.differences_for("white_box") == []
    board = build_leaderboard({Path("m"): own}, protocol="black_box", datasets=["d"])
    assert board.rows[0].status == OTHER_PROTOCOL and board.rows[0].rank == 0
    assert black_box_score(_acc(90, 100), _acc(80, 100), transfer, None, own=["x"]).own_surrogates == []


def test_an_api_models_settings_plot_says_n_a_as_its_table_does():
    fig = settings_figure({"d": {"test": 0.9, "autoattack_l1": None, "autoattack_linf": None}}, "t",
                          {"autoattack_l1": "n/a (API model)", "autoattack_linf": "n/a (API model)"})
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert texts.count("n/a (API model)") == 2 and "missing" not in texts


def test_a_killed_evaluations_staging_copy_never_enters_a_pool_and_is_cleaned_up(tmp_path):
    save_pool([record("demo", "digits", [0.5] * 5, protocol=card_protocol("digits", 32))], tmp_path / "eval")
    run_dir = tmp_path / "eval" / "digits" / "demo"
    dead = run_dir.with_name(".demo.new.999999999")  # beyond pid_max: no such process
    shutil.copytree(run_dir, dead)
    assert is_staging(dead) and not is_staging(run_dir)
    assert list(find_records([tmp_path / "eval"])) == [run_dir / "scores.json"]  # was: "two records for model"
    live = run_dir.with_name(f".demo.new.{os.getpid()}")
    shutil.copytree(run_dir, live)
    assert remove_dead_staging(run_dir) == [dead] and not dead.exists() and live.exists()
    shutil.rmtree(live)
    shutil.copytree(run_dir, dead)
    with replaced_whole(run_dir) as staging:
        (staging / "note").write_text("x")
    assert not dead.exists() and (run_dir / "note").is_file()


def test_a_pool_that_is_no_longer_one_recipe_over_seeds_drops_the_old_seeds_files(tmp_path):
    (tmp_path / "seeds.md").write_text("old")
    (tmp_path / "seeds.json").write_text("{}")
    write_seed_spread(None, tmp_path)
    assert not (tmp_path / "seeds.md").exists() and not (tmp_path / "seeds.json").exists()
