"""One training run from its request (train.py's config made typed by rgb.commands.train): check it, own its run
dir, fit (resuming if possible), export the best weights with the record of what produced them."""

from __future__ import annotations

import copy
import logging
import math
import sys
from pathlib import Path

import lightning as L
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.loggers import Logger, WandbLogger
from lightning.pytorch.plugins.environments import SLURMEnvironment
from lightning.pytorch.utilities import rank_zero_only

from rgb.core import configure_threads
from rgb.core.machine import DeviceError
from rgb.models import META_FILE, export_meta, export_model, parameter_counts, rebuild_like
from rgb.training.config import TrainingConfigError, TrainingError
from rgb.training.datamodule import RGBDataModule
from rgb.training.module import RobustFinetuneModule
from rgb.training.request import TrainRequest
from rgb.training.robust_val import RobustValidation
from rgb.training.wandb_export import export_wandb_record, log_export, params_hyperparams
from rgb.training.zeroshot import check_zeroshot_metric, initialise_head, train_zeroshot
from rgb.training.rundir import (
    AtomicCheckpointIO,
    RunManifest,
    SameHyperparameters,
    load_checkpoint_file,
    locked,
    start_record,
    write_hydra_record,
)
from rgb.zeroshot import ZEROSHOT

log = logging.getLogger(__name__)
# Where a sweep job refused by its job dir goes instead: the job dir is named by the sweep, not by run_name.
SWEEP_ELSEWHERE = "another sweep_name= (a multirun without one gets a fresh directory)"


def accumulation_steps(effective_batch_size: int | None, batch_size: int, world_size: int) -> int:
    """Micro-batches per optimiser step so that batch_size * world_size * steps == effective_batch_size."""
    if effective_batch_size is None:
        return 1
    per_step = batch_size * world_size
    if effective_batch_size % per_step:
        raise TrainingConfigError(
            f"effective_batch_size {effective_batch_size} is not a multiple of batch_size x devices = {per_step}"
        )
    return effective_batch_size // per_step


def resume_path(ckpt_path: str | None, last: Path | None) -> str | None:
    """`auto`: the run's last checkpoint if present; `last`: it must exist; None: start fresh; else a path."""
    if ckpt_path == "auto":
        return str(last) if last is not None and last.is_file() else None
    if ckpt_path == "last":
        if last is None or not last.is_file():
            raise FileNotFoundError(f"ckpt_path=last but there is no last checkpoint ({last})")
        return str(last)
    if ckpt_path is not None and not Path(ckpt_path).is_file():
        raise FileNotFoundError(f"ckpt_path {ckpt_path} does not exist")
    return ckpt_path


def last_checkpoint_file(callbacks: list) -> Path | None:
    """The file of the unmonitored ModelCheckpoint (rewritten every epoch), where resuming starts from."""
    for callback in callbacks:
        if isinstance(callback, ModelCheckpoint) and callback.monitor is None and callback.filename:
            return Path(callback.dirpath) / f"{callback.filename}{callback.FILE_EXTENSION}"
    return None


def cluster_plugins() -> list:
    """On SLURM, submitit owns requeueing (max_num_timeout > 0), so Lightning must not requeue as well."""
    return [SLURMEnvironment(auto_requeue=False)] if SLURMEnvironment.detect() else []


def close_loggers(loggers: list[Logger], status: str, summary: dict) -> None:
    """Always called, even after an exception: an open W&B run would hang the next multirun job."""
    for logger in loggers:
        if isinstance(logger, WandbLogger) and summary:
            logger.experiment.summary.update(summary)
        logger.finalize(status)
    if "wandb" in sys.modules:
        import wandb

        if wandb.run is not None:
            wandb.finish(exit_code=0 if status == "success" else 1)


def best_state_dict(best: ModelCheckpoint | None, module: RobustFinetuneModule) -> tuple[dict, str]:
    """Weights of the best checkpoint (the module's own when no checkpoint was written, e.g. fast_dev_run)."""
    if best is None or not best.best_model_path:
        return module.model.state_dict(), "final"
    state = load_checkpoint_file(best.best_model_path)["state_dict"]
    return {k.removeprefix("model."): v for k, v in state.items() if k.startswith("model.")}, "best"


def export_best(
    datamodule, module: RobustFinetuneModule, best: ModelCheckpoint | None, request: TrainRequest, record: dict,
    described: dict,
) -> Path:
    """Export the best weights with what produced them: the request's settings (run.json accepted its identity)
    and the run's stored identity and starts (`record`, from run.json); `described`: what else model.json records
    (parameter counts, card, W&B run)."""
    model = rebuild_like(module.model)
    state, which = best_state_dict(best, module)
    model.load_state_dict(state, strict=True)
    meta = export_meta(
        datamodule, request.run_names,
        loss=sorted_tree(request.loss.settings()),
        strategy=request.strategy.name,
        optim=sorted_tree(request.optim.settings()),
        epochs=module.current_epoch,
        effective_batch_size=request.trainer.effective_batch_size,
        precision=request.trainer.precision,
        seed=request.seed,
        weights=which,
        checkpoint=best.best_model_path if best is not None else "",
        monitor=request.logging.monitor,
        monitor_value=None if best is None or best.best_model_score is None else float(best.best_model_score),
        training={"identity": record["identity"], "starts": record["starts"]},
        **described,
    )
    return export_model(model, request.run_dir, meta)


def sorted_tree(settings: dict) -> dict:
    """`settings` with its keys sorted at every level: how model.json has always recorded the loss and optim."""
    return {key: sorted_tree(value) if isinstance(value, dict) and value else value
            for key, value in sorted(settings.items())}


class StartProgress(Callback):
    """The global step at which this start began training (None when it had nothing left to train)."""

    def __init__(self):
        self.first_step: int | None = None

    def on_train_start(self, trainer, pl_module) -> None:
        self.first_step = trainer.global_step

    def trained(self, trainer) -> bool:
        return self.first_step is not None and trainer.global_step > self.first_step


class MonitoredMetric(Callback):
    """After each validation: the monitored metric must have been logged, one line naming the logged ones
    (Lightning's checkpoint callback, which runs after this one, would stop with a traceback)."""

    def __init__(self, metric: str):
        self.metric = metric

    def on_validation_end(self, trainer, pl_module) -> None:
        if not trainer.sanity_checking and self.metric not in trainer.callback_metrics:
            raise TrainingConfigError(f"monitored metric {self.metric!r} was never logged; logged: "
                                      f"{sorted(trainer.callback_metrics)}: set monitor.metric to one of them")


def checked_callbacks(callbacks: list[Callback]) -> list[Callback]:
    """The configured callbacks, once those that depend on others agree with them."""
    for callback in callbacks:
        if isinstance(callback, RobustValidation):
            callback.check_checkpoints(callbacks)
    return callbacks


def monitored_value(trainer: L.Trainer, best: ModelCheckpoint | None, metric: str) -> float:
    if best is not None and best.best_model_score is not None:
        return float(best.best_model_score)
    if metric not in trainer.callback_metrics:  # no validation ran (MonitoredMetric checks each one)
        raise TrainingConfigError(f"monitored metric {metric!r} was never logged; logged: "
                                  f"{sorted(trainer.callback_metrics)}: set monitor.metric to one of them")
    return float(trainer.callback_metrics[metric])


def train(request: TrainRequest) -> float | None:
    """Fit the requested run (or build its head from prompts: strategy=zeroshot), export `model.safetensors` +
    `model.json` into the run dir, return the monitored metric (best value when checkpointing, for Hydra sweepers).

    Before anything starts: the CPU threads are set, the run dir locked and its identity checked against run.json
    (process of rank 0; the other DDP ranks run under its lock). Nothing in the run dir changes before that check
    passes (the .hydra/ record included)."""
    try:
        threads = configure_threads(request.trainer.threads)
    except DeviceError as err:
        raise TrainingConfigError(str(err)) from None
    zeroshot = request.strategy.name == ZEROSHOT  # a head from prompts: no fit, no checkpoints
    if zeroshot:
        check_zeroshot_metric(request.logging.monitor)
    # The callbacks check their own settings: before the run dir is claimed.
    callbacks = [] if zeroshot else checked_callbacks(request.trainer.callbacks())
    run_dir = request.run_dir
    if rank_zero_only.rank != 0:
        return fit_and_export(request, threads, callbacks, None, None)
    with locked(run_dir):
        manifest = RunManifest(run_dir, SWEEP_ELSEWHERE if request.run_names.get("sweep") else "another run_name")
        record = manifest.claim(request.identity)
        write_hydra_record(run_dir, request.logging.hydra_record)
        if zeroshot:
            return train_zeroshot(request, threads, manifest, record)
        return fit_and_export(request, threads, callbacks, manifest, record)


def fit_and_export(
    request: TrainRequest, threads: int, callbacks: list[Callback], manifest: RunManifest | None, record: dict | None,
) -> float:
    run_dir, metric = request.run_dir, request.logging.monitor
    if request.seed is not None:
        L.seed_everything(request.seed, workers=True)
    datamodule = request.data.build_fit()
    if isinstance(datamodule, RGBDataModule):
        datamodule.setup("fit")  # the data is read before the weights load: missing data is said first (cached)
    model = request.model.build()
    initialise_head(model, request.model, datamodule)
    module = RobustFinetuneModule(
        model,
        loss=request.loss.settings(),
        strategy=request.strategy.name,
        optim=request.optim.settings(),
        channels_last=request.model.channels_last,
        compile=request.model.compile,
    )
    progress = StartProgress()
    callbacks = [*callbacks, progress, SameHyperparameters(), MonitoredMetric(metric)]
    best = next((c for c in callbacks if isinstance(c, ModelCheckpoint) and c.monitor), None)
    loggers = request.logging.loggers()
    status, summary = "failed", {}
    try:
        trainer: L.Trainer = request.trainer.build(
            callbacks=callbacks, logger=loggers or False, plugins=[*cluster_plugins(), AtomicCheckpointIO()],
        )
        trainer.accumulate_grad_batches = accumulation_steps(
            request.trainer.effective_batch_size, request.data.batch_size, trainer.world_size
        )
        counts = parameter_counts(module.model)
        for logger in trainer.loggers:
            logger.log_hyperparams({"config": copy.deepcopy(request.logging.hyperparameters),
                                    **params_hyperparams(counts)})
        ckpt_path = resume_path(request.trainer.ckpt_path, last_checkpoint_file(callbacks))
        if ckpt_path is not None:
            log.info("resuming from %s", ckpt_path)
        if manifest is not None:
            accelerator = type(trainer.accelerator).__name__.removesuffix("Accelerator").lower()
            record = manifest.add_start(record, start_record(threads, accelerator, trainer.num_devices,
                                                             trainer.num_nodes, str(trainer.precision), ckpt_path))
        trainer.fit(module, datamodule=datamodule, ckpt_path=ckpt_path)
        value = monitored_value(trainer, best, metric)
        if not math.isfinite(value):  # Lightning ranks NaN as the worst value: here every validation was NaN/inf
            raise TrainingError(
                f"training diverged: best {metric} is {value}; nothing exported; lower the learning "
                f"rates (optim.head_lr, optim.backbone_lr) and start fresh (delete {run_dir} or another run_name)"
            )
        if trainer.is_global_zero and (progress.trained(trainer) or not (run_dir / META_FILE).is_file()):
            described = {"parameters": counts, "card": request.model.card,
                         "wandb": export_wandb_record(loggers, request.run_names["run_name"] or run_dir.name)}
            exported = export_best(datamodule, module, best, request, record, described)
            log.info("exported %s (%s = %.4f)", exported, metric, value)
            logged = log_export(loggers, run_dir, request.logging.log_weights)
            if logged:
                log.info("W&B: export logged as artifact %s", logged)
        elif trainer.is_global_zero:
            log.info("nothing left to train in %s: %s unchanged", run_dir, META_FILE)
        summary = {f"best/{metric}": value, "epochs": module.current_epoch}
        status = "success"
        return value
    finally:
        close_loggers(loggers, status, summary)
