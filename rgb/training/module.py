"""LightningModule: fine-tune a classifier with a loss of rgb.training.losses (CE / PGD-AT / TRADES, TeCoA / FARE
for CLIP image towers), fully or as a linear probe."""

from __future__ import annotations

import lightning as L
import torch
from torchmetrics import MeanMetric
from torchmetrics.classification import MulticlassAccuracy

from rgb.models import NormalizedClassifier, apply_speed_options, family_of
from rgb.training.losses import build_loss
from rgb.training.optim import build_optimizer, warmup_cosine
from rgb.training.settings import LINEAR_PROBE, SCHEDULERS, STRATEGIES

# The clean validation metrics every strategy logs (strategy=zeroshot too), which monitors, sweepers and robust
# validation's score read.
VAL_LOSS = "val/loss"
VAL_ACC = "val/acc"


class RobustFinetuneModule(L.LightningModule):
    """Training and validation of one (model, loss, strategy) run.

    Validation each epoch logs `val/loss` (the training loss itself: the paper's HPO objective), `val/acc`
    (clean) and, for adversarial losses, `val/adv_acc` (accuracy under the inner attack). Hyperparameters are
    plain dicts and numbers only, so checkpoints load with `torch.load(weights_only=True)`.
    """

    def __init__(
        self,
        model: NormalizedClassifier,
        loss: dict,
        strategy: str,
        optim: dict,
        channels_last: bool = False,
        compile: bool = False,
    ):
        super().__init__()
        if strategy not in STRATEGIES:
            raise ValueError(f"unknown strategy {strategy!r}; choose one of {', '.join(STRATEGIES)}")
        self.save_hyperparameters(
            {
                "model": model.recipe,
                "loss": dict(loss),
                "strategy": strategy,
                "optim": dict(optim),
                "channels_last": channels_last,
                "compile": compile,
            }
        )
        self.model = model
        self.training_loss = build_loss(**loss)
        # A frozen copy of the starting model, for losses that compare against it (FARE); part of the checkpoint,
        # never of the export (which takes `model.*` only).
        self.reference = self.training_loss.reference_model(model)
        self.freeze_backbone = strategy == LINEAR_PROBE
        self.memory_format = torch.channels_last if channels_last else torch.contiguous_format
        if self.freeze_backbone:
            head = {id(p) for p in self.head.parameters()}
            for param in model.parameters():
                param.requires_grad_(id(param) in head)
        if not self.training_loss.trains_head:  # TeCoA / FARE: the prompt-built head stays as it is
            self.head.requires_grad_(False)
        apply_speed_options(self.model, channels_last=channels_last, compile=compile)
        num_classes = family_of(model).num_classes(model)
        self.train_loss, self.val_loss = MeanMetric(), MeanMetric()
        self.train_acc = MulticlassAccuracy(num_classes, average="micro")
        self.val_acc = MulticlassAccuracy(num_classes, average="micro")
        self.val_adv_acc = MulticlassAccuracy(num_classes, average="micro")
        self.train()

    @property
    def head(self) -> torch.nn.Module:
        """The model's classification head, as its family names it (not a submodule of its own: the checkpoint
        holds it once, under `model.`)."""
        return family_of(self.model).head(self.model)

    def train(self, mode: bool = True) -> RobustFinetuneModule:
        """Linear probing keeps the whole backbone in eval mode (BN statistics, dropout) whatever Lightning asks."""
        super().train(mode)
        if self.reference is not None:
            self.reference.eval()
        if self.freeze_backbone:
            self.model.eval()
            self.head.train(mode)
        return self

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x.contiguous(memory_format=self.memory_format))

    def inner_attack(self, x: torch.Tensor, y: torch.Tensor, attack=None) -> torch.Tensor:
        """Adversarial images from the inner attack (the loss's own, or `attack(module, x, y)`), crafted with the
        model in eval mode (mode restored after)."""
        was_training = self.training
        self.eval()
        with torch.enable_grad():
            x_adv = (attack or self.training_loss.attack)(self, x, y)
        self.train(was_training)
        return x_adv

    def loss_and_logits(self, x: torch.Tensor, y: torch.Tensor):
        """(training loss, clean logits or None, adversarial logits or None) in the current train/eval mode."""
        return self.training_loss.compute(self, x, y)

    def training_step(self, batch, batch_idx):
        x, y = batch[0], batch[1]
        loss, clean, adv = self.loss_and_logits(x, y)
        self.train_loss(loss.detach(), weight=y.shape[0])
        self.train_acc((clean if clean is not None else adv).detach(), y)
        self.log("train/loss", self.train_loss, on_step=True, on_epoch=True, prog_bar=True, batch_size=y.shape[0])
        self.log("train/acc", self.train_acc, on_step=False, on_epoch=True, batch_size=y.shape[0])
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch[0], batch[1]
        loss, clean, adv = self.loss_and_logits(x, y)
        if clean is None:
            clean = self(x)
        self.val_loss(loss, weight=y.shape[0])
        self.val_acc(clean, y)
        self.log(VAL_LOSS, self.val_loss, prog_bar=True, batch_size=y.shape[0])
        self.log(VAL_ACC, self.val_acc, prog_bar=True, batch_size=y.shape[0])
        if adv is not None:
            self.val_adv_acc(adv, y)
            self.log("val/adv_acc", self.val_adv_acc, prog_bar=True, batch_size=y.shape[0])

    def configure_optimizers(self):
        optim = dict(self.hparams.optim)
        scheduler, warmup_epochs = optim.pop("scheduler", None), optim.pop("warmup_epochs", 0)
        optimizer = build_optimizer(self.model, **optim)
        if scheduler is None:
            return optimizer
        if scheduler not in SCHEDULERS:
            raise ValueError(f"unknown scheduler {scheduler!r}; choose one of {SCHEDULERS}")
        total = self.trainer.estimated_stepping_batches
        warmup = round(total * warmup_epochs / max(1, self.trainer.max_epochs))
        lr_lambda = warmup_cosine(total, warmup)
        schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}
