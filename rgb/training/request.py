"""One training run as typed sections (data, model, loss, strategy, optim, trainer, logging): what rgb.training
reads, built by rgb.commands.train from train.py's composed config. The training code reads fields, never YAML key
paths; the run's identity (which weights it produces) comes in as a value computed by the command."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.loggers import Logger

from rgb.zeroshot.head import PromptSettings


@dataclass(frozen=True)
class DataSection:
    batch_size: int  # images per device and step (effective_batch_size accumulates them)
    build: Callable[[], object]  # the data config's own class (rgb.data.BenchmarkData): what a zero-shot head reads
    build_fit: Callable[[], L.LightningDataModule]  # the same data as Lightning fits on it


@dataclass(frozen=True)
class ModelSection:
    build: Callable[[], torch.nn.Module]  # called after the seed is set
    head_init: str | None = None  # how the head starts (rgb.training.zeroshot.HEAD_INITS); None: the model's own
    prompts: PromptSettings | None = None  # the prompt ensemble of strategy=zeroshot and head_init=zeroshot
    channels_last: bool = False
    compile: bool = False
    card: dict = field(default_factory=dict)  # the model card (rgb.models.card.model_card), recorded in model.json


@dataclass(frozen=True)
class LossSection:
    """A loss of rgb.training.losses.LOSSES, its inner attack's settings and its own options (TRADES' beta)."""

    name: str
    attack: dict | None = None
    options: dict = field(default_factory=dict)

    def settings(self) -> dict:
        """As `build_loss` takes it and model.json / the checkpoint's hyper-parameters record it."""
        return {"name": self.name, **self.options, **({} if self.attack is None else {"attack": dict(self.attack)})}


@dataclass(frozen=True)
class StrategySection:
    name: str  # rgb.training.module.STRATEGIES, or zeroshot (a head from prompts, no fit)


@dataclass(frozen=True)
class OptimSection:
    """AdamW's settings (rgb.training.optim), fields in the order model.json records them."""

    backbone_lr: float
    backbone_weight_decay: float
    betas: list[float]
    head_lr: float
    head_weight_decay: float
    scheduler: str | None = None
    warmup_epochs: float = 0

    def settings(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class TrainerSection:
    build: Callable[..., L.Trainer]  # called with callbacks=, logger=, plugins=
    callbacks: Callable[[], list[Callback]]  # each refuses its own settings in one line (TrainingError)
    precision: str
    effective_batch_size: int | None = None  # images per optimiser step (None: one batch)
    ckpt_path: str | None = "auto"  # rgb.training.run.resume_path
    threads: int | str = "auto"  # rgb.core.configure_threads


@dataclass(frozen=True)
class LoggingSection:
    loggers: Callable[[], list[Logger]]
    monitor: str  # the metric that picks the best checkpoint and is returned to sweepers
    hyperparameters: dict  # the resolved config, as the loggers record it
    log_weights: bool = False  # the W&B model artifact uploads the weights (False: a file:// reference to them)
    hydra_record: dict[str, bytes] = field(default_factory=dict)  # the .hydra/ files of this start ({}: none)


@dataclass(frozen=True)
class TrainRequest:
    """One training run, as `rgb.training.train` reads it: typed sections, never YAML key paths.

    Built by `rgb.commands.train` from train.py's composed config (the schema has refused bad values first); a
    Python caller may build one directly.

    Args:
        run_dir: the folder the run owns (model.safetensors, model.json, run.json, checkpoints), locked while it runs.
        names: run_name and, for a sweep job, its sweep, as model.json records them (rgb.runs.store.run_name_for).
        identity: what the weights depend on (the resolved config minus the keys that may change between starts),
            computed by the command and checked against run.json before anything in run_dir changes.
        seed: the seed set before the model is built; None leaves the generators as they are.
        data: the benchmark data and its Lightning form (DataSection).
        model: how the network is built and how its head starts (ModelSection).
        loss: the training loss and its inner attack (LossSection).
        strategy: which parameters train (full, linear probe, ...) or zeroshot for a head from prompts.
        optim: AdamW's learning rates, weight decays and schedule (OptimSection).
        trainer: Lightning's Trainer, its callbacks, precision, batch accumulation and resume (TrainerSection).
        logging: loggers, the monitored metric and what they record (LoggingSection).
    """

    run_dir: Path
    names: dict  # run_name and, for a sweep job, its sweep: recorded in model.json (rgb.runs.store.run_name_for)
    identity: dict
    seed: int | None
    data: DataSection
    model: ModelSection
    loss: LossSection
    strategy: StrategySection
    optim: OptimSection
    trainer: TrainerSection
    logging: LoggingSection
