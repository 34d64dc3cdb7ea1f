"""What an attack run keeps of the images it attacked: the images of given ids, and the checked tensors of a
finished batch (the columns of a batch file, rgb.runs.store), whichever schedule made them (rgb.runs.runner,
rgb.runs.pooled)."""

from __future__ import annotations

import json
from collections.abc import Iterable

import torch
from torch.utils.data import default_collate

from rgb.attacks.autoattack import within_budget
from rgb.data.benchmark import ImageSplit
from rgb.data.export import quantise_within_budget
from rgb.runs.request import Budget
from rgb.runs.store import AttackRunError


def load_images(split: ImageSplit, image_ids: Iterable[int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(x, y, image_id) of the test images `image_ids`, in that order."""
    return default_collate([split[i] for i in image_ids])


def batch_record(result, x, y, image_id, budget: Budget, seconds: float, keep_images: bool) -> dict:
    """Tensors of one finished batch (checked against the budget and the cascade rule before they are kept)."""
    threat = budget.threat
    robust = result.robust.bool()
    if not torch.equal(result.y_adv == y, robust) or bool((robust & ~result.clean_correct).any()):
        raise AttackRunError("AutoAttack result is inconsistent: robust != (prediction on x_adv is correct)")
    if not bool(within_budget(result.x_adv - x, threat.norm.value, threat.eps).all()):
        raise AttackRunError(f"AutoAttack returned an image outside {threat}")
    record = {
        "image_id": image_id.long(), "label": y.long(),
        # Clean-wrong points are never attacked (x_adv = x), so their prediction on x_adv is the clean one.
        "clean_pred": torch.where(result.clean_correct, y, result.y_adv).long(), "adv_pred": result.y_adv.long(),
        "clean_correct": result.clean_correct.bool(), "robust": robust, "fooled_by": result.fooled_by.long(),
        "perturbation_norm": result.perturbation_norm.float(),
        # Model evaluations (rows) spent per image: a batch's cost shared by the images it was spent on.
        "forward_rows": torch.as_tensor(result.forward_rows).double(),
        "backward_rows": torch.as_tensor(result.backward_rows).double(),
        "seconds": torch.tensor([seconds], dtype=torch.float64),
        "attacks": torch.tensor(list(json.dumps(list(result.attacks)).encode()), dtype=torch.uint8),
        "warnings": torch.tensor(list(json.dumps(list(result.warnings)).encode()), dtype=torch.uint8),
    }
    for name in ("forward_rows", "backward_rows"):
        if record[name].shape != y.shape:
            shape = tuple(record[name].shape)
            raise AttackRunError(f"AutoAttackResult.{name} must hold one value per image, got shape {shape}")
    if keep_images:
        record["adversarial"] = quantise_within_budget(x, result.x_adv, threat.norm.key, threat.eps)
        record["modified"] = (record["adversarial"] != torch.round(x * 255).to(torch.uint8)).flatten(1).any(dim=1)
    return record
