"""Benchmark access: RobustGenBench splits from the hub or a local snapshot, and the embedded mini benchmark.

`RGBDataModule` and `paper_augmentation` (training's, rgb.data.datamodule) load on first use: Lightning takes
about 1.5 s to import, and attack.py and evaluate.py never need it."""

from rgb.data.benchmark import BenchmarkError, ImageSplit, check_aligned, class_names, config_name, load_split
from rgb.data.benchmark_data import BenchmarkData
from rgb.data.catalog import DATASETS, DEFAULT_REPO_ID, TRANSFER_SPLITS, transfer_coverage

_TRAINING = ("RGBDataModule", "paper_augmentation")

__all__ = [
    "BenchmarkData",
    "BenchmarkError",
    "DATASETS",
    "DEFAULT_REPO_ID",
    "ImageSplit",
    "TRANSFER_SPLITS",
    "check_aligned",
    "class_names",
    "config_name",
    "load_split",
    "transfer_coverage",
    *_TRAINING,
]


def __getattr__(name: str):
    if name in _TRAINING:
        from rgb.data import datamodule

        return getattr(datamodule, name)
    raise AttributeError(f"module 'rgb.data' has no attribute {name!r}")
