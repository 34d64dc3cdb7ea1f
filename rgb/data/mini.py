"""The embedded mini benchmark: scikit-learn's handwritten digits in RobustGenBench format.

`python -m rgb.data.mini OUT_DIR` writes config `digits` (train / validation / test / common / random_linf_30)
at 32x32 RGB. The build is deterministic: the same bytes on every run, so results on it are comparable.
It writes only into a new or empty folder or over a previous mini build (`--force`): never over anything else.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from PIL import Image
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

from rgb.data.benchmark import BenchmarkError
from rgb.data.catalog import CORRUPTION_SEVERITY, MINI
from rgb.data.corruptions import apply_corruption, corruption_of_row
from rgb.data.snapshot import is_mini_build, png_bytes, write_readme, write_split

DATASET = MINI.name
IMAGE_SIZE = 32
CLASS_NAMES = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
# 450 images are held out of training (as in every build, so train and validation keep their bytes); the test
# split is a stratified 200 of them (20 per class), small enough for `make demo` to attack in minutes:
# 11 blocks of 18 for `common`, and a remainder of 2 that wraps to the first corruption.
HELD_OUT = 450
TEST_SIZE = MINI.test_size
VALIDATION_SIZE = MINI.validation_size
SEED = 0
RANDOM_LINF = 30  # in 1/255 units, as the real `random_linf_30`


def digit_images() -> tuple[np.ndarray, np.ndarray]:
    """All 1797 digits as uint8 32x32x3 (bicubic upscaling of the 8x8 scans, grey in three channels)."""
    digits = load_digits()
    scans = np.round(digits.images * (255.0 / 16.0)).astype(np.uint8)
    images = np.stack(
        [np.asarray(Image.fromarray(s).resize((IMAGE_SIZE, IMAGE_SIZE), Image.BICUBIC)) for s in scans]
    )
    return np.repeat(images[..., None], 3, axis=-1), digits.target.astype(np.int64)


def stratified_splits(labels: np.ndarray) -> dict[str, np.ndarray]:
    index = np.arange(len(labels))
    rest, held_out = train_test_split(index, test_size=HELD_OUT, stratify=labels, random_state=SEED)
    rng = np.random.default_rng(SEED)  # the same number of images from every class, drawn reproducibly
    per_class = TEST_SIZE // len(CLASS_NAMES)
    test = np.concatenate([rng.permutation(held_out[labels[held_out] == c])[:per_class]
                           for c in range(len(CLASS_NAMES))])
    train, validation = train_test_split(
        rest, test_size=VALIDATION_SIZE, stratify=labels[rest], random_state=SEED
    )
    return {"train": np.sort(train), "validation": np.sort(validation), "test": np.sort(test)}


def clean_columns(images: np.ndarray, labels: np.ndarray) -> dict[str, list]:
    n = len(labels)
    return {
        "image": [png_bytes(im) for im in images],
        "label": labels.tolist(),
        "image_id": list(range(n)),
        "perturbation": ["clean"] * n,
        "is_modified": [False] * n,
    }


def common_columns(images: np.ndarray, labels: np.ndarray) -> dict[str, list]:
    names = [corruption_of_row(i, len(images)) for i in range(len(images))]
    corrupted = [apply_corruption(im, name, CORRUPTION_SEVERITY, SEED + i) for i, (im, name) in enumerate(zip(images, names))]
    columns = clean_columns(np.stack(corrupted), labels)
    columns["perturbation"] = [f"common_corruption_severity{CORRUPTION_SEVERITY}"] * len(images)
    columns["corruption"] = names
    columns["is_modified"] = [bool((c != im).any()) for c, im in zip(corrupted, images)]
    return columns


def random_linf_columns(images: np.ndarray, labels: np.ndarray) -> dict[str, list]:
    """Uniform noise of at most 30/255 per pixel, drawn in whole grey levels so PNG storage keeps the bound exact."""
    rng = np.random.default_rng(SEED)
    noise = rng.integers(-RANDOM_LINF, RANDOM_LINF + 1, size=images.shape)
    noisy = np.clip(images.astype(np.int64) + noise, 0, 255).astype(np.uint8)
    columns = clean_columns(noisy, labels)
    n = len(images)
    columns.update(
        perturbation=["random_uniform"] * n,
        norm=["linf"] * n,
        epsilon=[RANDOM_LINF / 255] * n,
        is_modified=[bool((a != b).any()) for a, b in zip(noisy, images)],
    )
    return columns


def write_mini(root: Path) -> None:
    """Write every split and the README of the mini benchmark into the (new) folder `root`."""
    images, labels = digit_images()
    for split, index in stratified_splits(labels).items():
        columns = clean_columns(images[index], labels[index])
        write_split(root / "data" / DATASET / f"{split}.parquet", CLASS_NAMES, columns)
        if split == "test":
            write_split(
                root / "data" / DATASET / "common.parquet", CLASS_NAMES, common_columns(images[index], labels[index])
            )
            write_split(
                root / "data" / DATASET / "random_linf_30.parquet",
                CLASS_NAMES,
                random_linf_columns(images[index], labels[index]),
            )
    write_readme(root, MINI.title)


def check_replaceable(out_dir: Path) -> None:
    """Refuse any `out_dir` but a new or empty folder or a previous mini build: user files are never deleted."""
    if not out_dir.exists() or (out_dir.is_dir() and not any(out_dir.iterdir())) or is_mini_build(out_dir):
        return
    raise BenchmarkError(
        f"{out_dir} is not empty and is not a mini benchmark build: nothing written; choose a new or empty folder"
    )


def build_mini(out_dir: Path) -> Path:
    """Write the mini benchmark to `out_dir` (replacing a previous mini build only once the new one is complete)."""
    out_dir = Path(out_dir).expanduser()
    check_replaceable(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.building-", dir=out_dir.parent))
    try:
        write_mini(staging)
        install(staging, out_dir)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out_dir


def install(staging: Path, out_dir: Path) -> None:
    """Move a finished build into place; a previous build is moved aside first and deleted only after."""
    check_replaceable(out_dir)  # again: the folder may have changed while the build ran
    previous = None
    if out_dir.is_dir() and any(out_dir.iterdir()):
        previous = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.previous-", dir=out_dir.parent)) / out_dir.name
        os.rename(out_dir, previous)
    try:
        os.rename(staging, out_dir)
    except OSError:
        if not is_mini_build(out_dir):  # another process finished the same build first: keep it
            raise
    if previous is not None:
        shutil.rmtree(previous.parent, ignore_errors=True)


def ensure_mini(out_dir: Path) -> Path:
    """Build the mini benchmark unless a mini build is already there."""
    out_dir = Path(out_dir).expanduser()
    if not is_mini_build(out_dir):
        build_mini(out_dir)
    return out_dir


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--force", action="store_true", help="rebuild over a previous mini build")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    if is_mini_build(args.out_dir) and not args.force:
        print(f"mini benchmark already at {args.out_dir} (--force rebuilds it)")
        return 0
    try:
        build_mini(args.out_dir)
    except BenchmarkError as err:
        print(f"rgb.data.mini: error: {err}", file=sys.stderr)
        return 2
    size = sum(f.stat().st_size for f in args.out_dir.rglob("*") if f.is_file())
    print(f"mini benchmark built at {args.out_dir} ({size / 1e6:.2f} MB, {time.perf_counter() - start:.1f}s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
