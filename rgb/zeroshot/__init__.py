"""Zero-shot CLIP classifiers: prompt ensembles (single, mean, zpe, zpe_select, cpe), heads from prompts and the
comparison table (class-wise metrics: rgb.core.classwise). Text brittleness (perturbations, ranking instability) is
rgb.brittleness; the embedded mini CLIP, next to the openclip family, is rgb.models.embedded_clip.

Sits at the models layer: imports rgb.core, rgb.data and rgb.models only. Definitions: the zero-shot spec (docs/specs.md).
"""

from rgb.core.templates import check_templates
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

# The training strategy whose head is built from prompts, no fit (rgb.training.zeroshot): what model.json and a
# scores record's model identity name as `strategy`, and how the exports tell a zero-shot result.
ZEROSHOT = "zeroshot"

__all__ = [
    "ENSEMBLES",
    "ZEROSHOT",
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
    "encode_texts",
    "ensemble_head",
    "ensemble_label",
    "ensemble_weights",
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
