"""Benchmark access: RobustGenBench splits from the hub or a local snapshot, and the embedded mini benchmark."""

from rgb.data.benchmark import BenchmarkError, ImageSplit, check_aligned, class_names, config_name, load_split
from rgb.data.catalog import DATASETS, DEFAULT_REPO_ID, TRANSFER_SPLITS, transfer_coverage
from rgb.data.datamodule import RGBDataModule, paper_augmentation

__all__ = [
    "BenchmarkError",
    "DATASETS",
    "DEFAULT_REPO_ID",
    "ImageSplit",
    "RGBDataModule",
    "TRANSFER_SPLITS",
    "check_aligned",
    "class_names",
    "config_name",
    "load_split",
    "paper_augmentation",
    "transfer_coverage",
]
