"""evaluate.py zeroshot_report=true: every prompt ensemble of a zero-shot run side by side (the CPE seed's Table 2),
on a tiny random-weight CLIP exported by strategy=zeroshot through the real configs; bad input in one line."""

import csv
import json
import shutil
from pathlib import Path

import hydra
import pytest
import safetensors.torch
import torch

from helpers import compose_config, compose_tiny_clip, raises_one_line, scoring
from rgb.evaluation.model_eval import EvaluationError, evaluate_model
from rgb.commands.evaluate import run_evaluation
from rgb.runs.store import ZEROSHOT_REPORT_DIR
from rgb.zeroshot import row_metrics
from rgb.models import load_with_meta
from rgb.commands.train import train

ROWS = ("clip (class names)", "single", "mean", "zpe (test debias)", "zpe (median+2*MAD, logit average, test debias)",
        "cpe (weights)")
CPE = "cpe (weights)"
METRICS = ("overall", "worst@1", "worst@5", "worst@10", "hm", "gm")


@pytest.fixture(scope="module")
def cpe_run(tmp_path_factory, mini_dir):
    """strategy=zeroshot prompts=cpe on the untrained embedded architecture; its prompts cache in <root>/data."""
    root = tmp_path_factory.mktemp("zs_report")
    train(compose_tiny_clip(root, mini_dir, "strategy=zeroshot", "prompts=cpe", "monitor.metric=val/acc"))
    return root


def evaluate_config(root: Path, mini_dir: Path, *overrides: str):
    return compose_config("evaluate", f"paths.mini_dir={mini_dir}", f"paths.output_dir={root / 'out'}",
                          f"paths.data_dir={root / 'data'}", *overrides)


def report_of(root: Path, mini_dir: Path, *overrides: str) -> tuple[dict, Path]:
    run_evaluation(evaluate_config(root, mini_dir, f"run={root / 'run'}", "zeroshot_report=true", *overrides))
    out = root / "out" / "eval" / "digits" / "run" / ZEROSHOT_REPORT_DIR
    return json.loads((out / "comparison.json").read_text()), out


def by_ensemble(report: dict) -> dict[str, dict]:
    return {row["ensemble"]: {**row, **row_metrics(row)} for row in report["rows"]}


def test_every_ensemble_side_by_side_and_the_run_s_own_row_is_the_exported_model(cpe_run, mini_dir):
    report, out = report_of(cpe_run, mini_dir)
    _, meta = load_with_meta(cpe_run / "run")
    rows = by_ensemble(report)
    assert list(rows) == [*ROWS, "exported (cpe (weights))"]
    assert (report["n_images"], report["unlabelled_split"], report["unlabelled_images"]) == (200, "validation", 270)
    assert (report["cmm_units"], report["cpe_weights_split"], report["worst_k"]) == ("logit", "validation",
                                                                                     ["1", "5", "10"])
    assert report["zpe_variants"] == [ROWS[3], ROWS[4]] and report["run_label"] == CPE
    # the training run's text features are read from the prompts cache: only the prompts of the report's own rows
    # (the class name alone, `{}`, and the single template, which a cpe pool no longer holds) are encoded
    assert report["texts_encoded"] == 2 * 10
    for row in rows.values():
        assert all(0 <= row[m] <= 1 for m in METRICS)
        assert row["worst@1"] <= row["worst@5"] <= row["worst@10"]  # 10 classes: worst@10 = mean class accuracy
    # the cpe row rebuilds the exported head from the same unlabelled images: same weights, same predictions
    recorded = meta["zeroshot"]["templates"]
    assert [t["template"] for t in rows[CPE]["templates"]] == [t["template"] for t in recorded]
    assert [t["kept"] for t in rows[CPE]["templates"]] == [t["kept"] for t in recorded]
    assert [t["weight"] for t in rows[CPE]["templates"]] == pytest.approx([t["weight"] for t in recorded], abs=1e-6)
    assert rows[CPE]["class_wise"] == rows["exported (cpe (weights))"]["class_wise"]
    m = len(recorded)
    assert [t["weight"] for t in rows["mean"]["templates"]] == pytest.approx([1 / m] * m)
    assert rows["single"]["templates"] == [] and rows[ROWS[0]]["templates"] == []  # fixed heads
    with open(out / "ensembles.csv") as f:
        table = list(csv.DictReader(f))
    assert [r["ensemble"] for r in table] == list(rows) and float(table[5]["overall"]) == rows[CPE]["overall"]
    with open(out / "templates.csv") as f:
        assert sum(1 for _ in csv.DictReader(f)) == 4 * m  # mean, two zpe, cpe
    markdown = (out / "comparison.md").read_text()
    assert "| ensemble | overall | worst@1 | worst@5 | worst@10 | hm | gm | templates kept |" in markdown
    assert "cpe: Cmm in logit units, k = 0.1, tau = 1.0, weights from the `validation` split" in markdown
    assert f"zpe variants: {ROWS[3]}, {ROWS[4]}" in markdown
    assert f"| `{recorded[0]['template']}` |" in markdown


def test_worst_k_cmm_units_and_descriptions_are_options(cpe_run, mini_dir, tmp_path):
    descriptions = tmp_path / "descriptions.json"
    names = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
    descriptions.write_text(json.dumps({name: [f"the shape of {name}", "a thick stroke"] for name in names}))
    model, _ = load_with_meta(cpe_run / "run")
    with torch.no_grad():
        pretraining = model.image_features(torch.rand(6, 3, 32, 32, generator=torch.Generator().manual_seed(0)))
    features = tmp_path / "pretraining.safetensors"
    safetensors.torch.save_file({"features": pretraining.contiguous()}, str(features))
    report, out = report_of(cpe_run, mini_dir, "worst_k=[1,5,10,20,100]", "zeroshot_report_options.cmm_units=cosine",
                            f"zeroshot_report_options.descriptions={descriptions}",
                            f"zeroshot_report_options.zpe_pretraining_features={features}",
                            "zeroshot_report_options.mad_t=0.5")
    rows = by_ensemble(report)
    published = "zpe (median+0.5*MAD, logit average, pretraining+test debias)"
    assert list(rows) == [*ROWS[:2], "descriptor", *ROWS[2:4], published, CPE, "cpe (+descriptions)",
                          "exported (cpe (weights))"]
    assert report["zpe_pretraining_features"]["images"] == 6 and report["zpe_variants"] == [ROWS[3], published]
    assert rows["descriptor"]["worst@20"] is None and rows["descriptor"]["worst@100"] is None  # 10 classes
    markdown = (out / "comparison.md").read_text()
    assert report["cmm_units"] == "cosine" and "Cmm in cosine units" in markdown
    assert "| worst@20 | worst@100 | hm |" in markdown and "| n/a | n/a |" in markdown
    default = by_ensemble(report_of(cpe_run, mini_dir)[0])
    weights = [[t["weight"] for t in r[CPE]["templates"]] for r in (default, rows)]
    assert weights[0] != pytest.approx(weights[1], abs=1e-9)  # cosine Cmm: another softmax
    assert rows["cpe (+descriptions)"]["templates"] == rows[CPE]["templates"]  # same weights, described classes


def test_reports_are_averaged_over_a_pool(cpe_run, mini_dir):
    report, out = report_of(cpe_run, mini_dir)
    saved = out.parent / "saved.json"
    shutil.copy(out / "comparison.json", saved)
    run_evaluation(evaluate_config(cpe_run, mini_dir, f"pool=[{saved},{cpe_run / 'run'}]", "zeroshot_report=true"))
    pool = json.loads((cpe_run / "out" / "leaderboard" / ZEROSHOT_REPORT_DIR / "comparison.json").read_text())
    rows = by_ensemble(report)
    assert [r["ensemble"] for r in pool["rows"]] == list(rows)
    for averaged in pool["rows"]:
        assert averaged["datasets"] == 2
        assert {m: averaged[m] for m in METRICS} == pytest.approx({m: rows[averaged["ensemble"]][m] for m in METRICS})
    assert "averaged over 2 reports" in (cpe_run / "out" / "leaderboard" / ZEROSHOT_REPORT_DIR / "comparison.md").read_text()


def test_the_unlabelled_split_option_changes_the_weights_and_never_the_scoring(cpe_run, mini_dir):
    default, _ = report_of(cpe_run, mini_dir)
    transductive, _ = report_of(cpe_run, mini_dir, "zeroshot_report_options.unlabelled_split=test",
                                "zeroshot_report_options.ensembles=[mean,cpe]")
    assert (transductive["unlabelled_split"], transductive["unlabelled_images"]) == ("test", 200)
    before, after = by_ensemble(default), by_ensemble(transductive)
    assert list(after) == ["clip (class names)", "mean", CPE, "exported (cpe (weights))"]
    weights = [[t["weight"] for t in rows[CPE]["templates"]] for rows in (before, after)]
    assert weights[0] != pytest.approx(weights[1], abs=1e-9)
    assert after["mean"]["overall"] == before["mean"]["overall"]  # mean reads no image: same head, same score


def test_a_model_that_is_not_zero_shot_is_one_line(cpe_run, mini_dir, tmp_path):
    ft = tmp_path / "ft"
    train(compose_tiny_clip(ft, mini_dir, "strategy=linear_probe", "debug=fdr", "data.batch_size=16"))
    with raises_one_line(EvaluationError, match="zeroshot_report=true .* needs a zero-shot .* an openclip "
                                                "model without a prompt-built head") as err:
        run_evaluation(evaluate_config(tmp_path, mini_dir, f"run={ft / 'run'}", "zeroshot_report=true"))


@pytest.mark.parametrize("overrides, message", [
    (["text_robustness=true"], "text_robustness and zeroshot_report are separate reports"),
    (["zeroshot_report_options.ensembles=[mean,best]"], r"unknown or none \(best\); choose from single, mean"),
    (["zeroshot_report_options.ensembles=[]"], "unknown or none"),
    (["zeroshot_report_options.cmm_units=degrees"], "cmm_units: 'degrees' is none of logit, cosine"),
    (["worst_k=[0]"], "worst_k: worst-k needs a class count >= 1"),
    (["pool=[nowhere/comparison.json]"], "zero-shot report nowhere/comparison.json does not exist"),
])
def test_bad_options_are_one_line(cpe_run, mini_dir, overrides, message):
    with raises_one_line(EvaluationError, match=message) as err:
        report_of(cpe_run, mini_dir, *overrides)


def test_other_class_names_are_refused_by_the_report_and_by_the_scores(cpe_run, mini_dir, tmp_path):
    run = tmp_path / "renamed"
    shutil.copytree(cpe_run / "run", run)
    meta = json.loads((run / "model.json").read_text())
    meta["zeroshot"]["class_names"] = [str(i) for i in range(10)]  # a head built for "0".."9", not "zero".."nine"
    (run / "model.json").write_text(json.dumps(meta))
    with raises_one_line(EvaluationError,
                         match=r"built for other class names than the dataset's .*'0' != 'zero'") as err:
        run_evaluation(evaluate_config(tmp_path, mini_dir, f"run={run}", "zeroshot_report=true"))
    cfg = evaluate_config(tmp_path, mini_dir, f"run={run}")
    model, meta = load_with_meta(run)
    options = scoring(tmp_path / "attack", tmp_path / "eval")
    with raises_one_line(EvaluationError, match="built for other class names") as err:
        evaluate_model(model, meta, run / "model.safetensors", hydra.utils.instantiate(cfg.data), options)
    assert not (tmp_path / "eval").exists()
    assert isinstance(model, torch.nn.Module)
