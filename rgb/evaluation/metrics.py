"""Class-wise views of per-image correctness: per-class accuracy, worst-k, harmonic and geometric means."""

from __future__ import annotations

import math

import numpy as np

from rgb.evaluation.records import ClassWise


def per_class_accuracy(labels, correct_flags, num_classes: int) -> np.ndarray:
    """Accuracy of each class (NaN for a class absent from the split, so it is never mistaken for 0)."""
    labels = np.asarray(labels, dtype=np.int64)
    flags = np.asarray(correct_flags, dtype=np.float64)
    counts = np.bincount(labels, minlength=num_classes).astype(np.float64)
    hits = np.bincount(labels, weights=flags, minlength=num_classes)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(counts > 0, hits / counts, np.nan)


def worst_k_count(k: int | float | str, num_classes: int) -> int | None:
    """k as a class count (3) or a percentage of the classes ("10%" or 0.1), at least 1; None when the split
    has fewer than k classes (worst@10 of a 5-class split is not a number)."""
    if isinstance(k, str) and k.endswith("%"):
        k = float(k[:-1]) / 100
    if isinstance(k, float) and 0 < k < 1:
        return max(1, math.ceil(k * num_classes))
    if isinstance(k, str) or int(k) != k or int(k) < 1:
        raise ValueError(f"worst-k needs a class count >= 1 or a percentage, got {k!r}")
    return int(k) if int(k) <= num_classes else None


def class_wise_summary(labels, correct_flags, num_classes: int, worst_k=(1, 5, 10)) -> ClassWise:
    """Per-class accuracy with the worst-k means and the harmonic / geometric means over present classes.

    The harmonic and geometric means are 0 as soon as one class has accuracy 0: that is the point of them.
    """
    per_class = per_class_accuracy(labels, correct_flags, num_classes)
    present = per_class[~np.isnan(per_class)]
    ordered = np.sort(present)
    counts = {str(k): worst_k_count(k, len(present)) for k in worst_k}
    worst = {k: None if n is None else float(ordered[:n].mean()) for k, n in counts.items()}
    if (present == 0).any():
        harmonic = geometric = 0.0
    else:
        harmonic = float(len(present) / np.sum(1.0 / present))
        geometric = float(np.exp(np.mean(np.log(present))))
    return ClassWise(
        per_class=[None if np.isnan(v) else float(v) for v in per_class], mean=float(present.mean()), worst=worst,
        harmonic_mean=harmonic, geometric_mean=geometric,
        worst_classes=[int(i) for i in np.argsort(np.nan_to_num(per_class, nan=np.inf))[:5]],
    )
