"""One dataset of RobustGenBench (or the mini benchmark) as a data config describes it: its splits, budgets and
deterministic evaluation loaders. No Lightning here: attack.py and evaluate.py read data through this class and
start without importing it; training's Lightning module (rgb.training.datamodule) adds augmented training loaders."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import torch
from torch.utils.data import DataLoader

from rgb.core.machine import available_cpus
from rgb.core.threat import ThreatModel, parse_norm
from rgb.core.values import DATA_LOADING, require
from rgb.data.benchmark import ImageSplit, load_split
from rgb.data.catalog import (CARD_IMAGE_SIZE, DATASET_IDS, DATASETS, DEFAULT_REPO_ID, MINI, WHITE_BOX,
                              UnknownDatasetError)
from rgb.data.errors import DataConfigError
from rgb.data.resolvers import budgets as resolved_budgets


class BenchmarkData:
    """One dataset of the benchmark (or the mini benchmark) with its evaluation budgets.

    `budgets` holds the white-box eps per norm (l1, l2, linf) in [0,1] pixel units for this dataset's image
    size; `transfer_budgets` the eps of each transfer split (the attack runs' budgets come from these two).
    Images come out in [0,1]; never normalised here. `surrogates` is accepted because the data configs pass it,
    and not kept: any surrogate's split is loaded by name through `split`. `batch_size` and `augment` are
    training's, read by rgb.training.datamodule.RGBDataModule.
    With `build_mini_if_missing` (the mini config), an absent `source` is built as the mini benchmark first, so
    the default configuration serves on a fresh clone.
    The keyword defaults are a Python caller's, safe on any machine (no worker processes, no pinned memory); the
    data configs set the benchmark's own (conf/data/_benchmark.yaml) and `for_dataset` the configs' batch sizes.
    """

    def __init__(
        self,
        source: str,
        dataset: str,
        image_size: int,
        num_classes: int,
        budgets: dict,
        transfer_budgets: dict | None = None,
        surrogates: list | None = None,
        batch_size: int = 64,
        eval_batch_size: int = 128,
        num_workers: int = 0,
        pin_memory: bool = False,
        augment: dict | None = None,
        cache_dir: str | None = None,
        build_mini_if_missing: bool = False,
    ):
        self.source = str(source)
        self.dataset = dataset
        self.image_size = int(image_size)
        self.num_classes = int(num_classes)
        self.budgets = {threat.name: threat.eps for threat in (ThreatModel(k, v) for k, v in dict(budgets).items())}
        self.transfer_budgets = {k: float(v) for k, v in dict(transfer_budgets or {}).items()}
        require({"image_size": image_size, "batch_size": batch_size, "eval_batch_size": eval_batch_size,
                 "num_workers": num_workers}, DATA_LOADING)
        self.batch_size = batch_size
        self.eval_batch_size = eval_batch_size
        self.num_workers = num_workers
        self.pin_memory = pin_memory
        self.augment = dict(augment or {})
        self.cache_dir = cache_dir
        self.build_mini_if_missing = bool(build_mini_if_missing)
        self._splits: dict[tuple[str, str | None], ImageSplit] = {}

    @classmethod
    def for_dataset(cls, dataset: str, source: str | Path | None = None, *, eval_batch_size: int | None = None,
                    budgets: Mapping[str, float] | None = None, cache_dir: str | None = None) -> BenchmarkData:
        """The data module `data=<its config>` gives for evaluation, from plain arguments (rgb.benchmark: no config
        composition): a card dataset or the mini benchmark by id, its catalog class count and image size, the
        protocol's budgets at that size (`budgets` replaces some), and the config's default source and attack
        batch size. tests/test_data.py holds it equal to the composed configs."""
        if dataset == MINI.name:
            # Deferred, as below: `python -m rgb.data.mini` imports the rgb.data package before running the module.
            from rgb.data.mini import IMAGE_SIZE as MINI_IMAGE_SIZE

            info, size, batch = MINI, MINI_IMAGE_SIZE, 50
            default_source = f"{os.environ.get('RGB_ROOT', '.')}/data/mini"  # as conf/paths spells it
        elif dataset in DATASETS:
            info, size, batch = DATASETS[dataset], CARD_IMAGE_SIZE, 256
            default_source = os.environ.get("RGB_BENCHMARK", DEFAULT_REPO_ID)
        else:
            raise UnknownDatasetError(f"unknown dataset {dataset!r}; dataset ids: {sorted(DATASET_IDS)}")
        white_box = {**resolved_budgets(WHITE_BOX, size), **{parse_norm(k).key: v for k, v in (budgets or {}).items()}}
        return cls(source=str(source or default_source), dataset=info.name, image_size=size,
                   num_classes=info.num_classes, budgets=white_box, transfer_budgets=resolved_budgets("transfer", size),
                   eval_batch_size=batch if eval_batch_size is None else eval_batch_size, cache_dir=cache_dir,
                   build_mini_if_missing=info is MINI)

    def split(self, split: str, surrogate: str | None = None) -> ImageSplit:
        """A validated split as a torch Dataset (cached), images as stored."""
        key = (split, surrogate)
        if key not in self._splits:
            if self.build_mini_if_missing and not Path(self.source).expanduser().exists():
                from rgb.data.mini import ensure_mini

                ensure_mini(Path(self.source))
            rows = load_split(self.source, self.dataset, split, surrogate=surrogate, cache_dir=self.cache_dir)
            self._splits[key] = ImageSplit(rows, self.image_size)
        return self._splits[key]

    @property
    def class_names(self) -> list[str]:
        names = self.split("test").class_names
        if len(names) != self.num_classes:
            raise DataConfigError(f"data.num_classes={self.num_classes} but {self.dataset} in {self.source} has "
                                  f"{len(names)} classes: set data.num_classes={len(names)}, or point the source at "
                                  f"{self.dataset}'s snapshot")
        return names

    def loader_workers(self) -> int:
        """data.num_workers, at most one per CPU this process may use: the card configs ask for 8, and more
        decoding processes than CPUs only add memory (a copy of the split per worker) and contention."""
        return min(self.num_workers, available_cpus())

    def _loader(self, data: ImageSplit, batch_size: int, shuffle: bool) -> DataLoader:
        return DataLoader(
            data,
            batch_size=batch_size,
            shuffle=shuffle,
            drop_last=False,
            num_workers=self.loader_workers(),
            pin_memory=self.pin_memory and torch.cuda.is_available(),
            persistent_workers=self.loader_workers() > 0,
        )

    def eval_dataloader(self, split: str, surrogate: str | None = None) -> DataLoader:
        """Whole split, in order, no shuffling and no dropped batch: every accuracy is over all of it."""
        return self._loader(self.split(split, surrogate), self.eval_batch_size, shuffle=False)
