"""Your own dataset as a RobustGenBench-format snapshot: `python -m rgb.data.import_folder SRC OUT --name NAME`.

SRC is an ImageFolder tree: `train/`, `validation/` and `test/`, each with one folder per class (the same class
folders in all three) holding the images. OUT gets config NAME with the card's fields: the three clean splits
squash-resized to `--size` (224 by default) and stored as lossless PNG, plus `common` (the card's 11 corruptions
at severity 3, in its contiguous blocks) and `random_linf_30` made from `test`, and the README `configs:` block;
the same bytes on every run. Then `data=custom data.source=OUT data.dataset=NAME` trains, attacks and scores it.
Every image is read as a viewer shows it, as 8-bit RGB: 16-bit grey (PNG's I;16, I;16B, and mode I, read as
0..65535) scaled to 0..255, float grey (F) read as 0..1, palette, CMYK and 1-bit images converted, transparency
(LA, RGBA, PA, a palette's or tRNS transparent colour) composited on white. A value outside its mode's range, a
mode Pillow cannot convert, a broken symbolic link: one line naming the file, never a silent clip or skip.
Bad input is one line naming the file or folder, and nothing is written (the build is moved into place only
once complete; OUT must be new or empty).
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path

import numpy as np
from PIL import Image
from tqdm import tqdm

from rgb.data.catalog import CARD_IMAGE_SIZE, CLEAN_SPLITS, CORRUPTIONS, DATASETS, MINI
from rgb.data.errors import BenchmarkError
from rgb.data.snapshot import build_staged, write_dataset

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".ppm")
BACKGROUND = (255, 255, 255)  # what transparent pixels are composited on: white, as a viewer's page shows them
ALPHA_MODES = ("LA", "La", "PA", "RGBA", "RGBa")
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]*")


class ImageFolderError(BenchmarkError):
    """A problem with the ImageFolder tree or the output folder (one line, nothing written)."""


def check_name(name: str) -> None:
    if not NAME_PATTERN.fullmatch(name):
        raise ImageFolderError(f"dataset name {name!r} must be letters, digits, '_', '.' or '-' (a config name)")
    if name in DATASETS or name == MINI.name:
        raise ImageFolderError(f"dataset name {name!r} is one of the benchmark's own: choose another name")


def refuse_broken_links(entries: list[Path]) -> None:
    """A symbolic link to nothing would otherwise be skipped silently (it is neither a file nor a folder)."""
    broken = [p for p in entries if p.is_symlink() and not p.exists()]
    if broken:
        more = f" (and {len(broken) - 1} more)" if len(broken) > 1 else ""
        raise ImageFolderError(f"{broken[0]} is a broken symbolic link (to {broken[0].readlink()}){more}: fix or "
                               f"remove it")


def class_folders(split_dir: Path) -> list[str]:
    if not split_dir.is_dir():
        raise ImageFolderError(f"{split_dir} not found: an ImageFolder tree has {', '.join(CLEAN_SPLITS)} folders")
    entries = sorted(p for p in split_dir.iterdir() if not p.name.startswith("."))
    refuse_broken_links(entries)
    names = [p.name for p in entries if p.is_dir()]
    if len(names) < 2:
        raise ImageFolderError(f"{split_dir} has {len(names)} class folder(s): a classification dataset needs at least 2")
    return names


def image_files(class_dir: Path) -> list[Path]:
    candidates = sorted(p for p in class_dir.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
    refuse_broken_links(candidates)
    files = [p for p in candidates if p.is_file()]
    if not files:
        raise ImageFolderError(f"class folder {class_dir} holds no image ({', '.join(IMAGE_SUFFIXES)})")
    return files


def as_rgb(image: Image.Image, path: Path) -> Image.Image:
    """`image` in 8-bit RGB as a viewer shows it (see the module doc); ImageFolderError for values outside its
    mode's range."""
    if image.mode.startswith("I") or image.mode == "F":  # 16-bit and float grey: scaled, never clipped to white
        values = np.asarray(image, dtype=np.float64)
        top = 1.0 if image.mode == "F" else 65535.0
        if not np.isfinite(values).all():
            raise ImageFolderError(f"image {path}: {image.mode} values are not finite (NaN or inf)")
        low, high = values.min(), values.max()
        if low < 0 or high > top:
            raise ImageFolderError(f"image {path}: {image.mode} values {low:g}..{high:g} outside 0..{top:g}, which "
                                   f"would be clipped: convert it to 8 bits first")
        return Image.fromarray(np.round(values * (255 / top)).astype(np.uint8), mode="L").convert("RGB")
    if image.mode in ALPHA_MODES or "transparency" in image.info:
        rgba = image.convert("RGBA")
        return Image.alpha_composite(Image.new("RGBA", rgba.size, (*BACKGROUND, 255)), rgba).convert("RGB")
    return image.convert("RGB")


def read_image(path: Path, size: int) -> np.ndarray:
    """uint8 size x size x 3: RGB, squash-resized (bicubic) as the benchmark's images are."""
    try:
        with Image.open(path) as image:
            rgb = as_rgb(image, path)
    except (OSError, ValueError, Image.DecompressionBombError) as err:
        raise ImageFolderError(f"cannot read image {path}: {type(err).__name__}: {err}") from None
    if rgb.size != (size, size):
        rgb = rgb.resize((size, size), Image.BICUBIC)
    return np.asarray(rgb, dtype=np.uint8)


def scan(src: Path) -> tuple[list[str], dict[str, list[tuple[Path, int]]]]:
    """(class names, split -> [(file, label)] in class then file-name order), every problem found first."""
    src = Path(src).expanduser()
    if not src.is_dir():
        raise ImageFolderError(f"source folder {src} not found")
    classes = class_folders(src / CLEAN_SPLITS[0])
    files = {}
    for split in CLEAN_SPLITS:
        found = class_folders(src / split)
        if found != classes:
            missing, extra = sorted(set(classes) - set(found)), sorted(set(found) - set(classes))
            raise ImageFolderError(
                f"class folders of {src / split} differ from {src / CLEAN_SPLITS[0]}: missing {missing or 'none'}, "
                f"extra {extra or 'none'}"
            )
        files[split] = [(path, label) for label, name in enumerate(classes) for path in image_files(src / split / name)]
    if len(files["test"]) < len(CORRUPTIONS):
        raise ImageFolderError(f"{src / 'test'} has {len(files['test'])} images: the common split needs at least "
                           f"{len(CORRUPTIONS)} (one block per corruption)")
    return classes, files


def import_folder(src: Path, out_dir: Path, name: str, size: int = CARD_IMAGE_SIZE, seed: int = 0) -> Path:
    """Write config `name` of a new snapshot `out_dir` from the ImageFolder tree `src` (see the module doc)."""
    check_name(name)
    if size < 8:
        raise ImageFolderError(f"--size must be at least 8 pixels, got {size}")
    out_dir = Path(out_dir).expanduser()
    if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())):
        raise ImageFolderError(f"{out_dir} exists and is not empty: nothing written; choose a new or empty folder")
    classes, files = scan(Path(src))
    splits = {}
    for split, rows in files.items():
        images = [read_image(path, size) for path, _ in tqdm(rows, desc=f"reading {split}", leave=False)]
        splits[split] = (np.stack(images), np.array([label for _, label in rows], dtype=np.int64))

    def write(staging: Path) -> None:
        write_dataset(staging, name, classes, splits, f"{name} (imported ImageFolder, RobustGenBench format)", seed)

    return build_staged(out_dir, write, lambda _: False)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("src", type=Path, help="ImageFolder tree: train/, validation/, test/ of class folders")
    parser.add_argument("out_dir", type=Path, help="new (or empty) snapshot folder")
    parser.add_argument("--name", required=True, help="dataset (config) name: data.dataset=NAME")
    parser.add_argument("--size", type=int, default=CARD_IMAGE_SIZE,
                        help=f"image side in pixels (default {CARD_IMAGE_SIZE}, the card's)")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    try:
        import_folder(args.src, args.out_dir, args.name, args.size)
    except BenchmarkError as err:
        print(f"rgb.data.import_folder: error: {err}", file=sys.stderr)
        return 2
    print(f"{args.name} written to {args.out_dir} ({time.perf_counter() - start:.1f}s): train with "
          f"data=custom data.source={args.out_dir} data.dataset={args.name}"
          + (f" data.image_size={args.size}" if args.size != CARD_IMAGE_SIZE else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
