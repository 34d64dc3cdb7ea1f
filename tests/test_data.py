"""The data layer through its public loader, on the mini benchmark and on deliberately broken copies."""

import shutil
import subprocess
import sys

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from omegaconf import OmegaConf

from helpers import REPO, compose_config, raises_one_line, resolved
from rgb.core.threat import Norm
from rgb.data import BenchmarkError, ImageSplit, load_split, transfer_coverage
from rgb.data.catalog import CORRUPTIONS, DATASETS, MINI, TRANSFER_SPLITS, WHITE_BOX_BUDGETS, scale_budget
from rgb.data.corruptions import corruption_of_row
from rgb.data.mini import CLASS_NAMES, DATASET, HELD_OUT, TEST_SIZE, VALIDATION_SIZE, build_mini, digit_images, stratified_splits
from rgb.data.snapshot import build_staged, png_bytes, write_readme, write_split

SPLIT_SIZES = {"train": 1797 - HELD_OUT - VALIDATION_SIZE, "validation": VALIDATION_SIZE, "test": TEST_SIZE,
               "common": TEST_SIZE, "random_linf_30": TEST_SIZE}


@pytest.mark.parametrize("split", list(SPLIT_SIZES))
def test_every_mini_split_loads_through_the_public_loader(mini_dir, split):
    ds = load_split(str(mini_dir), DATASET, split)
    assert len(ds) == SPLIT_SIZES[split]
    assert ds.features["label"].names == CLASS_NAMES
    assert list(ds.features) == ["image", "label", "image_id", "perturbation", "surrogate", "norm", "epsilon",
                                 "corruption", "is_modified"]
    assert ds["image_id"] == list(range(len(ds)))
    images = ImageSplit(ds, image_size=32)
    x, y, image_id = images[len(ds) - 1]
    assert x.shape == (3, 32, 32) and x.dtype == torch.float32
    assert 0.0 <= x.min() and x.max() <= 1.0 and x.max() > 0.5
    assert image_id == len(ds) - 1 and y == ds[len(ds) - 1]["label"]


def test_mini_test_split_is_a_stratified_subset_of_the_held_out_images():
    """A test split of 200 (20 per class, every class) drawn from the 450 images held out of training, so train and
    validation are the images of the 450-image builds and only the test split shrank."""
    _, labels = digit_images()
    splits = stratified_splits(labels)
    assert len(splits["test"]) == TEST_SIZE == 200
    assert np.bincount(labels[splits["test"]], minlength=10).tolist() == [20] * 10
    held_out = set(range(len(labels))) - set(splits["train"]) - set(splits["validation"])
    assert len(held_out) == HELD_OUT and set(splits["test"]) <= held_out


def test_perturbed_splits_match_test_and_the_card(mini_dir):
    test = load_split(str(mini_dir), DATASET, "test")
    common = load_split(str(mini_dir), DATASET, "common")
    noisy = load_split(str(mini_dir), DATASET, "random_linf_30")
    assert common["label"] == test["label"]
    assert common["corruption"] == [corruption_of_row(i, TEST_SIZE) for i in range(TEST_SIZE)]
    block = TEST_SIZE // 11
    assert common["corruption"][:block] == [CORRUPTIONS[0]] * block
    assert common["corruption"][11 * block:] == [CORRUPTIONS[0]] * (TEST_SIZE - 11 * block)  # remainder wraps
    assert set(common["perturbation"]) == {"common_corruption_severity3"}
    assert sum(common["is_modified"]) > 0.9 * TEST_SIZE
    clean = np.stack([np.asarray(im, dtype=np.int16) for im in test["image"]])
    shifted = np.stack([np.asarray(im, dtype=np.int16) for im in noisy["image"]])
    assert np.abs(shifted - clean).max() <= 30  # exactly within 30/255 after PNG storage
    assert set(noisy["norm"]) == {"linf"} and np.allclose(noisy["epsilon"], 30 / 255)


def test_mini_build_is_byte_for_byte_deterministic(tmp_path):
    first, second = build_mini(tmp_path / "a"), build_mini(tmp_path / "b")
    files = sorted(p.relative_to(first) for p in first.rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(second) for p in second.rglob("*") if p.is_file())
    assert len(files) == 6
    for rel in files:
        assert (first / rel).read_bytes() == (second / rel).read_bytes(), rel


def test_force_rebuild_replaces_only_the_builders_files(mini_dir, tmp_path, capsys):
    """Issue 33: `python -m rgb.data.mini DIR --force` deleted every file in a mini build dir, the user's too."""
    from rgb.data.mini import main

    bench = tmp_path / "mini"
    shutil.copytree(mini_dir, bench)
    built = {p.relative_to(bench): p.read_bytes() for p in bench.rglob("*") if p.is_file()}
    (bench / "notes.txt").write_text("keep me")
    (bench / "data" / DATASET / "mine").mkdir()
    (bench / "data" / DATASET / "mine" / "labels.csv").write_text("0,1\n")
    test = bench / "data" / DATASET / "test.parquet"
    pq.write_table(pq.read_table(test).slice(0, 5), test)  # a stale split: replaced
    assert main([str(bench), "--force"]) == 0 and "built" in capsys.readouterr().out
    assert (bench / "notes.txt").read_text() == "keep me"
    assert (bench / "data" / DATASET / "mine" / "labels.csv").read_text() == "0,1\n"
    assert {rel: (bench / rel).read_bytes() for rel in built} == built  # the build itself byte for byte
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mini"]  # no staging folder left behind


def test_a_staged_build_keeps_one_another_process_finished_first_and_leaves_no_staging(tmp_path, monkeypatch):
    """build_staged is rgb.core.files.replaced_whole from an empty folder: a build another process moves in place
    just before ours is kept when it is one (a user's folder would be refused); no staging folder stays behind."""
    import os

    import rgb.core.files

    out = tmp_path / "mini"
    replace = os.replace

    def theirs_first(source, target):
        if os.fspath(target) == str(out):  # the other process wins the race to the final rename
            out.mkdir()
            (out / "theirs").write_text("theirs")
        return replace(source, target)

    monkeypatch.setattr(rgb.core.files.os, "replace", theirs_first)
    ours = lambda staging: (staging / "ours").write_text("ours")  # noqa: E731
    assert build_staged(out, ours, lambda d: (d / "theirs").is_file()) == out
    assert [p.name for p in out.iterdir()] == ["theirs"] and [p.name for p in tmp_path.iterdir()] == ["mini"]
    shutil.rmtree(out)
    with pytest.raises(OSError):
        build_staged(out, ours, lambda d: False)
    assert [p.name for p in tmp_path.iterdir()] == ["mini"]
    monkeypatch.setattr(rgb.core.files.os, "replace", replace)
    build_staged(out, ours, lambda d: False)  # over a finished build
    assert [p.name for p in out.iterdir()] == ["ours"] and [p.name for p in tmp_path.iterdir()] == ["mini"]


def test_misaligned_split_is_rejected_naming_split_and_id(mini_dir, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(mini_dir, broken)
    path = broken / "data" / DATASET / "common.parquet"
    table = pq.read_table(path)
    ids = table.column("image_id").to_pylist()
    ids[7], ids[8] = ids[8], ids[7]
    table = table.set_column(table.schema.get_field_index("image_id"), "image_id", [ids])
    pq.write_table(table, path)
    with pytest.raises(BenchmarkError, match=r"digits/common .*row 7 has image_id 8"):
        load_split(str(broken), DATASET, "common")
    load_split(str(broken), DATASET, "test")  # the clean split itself is fine


def test_corrupt_parquet_gives_one_line_naming_the_file(mini_dir, tmp_path):
    broken = tmp_path / "corrupt"
    shutil.copytree(mini_dir, broken)
    path = broken / "data" / DATASET / "validation.parquet"
    path.write_bytes(path.read_bytes()[:500])
    with raises_one_line(BenchmarkError) as err:
        load_split(str(broken), DATASET, "validation")
    message = str(err.value)
    assert str(path) in message and "corrupt parquet" in message


def test_missing_directory_unknown_dataset_and_missing_split(mini_dir, tmp_path):
    missing = tmp_path / "nowhere"
    with pytest.raises(BenchmarkError, match=f"benchmark directory not found: {missing}$"):
        load_split(str(missing), DATASET, "test")
    with pytest.raises(BenchmarkError, match=r"unknown dataset config 'letters' .*available: digits"):
        load_split(str(mini_dir), "letters", "test")
    with pytest.raises(BenchmarkError, match=r"missing split 'l1_75' .*present: common, random_linf_30, test"):
        load_split(str(mini_dir), DATASET, "l1_75")


@pytest.mark.slow
def test_hub_id_offline_says_how_to_use_a_local_snapshot(tmp_path):
    code = (
        "from rgb.data import load_split\n"
        "load_split('legolasflagstaff/RobustGenBench', 'flowers-102', 'test')\n"
    )
    env = {"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert "HF_HUB_OFFLINE=1" in done.stderr and "snapshot_download" in done.stderr and "data.source=" in done.stderr


def test_coverage_table_of_the_card():
    assert set(transfer_coverage("flowers-102")) == {"clip_vitb16", "clip_vith14", "metaclip_vith14",
                                                     "siglip2_so400m", "siglip2_base"}
    assert "siglip2_so400m" not in transfer_coverage("stanford_cars")
    assert transfer_coverage("oxford-iiit-pet")["siglip2_base"] == ("linf_30",)
    assert transfer_coverage("caltech101")["clip_vitb16"] == TRANSFER_SPLITS
    n_splits = sum(len(v) for d in DATASETS for v in transfer_coverage(d).values())
    assert n_splits == 6 * 3 * 7 + 3 * 7 + 6  # the card's table: 153 ticks
    with pytest.raises(BenchmarkError, match="provides no split 'l2_2' for config 'stanford_cars-siglip2_so400m'"):
        load_split("/nonexistent-but-refused-first", "stanford_cars", "l2_2", surrogate="siglip2_so400m")
    with pytest.raises(ValueError, match="available: caltech101, fgvc-aircraft-2013b"):
        transfer_coverage("imagenet")


def test_own_surrogate_of_a_real_dataset_loads_outside_the_coverage_table(tmp_path):
    """attack.py exports a user's surrogate as config <dataset>-<surrogate>: it must load like the card's splits."""
    names = [f"car{i}" for i in range(DATASETS["stanford_cars"].num_classes)]
    n = DATASETS["stanford_cars"].test_size  # the card's size: anything else is refused
    images = [png_bytes(np.full((4, 4, 3), v, dtype=np.uint8)) for v in (10, 200)] * (n // 2)
    common = {"label": [i % len(names) for i in range(n)], "image_id": list(range(n))}
    write_split(tmp_path / "data" / "stanford_cars" / "test.parquet", names, {"image": images, **common})
    adversarial = {"image": images[::-1], "surrogate": ["my_vit"] * n, "norm": ["l2"] * n, **common}
    write_split(tmp_path / "data" / "stanford_cars" / "my_vit" / "l2_2.parquet", names, adversarial)
    write_readme(tmp_path, "own export")
    split = load_split(str(tmp_path), "stanford_cars", "l2_2", surrogate="my_vit")
    assert split["surrogate"] == ["my_vit"] * n and split["image_id"] == list(range(n))
    with pytest.raises(BenchmarkError, match="unknown dataset config 'stanford_cars-other' .*stanford_cars-my_vit"):
        load_split(str(tmp_path), "stanford_cars", "l2_2", surrogate="other")


# The budgets of the data configs before they were derived from the catalog: the resolvers must give these bits.
MINI_BUDGETS = {"l1": 1.530612244897959, "l2": 0.2857142857142857, "linf": 0.01568627450980392}
MINI_TRANSFER_BUDGETS = {"l1_75": 1.530612244897959, "l1_300": 6.122448979591836, "l2_2": 0.2857142857142857,
                         "l2_8": 1.1428571428571428, "linf_4": 0.01568627450980392, "linf_8": 0.03137254901960784,
                         "linf_30": 0.11764705882352941}
REAL_BUDGETS = {"l1": 75.0, "l2": 2.0, "linf": 0.01568627450980392}
REAL_TRANSFER_BUDGETS = {"l1_75": 75.0, "l1_300": 300.0, "l2_2": 2.0, "l2_8": 8.0, "linf_4": 0.01568627450980392,
                         "linf_8": 0.03137254901960784, "linf_30": 0.11764705882352941}


# data=custom reads its image size from an imported snapshot: its budgets are checked in tests/test_data_import_folder.py
@pytest.mark.parametrize("name", sorted(p.stem for p in (REPO / "conf/data").glob("[!_]*.yaml") if p.stem != "custom"))
def test_data_configs_have_the_catalog_budgets_bit_for_bit(name):
    data = resolved(compose_config("train", f"data={name}").data)
    mini = data["image_size"] == 32
    assert data["budgets"] == (MINI_BUDGETS if mini else REAL_BUDGETS)  # exact: no rounding drift
    assert data["transfer_budgets"] == (MINI_TRANSFER_BUDGETS if mini else REAL_TRANSFER_BUDGETS)
    dim = 3 * data["image_size"] ** 2
    for norm, eps in WHITE_BOX_BUDGETS.items():
        assert data["budgets"][norm] == scale_budget(norm, eps, dim)
    assert set(data["budgets"]) == {n.key for n in Norm}


@pytest.mark.parametrize("name", sorted(p.stem for p in (REPO / "conf/data").glob("[!_]*.yaml") if p.stem != "custom"))
def test_data_configs_take_their_class_count_from_the_catalog(name):
    """The catalog owns each dataset's class count: a data config composes to it and writes no number of its own
    (a count typed into a YAML drifts from the catalog unnoticed)."""
    data = resolved(compose_config("train", f"data={name}").data)
    info = MINI if data["dataset"] == MINI.name else DATASETS[data["dataset"]]
    assert data["num_classes"] == info.num_classes
    assert "num_classes" not in OmegaConf.load(REPO / "conf/data" / f"{name}.yaml")


@pytest.mark.parametrize("name", sorted(p.stem for p in (REPO / "conf/data").glob("[!_]*.yaml") if p.stem != "custom"))
def test_the_plain_data_module_of_a_dataset_is_its_composed_config(name, monkeypatch):
    """rgb.benchmark builds its data module without Hydra (`BenchmarkData.for_dataset`): what evaluation reads of
    it equals what `data=<name>` composes, so the two spellings cannot drift apart."""
    monkeypatch.delenv("RGB_ROOT", raising=False)
    monkeypatch.delenv("RGB_BENCHMARK", raising=False)
    from hydra.utils import instantiate

    from rgb.data import BenchmarkData

    composed = instantiate(resolved(compose_config("train", f"data={name}").data))
    assert type(composed) is BenchmarkData  # attack.py and evaluate.py start without Lightning
    plain = BenchmarkData.for_dataset(composed.dataset)
    for field in ("source", "dataset", "image_size", "num_classes", "budgets", "transfer_budgets", "eval_batch_size",
                  "build_mini_if_missing"):
        assert getattr(plain, field) == getattr(composed, field), field
    chosen = BenchmarkData.for_dataset(composed.dataset, "/snapshots/x", eval_batch_size=8, budgets={"Linf": 0.5})
    assert (chosen.source, chosen.eval_batch_size, chosen.budgets["linf"]) == ("/snapshots/x", 8, 0.5)
    assert chosen.budgets["l2"] == composed.budgets["l2"]


def test_the_plain_data_module_refuses_an_unknown_dataset():
    from rgb.data import BenchmarkData

    with pytest.raises(ValueError, match="unknown dataset 'flowers102'; dataset ids: .*'flowers-102'"):
        BenchmarkData.for_dataset("flowers102")  # a config name is not an id: rgb.benchmark translates it first


def test_one_budget_stays_overridable():
    data = resolved(compose_config("train", "data=mini", "data.budgets.linf=0.03", "data.image_size=64").data)
    assert data["budgets"]["linf"] == 0.03 and data["budgets"]["l1"] == scale_budget("l1", 75.0, 3 * 64 * 64)


def test_datamodule_loaders_cover_whole_splits_in_order(mini_dir):
    from rgb.training.datamodule import RGBDataModule

    dm = RGBDataModule(source=str(mini_dir), dataset=DATASET, image_size=32, num_classes=10,
                       budgets={"l1": 1.0, "l2": 0.5, "Linf": 0.1}, batch_size=100, eval_batch_size=64,
                       augment={"hflip": True, "color_jitter": 0.25, "rotation": 2.0})
    dm.setup("fit")
    assert dm.budgets["linf"] == 0.1 and dm.class_names == CLASS_NAMES
    ids = torch.cat([batch[2] for batch in dm.eval_dataloader("common")])
    assert ids.tolist() == list(range(TEST_SIZE))  # whole split, in order, last partial batch kept
    x, y, _ = next(iter(dm.train_dataloader()))
    assert x.shape == (100, 3, 32, 32) and 0 <= x.min() and x.max() <= 1
    wrong = RGBDataModule(source=str(mini_dir), dataset=DATASET, image_size=32, num_classes=7, budgets={})
    with pytest.raises(ValueError, match="data.num_classes=7 but digits .* has 10 classes"):
        wrong.setup("fit")


@pytest.mark.slow
def test_corruptions_are_an_optional_extra(monkeypatch):
    """Issue 24: the corruption library (OpenCV, scikit-image, numba) is an extra: a command that needs it names
    the extra in one line, and the modules of training, attacking and scoring import without it."""
    import subprocess
    import sys

    from rgb.data.benchmark import BenchmarkError
    from rgb.data.corruptions import apply_corruption

    monkeypatch.setitem(sys.modules, "imagecorruptions", None)  # as if not installed
    with pytest.raises(BenchmarkError, match=r"robustgenbench\[corruptions\]"):
        apply_corruption(np.zeros((32, 32, 3), dtype=np.uint8), CORRUPTIONS[0], 3, seed=0)
    blocked = ("imagecorruptions", "cv2", "skimage", "numba")
    code = ("import sys\n"
            "class Block:\n"
            f"    def find_spec(self, name, *args):\n"
            f"        if name.split('.')[0] in {blocked!r}: raise ImportError(name)\n"
            "sys.meta_path.insert(0, Block())\n"
            "import rgb.commands.main, rgb.data.mini, rgb.runs.runner, rgb.evaluation.run, rgb.commands.train, rgb.zeroshot\n"
            "print('imported')\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "imported" in done.stdout, done.stderr[-2000:]


def test_training_fits_on_the_data_config_it_is_given(compose):
    """The data configs build rgb.data.BenchmarkData (no Lightning); training builds RGBDataModule from the same
    keys, or a user's own LightningDataModule `_target_` as given. Which class reads the data is not a training
    run's identity (run dirs of before the split still resume)."""
    import lightning as L

    from rgb.commands.train_config import resumable
    from rgb.training.datamodule import RGBDataModule
    from rgb.commands.train import lightning_data

    cfg = compose("train", "data=mini")
    built = lightning_data(cfg.data)
    assert type(built) is RGBDataModule and built.eval_batch_size == cfg.data.eval_batch_size
    own = lightning_data(OmegaConf.create({"_target_": "lightning.pytorch.demos.boring_classes.BoringDataModule"}))
    assert isinstance(own, L.LightningDataModule) and not isinstance(own, RGBDataModule)
    assert resumable("data._target_")


@pytest.mark.slow
def test_attack_and_evaluation_start_without_lightning_or_scikit_learn():
    """Lightning (about 1.5 s to import) is training's, and scikit-learn only builds the mini benchmark: the modules
    attack.py and evaluate.py run, the data config they instantiate and rgb.commands.main load neither (issue
    24: start-up)."""
    import subprocess
    import sys

    code = ("import sys\n"
            "from hydra.utils import instantiate\n"
            "import rgb.commands.attack, rgb.runs.runner, rgb.commands.evaluate, rgb.models.openclip\n"
            "from rgb.commands.main import register_resolvers\n"
            "from tests.helpers import compose_config\n"
            "register_resolvers()\n"
            "instantiate(compose_config('attack', 'data=mini').data)\n"
            "import rgb.commands.main\n"
            "print(sorted(m for m in ('lightning', 'pytorch_lightning', 'sklearn') if m in sys.modules))\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split()[-1] == "[]"


def test_every_name_rgb_data_advertises_imports():
    import rgb.data

    assert all(hasattr(rgb.data, name) for name in rgb.data.__all__)


@pytest.mark.slow
def test_mini_module_runs_without_runpy_warning():
    """`python -m rgb.data.mini` (make demo's first step) imports the rgb.data package first: when the package
    imported rgb.data.mini itself, runpy warned "found in sys.modules ... unpredictable behaviour"."""
    done = subprocess.run([sys.executable, "-W", "error::RuntimeWarning", "-m", "rgb.data.mini", "--help"],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "RuntimeWarning" not in done.stderr, done.stderr
