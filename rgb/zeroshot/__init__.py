"""Zero-shot CLIP classifiers: prompt ensembles (single, mean, zpe, cpe), class-wise metrics, the comparison table.

Sits at the models layer: imports rgb.core, rgb.data and rgb.models only. Definitions: docs/zeroshot-spec.md.
"""

from rgb.zeroshot.ensembles import (
    ENSEMBLES,
    EnsembleError,
    cpe_scores,
    ensemble_head,
    ensemble_weights,
    matching_margins,
    mean_head,
    pseudo_labels,
)
from rgb.zeroshot.metrics import WORST_K, class_accuracies, class_wise_metrics
from rgb.zeroshot.report import comparison_table

__all__ = [
    "ENSEMBLES",
    "EnsembleError",
    "WORST_K",
    "class_accuracies",
    "class_wise_metrics",
    "comparison_table",
    "cpe_scores",
    "ensemble_head",
    "ensemble_weights",
    "matching_margins",
    "mean_head",
    "pseudo_labels",
]
