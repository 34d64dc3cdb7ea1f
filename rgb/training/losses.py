"""Training losses of the paper: plain CE, PGD-AT (CE on adversarial images only) and TRADES, with the inner APGD."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from rgb.attacks import apgd


@dataclass(frozen=True)
class InnerAttack:
    """APGD-CE from the clean image (no random start), first step 2*eps, momentum 0.75; keeps the highest-loss
    iterate. Runs under whatever autocast the caller has on: during training that is the trainer's precision
    (bf16 on GPU), so the inner attack is bf16 there; the paper did the same with fp16."""

    norm: str = "Linf"
    eps: float = 4 / 255
    n_iter: int = 10

    def __call__(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        result = apgd(
            model, x, y, norm=self.norm, eps=self.eps, n_iter=self.n_iter, random_start=False, early_stop=False
        )
        return result.x_best.detach()


class TrainingLoss(ABC):
    """loss(y, logits on clean images, logits on inner-attack images); `attack` None means no adversary."""

    name: str
    uses_clean: bool
    attack: InnerAttack | None

    @abstractmethod
    def __call__(self, y: torch.Tensor, clean: torch.Tensor | None, adv: torch.Tensor | None) -> torch.Tensor:
        """Scalar loss; `clean` is None when not `uses_clean`, `adv` is None when `attack` is None."""


class CrossEntropy(TrainingLoss):
    """Standard fine-tuning."""

    name, uses_clean, attack = "ce", True, None

    def __call__(self, y, clean, adv):
        return F.cross_entropy(clean.float(), y)


class PGDAT(TrainingLoss):
    """Madry adversarial training (the paper's CLASSIC_AT): CE on adversarial images only."""

    name, uses_clean = "pgd_at", False

    def __init__(self, attack: InnerAttack):
        self.attack = attack

    def __call__(self, y, clean, adv):
        return F.cross_entropy(adv.float(), y)


class TRADES(TrainingLoss):
    """CE(clean) + beta * KL(softmax(clean) || softmax(adv)), KL summed over classes, averaged over the batch."""

    name, uses_clean = "trades", True

    def __init__(self, attack: InnerAttack, beta: float = 1.0):
        self.attack, self.beta = attack, beta

    def __call__(self, y, clean, adv):
        log_p_clean, log_p_adv = F.log_softmax(clean.float(), dim=1), F.log_softmax(adv.float(), dim=1)
        kl = F.kl_div(log_p_adv, log_p_clean, log_target=True, reduction="batchmean")
        return F.cross_entropy(clean.float(), y) + self.beta * kl


# Loss name -> class; the ones with an `attack` take the inner attack as their first argument.
LOSSES: dict[str, type[TrainingLoss]] = {"ce": CrossEntropy, "pgd_at": PGDAT, "trades": TRADES}


def build_loss(name: str, attack: dict | None = None, **options) -> TrainingLoss:
    """Loss from its config (`conf/loss/<name>.yaml`): plain values only, so checkpoints stay weights-only."""
    if name not in LOSSES:
        raise ValueError(f"unknown loss {name!r}; choose one of {', '.join(LOSSES)}")
    if LOSSES[name] is CrossEntropy:
        if attack is not None or options:
            raise ValueError(f"loss 'ce' takes no attack or options, got attack={attack} {options}")
        return CrossEntropy()
    return LOSSES[name](InnerAttack(**(attack or {})), **options)
