"""Benchmark access: RobustGenBench splits from the hub or a local snapshot, and the embedded mini benchmark.
No Lightning here (training's data module is rgb.training.datamodule): attack.py and evaluate.py start without it.

The names are imported on first use, as `rgb`'s are: the config resolvers read the catalog (rgb.data.resolvers)
while a command's config is checked, before torch and the datasets stack load, so a mistyped option is said at once.
"""

_LAZY = {
    "BenchmarkError": "rgb.data.benchmark",
    "ImageSplit": "rgb.data.benchmark",
    "check_aligned": "rgb.data.benchmark",
    "class_names": "rgb.data.benchmark",
    "config_name": "rgb.data.benchmark",
    "load_split": "rgb.data.benchmark",
    "BenchmarkData": "rgb.data.benchmark_data",
    "DATASETS": "rgb.data.catalog",
    "DEFAULT_REPO_ID": "rgb.data.catalog",
    "TRANSFER_SPLITS": "rgb.data.catalog",
    "transfer_coverage": "rgb.data.catalog",
    "DataConfigError": "rgb.data.errors",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str):
    if name in _LAZY:
        from importlib import import_module

        value = getattr(import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'rgb.data' has no attribute {name!r}")
