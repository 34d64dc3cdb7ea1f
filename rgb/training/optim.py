"""AdamW with separate backbone / head learning rate and weight decay (no decay on biases and norms)."""

from __future__ import annotations

import math

import torch

from rgb.models import NormalizedClassifier, family_of
from rgb.training.config import TrainingConfigError



def parameter_groups(
    model: NormalizedClassifier,
    backbone_lr: float,
    head_lr: float,
    backbone_weight_decay: float,
    head_weight_decay: float,
) -> list[dict]:
    """Trainable parameters in up to four groups: (backbone|head) x (decay|no decay).

    No decay for 1-d tensors (biases, norm scales, layer-scale gammas), any `.bias`, and what the backbone
    lists in `no_weight_decay()` (position embeddings, class tokens), as timm's own optimiser factory does.
    Head and backbone are the model family's.
    """
    family = family_of(model)
    backbone = family.backbone(model)
    head = {id(p) for p in family.head(model).parameters()}
    skip = set(backbone.no_weight_decay()) if hasattr(backbone, "no_weight_decay") else set()
    groups: dict[tuple[bool, bool], list] = {}
    for name, param in backbone.named_parameters():
        if not param.requires_grad:
            continue
        no_decay = param.ndim <= 1 or name.endswith(".bias") or name in skip
        groups.setdefault((id(param) in head, no_decay), []).append(param)
    settings = {False: (backbone_lr, backbone_weight_decay), True: (head_lr, head_weight_decay)}
    return [
        {
            "params": params,
            "lr": settings[is_head][0],
            "weight_decay": 0.0 if no_decay else settings[is_head][1],
            "name": f"{'head' if is_head else 'backbone'}{'_no_decay' if no_decay else ''}",
        }
        for (is_head, no_decay), params in sorted(groups.items())
    ]


def warmup_cosine(total_steps: int, warmup_steps: int):
    """LR factor per optimiser step: linear warmup to 1, then cosine decay to 0 at `total_steps`."""

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
        return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))

    return factor


def build_optimizer(
    model: NormalizedClassifier,
    backbone_lr: float,
    head_lr: float,
    backbone_weight_decay: float,
    head_weight_decay: float,
    betas: tuple[float, float] = (0.9, 0.95),
) -> torch.optim.AdamW:
    groups = parameter_groups(model, backbone_lr, head_lr, backbone_weight_decay, head_weight_decay)
    if not groups:
        raise TrainingConfigError("the model has no trainable parameters: every one has requires_grad=False (a model "
                                  "built frozen, or linear_probe with a loss that keeps the head fixed): unfreeze the "
                                  "model or use strategy=full_finetune")
    return torch.optim.AdamW(groups, betas=tuple(betas))
