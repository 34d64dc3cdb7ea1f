"""Accuracies that carry their counts, and class-wise views of them (worst-k, harmonic and geometric means).

Every accuracy here knows its numerator and denominator, so a report can always say "over how many images".
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Accuracy:
    correct: int
    total: int
    partial: bool = False  # True only when the user explicitly asked for a score over part of a split

    def __post_init__(self):
        if self.total <= 0 or not 0 <= self.correct <= self.total:
            raise ValueError(f"invalid accuracy counts {self.correct}/{self.total}")

    @property
    def value(self) -> float:
        return self.correct / self.total

    @classmethod
    def of(cls, correct_flags, partial: bool = False) -> Accuracy:
        flags = np.asarray(correct_flags, dtype=bool)
        return cls(int(flags.sum()), int(flags.size), partial)

    def to_dict(self) -> dict:
        return {"accuracy": self.value, "correct": self.correct, "total": self.total, "partial": self.partial}

    def __str__(self) -> str:
        return f"{self.value:.4f} ({self.correct}/{self.total}{', PARTIAL' if self.partial else ''})"


def per_class_accuracy(labels, correct_flags, num_classes: int) -> np.ndarray:
    """Accuracy of each class (NaN for a class absent from the split, so it is never mistaken for 0)."""
    labels = np.asarray(labels, dtype=np.int64)
    flags = np.asarray(correct_flags, dtype=np.float64)
    counts = np.bincount(labels, minlength=num_classes).astype(np.float64)
    hits = np.bincount(labels, weights=flags, minlength=num_classes)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(counts > 0, hits / counts, np.nan)


def worst_k_count(k: int | float | str, num_classes: int) -> int:
    """k as a class count (3) or a percentage of the classes ("10%" or 0.1), at least 1."""
    if isinstance(k, str) and k.endswith("%"):
        k = float(k[:-1]) / 100
    if isinstance(k, float) and 0 < k < 1:
        return max(1, math.ceil(k * num_classes))
    if int(k) != k or not 1 <= int(k) <= num_classes:
        raise ValueError(f"worst-k needs k in [1, {num_classes}] classes or a percentage, got {k!r}")
    return int(k)


def class_wise_summary(labels, correct_flags, num_classes: int, worst_k=(1, "10%")) -> dict:
    """Per-class accuracy with the worst-k means and the harmonic / geometric means over present classes.

    The harmonic and geometric means are 0 as soon as one class has accuracy 0: that is the point of them.
    """
    per_class = per_class_accuracy(labels, correct_flags, num_classes)
    present = per_class[~np.isnan(per_class)]
    ordered = np.sort(present)
    summary = {"per_class": per_class.tolist(), "mean": float(present.mean())}
    for k in worst_k:
        count = worst_k_count(k, len(present))
        summary[f"worst_{k}"] = float(ordered[:count].mean())
    if (present == 0).any():
        summary["harmonic_mean"] = summary["geometric_mean"] = 0.0
    else:
        summary["harmonic_mean"] = float(len(present) / np.sum(1.0 / present))
        summary["geometric_mean"] = float(np.exp(np.mean(np.log(present))))
    summary["worst_classes"] = [int(i) for i in np.argsort(np.nan_to_num(per_class, nan=np.inf))[:5]]
    return summary
