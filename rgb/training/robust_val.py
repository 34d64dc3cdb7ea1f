"""Robust validation while training: AutoAttack on a fixed, seeded subset of the validation split every N epochs.

PGD-AT and TRADES overfit robustly (robust accuracy peaks, then falls while clean accuracy still rises), so the
epoch worth keeping is chosen by robust validation accuracy when asked: `monitor.metric=val/robust_acc_linf
monitor.mode=max`. Stale values must never select a checkpoint, so a ModelCheckpoint that monitors one of these
metrics has to run on the same epochs as this callback (conf/callbacks/robust_val.yaml ties them).

Logged (to every logger): `val/robust_acc_<norm>` per norm, `val/robust_score` = clean_weight x val/acc +
(1 - clean_weight) x mean robust accuracy (the robust-aware sweep objective), and `val/robust_seconds` (the cost);
the training log gets one line per run. Numbers from a subset and a cheap attack are for choosing, never the
benchmark's score (attack.py is).
"""

from __future__ import annotations

import logging
import time

import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint

from rgb.attacks.autoattack import AutoAttack
from rgb.attacks.options import AttackOptions, AttackOptionsError
from rgb.core import parse_norm
from rgb.training.config import TrainingConfigError, TrainingError
from rgb.training.module import VAL_ACC
from rgb.training.settings import KEY, RobustValSettings

log = logging.getLogger(__name__)


PREFIX = "val/robust_acc_"
SCORE = "val/robust_score"
SECONDS = "val/robust_seconds"


def robust_metric(norm: str) -> str:
    return PREFIX + parse_norm(norm).key


class RobustValidation(Callback):
    """AutoAttack (`version`, optionally only `attacks` of it) on `n_images` validation images drawn once with
    `seed`, at every epoch e with (e + 1) % every_n_epochs == 0 (the cadence of ModelCheckpoint(every_n_epochs)).
    Default: APGD-CE only; `version=fast attacks=null` adds APGD-T over MALT targets. `n_iter`: iterations per
    gradient attack (AutoAttack's 100 by default; fewer is cheaper and weaker)."""

    def __init__(
        self,
        every_n_epochs: int = 1,
        n_images: int = 200,
        seed: int = 0,
        norms: list[str] | tuple[str, ...] = ("linf",),
        version: str = "standard",
        attacks: list[str] | tuple[str, ...] | None = ("apgd-ce",),
        batch_size: int = 256,
        precision: str = "fp32",
        clean_weight: float = 0.5,
        n_iter: int = 100,
    ):
        problems = RobustValSettings(every_n_epochs, n_images, batch_size, n_iter, clean_weight).problems(KEY)
        try:
            self.norms = [parse_norm(n) for n in norms]
        except ValueError as err:
            problems.append(f"{KEY}norms: {err}")
        if not problems and not self.norms:
            problems.append(f"{KEY}norms must name at least one norm")
        if not problems:
            try:  # a LightningModule may keep Python-side state between calls: attacked eager
                self.options = AttackOptions(version=version, seed=seed, attacks=attacks, precision=precision,
                                             steps=n_iter, capture="eager")
            except AttackOptionsError as err:  # collected with the callback's own problems, its keys named
                problems.append(f"{KEY.rstrip('.')}: {err}")
        if problems:
            raise TrainingConfigError("; ".join(problems))
        self.every_n_epochs, self.n_images = every_n_epochs, n_images
        self.batch_size, self.clean_weight = batch_size, float(clean_weight)
        self.metrics = [robust_metric(n) for n in self.norms]
        self._subset: tuple[torch.Tensor, torch.Tensor] | None = None

    @property
    def label(self) -> str:
        version, attacks = self.options.version, self.options.attacks
        return f"{version}:{','.join(attacks)}" if attacks else version

    def check_checkpoints(self, callbacks: list[Callback]) -> None:
        """Refuse a checkpoint callback that would read this callback's metrics on epochs where they are stale."""
        for callback in callbacks:
            if isinstance(callback, ModelCheckpoint) and callback.monitor in (*self.metrics, SCORE):
                if callback._every_n_epochs != self.every_n_epochs:
                    raise TrainingConfigError(
                        f"the checkpoint monitoring {callback.monitor} runs every {callback._every_n_epochs} "
                        f"epoch(s), robust validation every {self.every_n_epochs}: set its every_n_epochs to "
                        f"callbacks.robust_val.every_n_epochs"
                    )

    def subset(self, trainer) -> tuple[torch.Tensor, torch.Tensor]:
        """The same images at every epoch and every resume: a seeded draw from the validation split."""
        if self._subset is None:
            split = trainer.datamodule.split("validation")
            generator = torch.Generator().manual_seed(self.options.seed)
            picked = torch.randperm(len(split), generator=generator)[: self.n_images].sort().values
            items = [split[int(i)] for i in picked]
            self._subset = torch.stack([item[0] for item in items]), torch.tensor([int(item[1]) for item in items])
        return self._subset

    def due(self, trainer) -> bool:
        return not trainer.sanity_checking and (trainer.current_epoch + 1) % self.every_n_epochs == 0

    def on_validation_epoch_end(self, trainer, pl_module) -> None:
        if not self.due(trainer):
            return
        if torch.is_inference_mode_enabled():
            raise TrainingConfigError("robust validation needs gradients: set trainer.inference_mode=false")
        budgets = trainer.datamodule.budgets
        x, y = self.subset(trainer)
        started = time.perf_counter()
        accuracies = {}
        with torch.enable_grad():
            for norm, metric in zip(self.norms, self.metrics):
                if norm.key not in budgets:
                    raise TrainingError(f"robust validation at {norm}: the data config has no budget {norm.key!r}")
                attack = AutoAttack(pl_module, norm, budgets[norm.key], self.options, batch_size=self.batch_size)
                accuracies[metric] = attack.run(x, y).robust_accuracy
        seconds = time.perf_counter() - started
        if VAL_ACC not in trainer.callback_metrics:
            raise TrainingError(f"robust validation needs {VAL_ACC}, which this epoch's validation did not log")
        clean = float(trainer.callback_metrics[VAL_ACC])
        robust = sum(accuracies.values()) / len(accuracies)
        logged = {**accuracies, SCORE: self.clean_weight * clean + (1 - self.clean_weight) * robust, SECONDS: seconds}
        for name, value in logged.items():
            pl_module.log(name, value, sync_dist=True)
        shown = ", ".join(f"{m.removeprefix(PREFIX)} {a:.4f}" for m, a in accuracies.items())
        log.info("epoch %d robust validation (%s, %d images): %s; clean %.4f; %.1f s", trainer.current_epoch,
                 self.label, len(y), shown, clean, seconds)
