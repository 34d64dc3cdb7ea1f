"""Zero-shot CLIP classifiers: prompt ensembles (single, mean, zpe, zpe_select, cpe), heads from prompts, the
comparison table (class-wise metrics: rgb.core.classwise) and the embedded mini CLIP. Text brittleness
(perturbations, ranking instability) is rgb.brittleness.

Sits at the models layer: imports rgb.core, rgb.data and rgb.models only. Definitions: the zero-shot spec (docs/specs.md).
"""

from rgb.core.templates import check_templates
from rgb.zeroshot.embedded import EMBEDDED_ARCH, embedded_clip_classifier, ensure_embedded_clip
from rgb.zeroshot.ensembles import (
    ENSEMBLES,
    EnsembleError,
    cpe_scores,
    ensemble_head,
    ensemble_label,
    ensemble_weights,
    matching_margins,
    mean_head,
    pseudo_labels,
)
from rgb.zeroshot.head import (
    PromptSettings,
    ZeroShotHead,
    build_zeroshot_head,
    check_class_names,
    features_of,
    zeroshot_classifier,
)
from rgb.zeroshot.prompts import PromptError, load_descriptions, template_pool
from rgb.zeroshot.report import average_rows, comparison_table, head_row, row_metrics
from rgb.zeroshot.text import TextFeatureCache, encode_texts

__all__ = [
    "EMBEDDED_ARCH",
    "ENSEMBLES",
    "EnsembleError",
    "PromptError",
    "PromptSettings",
    "TextFeatureCache",
    "ZeroShotHead",
    "average_rows",
    "build_zeroshot_head",
    "check_class_names",
    "check_templates",
    "comparison_table",
    "cpe_scores",
    "embedded_clip_classifier",
    "encode_texts",
    "ensemble_head",
    "ensemble_label",
    "ensemble_weights",
    "ensure_embedded_clip",
    "features_of",
    "head_row",
    "load_descriptions",
    "matching_margins",
    "mean_head",
    "pseudo_labels",
    "row_metrics",
    "template_pool",
    "zeroshot_classifier",
]
