"""Exports for other boards (rgb.evaluation.exports): RobustBench's model_info and CLIP_benchmark's JSON, written by
write_leaderboard beside rgb's own model_info, read back as those projects' own code reads them."""

import json
import re
from dataclasses import replace
from pathlib import Path

from helpers import card_protocol, record
from rgb.core.classwise import class_wise_summary
from rgb.evaluation.leaderboard import write_leaderboard
from rgb.evaluation.records import Accuracy, ModelIdentity, TrainRun

# The keys, in their order, of RobustBench's model_info files as checked in RobustBench/robustbench at 78fcc9e
# (model_info/cifar10/Linf/Amini2024MeanSparse.json, model_info/cifar10/L2/Wang2023Better_WRN-70-16.json): all 188
# Linf/L2 files there hold the first twelve; `footnote` and `unreliable` are optional (robustbench/leaderboard/
# leaderboard.html.j2 shows the footnote under the name, "Unknown" where `unreliable` is not defined).
ROBUSTBENCH_KEYS = ["link", "name", "authors", "additional_data", "number_forward_passes", "dataset", "venue",
                    "architecture", "eps", "clean_acc", "reported", "autoattack_acc", "footnote", "unreliable"]
PERCENT = re.compile(r"^\d{1,3}\.\d{2}$")  # "89.69", as robustbench.utils.update_json writes str(round(acc*100, 2))
# The keys of the dump of LAION-AI/CLIP_benchmark's clip_benchmark/cli.py (run(), at 48de38c); the metrics of
# clip_benchmark/metrics/zeroshot_classification.py evaluate(): acc1, acc5, mean_per_class_recall, as fractions.
CLIP_BENCHMARK_KEYS = {"dataset", "model", "pretrained", "task", "metrics", "language"}

CARD = {"title": "Robust Fine-Tuning Everywhere", "authors": "A. Author, B. Author", "venue": "ICLR 2026",
        "url": "https://arxiv.org/abs/0000.00000", "additional_data": True}


def train_run(card=None, pretraining=None) -> TrainRun:
    return TrainRun("m", "train/caltech101/m", None, None, None, 10, pretraining or {}, None, card or {})


def over_10000_images(scores, values):
    """`scores` with its five white-box accuracies over 10000 images (four decimals, as RobustBench's CIFAR-10)."""
    settings = {s: Accuracy(round(v * 10000), 10000) for s, v in zip(scores.white_box.settings, values)}
    return replace(scores, white_box=replace(scores.white_box, settings=settings))


def robustbench_leaderboard_row(folder: Path) -> list[dict]:
    """What RobustBench's readers take from model_info/<dataset>/<threat model>/*.json: template.py's sort key
    (float of autoattack_acc), list_available_models' fractions (float / 100) and venue "" -> "Unpublished",
    get_leaderboard_bibtex's year (the venue's last word) unless the venue is "N/A"."""
    rows = []
    for path in sorted(folder.glob("*.json")):
        model = json.loads(path.read_text())
        rows.append({"model_name": path.stem, "robust": float(model["autoattack_acc"]) / 100,
                     "clean": float(model["clean_acc"]) / 100, "extra": "Y" if model["additional_data"] else "N",
                     "year": None if model["venue"] == "N/A" else model["venue"].split(" ")[-1]})
    return sorted(rows, key=lambda r: -r["robust"])


def test_robustbench_model_info_per_norm_from_the_record_and_its_card(tmp_path):
    carded = replace(over_10000_images(record("m", "caltech101", [0] * 5), [0.8969, 0.7, 0.3, 0.5953, 0.25]),
                     train=train_run(CARD, {"pretrained": "augreg_in21k"}))
    bare = record("plain", "caltech101", [0.9, 0.6, 0.1, 0.2, 0.0])
    write_leaderboard({Path("a"): carded, Path("b"): bare}, tmp_path, datasets=["caltech101"])
    assert json.loads((tmp_path / "model_info" / "caltech101" / "m.json").read_text())["clean_acc"] == 0.8969
    linf = json.loads((tmp_path / "model_info" / "caltech101" / "Linf" / "m.json").read_text())
    assert list(linf) == ROBUSTBENCH_KEYS
    assert {k: linf[k] for k in ROBUSTBENCH_KEYS[:12]} == {
        "link": CARD["url"], "name": CARD["title"], "authors": CARD["authors"], "additional_data": True,
        "number_forward_passes": 1, "dataset": "caltech101", "venue": "ICLR 2026", "architecture": "t",
        "eps": "4/255", "clean_acc": "89.69", "reported": "25.00", "autoattack_acc": "25.00"}
    assert linf["unreliable"] is False and "Evaluated by RobustGenBench on 10000 test images." in linf["footnote"]
    eps = {n: json.loads((tmp_path / "model_info" / "caltech101" / n / "m.json").read_text())["eps"]
           for n in ("L1", "L2", "Linf")}
    assert eps == {"L1": "75", "L2": "2", "Linf": "4/255"}  # the card's budgets as the papers write them
    l2 = json.loads((tmp_path / "model_info" / "caltech101" / "L2" / "m.json").read_text())
    assert (l2["clean_acc"], l2["autoattack_acc"]) == ("89.69", "59.53")
    plain = json.loads((tmp_path / "model_info" / "caltech101" / "Linf" / "plain.json").read_text())
    # RobustBench's conventions where nothing is known (its model_info/cifar10/Linf/Standard.json: venue "N/A",
    # authors ""); no card, no train run: no extra data claimed, and the footnote says it is not stated
    assert (plain["name"], plain["authors"], plain["venue"], plain["link"]) == ("plain", "", "N/A", "")
    assert plain["additional_data"] is False and "Extra data not stated" in plain["footnote"]
    assert plain["clean_acc"] == "90.00" and plain["autoattack_acc"] == "0.00"
    for path in (tmp_path / "model_info").glob("*/*/*.json"):
        entry = json.loads(path.read_text())
        assert all(PERCENT.match(entry[k]) for k in ("clean_acc", "reported", "autoattack_acc")), path
        assert isinstance(entry["additional_data"], bool) and isinstance(entry["number_forward_passes"], int)
        assert all(isinstance(entry[k], str) for k in ("link", "name", "authors", "venue", "architecture", "eps"))
    rows = robustbench_leaderboard_row(tmp_path / "model_info" / "caltech101" / "Linf")
    assert [(r["model_name"], r["robust"], r["clean"], r["extra"], r["year"]) for r in rows] == [
        ("m", 0.25, 0.8969, "Y", "2026"), ("plain", 0.0, 0.9, "N", None)]


def test_pretraining_without_a_card_flag_counts_as_extra_data(tmp_path):
    pretrained = replace(record("vit", "caltech101", [0.9, 0.7, 0.3, 0.4, 0.2]),
                         train=train_run({"title": "ViT"}, {"pretrained": "augreg_in21k"}))
    write_leaderboard({Path("a"): pretrained}, tmp_path, datasets=["caltech101"])
    entry = json.loads((tmp_path / "model_info" / "caltech101" / "L1" / "vit.json").read_text())
    assert entry["additional_data"] is True and "pretraining (pretrained augreg_in21k)" in entry["footnote"]


def test_a_model_trained_from_scratch_is_no_extra_data(tmp_path):
    """`pretrained: false` (the demo's CNN) is no pretraining: additional_data false (was true, footnote "pretrained
    False")."""
    scratch = replace(record("cnn", "caltech101", [0.9, 0.7, 0.3, 0.4, 0.2]),
                      train=train_run(pretraining={"pretrained": False}))
    write_leaderboard({Path("a"): scratch}, tmp_path, datasets=["caltech101"])
    entry = json.loads((tmp_path / "model_info" / "caltech101" / "L1" / "cnn.json").read_text())
    assert entry["additional_data"] is False and "pretrained False" not in entry.get("footnote", "")


def test_partial_other_protocol_and_missing_norms_are_never_exported_as_card_entries(tmp_path):
    partial = record("skim", "caltech101", [0.9, 0.7, 0.3, 0.4, 0.2])
    settings = dict(partial.white_box.settings, autoattack_linf=Accuracy(5, 20, partial=True))
    partial = replace(partial, white_box=replace(partial.white_box, settings=settings))
    other = record("easy", "caltech101", [0.8, 0.6, 0.3, 0.5, 0.1], protocol=card_protocol("caltech101", l2=1.0))
    no_l1 = record("nol1", "caltech101", [0.8, 0.6, None, 0.5, 0.1])
    api = replace(record("gpt", "caltech101", [0.8, 0.6, None, None, None]), white_box_na="API model")
    pool = {Path(str(i)): r for i, r in enumerate([partial, other, no_l1, api])}
    write_leaderboard(pool, tmp_path, datasets=["caltech101"])
    folder = tmp_path / "model_info" / "caltech101"
    assert not list(folder.glob("*/skim.json")) and not list(folder.glob("*/gpt.json"))
    assert (folder / "skim.json").is_file()  # rgb's own model_info still shows it (marked partial)
    easy = json.loads((folder / "L2" / "easy.json").read_text())
    assert easy["eps"] == "1" and easy["footnote"].startswith(
        "Not RobustGenBench's card protocol (caltech101: L2 1, card 2).")
    assert sorted(p.parent.name for p in folder.glob("*/nol1.json")) == ["L2", "Linf"]
    manifest = json.loads((tmp_path / "exports.json").read_text())
    assert "RobustBench skim@caltech101: PARTIAL: scored over part of a split" in manifest["not_exported"]
    assert "RobustBench gpt@caltech101: white-box settings n/a (API model)" in manifest["not_exported"]
    assert "RobustBench nol1@caltech101: L1: no AutoAttack number" in manifest["not_exported"]
    assert "model_info/caltech101/L2/easy.json" in manifest["robustbench"] and manifest["clip_benchmark"] == []


def test_zero_shot_results_in_clip_benchmark_format(tmp_path):
    labels = [0, 0, 1, 1, 1, 1, 2, 2]
    correct = [1, 0, 1, 1, 1, 0, 1, 1]  # accuracy 6/8; per class 0.5, 0.75, 1.0
    zero_shot = replace(record("zs", "caltech101", [0.75, 0.5, None, None, None]),
                        model=ModelIdentity("zs", "openclip", "ViT-B-32", "ce", "zeroshot", "0"),
                        class_wise={"test": class_wise_summary(labels, correct, 3)},
                        train=train_run(pretraining={"pretrained": "laion2b_s34b_b79k"}))
    fine_tuned = record("ft", "caltech101", [0.9, 0.7, 0.3, 0.4, 0.2])
    other_size = replace(zero_shot, model=replace(zero_shot.model, run_name="small"),
                         protocol=replace(card_protocol("caltech101"), image_size=112))
    write_leaderboard({Path("a"): zero_shot, Path("b"): fine_tuned, Path("c"): other_size}, tmp_path,
                      datasets=["caltech101"])
    files = sorted((tmp_path / "clip_benchmark").rglob("*.json"))
    # CLIP_benchmark's default output name: {dataset}_{pretrained}_{model}_{language}_{task}.json
    assert [f.relative_to(tmp_path).as_posix() for f in files] == [
        "clip_benchmark/zs/caltech101_laion2b_s34b_b79k_ViT-B-32_en_zeroshot_classification.json"]
    result = json.loads(files[0].read_text())
    assert set(result) == CLIP_BENCHMARK_KEYS and result["task"] == "zeroshot_classification"
    assert (result["dataset"], result["model"], result["pretrained"], result["language"]) == (
        "caltech101", "ViT-B-32", "laion2b_s34b_b79k", "en")
    # acc5 is not in the record (top-1 correctness per image only): left out, never NaN or a guess
    assert result["metrics"] == {"acc1": 0.75, "mean_per_class_recall": 0.75}
    # clip_benchmark build (main_build): metrics and the rest merged into one CSV row
    row = {**result["metrics"], **result}
    del row["metrics"]
    assert row["model"] + " " + row["pretrained"] == "ViT-B-32 laion2b_s34b_b79k" and row["acc1"] == 0.75
    manifest = json.loads((tmp_path / "exports.json").read_text())
    assert "CLIP_benchmark small@caltech101: other protocol: image size 112, card 224" in manifest["not_exported"]
    assert not any("ft@" in line and "CLIP" in line for line in manifest["not_exported"])  # not zero-shot: no entry
