"""Zero-shot CLIP classifiers: prompt ensembles (single, mean, zpe, zpe_select, cpe), heads from prompts and the
comparison table (class-wise metrics: rgb.core.classwise). Text brittleness (perturbations, ranking instability) is
rgb.brittleness; the embedded mini CLIP, next to the openclip family, is rgb.models.embedded_clip.

Sits at the models layer: imports rgb.core, rgb.data and rgb.models only. Definitions: the zero-shot spec (docs/specs.md).
"""

from rgb.core.lazy import lazy_names

# Each name from its module on first use (rgb.core.lazy): the package's option types load without torch.
__getattr__ = lazy_names(__name__, {
    "check_templates": "rgb.core.templates",
    "ENSEMBLES": "rgb.zeroshot.ensembles",
    "EnsembleError": "rgb.zeroshot.settings",
    "cpe_scores": "rgb.zeroshot.ensembles",
    "ensemble_head": "rgb.zeroshot.ensembles",
    "ensemble_label": "rgb.zeroshot.ensembles",
    "ensemble_weights": "rgb.zeroshot.ensembles",
    "matching_margins": "rgb.zeroshot.ensembles",
    "mean_head": "rgb.zeroshot.ensembles",
    "pseudo_labels": "rgb.zeroshot.ensembles",
    "PromptSettings": "rgb.zeroshot.settings",
    "ZeroShotHead": "rgb.zeroshot.head",
    "build_zeroshot_head": "rgb.zeroshot.head",
    "check_class_names": "rgb.zeroshot.head",
    "features_of": "rgb.zeroshot.head",
    "zeroshot_classifier": "rgb.zeroshot.head",
    "PromptError": "rgb.zeroshot.prompts",
    "load_descriptions": "rgb.zeroshot.prompts",
    "template_pool": "rgb.zeroshot.prompts",
    "average_rows": "rgb.zeroshot.report",
    "comparison_table": "rgb.zeroshot.report",
    "head_row": "rgb.zeroshot.report",
    "row_metrics": "rgb.zeroshot.report",
    "TextFeatureCache": "rgb.zeroshot.text",
    "encode_texts": "rgb.zeroshot.text",
})

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
