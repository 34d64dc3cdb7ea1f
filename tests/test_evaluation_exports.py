"""Exports for other boards (rgb.evaluation.exports): RobustBench's model_info and CLIP_benchmark's JSON, written by
write_leaderboard beside rgb's own model_info, read back as those projects' own code reads them."""

import csv
import json
import re
import sys
import unicodedata
from dataclasses import replace
from html.parser import HTMLParser
from pathlib import Path

import pytest

from consumers import clip_benchmark_cli, robustbench
from helpers import card_protocol, raises_one_line, record
from rgb.core.classwise import class_wise_summary
from rgb.core.files import NameClashError, distinct_name
from rgb.core.jsonrecord import RecordError
from rgb.evaluation.leaderboard import find_records, write_leaderboard
from rgb.evaluation.records import Accuracy, ModelIdentity, ScoresRecord, TrainRun

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
# The column titles of RobustBench's robustbench/leaderboard/leaderboard.html.j2 (78fcc9e) for Linf and L2.
ROBUSTBENCH_COLUMNS = ["Rank", "Method", "Standard accuracy", "AutoAttack robust accuracy",
                       "Best known robust accuracy", "AA eval. potentially unreliable", "Extra data", "Architecture",
                       "Venue"]

CARD = {"title": "Robust Fine-Tuning Everywhere", "authors": "A. Author, B. Author", "venue": "ICLR 2026",
        "url": "https://arxiv.org/abs/0000.00000", "additional_data": True}


def train_run(card=None, pretraining=None) -> TrainRun:
    return TrainRun("m", "train/caltech101/m", None, None, None, 10, pretraining or {}, None, card or {})


def over_10000_images(scores, values):
    """`scores` with its five white-box accuracies over 10000 images (four decimals, as RobustBench's CIFAR-10)."""
    settings = {s: Accuracy(round(v * 10000), 10000) for s, v in zip(scores.white_box.settings, values)}
    return replace(scores, white_box=replace(scores.white_box, settings=settings))


def stem(name: str) -> str:
    """The file stem rgb gives a model's files (one maker: rgb.core.files.distinct_name)."""
    return distinct_name(name)


class _Table(HTMLParser):
    """The header and body cells (text only) of an HTML table."""

    def __init__(self):
        super().__init__()
        self.head, self.rows, self._cell, self._in = [], [], None, None

    def handle_starttag(self, tag, attrs):
        if tag in ("thead", "tbody"):
            self._in = tag
        elif tag == "tr" and self._in == "tbody":
            self.rows.append([])
        elif tag in ("th", "td"):
            self._cell = []
        elif tag == "br" and self._cell is not None:
            self._cell.append(" ")

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data)

    def handle_endtag(self, tag):
        if tag in ("th", "td") and self._cell is not None:
            text = " ".join("".join(self._cell).split())
            (self.head if tag == "th" else self.rows[-1]).append(text)
            self._cell = None


def table_of(html: str) -> _Table:
    parsed = _Table()
    parsed.feed(html)
    return parsed


def test_robustbench_model_info_per_norm_from_the_record_and_its_card(tmp_path):
    carded = replace(over_10000_images(record("m", "caltech101", [0] * 5), [0.8969, 0.7, 0.3, 0.5953, 0.25]),
                     train=train_run(CARD, {"pretrained": "augreg_in21k"}))
    bare = record("plain", "caltech101", [0.9, 0.6, 0.1, 0.2, 0.0])
    write_leaderboard({Path("a"): carded, Path("b"): bare}, tmp_path, datasets=["caltech101"])
    assert json.loads((tmp_path / "model_info" / "caltech101" / f"{stem('m')}.json").read_text())["clean_acc"] == 0.8969
    linf = json.loads((tmp_path / "model_info" / "caltech101" / "Linf" / f"{stem('m')}.json").read_text())
    assert list(linf) == ROBUSTBENCH_KEYS
    assert {k: linf[k] for k in ROBUSTBENCH_KEYS[:12]} == {
        "link": CARD["url"], "name": CARD["title"], "authors": CARD["authors"], "additional_data": True,
        "number_forward_passes": 1, "dataset": "caltech101", "venue": "ICLR 2026", "architecture": "t",
        "eps": "4/255", "clean_acc": "89.69", "reported": "25.00", "autoattack_acc": "25.00"}
    assert linf["unreliable"] is False and "Evaluated by RobustGenBench on 10000 test images." in linf["footnote"]
    eps = {n: json.loads((tmp_path / "model_info" / "caltech101" / n / f"{stem('m')}.json").read_text())["eps"]
           for n in ("L1", "L2", "Linf")}
    assert eps == {"L1": "75", "L2": "2", "Linf": "4/255"}  # the card's budgets as the papers write them
    l2 = json.loads((tmp_path / "model_info" / "caltech101" / "L2" / f"{stem('m')}.json").read_text())
    assert (l2["clean_acc"], l2["autoattack_acc"]) == ("89.69", "59.53")
    plain = json.loads((tmp_path / "model_info" / "caltech101" / "Linf" / f"{stem('plain')}.json").read_text())
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
    # the board beside the files: RobustBench's leaderboard.html.j2 columns, best AutoAttack accuracy first
    board = table_of((tmp_path / "model_info" / "caltech101" / "Linf" / "index.html").read_text())
    assert board.head == ROBUSTBENCH_COLUMNS
    assert [row[:1] + row[2:] for row in board.rows] == [
        ["1", "89.69%", "25.00%", "25.00%", "×", "☑", "t", "ICLR 2026"],
        ["2", "90.00%", "0.00%", "0.00%", "×", "×", "t", "N/A"]]
    assert board.rows[0][1].startswith(CARD["title"]) and board.rows[1][1].startswith("plain Extra data not stated")


def test_pretraining_without_a_card_flag_counts_as_extra_data(tmp_path):
    pretrained = replace(record("vit", "caltech101", [0.9, 0.7, 0.3, 0.4, 0.2]),
                         train=train_run({"title": "ViT"}, {"pretrained": "augreg_in21k"}))
    write_leaderboard({Path("a"): pretrained}, tmp_path, datasets=["caltech101"])
    entry = json.loads((tmp_path / "model_info" / "caltech101" / "L1" / f"{stem('vit')}.json").read_text())
    assert entry["additional_data"] is True and "pretraining (pretrained augreg_in21k)" in entry["footnote"]


def test_a_model_trained_from_scratch_is_no_extra_data(tmp_path):
    """`pretrained: false` (the demo's CNN) is no pretraining: additional_data false (was true, footnote "pretrained
    False")."""
    scratch = replace(record("cnn", "caltech101", [0.9, 0.7, 0.3, 0.4, 0.2]),
                      train=train_run(pretraining={"pretrained": False}))
    write_leaderboard({Path("a"): scratch}, tmp_path, datasets=["caltech101"])
    entry = json.loads((tmp_path / "model_info" / "caltech101" / "L1" / f"{stem('cnn')}.json").read_text())
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
    assert not list(folder.glob(f"*/{stem('skim')}.json")) and not list(folder.glob(f"*/{stem('gpt')}.json"))
    assert (folder / f"{stem('skim')}.json").is_file()  # rgb's own model_info still shows it (marked partial)
    easy = json.loads((folder / "L2" / f"{stem('easy')}.json").read_text())
    assert easy["eps"] == "1" and easy["footnote"].startswith(
        "Not RobustGenBench's card protocol (caltech101: L2 1, card 2).")
    assert sorted(p.parent.name for p in folder.glob(f"*/{stem('nol1')}.json")) == ["L2", "Linf"]
    manifest = json.loads((tmp_path / "exports.json").read_text())
    assert "RobustBench skim@caltech101: PARTIAL: scored over part of a split" in manifest["not_exported"]
    assert "RobustBench gpt@caltech101: white-box settings n/a (API model)" in manifest["not_exported"]
    assert "RobustBench nol1@caltech101: L1: no AutoAttack number" in manifest["not_exported"]
    assert f"model_info/caltech101/L2/{stem('easy')}.json" in manifest["robustbench"]
    assert manifest["clip_benchmark"] == []


def clip_benchmark_build(folder: Path, out: Path, monkeypatch) -> list[dict]:
    """The rows of CLIP_benchmark's own `clip_benchmark build <folder> --output <out>` (its cli.main)."""
    cli = clip_benchmark_cli()
    monkeypatch.setattr(sys, "argv", ["clip_benchmark", "build", str(folder), "--output", str(out)])
    cli.main()
    with open(out, newline="") as handle:
        return list(csv.DictReader(handle))


def zero_shot(name: str, pretraining: dict, weights_sha256: str = "0" * 64, arch: str = "ViT-B-32"):
    labels = [0, 0, 1, 1, 1, 1, 2, 2]
    correct = [1, 0, 1, 1, 1, 0, 1, 1]  # accuracy 6/8; per class 0.5, 0.75, 1.0
    return replace(record(name, "caltech101", [0.75, 0.5, None, None, None]),
                   model=ModelIdentity(name, "openclip", arch, "ce", "zeroshot", weights_sha256),
                   class_wise={"test": class_wise_summary(labels, correct, 3)},
                   train=train_run(pretraining=pretraining))


def test_zero_shot_results_in_clip_benchmark_format_read_by_its_build(tmp_path, monkeypatch):
    """Files flat in clip_benchmark/ (`build <folder>` lists only its top level: rgb's folder per model gave an
    empty CSV), `pretrained` the open_clip tag or, for rgb's own weights, `rgb-<sha8>` (was "": a model_fullname
    with a trailing space); CLIP_benchmark's own `build` makes one row per model."""
    tagged = zero_shot("zs", {"pretrained": "laion2b_s34b_b79k"})
    own = zero_shot("mini_clip", {}, weights_sha256="ab12cd34" + "e" * 56, arch="rgb-mini-clip")
    local = zero_shot("local", {"pretrained": "laion2b_s34b_b79k", "weights": "finetuned.safetensors"},
                      weights_sha256="99887766" + "0" * 56)
    fine_tuned = record("ft", "caltech101", [0.9, 0.7, 0.3, 0.4, 0.2])
    other_size = replace(tagged, model=replace(tagged.model, run_name="small"),
                         protocol=replace(card_protocol("caltech101"), image_size=112))
    pool = {Path(str(i)): r for i, r in enumerate([tagged, own, local, fine_tuned, other_size])}
    write_leaderboard(pool, tmp_path, datasets=["caltech101"])
    folder = tmp_path / "clip_benchmark"
    assert all(p.is_file() for p in folder.iterdir()) and len(list(folder.iterdir())) == 3  # flat, one per model
    manifest = json.loads((tmp_path / "exports.json").read_text())
    assert sorted(manifest["clip_benchmark"]) == sorted(f"clip_benchmark/{p.name}" for p in folder.iterdir())
    result = json.loads((tmp_path / manifest["clip_benchmark"][0]).read_text())
    assert set(result) == CLIP_BENCHMARK_KEYS and result["task"] == "zeroshot_classification"
    assert (result["dataset"], result["model"], result["pretrained"], result["language"]) == (
        "caltech101", "ViT-B-32", "laion2b_s34b_b79k", "en")
    # acc5 is not in the record (top-1 correctness per image only): left out, never NaN or a guess
    assert result["metrics"] == {"acc1": 0.75, "mean_per_class_recall": 0.75}
    rows = clip_benchmark_build(folder, tmp_path / "benchmark.csv", monkeypatch)
    assert sorted(row["model_fullname"] for row in rows) == [
        "ViT-B-32 laion2b_s34b_b79k", "ViT-B-32 rgb-99887766", "rgb-mini-clip rgb-ab12cd34"]
    assert all(row["dataset"] == "caltech101" and float(row["acc1"]) == 0.75 for row in rows)
    assert "CLIP_benchmark small@caltech101: other protocol: image size 112, card 224" in manifest["not_exported"]
    assert not any("ft@" in line and "CLIP" in line for line in manifest["not_exported"])  # not zero-shot: no entry


def test_robustbench_reads_the_model_ids_and_entries_with_its_own_code(tmp_path, monkeypatch):
    """Where RobustBench's enums allow (a dataset named cifar10; Linf and L2), its own readers take each file's
    model id as the stem before the first `_` (`demo_zeroshot.json` was cited as `demo`): rgb's stems hold none,
    so the id is the whole stem, one per model."""
    names = {"demo": [0.9, 0.7, 0.2, 0.5, 0.4], "demo_zeroshot": [0.8, 0.6, 0.1, 0.3, 0.3],
             "x 1": [0.7, 0.5, 0.1, 0.2, 0.1]}
    protocol = card_protocol("cifar10", image_size=32)
    pool = {Path(name): replace(record(name, "cifar10", values, protocol=protocol),
                                train=train_run({**CARD, "title": f"Paper of {name}"}))
            for name, values in names.items()}
    write_leaderboard(pool, tmp_path, datasets=["cifar10"])
    utils = robustbench("utils")
    monkeypatch.chdir(tmp_path)  # RobustBench reads ./model_info/<dataset>/<threat model>/
    for threat_model in ("Linf", "L2"):
        entries, _ = utils.get_leaderboard_bibtex("cifar10", threat_model)
        ids = {re.match(r"@article\{(.+),", entry)[1]: entry for entry in entries}
        assert sorted(ids) == sorted(stem(name) for name in names)
        for name in names:
            assert f"title\t= {{Paper of {name}}}" in ids[stem(name)] and "year\t= {2026}" in ids[stem(name)]
    latex = utils.get_leaderboard_latex("cifar10", "Linf", sort_by="autoattack_acc").splitlines()
    # rank, model id, clean, robust, extra data, architecture, venue, model-zoo id (none: not in its zoo)
    assert latex == [f"{rank} &\\citet{{{stem(name)}}} & {clean} & {robust} & Y & t & ICLR 2026 & N/A\\\\"
                     for rank, (name, clean, robust) in enumerate(
                         [("demo", "90.00", "40.00"), ("demo_zeroshot", "80.00", "30.00"),
                          ("x 1", "70.00", "10.00")], start=1)]


def test_names_one_spelling_would_merge_get_files_of_their_own(tmp_path):
    """`x 1`, `x+1` and `x_1` all wrote model_info/<dataset>/<norm>/x_1.json (two models lost, exports.json listing
    one path three times); case-only names, a 200-character name and rgb's own model_info too."""
    names = ["x 1", "x+1", "x_1", "X_1", "a" * 200, "demo_zeroshot"]
    protocol = card_protocol("digits", image_size=32)
    pool = {Path(str(i)): record(name, "digits", [0.9 - i / 10, 0.5, 0.2, 0.3, 0.1], protocol=protocol)
            for i, name in enumerate(names)}
    write_leaderboard(pool, tmp_path, datasets=["digits"])
    manifest = json.loads((tmp_path / "exports.json").read_text())
    assert len(manifest["robustbench"]) == len(set(manifest["robustbench"])) == 3 * len(names)
    for folder in ("model_info/digits", "model_info/digits/Linf", "model_info/digits/L2", "model_info/digits/L1"):
        files = sorted((tmp_path / folder).glob("*.json"))
        assert len(files) == len({p.name.casefold() for p in files}) == len(names)  # case-insensitive too
        shown = {json.loads(p.read_text())["name"] for p in files}
        assert shown == set(names), folder  # each file its model's: none overwritten
        assert all("_" not in p.stem and len(p.name) < 100 for p in files)
    board = table_of((tmp_path / "model_info" / "digits" / "Linf" / "index.html").read_text())
    assert sorted(row[1] for row in board.rows) == sorted(f"{n} Extra data not stated in a model card. Evaluated by "
                                                          f"RobustGenBench on 100 test images." for n in names)


def test_two_spellings_of_one_name_stop_the_pool_before_anything_is_written(tmp_path):
    """`café` in NFC and in NFD (what a macOS file system stores) are two run names that read as one: they would
    share every file, and are refused in one line naming both, with nothing written."""
    composed, decomposed = unicodedata.normalize("NFC", "café"), unicodedata.normalize("NFD", "café")
    protocol = card_protocol("digits", image_size=32)
    pool = {Path(name): record(name, "digits", [0.9, 0.5, 0.2, 0.3, 0.1], protocol=protocol)
            for name in (composed, decomposed)}
    with raises_one_line(NameClashError, r"model 'caf\\xe9' .* and model 'cafe\\u0301' .* would both be written"):
        write_leaderboard(pool, tmp_path / "board", datasets=["digits"])
    assert not (tmp_path / "board").exists()


@pytest.mark.parametrize("name", ["..", ".", "", " ", "a/b", "../x", "a\\b", "nul\x00", "é" * 200])
def test_a_record_whose_name_is_no_single_path_component_is_refused_when_read(tmp_path, name):
    good = record("m", "digits", [0.9, 0.5, 0.2, 0.3, 0.1], protocol=card_protocol("digits", image_size=32))
    data = good.to_json()
    data["model"]["run_name"] = name
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "scores.json").write_text(json.dumps(data))
    with raises_one_line(RecordError, f"scores.json: scores record with model run_name .*evaluate the model again"):
        find_records([tmp_path])


def test_a_record_whose_dataset_is_no_single_path_component_is_refused_when_read(tmp_path):
    data = record("m", "digits", [0.9, 0.5, 0.2, 0.3, 0.1], protocol=card_protocol("digits", image_size=32)).to_json()
    data["dataset"] = "../digits"
    (tmp_path / "scores.json").write_text(json.dumps(data))
    with raises_one_line(RecordError, r"scores record with dataset '\.\./digits': .* no '/'"):
        ScoresRecord.load(tmp_path / "scores.json")
