"""Text brittleness of zero-shot classifiers (the zero-shot spec, docs/specs.md): perturbed text queries
(`perturb`: lexical, syntactic and semantic perturbation types, user edit files) and the ranking-instability
metrics over them (`metrics`: overlap@k, RBO, instability, the brittleness index). Pure text and tensors: it
imports rgb.core only; evaluation's text-robustness report runs the queries through a CLIP.
"""

from rgb.core.lazy import lazy_names

# Each name from its module on first use (rgb.core.lazy): the package's option types load without torch.
__getattr__ = lazy_names(__name__, {
    "brittleness_index": "rgb.brittleness.metrics",
    "classification_view": "rgb.brittleness.metrics",
    "instability": "rgb.brittleness.metrics",
    "inter_distance": "rgb.brittleness.metrics",
    "overlap_at_k": "rgb.brittleness.metrics",
    "query_table": "rgb.brittleness.metrics",
    "rank_images": "rgb.brittleness.metrics",
    "rbo_ext": "rgb.brittleness.metrics",
    "summarize": "rgb.brittleness.metrics",
    "text_distance": "rgb.brittleness.metrics",
    "DEFAULT_TYPES": "rgb.brittleness.perturb",
    "Perturbation": "rgb.brittleness.perturb",
    "PerturbationError": "rgb.brittleness.perturb",
    "PerturbationType": "rgb.brittleness.perturb",
    "Query": "rgb.brittleness.perturb",
    "generate": "rgb.brittleness.perturb",
    "load_user_edits": "rgb.brittleness.perturb",
    "perturbation_type": "rgb.brittleness.perturb",
    "template_queries": "rgb.brittleness.perturb",
})

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
