"""rgb.data.import_folder: an ImageFolder tree -> a RobustGenBench-format snapshot read by the same loader as the
benchmark, deterministic, with one-line errors and nothing half-written; `data=custom` picks it up."""

import hashlib

import numpy as np
import pytest
from PIL import Image

from helpers import REPO, raises_one_line
from rgb.data import ImageSplit, load_split
from rgb.data.catalog import CORRUPTIONS
from rgb.data.import_folder import ImageFolderError, import_folder, main, read_image

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
    with raises_one_line(ImageFolderError, match=message) as err:
        import_folder(src, out, "mine", size=32)
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


# Issue 33: every image mode as a viewer shows it (16-bit gradients imported 98% white), broken links refused.

GRADIENT = np.round(np.linspace(0, 65535, 32 * 32)).reshape(32, 32).astype(np.int64)


def saved(tmp_path, name, image):
    path = tmp_path / name
    image.save(path)
    return path


def test_16_bit_grey_is_scaled_to_8_bits_not_clipped_to_white(tmp_path):
    expected = np.round(GRADIENT / 257).astype(np.uint8)
    files = [saved(tmp_path, "g.png", Image.fromarray(GRADIENT.astype(np.uint16))),  # opens as I;16
             saved(tmp_path, "gb.tif", Image.fromarray(GRADIENT.astype(">u2"))),  # I;16B
             saved(tmp_path, "gi.tif", Image.fromarray(GRADIENT.astype(np.int32)))]  # I
    modes = []
    for path in files:
        with Image.open(path) as image:
            modes.append(image.mode)
        pixels = read_image(path, 32)
        assert np.array_equal(pixels, np.repeat(expected[..., None], 3, axis=2)), path.name
        assert (pixels == 255).mean() < 0.01
    assert modes == ["I;16", "I;16B", "I"]


def test_float_grey_is_read_as_0_to_1(tmp_path):
    path = saved(tmp_path, "f.tif", Image.fromarray((GRADIENT / 65535).astype(np.float32)))
    assert np.array_equal(read_image(path, 32)[..., 0], np.round(GRADIENT / 65535 * 255).astype(np.uint8))


@pytest.mark.parametrize("name, values, shown", [
    ("big.tif", np.array([[0, 70000]], dtype=np.int32), "I values 0..70000 outside 0..65535"),
    ("neg.tif", np.array([[-3, 5]], dtype=np.int32), "I values -3..5 outside 0..65535"),
    ("hdr.tif", np.array([[0, 1.5]], dtype=np.float32), "F values 0..1.5 outside 0..1"),
    ("nan.tif", np.array([[0, np.nan]], dtype=np.float32), "F values are not finite"),
])
def test_values_outside_a_modes_range_are_refused_naming_the_file_never_clipped(tmp_path, name, values, shown):
    path = saved(tmp_path, name, Image.fromarray(values))
    with raises_one_line(ImageFolderError, match=shown) as err:
        read_image(path, 2)
    assert str(path) in str(err.value)


def test_transparency_is_composited_on_white(tmp_path):
    alpha = np.array([[0, 128, 255, 255]] * 4, dtype=np.uint8)
    grey = np.full((4, 4), 100, dtype=np.uint8)
    over_white = np.round(100 * (alpha / 255) + 255 * (1 - alpha / 255))  # alpha 0: white, 255: the pixel
    la = saved(tmp_path, "la.png", Image.fromarray(np.stack([grey, alpha], axis=2), mode="LA"))
    rgba = saved(tmp_path, "rgba.png", Image.fromarray(np.stack([grey, grey, grey, alpha], axis=2), mode="RGBA"))
    for path in (la, rgba):
        assert np.abs(read_image(path, 4)[..., 0].astype(int) - over_white).max() <= 1, path.name
    palette = Image.fromarray(np.array([[0, 1], [1, 0]], dtype=np.uint8), mode="P")
    palette.putpalette([0, 0, 0, 200, 30, 30] + [0] * 762)  # index 0 black, 1 red
    palette.info["transparency"] = 0  # black is transparent: shown as the background
    path = tmp_path / "p.png"
    palette.save(path, transparency=0)
    with Image.open(path) as image:
        assert image.mode == "P" and "transparency" in image.info
    assert read_image(path, 2).tolist() == [[[255] * 3, [200, 30, 30]], [[200, 30, 30], [255] * 3]]


def test_cmyk_and_1_bit_images_convert(tmp_path):
    cmyk = saved(tmp_path, "c.tif", Image.new("CMYK", (4, 4), (255, 0, 0, 0)))  # full cyan
    assert read_image(cmyk, 4)[0, 0].tolist() == [0, 255, 255]
    bits = saved(tmp_path, "b.png", Image.fromarray(np.array([[True, False]] * 2)))
    assert read_image(bits, 2)[..., 0].tolist() == [[255, 0], [255, 0]]


def test_a_16_bit_png_in_the_tree_is_imported_as_a_gradient(tmp_path):
    src = make_tree(tmp_path / "src")
    Image.fromarray(GRADIENT.astype(np.uint16)).save(src / "test" / "cat" / "00.png")
    (src / "test" / "cat" / "00.jpg").unlink(missing_ok=True)
    import_folder(src, tmp_path / "out", "grads", size=32)
    first = np.asarray(load_split(str(tmp_path / "out"), "grads", "test")[0]["image"])
    assert np.array_equal(first[..., 0], np.round(GRADIENT / 257).astype(np.uint8))


def test_a_broken_symbolic_link_is_refused_in_one_line_naming_it(tmp_path, capsys):
    src = make_tree(tmp_path / "src")
    (src / "train" / "dog" / "gone.png").symlink_to(tmp_path / "nowhere.png")
    (src / "test" / "owl" / "lost.jpg").symlink_to(tmp_path / "lost.jpg")
    out = tmp_path / "out"
    with raises_one_line(ImageFolderError, match=r"train/dog/gone\.png is a broken symbolic link") as err:
        import_folder(src, out, "mine", size=32)
    assert not out.exists()
    (src / "train" / "dog" / "gone.png").unlink()
    (src / "test" / "holes").symlink_to(tmp_path / "no_class_folder")
    with pytest.raises(ImageFolderError, match=r"test/holes is a broken symbolic link"):
        import_folder(src, out, "mine", size=32)
