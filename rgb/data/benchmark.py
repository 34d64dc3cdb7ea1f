"""Load RobustGenBench splits from the hub or a local snapshot through one code path: `datasets.load_dataset`.

A perturbed split is only useful if row i is a perturbed copy of test row i, so every perturbed split is checked
against `test` (image_id and label, row by row) before anyone computes an accuracy on it. Every split also has
the row count the card gives it (a truncated split would be scored as the whole), labels within the classes
and an image in every row.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
from pathlib import Path

import datasets
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import torch
from PIL import Image

from rgb.data.catalog import DATASET_SPLITS, DATASETS, MINI, SURROGATES, transfer_coverage
from rgb.data.errors import BenchmarkError
from rgb.data.layout import is_mini_build


def config_name(dataset: str, surrogate: str | None = None) -> str:
    return dataset if surrogate is None else f"{dataset}-{surrogate}"


def is_local(source: str) -> bool:
    """A source is a local snapshot if it exists on disk or is written like a path rather than `owner/name`."""
    return Path(source).expanduser().exists() or source.startswith(("/", ".", "~")) or source.count("/") != 1


def load_split(
    source: str,
    dataset: str,
    split: str,
    surrogate: str | None = None,
    cache_dir: str | None = None,
    validate: bool = True,
) -> datasets.Dataset:
    """One split of config `<dataset>` (or `<dataset>-<surrogate>`), validated against `test` when perturbed."""
    source = str(source)
    config = config_name(dataset, surrogate)
    # The card's surrogates only have the splits of its coverage table; any other surrogate is the user's own
    # export (attack.py export_adversarial=true) and is looked up on disk like everything else.
    if dataset in DATASETS and surrogate in SURROGATES:
        covered = transfer_coverage(dataset).get(surrogate, ())
        if split not in covered:
            raise BenchmarkError(
                f"RobustGenBench provides no split {split!r} for config {config!r} (card coverage table: "
                f"{', '.join(covered) or 'no splits'})"
            )
    if is_local(source) and not Path(source).expanduser().is_dir():
        raise BenchmarkError(f"benchmark directory not found: {source}")
    ds = _load(source, config, split, cache_dir)
    name = f"{config}/{split}"
    if validate:
        check_rows(ds, name, expected_rows(source, dataset, split, surrogate))
        check_labels(ds, name)
        check_images_present(ds, name)
    if validate and (surrogate is not None or split not in ("train", "validation", "test")):
        test = _load(source, config_name(dataset), "test", cache_dir)
        check_aligned(test, ds, name)
    return ds


def expected_rows(source: str, dataset: str, split: str, surrogate: str | None) -> int | None:
    """Rows the card gives this split (the six datasets), or the mini builder (a snapshot it wrote); else None."""
    info = DATASETS.get(dataset)
    if info is None and dataset == MINI.name and is_local(source) and is_mini_build(Path(source).expanduser()):
        info = MINI
    return None if info is None else info.split_rows(split, surrogate)


def check_rows(ds: datasets.Dataset, name: str, expected: int | None) -> None:
    if expected is not None and len(ds) != expected:
        raise BenchmarkError(
            f"split {name} has {len(ds)} rows, expected {expected}: the snapshot is truncated or not the "
            f"benchmark; re-download (or rebuild) it"
        )


def _first_row(ds: datasets.Dataset, mask: np.ndarray) -> tuple[int, object]:
    """Index and image_id of the first row where `mask` holds."""
    row = int(np.flatnonzero(mask)[0])
    return row, ds.data.column("image_id")[row].as_py()


def check_labels(ds: datasets.Dataset, name: str) -> None:
    """Every label is one of the split's classes (an out-of-range label would be counted as misclassified)."""
    labels = ds.data.column("label")
    n_classes = len(class_names(ds))
    values = np.asarray(labels.fill_null(-1).to_numpy())
    bad = (values < 0) | (values >= n_classes)
    if bad.any():
        row, image_id = _first_row(ds, bad)
        found = labels[row].as_py()
        raise BenchmarkError(
            f"split {name} row {row} (image_id {image_id}) has label {found}, outside the {n_classes} classes "
            f"0..{n_classes - 1}"
        )


def check_images_present(ds: datasets.Dataset, name: str) -> None:
    """Every row has image bytes (bytes that do not decode are named by ImageSplit when read)."""
    images = ds.data.column("image")
    missing = pc.or_(images.is_null(), pc.struct_field(images, "bytes").is_null())
    mask = np.asarray(missing.fill_null(True).to_numpy(zero_copy_only=False))
    if mask.any():
        row, image_id = _first_row(ds, mask)
        raise BenchmarkError(f"split {name} row {row} (image_id {image_id}) has no image")


def _load(source: str, config: str, split: str, cache_dir: str | None) -> datasets.Dataset:
    path = str(Path(source).expanduser().resolve()) if is_local(source) else source
    try:
        available = datasets.get_dataset_config_names(path)
        if config not in available:
            raise BenchmarkError(f"unknown dataset config {config!r} in {source}; available: {', '.join(available)}")
        if is_local(source):
            cache_dir = snapshot_cache_dir(path, config, cache_dir)
        return datasets.load_dataset(path, name=config, split=split, cache_dir=cache_dir)
    except BenchmarkError:
        raise
    except (datasets.exceptions.DatasetGenerationError, pa.ArrowException) as err:
        raise BenchmarkError(_describe_broken_files(path, config, err)) from err
    except ValueError as err:  # after ArrowInvalid, which is a ValueError too
        if "split" not in str(err).lower():
            raise
        splits = datasets.get_dataset_split_names(path, config)
        raise BenchmarkError(
            f"missing split {split!r} of config {config!r} in {source}; present: {', '.join(splits)}"
        ) from err
    except Exception as err:  # the hub client raises many types; all mean "cannot read this source"
        broken = _describe_broken_files(path, config, err) if is_local(source) else None
        raise (BenchmarkError(broken) if broken else _source_error(source, err)) from err


def snapshot_cache_dir(path: str, config: str, cache_dir: str | None) -> str:
    """A datasets cache of its own for one local snapshot config as its files are now.

    The datasets cache names a local snapshot's entry by folder basename and config only, so another snapshot
    with the same folder name, or parquet files changed in place, would be served from the first one's Arrow
    files. Keying on the resolved path and every data file's path, size and mtime gives each its own entry.
    """
    root = Path(cache_dir or os.environ.get("HF_DATASETS_CACHE") or datasets.config.HF_DATASETS_CACHE)
    files = datasets.load_dataset_builder(path, name=config, cache_dir=str(root)).config.data_files
    stats = {
        split: [(file, os.stat(file).st_size, os.stat(file).st_mtime_ns) for file in files[split]]
        for split in sorted(files)
    }
    key = hashlib.sha256(json.dumps([path, config, stats]).encode()).hexdigest()[:24]
    return str(root / "rgb-snapshots" / key)


def _source_error(source: str, err: Exception) -> BenchmarkError:
    if not is_local(source) and os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False"):
        return BenchmarkError(
            f"cannot load hub dataset {source!r} with HF_HUB_OFFLINE=1; download a snapshot on a machine with "
            f"internet (huggingface_hub.snapshot_download({source!r}, repo_type='dataset', local_dir=DIR)) and "
            f"point the suite at it: data.source=DIR"
        )
    return BenchmarkError(f"cannot read benchmark source {source!r}: {type(err).__name__}: {str(err).splitlines()[0]}")


def _describe_broken_files(path: str, config: str, err: Exception) -> str:
    """Name the first unreadable parquet file, so the user knows what to re-download."""
    if Path(path).is_dir():
        for file in sorted(Path(path).rglob("*.parquet")):
            try:
                pq.read_metadata(file)
            except Exception as bad:  # pyarrow raises ArrowInvalid/OSError for truncated or foreign files
                return f"corrupt parquet file {file}: {str(bad).splitlines()[0]}"
    return f"cannot read config {config!r} from {path}: {type(err).__name__}: {str(err).splitlines()[0]}"


def check_aligned(test: datasets.Dataset, other: datasets.Dataset, name: str) -> None:
    """Raise unless `other` is row-aligned with `test` (same length, image_id and label per row, same classes)."""
    if len(other) != len(test):
        raise BenchmarkError(f"split {name} has {len(other)} rows but test has {len(test)}")
    if class_names(other) != class_names(test):
        raise BenchmarkError(f"split {name} has other class names than test")
    for column in ("image_id", "label"):
        mine = np.asarray(other.data.column(column).to_numpy())
        ref = np.asarray(test.data.column(column).to_numpy())
        bad = np.flatnonzero(mine != ref)
        if bad.size:
            i = int(bad[0])
            raise BenchmarkError(
                f"split {name} is not aligned with test: row {i} has {column} {mine[i]} (image_id "
                f"{other[i]['image_id']}) but test has {ref[i]}"
            )


def class_names(ds: datasets.Dataset) -> list[str]:
    return list(ds.features["label"].names)


def decode_image(value: dict | Image.Image, image_size: int) -> Image.Image:
    """PNG bytes (or an already decoded image) -> RGB PIL image of side `image_size` (squashed, as in the paper)."""
    image = value if isinstance(value, Image.Image) else Image.open(io.BytesIO(value["bytes"]))
    image = image.convert("RGB")
    if image.size != (image_size, image_size):
        image = image.resize((image_size, image_size), Image.BILINEAR)
    return image


def to_tensor(image: Image.Image) -> torch.Tensor:
    """uint8 HWC -> float32 CHW in [0, 1]; no normalisation (that lives inside the model)."""
    array = torch.from_numpy(np.asarray(image, dtype=np.uint8).copy())
    return array.permute(2, 0, 1).float().div_(255.0)


class ImageSplit(torch.utils.data.Dataset):
    """A benchmark split as (image in [0,1], label, image_id) items, decoded lazily in the worker.

    `name` (default `<config>/<split>` of the Hugging Face dataset) names the split in errors.
    """

    def __init__(self, hf_dataset: datasets.Dataset, image_size: int, transform=None, name: str | None = None):
        self.rows = hf_dataset.cast_column("image", datasets.Image(decode=False))
        self.image_size = image_size
        self.transform = transform
        self.class_names = class_names(hf_dataset)
        self.name = name or f"{hf_dataset.info.config_name}/{hf_dataset.split}"

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int):
        row = self.rows[index]
        try:
            image = decode_image(row["image"], self.image_size)
        except Exception as err:  # PIL raises UnidentifiedImageError, OSError, ValueError, ... for bad bytes
            present = bool((row["image"] or {}).get("bytes"))
            reason = f"has an image that does not decode ({type(err).__name__})" if present else "has no image"
            raise BenchmarkError(f"split {self.name} row {index} (image_id {row['image_id']}) {reason}") from err
        if self.transform is not None:
            image = self.transform(image)
        return to_tensor(image), int(row["label"]), int(row["image_id"])

    @property
    def labels(self) -> torch.Tensor:
        return torch.from_numpy(np.array(self.rows.data.column("label").to_numpy(), dtype=np.int64))


__all__ = [
    "BenchmarkError",
    "ImageSplit",
    "check_aligned",
    "class_names",
    "config_name",
    "load_split",
    "DATASET_SPLITS",
]
