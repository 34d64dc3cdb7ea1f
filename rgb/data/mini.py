"""The embedded mini benchmark: scikit-learn's handwritten digits in RobustGenBench format.

`python -m rgb.data.mini OUT_DIR` writes config `digits` (train / validation / test / common / random_linf_30)
at 32x32 RGB. The build is deterministic: the same bytes on every run, so results on it are comparable.
It writes only into a new or empty folder or over a previous mini build (`--force`): never over anything else.
`--force` replaces only the files the builder writes (the splits and README.md); any other file in the folder (a
user's notes, transfer splits added with rgb-transfer) stays, and the README declares what is there.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from PIL import Image

from rgb.core.files import atomic_write_bytes
from rgb.data.catalog import MINI
from rgb.data.errors import BenchmarkError
from rgb.data.layout import README, is_mini_build
from rgb.data.snapshot import build_staged, write_dataset, write_readme

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


def digit_images() -> tuple[np.ndarray, np.ndarray]:
    """All 1797 digits as uint8 32x32x3 (bicubic upscaling of the 8x8 scans, grey in three channels)."""
    from sklearn.datasets import load_digits  # scikit-learn only where the mini benchmark is built

    digits = load_digits()
    scans = np.round(digits.images * (255.0 / 16.0)).astype(np.uint8)
    images = np.stack(
        [np.asarray(Image.fromarray(s).resize((IMAGE_SIZE, IMAGE_SIZE), Image.BICUBIC)) for s in scans]
    )
    return np.repeat(images[..., None], 3, axis=-1), digits.target.astype(np.int64)


def stratified_splits(labels: np.ndarray) -> dict[str, np.ndarray]:
    from sklearn.model_selection import train_test_split

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


def write_mini(root: Path) -> None:
    """Write every split and the README of the mini benchmark into the (new) folder `root`."""
    images, labels = digit_images()
    splits = {split: (images[index], labels[index]) for split, index in stratified_splits(labels).items()}
    write_dataset(root, DATASET, CLASS_NAMES, splits, MINI.title, SEED)


def check_replaceable(out_dir: Path) -> None:
    """Refuse any `out_dir` but a new or empty folder or a previous mini build: user files are never deleted."""
    if not out_dir.exists() or (out_dir.is_dir() and not any(out_dir.iterdir())) or is_mini_build(out_dir):
        return
    raise BenchmarkError(
        f"{out_dir} is not empty and is not a mini benchmark build: nothing written; choose a new or empty folder"
    )


def build_mini(out_dir: Path) -> Path:
    """Write the mini benchmark to `out_dir` (moved into place only once complete; over a previous mini build, only
    the builder's own files are replaced)."""
    out_dir = Path(out_dir).expanduser()
    check_replaceable(out_dir)
    if is_mini_build(out_dir):
        return rebuild_in_place(out_dir)

    def write(staging: Path) -> None:
        write_mini(staging)
        check_replaceable(out_dir)  # again: the folder may have changed while the build ran

    return build_staged(out_dir, write, is_mini_build)


def rebuild_in_place(out_dir: Path) -> Path:
    """Replace the files a mini build consists of, each atomically, with a complete new build's, leaving any other
    file in `out_dir` where it is; the README is rewritten last, declaring every config found there."""
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.building-", dir=out_dir.parent))
    try:
        write_mini(staging)
        for built in sorted(p for p in staging.rglob("*") if p.is_file() and p.name != README):
            target = out_dir / built.relative_to(staging)
            target.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_bytes(target, built.read_bytes())
        write_readme(out_dir, MINI.title)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out_dir


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
