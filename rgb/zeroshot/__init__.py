"""Zero-shot CLIP classifiers: prompt ensembles (single, mean, zpe, zpe_select, cpe), heads from prompts, the
comparison table (class-wise metrics: rgb.core.classwise), the embedded mini CLIP, and text brittleness
(perturbations, ranking instability).

Sits at the models layer: imports rgb.core, rgb.data and rgb.models only. Definitions: the zero-shot spec (docs/specs.md).
"""

from rgb.zeroshot.brittleness import (
    brittleness_index,
    classification_view,
    instability,
    inter_distance,
    overlap_at_k,
    query_table,
    rank_images,
    rbo_ext,
    summarize,
    text_distance,
)
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
from rgb.zeroshot.perturb import (
    DEFAULT_TYPES,
    Perturbation,
    PerturbationError,
    PerturbationType,
    Query,
    generate,
    load_user_edits,
    perturbation_type,
    template_queries,
)
from rgb.zeroshot.prompts import PromptError, check_templates, load_descriptions, template_pool
from rgb.zeroshot.report import average_rows, comparison_table, head_row, row_metrics
from rgb.zeroshot.text import TextFeatureCache, encode_texts

__all__ = [
    "DEFAULT_TYPES",
    "EMBEDDED_ARCH",
    "ENSEMBLES",
    "EnsembleError",
    "Perturbation",
    "PerturbationError",
    "PerturbationType",
    "PromptError",
    "PromptSettings",
    "Query",
    "TextFeatureCache",
    "ZeroShotHead",
    "average_rows",
    "brittleness_index",
    "build_zeroshot_head",
    "check_class_names",
    "check_templates",
    "classification_view",
    "comparison_table",
    "cpe_scores",
    "embedded_clip_classifier",
    "encode_texts",
    "ensemble_head",
    "ensemble_label",
    "ensemble_weights",
    "ensure_embedded_clip",
    "features_of",
    "generate",
    "head_row",
    "instability",
    "inter_distance",
    "load_descriptions",
    "load_user_edits",
    "matching_margins",
    "mean_head",
    "overlap_at_k",
    "perturbation_type",
    "pseudo_labels",
    "query_table",
    "rank_images",
    "rbo_ext",
    "row_metrics",
    "summarize",
    "template_pool",
    "template_queries",
    "text_distance",
    "zeroshot_classifier",
]
