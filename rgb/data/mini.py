"""The embedded mini benchmark: scikit-learn's handwritten digits in RobustGenBench format.

`python -m rgb.data.mini OUT_DIR` writes config `digits` (train / validation / test / common / random_linf_30)
at 32x32 RGB. The build is deterministic: the same bytes on every run, so results on it are comparable.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path

import numpy as np
from PIL import Image
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

from rgb.data.catalog import CORRUPTION_SEVERITY
from rgb.data.corruptions import apply_corruption, corruption_of_row
from rgb.data.snapshot import png_bytes, write_readme, write_split

DATASET = "digits"
IMAGE_SIZE = 32
CLASS_NAMES = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
TEST_SIZE = 450  # 11 blocks of 40 for `common`, and a remainder of 10 that wraps to the first corruption
VALIDATION_SIZE = 270
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
    rest, test = train_test_split(index, test_size=TEST_SIZE, stratify=labels, random_state=SEED)
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


def build_mini(out_dir: Path) -> Path:
    """Write the mini benchmark to `out_dir` (replacing a previous build only once the new one is complete)."""
    out_dir = Path(out_dir)
    staging = out_dir.with_name(out_dir.name + ".building")
    shutil.rmtree(staging, ignore_errors=True)
    images, labels = digit_images()
    for split, index in stratified_splits(labels).items():
        columns = clean_columns(images[index], labels[index])
        write_split(staging / "data" / DATASET / f"{split}.parquet", CLASS_NAMES, columns)
        if split == "test":
            write_split(staging / "data" / DATASET / "common.parquet", CLASS_NAMES, common_columns(images[index], labels[index]))
            write_split(
                staging / "data" / DATASET / "random_linf_30.parquet",
                CLASS_NAMES,
                random_linf_columns(images[index], labels[index]),
            )
    write_readme(staging, "RobustGenBench mini (scikit-learn digits, 32x32)")
    shutil.rmtree(out_dir, ignore_errors=True)
    staging.rename(out_dir)
    return out_dir


def ensure_mini(out_dir: Path) -> Path:
    """Build the mini benchmark unless a complete build is already there."""
    out_dir = Path(out_dir)
    if not (out_dir / "README.md").is_file():
        build_mini(out_dir)
    return out_dir


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--force", action="store_true", help="rebuild even if a complete build exists")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    (build_mini if args.force else ensure_mini)(args.out_dir)
    size = sum(f.stat().st_size for f in args.out_dir.rglob("*") if f.is_file())
    print(f"mini benchmark at {args.out_dir} ({size / 1e6:.2f} MB, {time.perf_counter() - start:.1f}s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
