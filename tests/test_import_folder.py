"""rgb.data.import_folder: an ImageFolder tree -> a RobustGenBench-format snapshot read by the same loader as the
benchmark, deterministic, with one-line errors and nothing half-written; `data=custom` picks it up."""

import hashlib

import numpy as np
import pytest
from PIL import Image

from helpers import REPO
from rgb.data import ImageSplit, load_split
from rgb.data.catalog import CORRUPTIONS
from rgb.data.import_folder import ImageFolderError, import_folder, main

CLASSES = ["cat", "dog", "fox", "owl"]  # four: AutoAttack's APGD-T needs at least four classes
PER_CLASS = {"train": 3, "validation": 2, "test": 3}  # 12 test images: 11 corruption blocks + 1 wrapping


def make_tree(root, classes=CLASSES, per_class=PER_CLASS):
    rng = np.random.default_rng(0)
    for split, n in per_class.items():
        for c, name in enumerate(classes):
            folder = root / split / name
            folder.mkdir(parents=True)
            for i in range(n):
                size = (20 + 3 * i, 24)  # not square, not the target size: squash-resized
                pixels = rng.integers(0, 256, (*size[::-1], 3), dtype=np.uint8)
                pixels[..., c % 3] = 60 * (c + 1)  # a class signal
                Image.fromarray(pixels).save(folder / f"{i:02d}.{'png' if i % 2 else 'jpg'}")
    return root


def digest(folder):
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    src = make_tree(tmp_path_factory.mktemp("src"))
    out = tmp_path_factory.mktemp("snap") / "mine"
    import_folder(src, out, "pets3", size=32)
    return src, out


def test_import_writes_every_split_in_the_benchmark_format(imported):
    _, out = imported
    for split, n in {**PER_CLASS, "common": PER_CLASS["test"], "random_linf_30": PER_CLASS["test"]}.items():
        rows = load_split(str(out), "pets3", split)  # validated against test for the perturbed splits
        assert len(rows) == n * len(CLASSES) and rows.features["label"].names == CLASSES
        assert ImageSplit(rows, 32)[0][0].shape == (3, 32, 32)
    common = load_split(str(out), "pets3", "common")
    assert common["corruption"] == list(CORRUPTIONS) + [CORRUPTIONS[0]]  # the card's block rule, 12 rows
    test = ImageSplit(load_split(str(out), "pets3", "test"), 32)
    noisy = ImageSplit(load_split(str(out), "pets3", "random_linf_30"), 32)
    assert max(float((noisy[i][0] - test[i][0]).abs().max()) for i in range(len(test))) <= 30 / 255 + 1e-6
    assert "config_name: pets3" in (out / "README.md").read_text()


def test_import_is_deterministic(imported, tmp_path):
    src, out = imported
    assert main([str(src), str(tmp_path / "again"), "--name", "pets3", "--size", "32"]) == 0
    assert digest(tmp_path / "again") == digest(out)


@pytest.mark.parametrize("breakage, message", [
    ("empty_class", r"class folder .*train/dog holds no image"),
    ("unreadable", r"cannot read image .*test/owl/01\.png"),
    ("one_class", r"has 1 class folder"),
    ("other_classes", r"class folders of .*validation differ .*missing \['owl'\], extra \['bird'\]"),
    ("few_test", r"needs at least 11"),
])
def test_bad_trees_are_one_line_and_write_nothing(tmp_path, capsys, breakage, message):
    if breakage == "one_class":
        src = make_tree(tmp_path / "src", classes=["cat"])
    elif breakage == "few_test":
        src = make_tree(tmp_path / "src", per_class={"train": 1, "validation": 1, "test": 2})
    else:
        src = make_tree(tmp_path / "src")
    if breakage == "empty_class":
        for f in (src / "train" / "dog").iterdir():
            f.unlink()
    elif breakage == "unreadable":
        (src / "test" / "owl" / "01.png").write_bytes(b"not a png")
    elif breakage == "other_classes":
        (src / "validation" / "owl").rename(src / "validation" / "bird")
    out = tmp_path / "out"
    with pytest.raises(ImageFolderError, match=message) as err:
        import_folder(src, out, "mine", size=32)
    assert "\n" not in str(err.value)
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["src"]
    assert main([str(src), str(out), "--name", "mine", "--size", "32"]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if "rgb.data.import_folder: error:" in line]
    assert len(errors) == 1  # (after the progress bar's carriage returns)


def test_refuses_a_non_empty_output_and_a_card_name(imported, tmp_path):
    src, _ = imported
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("mine")
    with pytest.raises(ImageFolderError, match="not empty: nothing written"):
        import_folder(src, tmp_path / "full", "pets3", size=32)
    assert (tmp_path / "full" / "keep.txt").read_text() == "mine"
    with pytest.raises(ImageFolderError, match="one of the benchmark's own"):
        import_folder(src, tmp_path / "new", "flowers-102", size=32)


def test_data_custom_reads_classes_and_size_from_the_snapshot(imported, compose):
    import hydra

    _, out = imported
    cfg = compose("train", "data=custom", f"data.source={out}", "data.dataset=pets3")
    assert (cfg.data.num_classes, cfg.data.image_size, cfg.model.num_classes) == (4, 32, 4)
    assert cfg.data.budgets.linf == pytest.approx(4 / 255)
    datamodule = hydra.utils.instantiate(cfg.data)
    assert datamodule.class_names == CLASSES


@pytest.mark.slow
def test_imported_dataset_trains_attacks_and_scores_with_the_usual_commands(imported, tmp_path):
    import json
    import os
    import subprocess
    import sys

    _, out = imported

    def run(script, *args):
        env = {**os.environ, "OMP_NUM_THREADS": "1", "RGB_THREADS": "1"}
        done = subprocess.run([sys.executable, str(REPO / script), *args], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=1200)
        assert done.returncode == 0, done.stderr[-2000:]
        return done

    run("train.py", "data=custom", f"data.source={out}", "data.dataset=pets3", "trainer.max_epochs=1",
        f"paths.output_dir={tmp_path}", "run_name=tiny", "data.num_workers=0", "logger=csv")
    train_dir = tmp_path / "train" / "pets3" / "tiny"
    assert json.loads((train_dir / "model.json").read_text())["dataset"] == "pets3"
    # data= is inferred from model.json (data=custom with its source); eps 0.2 keeps the attack short on a CPU
    run("attack.py", f"run={train_dir}", "norms=[linf]", "progress=false", "data.budgets.linf=0.2",
        f"paths.output_dir={tmp_path}")
    run("evaluate.py", f"run={train_dir}", "data.budgets.linf=0.2", f"paths.output_dir={tmp_path}",
        f"attack_dir={tmp_path / 'attack' / 'pets3' / 'tiny'}", f"output_dir={tmp_path / 'eval'}")
    scores = json.loads((tmp_path / "eval" / "scores.json").read_text())
    assert scores["dataset"] == "pets3" and scores["white_box"]["settings"]["common"]["total"] == 12
    board = run("evaluate.py", f"pool=[{tmp_path / 'eval'}]", "leaderboard_datasets=[pets3]",
                f"leaderboard_dir={tmp_path / 'board'}", f"paths.output_dir={tmp_path}")
    assert "Outside the card's six datasets" in board.stdout + board.stderr
