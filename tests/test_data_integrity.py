"""Data that must never reach a score unnoticed: stale or foreign cached rows, truncated splits, bad rows, and a
mini builder that deletes user files. Each case is refused in one line naming what is wrong."""

import random
import shutil

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hydra.utils import instantiate
from torch.utils.data import DataLoader

from rgb.data import BenchmarkError, ImageSplit, load_split
from rgb.data.catalog import DATASETS, MINI, transfer_coverage
from rgb.data.mini import DATASET, TEST_SIZE, main
from rgb.commands.resolvers import register_resolvers
from rgb.data.layout import is_mini_build
from rgb.data.snapshot import png_bytes, write_readme, write_split


def copy_of_mini(mini_dir, folder):
    """A copy of the mini benchmark in `folder`/mini: every copy has the same folder name on purpose."""
    target = folder / "mini"
    shutil.copytree(mini_dir, target)
    return target


def rewrite(path, edit):
    """Rewrite one parquet file in place with `edit(table) -> table` (schema metadata, i.e. features, kept)."""
    pq.write_table(edit(pq.read_table(path)), path)


def set_cell(bench, split, column, row, value):
    """Set one cell of a split of the snapshot `bench`, in place."""

    def edit(table):
        values = table.column(column).to_pylist()
        values[row] = value
        field = table.schema.field(column)
        return table.set_column(table.schema.get_field_index(column), field, pa.array(values, type=field.type))

    rewrite(bench / "data" / DATASET / f"{split}.parquet", edit)


# Item 6: the datasets cache must not serve another snapshot's rows, or rows of files since changed.

def test_two_snapshots_with_the_same_folder_name_give_their_own_rows(mini_dir, tmp_path):
    first, second = copy_of_mini(mini_dir, tmp_path / "a"), copy_of_mini(mini_dir, tmp_path / "b")
    for split in ("test", "common"):  # the same rows in reverse order: aligned with each other, not with `first`
        rewrite(second / "data" / DATASET / f"{split}.parquet", lambda t: t.take(list(range(len(t)))[::-1]))
    assert load_split(str(first), DATASET, "common")["image_id"][:3] == [0, 1, 2]
    assert load_split(str(second), DATASET, "common")["image_id"][:3] == [TEST_SIZE - 1, TEST_SIZE - 2, TEST_SIZE - 3]
    assert load_split(str(first), DATASET, "test")["image_id"][:3] == [0, 1, 2]


def test_snapshot_edited_in_place_is_read_again(mini_dir, tmp_path):
    bench = copy_of_mini(mini_dir, tmp_path)
    load_split(str(bench), DATASET, "common")  # fills the cache with the original rows
    order = list(range(TEST_SIZE))
    random.Random(0).shuffle(order)
    rewrite(bench / "data" / DATASET / "common.parquet", lambda t: t.take(order))
    with pytest.raises(BenchmarkError, match=r"digits/common is not aligned with test: row 0"):
        load_split(str(bench), DATASET, "common")
    rewrite(bench / "data" / DATASET / "test.parquet", lambda t: t.slice(0, TEST_SIZE // 2))
    with pytest.raises(BenchmarkError, match=rf"split digits/test has {TEST_SIZE // 2} rows, expected {TEST_SIZE}"):
        load_split(str(bench), DATASET, "test")


# Item 7: the mini builder writes only into a new or empty folder, or over a previous mini build.

def run_mini(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_mini_builder_refuses_a_folder_of_user_files(tmp_path, capsys):
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "notes.txt").write_text("keep me")
    for argv in ((folder,), (folder, "--force")):
        code, out, err = run_mini(capsys, *argv)
        assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
        assert "not a mini benchmark build" in err and str(folder) in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine"]  # no staging folder left behind either
    assert [p.name for p in folder.iterdir()] == ["notes.txt"] and (folder / "notes.txt").read_text() == "keep me"


def test_unrelated_readme_is_not_reported_as_built(tmp_path, capsys):
    folder = tmp_path / "other"
    folder.mkdir()
    (folder / "README.md").write_text("# my project\n")
    code, out, err = run_mini(capsys, folder)
    assert code == 2 and "built" not in out and (folder / "README.md").read_text() == "# my project\n"
    assert not is_mini_build(folder)


def test_force_replaces_only_a_previous_mini_build(mini_dir, tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    code, out, _ = run_mini(capsys, empty)
    assert code == 0 and "built" in out and is_mini_build(empty)
    bench = copy_of_mini(mini_dir, tmp_path / "copy")
    stale = bench / "data" / DATASET / "test.parquet"
    rewrite(stale, lambda t: t.slice(0, 5))
    code, out, _ = run_mini(capsys, bench)
    assert code == 0 and "already" in out and len(pq.read_table(stale)) == 5  # kept without --force
    code, out, _ = run_mini(capsys, bench, "--force")
    assert code == 0 and "built" in out and len(pq.read_table(stale)) == TEST_SIZE
    assert sorted(p.name for p in bench.parent.iterdir()) == ["mini"]  # previous build and staging removed


# Item 8: bad rows are named (split, row, image_id) in one line, from the loader or when the image is read.

def test_image_that_does_not_decode_is_named_in_one_line_even_from_a_worker(mini_dir, tmp_path):
    bench = copy_of_mini(mini_dir, tmp_path)
    set_cell(bench, "test", "image", 3, {"bytes": b"not a png", "path": None})
    split = ImageSplit(load_split(str(bench), DATASET, "test"), image_size=32)
    expected = r"^split digits/test row 3 \(image_id 3\) has an image that does not decode \(\w+\)$"
    with pytest.raises(BenchmarkError, match=expected):
        split[3]
    with pytest.raises(BenchmarkError, match=expected):
        list(DataLoader(split, batch_size=8, num_workers=1))


def test_missing_image_is_refused_at_load_naming_row_and_id(mini_dir, tmp_path):
    bench = copy_of_mini(mini_dir, tmp_path)
    set_cell(bench, "common", "image", 7, None)
    with pytest.raises(BenchmarkError, match=r"^split digits/common row 7 \(image_id 7\) has no image$"):
        load_split(str(bench), DATASET, "common")


@pytest.mark.parametrize("label", [10, -1])
def test_label_outside_the_classes_is_refused(mini_dir, tmp_path, label):
    bench = copy_of_mini(mini_dir, tmp_path)
    set_cell(bench, "test", "label", 11, label)
    with pytest.raises(BenchmarkError, match=rf"digits/test row 11 \(image_id 11\) has label {label}, outside the 10"):
        load_split(str(bench), DATASET, "test")


def test_multi_line_messages_become_one_line():
    assert str(BenchmarkError("a\n  b")) == "a b"
    worker = ("Caught BenchmarkError in DataLoader worker process 0.\nOriginal Traceback:\n  File x\n"
              "rgb.data.benchmark.BenchmarkError: split t row 1")
    assert str(BenchmarkError(worker)) == "split t row 1"


# Item 14: every split the card sizes has exactly the card's rows.

def test_card_sizes_of_every_split():
    for name, info in DATASETS.items():
        assert info.split_rows("train") == info.train_size and info.split_rows("validation") == info.validation_size
        for split in ("test", "common", "random_linf_30"):
            assert info.split_rows(split) == info.test_size
        for surrogate, splits in transfer_coverage(name).items():
            assert {info.split_rows(s, surrogate) for s in splits} == {info.test_size}
    n_test = sum(d.test_size for d in DATASETS.values())
    n_transfer = sum(d.test_size * len(s) for n, d in DATASETS.items() for s in transfer_coverage(n).values())
    assert n_test == 5420 and 2 * n_test + n_transfer == 147020  # the card: 5,420 clean and 147,020 perturbed


def small_real_snapshot(root, dataset, sizes):
    """A snapshot of a real dataset's config with tiny images: `sizes` maps (surrogate or None, split) -> rows."""
    info = DATASETS[dataset]
    names = [f"class{i}" for i in range(info.num_classes)]
    image = png_bytes(np.zeros((4, 4, 3), dtype=np.uint8))
    for (surrogate, split), n in sizes.items():
        folder = root / "data" / dataset / (surrogate or "")
        columns = {"image": [image] * n, "label": [i % info.num_classes for i in range(n)], "image_id": list(range(n))}
        write_split(folder / f"{split}.parquet", names, columns)
    write_readme(root, f"{dataset} sized for the test")
    return root


def test_truncated_splits_of_a_real_dataset_are_refused_naming_expected_and_found(tmp_path):
    dataset = "uc-merced-land-use-dataset"
    n = DATASETS[dataset].test_size
    bench = small_real_snapshot(tmp_path / "full", dataset, {(None, "test"): n, (None, "common"): n - 1,
                                                             ("clip_vitb16", "l1_75"): n - 20})
    assert len(load_split(str(bench), dataset, "test")) == n
    with pytest.raises(BenchmarkError, match=rf"^split {dataset}/common has {n - 1} rows, expected {n}:"):
        load_split(str(bench), dataset, "common")
    with pytest.raises(BenchmarkError, match=rf"{dataset}-clip_vitb16/l1_75 has {n - 20} rows, expected {n}:"):
        load_split(str(bench), dataset, "l1_75", surrogate="clip_vitb16")
    short = small_real_snapshot(tmp_path / "short", dataset, {(None, "test"): 100})  # the research code's bug
    with pytest.raises(BenchmarkError, match=rf"split {dataset}/test has 100 rows, expected {n}"):
        load_split(str(short), dataset, "test")


def test_mini_sizes_are_checked_only_on_a_snapshot_its_builder_wrote(mini_dir, tmp_path):
    bench = copy_of_mini(mini_dir, tmp_path / "mini_build")
    rewrite(bench / "data" / DATASET / "train.parquet", lambda t: t.slice(0, 100))
    with pytest.raises(BenchmarkError, match=rf"digits/train has 100 rows, expected {MINI.train_size}"):
        load_split(str(bench), DATASET, "train")
    (bench / "README.md").write_text((bench / "README.md").read_text().replace(MINI.title, "my digits subset"))
    assert len(load_split(str(bench), DATASET, "train")) == 100  # a user's own digits snapshot: no card size


# Item 20: the default data config serves on a fresh clone.

def test_default_data_config_builds_the_absent_mini_benchmark(tmp_path, compose):
    register_resolvers()
    cfg = compose("train", f"paths.root_dir={tmp_path}")
    datamodule = instantiate(cfg.data)
    assert len(datamodule.split("test")) == TEST_SIZE
    assert is_mini_build(tmp_path / "data" / "mini")
