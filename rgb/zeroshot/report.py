"""The seed's Table 2 for one model and dataset: every ensemble side by side, computed from features alone.

Labels enter only after the heads are built (to score them), so the table shows what each ensemble does without
ever having seen them.
"""

from __future__ import annotations

import torch

from rgb.zeroshot.ensembles import ENSEMBLES, ensemble_head, ensemble_weights
from rgb.zeroshot.metrics import class_wise_metrics


def comparison_table(test_features: torch.Tensor, labels: torch.Tensor, text_features: torch.Tensor,
                     templates: list[str], *, logit_scale: float, unlabelled_features: torch.Tensor | None = None,
                     methods: tuple[str, ...] = tuple(ENSEMBLES), k: float = 0.1, tau: float = 1.0,
                     template_index: int = 0) -> list[dict]:
    """One row per ensemble: overall, worst@1/5/10, HM, GM on (test_features, labels), and every template's
    weight and kept flag. Weights come from `unlabelled_features` (default: the test features, the seed's
    transductive setting)."""
    if len(templates) != text_features.shape[0]:
        raise ValueError(f"{len(templates)} templates for {text_features.shape[0]} rows of text features")
    unlabelled = test_features if unlabelled_features is None else unlabelled_features
    rows = []
    for method in methods:
        weights, kept = ensemble_weights(unlabelled, text_features, method, logit_scale=logit_scale, k=k, tau=tau,
                                         template_index=template_index)
        head = ensemble_head(text_features, weights, kept, method)
        predictions = (test_features.float() @ head.T).argmax(1)
        rows.append({
            "ensemble": method,
            **class_wise_metrics(predictions, labels, text_features.shape[1]),
            "templates": [{"template": t, "weight": float(w), "kept": bool(x)}
                          for t, w, x in zip(templates, weights, kept)],
        })
    return rows
