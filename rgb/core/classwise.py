"""Class-wise metrics of per-image correctness (the CPE seed's worst@k, HM, GM; zeroshot-spec §3, docs/specs.md):
the one definition that evaluate's scores and the zero-shot comparison report both use.

worst@k rule: k counts classes (3) or is a share of them ("10%", 0.1; at least one class). A share is below the
whole ("100%" is refused: worst@100% would be the mean under another name). When k exceeds the
classes present in the split, worst@k is None ("not a number"), not the mean over the classes there are: a capped
worst@10 of a 5-class split is the mean class accuracy under another name, and averaged across datasets it would
mix two definitions in one column. (The spec caps k at C; this deviation is stated in docs/design.md.)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from rgb.core.jsonrecord import JsonRecord
from rgb.core.values import ConfigValueError, Rule

DEFAULT_WORST_K = (1, 5, 10)


@dataclass(frozen=True)
class ClassWise(JsonRecord):
    """Per-class accuracy of one setting (None for a class absent from the split) and its summaries."""

    per_class: list[float | None]
    mean: float
    worst: dict[str, float | None]  # worst-k mean by k as configured ("1", "5", "10%"); None: fewer classes
    harmonic_mean: float
    geometric_mean: float
    worst_classes: list[int]


def per_class_accuracy(labels, correct_flags, num_classes: int) -> np.ndarray:
    """Accuracy of each class (NaN for a class absent from the split, so it is never mistaken for 0)."""
    labels = np.asarray(labels, dtype=np.int64)
    flags = np.asarray(correct_flags, dtype=np.float64)
    counts = np.bincount(labels, minlength=num_classes).astype(np.float64)
    hits = np.bincount(labels, weights=flags, minlength=num_classes)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(counts > 0, hits / counts, np.nan)


def worst_k_entry(k) -> int | float:
    """One configured k read by the module's worst@k rule: a class count (an integer >= 1) or a share of the
    classes (a number in (0, 1), or a percentage in (0%, 100%) such as "10%"); ValueError for anything else."""
    share = k
    if isinstance(k, str) and k.endswith("%"):
        try:
            share = float(k[:-1]) / 100
        except ValueError:
            share = None
    if isinstance(share, float) and 0 < share < 1:
        return share
    if isinstance(k, int) and not isinstance(k, bool) and k >= 1:
        return k
    raise ConfigValueError(f"worst-k needs a class count >= 1 or a percentage below 100%, got {k!r}")


def worst_k_count(k: int | float | str, num_classes: int) -> int | None:
    """k as a class count (3) or a percentage of the classes ("10%" or 0.1), at least 1; None when the split
    has fewer than k classes (the module's worst@k rule)."""
    k = worst_k_entry(k)
    if isinstance(k, float):
        return max(1, math.ceil(k * num_classes))
    return k if k <= num_classes else None


def check_worst_k(worst_k) -> tuple:
    """The configured worst-k list, each entry checked (one line for a bad one): the one validation of worst_k,
    which the commands' value check (rgb.commands.main) and the zero-shot report both call."""
    if not isinstance(worst_k, (list, tuple)):
        raise ConfigValueError(f"worst_k must be a list of ks (e.g. [1, 5, 10]), got {worst_k!r}")
    if not worst_k:
        raise ConfigValueError("worst_k is empty: give at least one k (e.g. [1, 5, 10])")
    for k in worst_k:
        worst_k_entry(k)
    return tuple(worst_k)


def _worst_k(value) -> bool:
    try:
        check_worst_k(value)
    except ValueError:
        return False
    return True


# worst_k's rule, as a config schema and a request check it.
WORST_K: Rule = (_worst_k, "a non-empty list of class counts >= 1 or percentages ('10%')")


def class_wise_summary(labels, correct_flags, num_classes: int, worst_k=DEFAULT_WORST_K) -> ClassWise:
    """Per-class accuracy with the worst-k means and the harmonic / geometric means over present classes.

    The harmonic and geometric means are 0 as soon as one class has accuracy 0: that is the point of them.
    """
    labels = np.asarray(labels, dtype=np.int64)
    if labels.size == 0:
        raise ValueError("class-wise metrics of an empty split")
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


__all__ = ["DEFAULT_WORST_K", "WORST_K", "ClassWise", "check_worst_k", "class_wise_summary", "per_class_accuracy",
           "worst_k_count", "worst_k_entry"]
