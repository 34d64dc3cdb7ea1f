"""Class-wise metrics of the CPE seed (docs/zeroshot-spec.md §3) as pure functions of predictions and labels."""

from __future__ import annotations

import math

import torch

WORST_K = (1, 5, 10)


def class_accuracies(predictions: torch.Tensor, labels: torch.Tensor, num_classes: int) -> torch.Tensor:
    """Acc_c = correct / images of class c, (C,) float64; NaN for a class with no image (never counted as 0)."""
    labels = torch.as_tensor(labels, dtype=torch.long)
    hits = (torch.as_tensor(predictions, dtype=torch.long) == labels).double()
    images = torch.bincount(labels, minlength=num_classes).double()
    correct = torch.zeros(num_classes, dtype=torch.float64).index_add_(0, labels, hits)
    return torch.where(images > 0, correct / images.clamp(min=1), torch.full_like(images, math.nan))


def class_wise_metrics(predictions: torch.Tensor, labels: torch.Tensor, num_classes: int,
                       worst_k: tuple[int, ...] = WORST_K) -> dict[str, float]:
    """overall accuracy, worst@k (mean of the k smallest Acc_c, k capped at the classes present), HM (0 when
    any class is at 0) and GM, over the classes that have images."""
    labels = torch.as_tensor(labels, dtype=torch.long)
    if labels.numel() == 0:
        raise ValueError("class-wise metrics of an empty split")
    acc = class_accuracies(predictions, labels, num_classes)
    acc = acc[~acc.isnan()]
    ordered = acc.sort().values
    metrics = {"overall": float((torch.as_tensor(predictions, dtype=torch.long) == labels).double().mean())}
    for k in worst_k:
        metrics[f"worst@{k}"] = float(ordered[: min(k, len(ordered))].mean())
    any_zero = bool((acc == 0).any())
    metrics["hm"] = 0.0 if any_zero else float(len(acc) / (1.0 / acc).sum())
    metrics["gm"] = 0.0 if any_zero else float(acc.log().mean().exp())
    return metrics
