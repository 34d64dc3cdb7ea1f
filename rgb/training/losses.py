"""Training losses: the paper's plain CE, PGD-AT (CE on adversarial images only) and TRADES with the inner APGD,
and the two robust CLIP fine-tuning methods of the openclip family, TeCoA (Mao et al. 2023) and FARE (Schlarmann
et al. 2024), which train the image tower under a fixed prompt-built head (`head_init=zeroshot`)."""

from __future__ import annotations

import copy
from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from rgb.attacks import apgd
from rgb.core.errors import UserError
from rgb.core.threat import Norm, parse_norm


class LossConfigError(UserError, ValueError):
    """A loss config that cannot train: an unknown loss, options it does not take, a model it does not fit."""


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
    """loss(y, logits on clean images, logits on inner-attack images); `attack` None means no adversary.

    `trains_head` False keeps the head fixed (the prompt-built head of a CLIP: `needs_prompt_head`);
    `reference_model` is a frozen copy of the starting model when the loss compares against it."""

    name: str
    uses_clean: bool
    attack: InnerAttack | None
    attack_type: type = InnerAttack
    trains_head: bool = True
    needs_prompt_head: bool = False

    @abstractmethod
    def __call__(self, y: torch.Tensor, clean: torch.Tensor | None, adv: torch.Tensor | None) -> torch.Tensor:
        """Scalar loss; `clean` is None when not `uses_clean`, `adv` is None when `attack` is None."""

    def reference_model(self, model: nn.Module) -> nn.Module | None:
        return None

    def compute(self, module, x: torch.Tensor, y: torch.Tensor):
        """(loss, clean logits or None, adversarial logits or None) of a batch, through `module` (the
        LightningModule: its forward, its eval-mode inner attack, its `reference`)."""
        x_adv = module.inner_attack(x, y) if self.attack is not None else None
        clean = module(x) if self.uses_clean else None
        adv = module(x_adv) if x_adv is not None else None
        return self(y, clean, adv), clean, adv


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


class TeCoA(PGDAT):
    """TeCoA: CE on inner-attack images (APGD-CE, as pgd_at) through the fixed zero-shot head built from the
    prompts: only the image tower learns, so the model stays a zero-shot classifier of its text tower."""

    name, trains_head, needs_prompt_head = "tecoa", False, True


def squared_distance(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """||a - b||^2 per row, in fp32."""
    return (a.float() - b.float()).pow(2).flatten(1).sum(dim=1)


@dataclass(frozen=True)
class EmbeddingAttack:
    """FARE's inner attack: PGD maximising ||f(x_adv) - f_0(x)||^2 from a uniform random start in the ball, steps
    of `step_size` (default eps/4: 1/255 at 4/255, the paper's) along the gradient's sign (Linf) or direction (L2),
    projected onto the ball and [0,1] after each step. Runs under the caller's autocast."""

    norm: str = "Linf"
    eps: float = 4 / 255
    n_iter: int = 10
    step_size: float | None = None

    def __post_init__(self):
        if parse_norm(self.norm) not in (Norm.LINF, Norm.L2):
            raise LossConfigError(f"loss=fare's inner attack supports Linf and L2, got {self.norm!r}")

    def _project(self, x: torch.Tensor, x_adv: torch.Tensor) -> torch.Tensor:
        delta = x_adv - x
        if parse_norm(self.norm) is Norm.LINF:
            delta = delta.clamp(-self.eps, self.eps)
        else:
            norms = delta.flatten(1).norm(dim=1).clamp_min(1e-12).view(-1, *[1] * (x.dim() - 1))
            delta = delta * (self.eps / norms).clamp(max=1.0)
        return (x + delta).clamp(0, 1)

    def __call__(self, features, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        step = self.step_size if self.step_size is not None else self.eps / 4
        linf = parse_norm(self.norm) is Norm.LINF
        noise = torch.empty_like(x).uniform_(-1, 1) if linf else torch.randn_like(x)
        if not linf:
            noise = noise / noise.flatten(1).norm(dim=1).clamp_min(1e-12).view(-1, *[1] * (x.dim() - 1))
            noise = noise * torch.rand(len(x), *[1] * (x.dim() - 1), device=x.device)
        x_adv = self._project(x, x + self.eps * noise)
        for _ in range(self.n_iter):
            x_adv.requires_grad_(True)
            loss = squared_distance(features(x_adv), target).sum()
            (grad,) = torch.autograd.grad(loss, x_adv)
            if linf:
                direction = grad.sign()
            else:
                direction = grad / grad.flatten(1).norm(dim=1).clamp_min(1e-12).view(-1, *[1] * (x.dim() - 1))
            x_adv = self._project(x, x_adv.detach() + step * direction)
        return x_adv.detach()


class FARE(TrainingLoss):
    """FARE: unsupervised, min ||f(x_adv) - f_0(x)||^2 (averaged over the batch) with f the image tower being
    trained, f_0 a frozen copy of the starting tower and x_adv maximising the same distance (EmbeddingAttack).
    f are the tower's embeddings before L2 normalisation; labels are not used, the head stays the prompt-built
    one (the logits reported are its accuracy under that attack)."""

    name, uses_clean, attack_type, trains_head, needs_prompt_head = "fare", False, EmbeddingAttack, False, True

    def __init__(self, attack: EmbeddingAttack):
        self.attack = attack

    def __call__(self, y, clean, adv):
        raise TypeError("FARE's loss is on embeddings: use compute()")

    def reference_model(self, model: nn.Module) -> nn.Module:
        if not hasattr(model, "tower_features"):
            raise LossConfigError(f"loss=fare needs an open_clip model (an image tower), got {type(model).__name__}")
        return copy.deepcopy(model).eval().requires_grad_(False)

    def compute(self, module, x, y):
        with torch.no_grad():
            target = module.reference.tower_features(x)
        x_adv = module.inner_attack(x, y, attack=lambda _, x_, __: self.attack(module.model.tower_features, x_, target))
        loss = squared_distance(module.model.tower_features(x_adv), target).mean()
        with torch.no_grad():
            adv = module(x_adv)
        return loss, None, adv


# Loss name -> class, one per name of LOSS_NAMES (rgb.training.settings, which train.py's schema reads) in its order;
# the ones with an `attack` take the inner attack (their `attack_type`) as first argument.
LOSSES: dict[str, type[TrainingLoss]] = {"ce": CrossEntropy, "pgd_at": PGDAT, "trades": TRADES, "tecoa": TeCoA,
                                         "fare": FARE}


def build_loss(name: str, attack: dict | None = None, **options) -> TrainingLoss:
    """Loss from its config (`conf/loss/<name>.yaml`): plain values only, so checkpoints stay weights-only."""
    if name not in LOSSES:
        raise LossConfigError(f"unknown loss {name!r}; choose one of {', '.join(LOSSES)}")
    if LOSSES[name] is CrossEntropy:
        if attack is not None or options:
            raise LossConfigError(f"loss 'ce' takes no attack or options, got attack={attack} {options}")
        return CrossEntropy()
    return LOSSES[name](LOSSES[name].attack_type(**(attack or {})), **options)
