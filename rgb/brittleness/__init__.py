"""Text brittleness of zero-shot classifiers (the zero-shot spec, docs/specs.md): perturbed text queries
(`perturb`: lexical, syntactic and semantic perturbation types, user edit files) and the ranking-instability
metrics over them (`metrics`: overlap@k, RBO, instability, the brittleness index). Pure text and tensors: it
imports rgb.core only; evaluation's text-robustness report runs the queries through a CLIP.
"""

from rgb.brittleness.metrics import (
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
from rgb.brittleness.perturb import (
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

__all__ = [
    "DEFAULT_TYPES",
    "Perturbation",
    "PerturbationError",
    "PerturbationType",
    "Query",
    "brittleness_index",
    "classification_view",
    "generate",
    "instability",
    "inter_distance",
    "load_user_edits",
    "overlap_at_k",
    "perturbation_type",
    "query_table",
    "rank_images",
    "rbo_ext",
    "summarize",
    "template_queries",
    "text_distance",
]
