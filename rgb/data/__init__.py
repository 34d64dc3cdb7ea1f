"""Benchmark access: RobustGenBench splits from the hub or a local snapshot, and the embedded mini benchmark.
No Lightning here (training's data module is rgb.training.datamodule): attack.py and evaluate.py start without it."""

from rgb.data.benchmark import BenchmarkError, ImageSplit, check_aligned, class_names, config_name, load_split
from rgb.data.benchmark_data import BenchmarkData
from rgb.data.catalog import DATASETS, DEFAULT_REPO_ID, TRANSFER_SPLITS, transfer_coverage
from rgb.data.errors import DataConfigError

__all__ = [
    "BenchmarkData",
    "BenchmarkError",
    "DATASETS",
    "DEFAULT_REPO_ID",
    "DataConfigError",
    "ImageSplit",
    "TRANSFER_SPLITS",
    "check_aligned",
    "class_names",
    "config_name",
    "load_split",
    "transfer_coverage",
]
