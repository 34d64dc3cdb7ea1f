"""One training run as typed sections (data, model, loss, strategy, optim, trainer, logging): what rgb.training
reads, built by rgb.commands.train from train.py's composed config by field name (rgb.core.options: a field is read
from its key, `<section>.<name>` unless it names another; its rule is what train.py's schema checks first, and a
field with identity=False may change between starts of one run). The training code reads fields, never YAML key
paths; the run's identity (which weights it produces) comes in as a value computed by the command."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING


from rgb.core.options import Ruled, ruled, section
from rgb.core.values import AUTO_OR_COUNT, BOOL, NON_NEGATIVE, POSITIVE, POSITIVE_INT, Rule, integer, number, optional
from rgb.training.config import TrainingConfigError
from rgb.training.settings import LOSS_NAMES, SCHEDULERS, STRATEGIES
from rgb.zeroshot import ZEROSHOT  # strategy=zeroshot; the fine-tuning strategies are rgb.training.settings.STRATEGIES
from rgb.zeroshot.settings import PromptSettings

if TYPE_CHECKING:  # plain Python at import: train.py's schema reads these sections' rules before torch loads
    import lightning as L
    import torch
    from lightning.pytorch.callbacks import Callback
    from lightning.pytorch.loggers import Logger

# The strategies a TrainRequest runs: the fine-tuning ones and zeroshot (a head from prompts, no fit).
STRATEGY_NAMES = (*STRATEGIES, ZEROSHOT)
STRATEGY: Rule = (lambda v: v in STRATEGY_NAMES, f"one of {list(STRATEGY_NAMES)}")


@dataclass(frozen=True)
class DataSection(Ruled):
    # images per device and step (effective_batch_size accumulates them); its rule is the data config's (DATA_LOADING)
    batch_size: int = ruled()
    build: Callable[[], object]  # the data config's own class (rgb.data.BenchmarkData): what a zero-shot head reads
    build_fit: Callable[[], L.LightningDataModule]  # the same data as Lightning fits on it


@dataclass(frozen=True)
class ModelSection(Ruled):
    build: Callable[[], torch.nn.Module]  # called after the seed is set
    # how the head starts (rgb.training.zeroshot.HEAD_INITS); None: the model's own
    head_init: str | None = ruled(None, key="head_init.name")
    prompts: PromptSettings | None = None  # the prompt ensemble of strategy=zeroshot and head_init=zeroshot
    channels_last: bool = ruled(False, BOOL, key="channels_last", identity=False)
    compile: bool = ruled(False, BOOL, key="compile", identity=False)  # the weights are the same either way
    card: dict = field(default_factory=dict)  # the model card (rgb.models.card.model_card), recorded in model.json


@dataclass(frozen=True)
class LossSection(Ruled):
    """A loss of rgb.training.losses.LOSSES, its inner attack's settings and its own options (TRADES' beta)."""

    name: str = ruled(rule=(lambda v: v in LOSS_NAMES, f"one of {sorted(LOSS_NAMES)}"))
    attack: dict | None = None
    options: dict = field(default_factory=dict)

    def settings(self) -> dict:
        """As `build_loss` takes it and model.json / the checkpoint's hyper-parameters record it."""
        return {"name": self.name, **self.options, **({} if self.attack is None else {"attack": dict(self.attack)})}


@dataclass(frozen=True)
class StrategySection(Ruled):
    name: str = ruled(rule=STRATEGY)  # rgb.training.settings.STRATEGIES, or zeroshot (a head from prompts, no fit)


@dataclass(frozen=True)
class OptimSection(Ruled):
    """AdamW's settings (rgb.training.optim), fields in the order model.json records them. The new head starts
    random: it must learn. A zero backbone lr keeps the backbone weights (its BN statistics still adapt under
    full_finetune): a meaningful ablation, so 0 is allowed there."""

    backbone_lr: float = ruled(rule=NON_NEGATIVE)
    backbone_weight_decay: float = ruled(rule=NON_NEGATIVE)
    betas: list[float] = ruled(rule=(lambda v: isinstance(v, list) and len(v) == 2
                                     and all(number(b) and 0 <= b < 1 for b in v), "two numbers in [0, 1)"))
    head_lr: float = ruled(rule=POSITIVE)
    head_weight_decay: float = ruled(rule=NON_NEGATIVE)
    scheduler: str | None = ruled(None, (lambda v: v in SCHEDULERS, f"one of {list(SCHEDULERS)}"))
    warmup_epochs: float = ruled(0, NON_NEGATIVE)

    def settings(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class TrainerSection(Ruled):
    build: Callable[..., L.Trainer]  # called with callbacks=, logger=, plugins=
    callbacks: Callable[[], list[Callback]]  # each refuses its own settings in one line (TrainingError)
    precision: str = ruled()
    # images per optimiser step (None: one batch)
    effective_batch_size: int | None = ruled(None, optional(POSITIVE_INT), key="effective_batch_size")
    ckpt_path: str | None = ruled("auto", key="ckpt_path", identity=False)  # rgb.training.run.resume_path
    threads: int | str = ruled("auto", AUTO_OR_COUNT, key="threads", identity=False)  # rgb.core.configure_threads


@dataclass(frozen=True)
class LoggingSection(Ruled):
    loggers: Callable[[], list[Logger]]
    # the metric that picks the best checkpoint and is returned to sweepers
    monitor: str = ruled(rule=(lambda v: isinstance(v, str) and bool(v), "a metric name"), key="monitor.metric")
    hyperparameters: dict  # the resolved config, as the loggers record it
    # the W&B model artifact uploads the weights (False: a file:// reference to them)
    log_weights: bool = ruled(False, key="wandb.log_weights", convert=bool, identity=False)
    hydra_record: dict[str, bytes] = field(default_factory=dict)  # the .hydra/ files of this start ({}: none)


@dataclass(frozen=True)
class TrainRequest(Ruled):
    """One training run, as `rgb.training.train` reads it: typed sections, never YAML key paths.

    Built by `rgb.commands.train` from train.py's composed config (the schema has refused bad values first); a
    Python caller may build one directly.

    Args:
        run_dir: the folder the run owns (model.safetensors, model.json, run.json, checkpoints), locked while it runs.
        run_names: run_name and, for a sweep job, its sweep, as model.json records them (rgb.runs.store.run_name_for).
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

    Raises:
        TrainingConfigError: A value outside its rule (one line naming its key, the rule and the value);
            `rgb.training.train` raises TrainingError (a UserError) for a run dir whose run.json
        names another identity and for settings a callback or the loss refuses.
    """

    run_dir: Path = ruled(convert=Path, identity=False)
    run_names: dict  # run_name and, for a sweep job, its sweep: recorded in model.json (rgb.runs.store.run_name_for)
    identity: dict
    seed: int | None = ruled(rule=(lambda v: v is None or integer(v), "null or an integer"))
    data: DataSection = section(DataSection, default=False)
    model: ModelSection = section(ModelSection, default=False)
    loss: LossSection = section(LossSection, default=False)
    strategy: StrategySection = section(StrategySection, default=False)
    optim: OptimSection = section(OptimSection, default=False)
    trainer: TrainerSection = section(TrainerSection, default=False)
    logging: LoggingSection = section(LoggingSection, default=False)

    def __post_init__(self):
        self.check(error=TrainingConfigError)
