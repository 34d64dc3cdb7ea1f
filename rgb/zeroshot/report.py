"""The seed's Table 2 for one model and dataset: every ensemble side by side, computed from features alone, and
rows averaged over datasets.

Labels enter only after the heads are built (to score them), so the table shows what each ensemble does without
ever having seen them. Each row holds the image accuracy and the `ClassWise` record evaluate writes
(rgb.core.classwise: one worst@k rule for both).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from rgb.core.classwise import DEFAULT_WORST_K, ClassWise, class_wise_summary
from rgb.zeroshot.ensembles import ENSEMBLES, ensemble_head, ensemble_label, ensemble_weights


def head_row(label: str, head: torch.Tensor, test_features: torch.Tensor, labels: torch.Tensor,
             worst_k: Sequence = DEFAULT_WORST_K, templates: Sequence[str] = (), weights: torch.Tensor | None = None,
             kept: torch.Tensor | None = None, bias: torch.Tensor | None = None) -> dict:
    """One row: the head's predictions argmax_c f(x) . W[c] (+ bias) scored on (test_features, labels), and the
    template weights and kept flags that made it (none for a fixed head)."""
    logits = test_features.float() @ head.float().T
    predictions = (logits if bias is None else logits + bias).argmax(1)
    labels = torch.as_tensor(labels, dtype=torch.long)
    correct = (predictions == labels).numpy()
    return {"ensemble": label, "overall": float(correct.mean()),
            "class_wise": class_wise_summary(labels.numpy(), correct, head.shape[0], worst_k),
            "templates": [] if weights is None else [{"template": t, "weight": float(w), "kept": bool(x)}
                                                     for t, w, x in zip(templates, weights, kept)]}


def comparison_table(test_features: torch.Tensor, labels: torch.Tensor, text_features: torch.Tensor,
                     templates: list[str], *, logit_scale: float, unlabelled_features: torch.Tensor | None = None,
                     methods: Sequence[str] = tuple(ENSEMBLES), worst_k: Sequence = DEFAULT_WORST_K,
                     heads: Mapping[str, torch.Tensor] | None = None, **params) -> list[dict]:
    """The rows of `heads` (fixed heads by label: class names only, Descriptor, ...) then one per ensemble of
    `methods`, labelled by what runs (`zpe (test debias)`, `cpe (weights)`), with every template's weight and kept
    flag. Weights come from `unlabelled_features` (default: the test features, the seed's transductive setting);
    `params` are those of rgb.zeroshot.ensembles.ensemble_params."""
    if len(templates) != text_features.shape[0]:
        raise ValueError(f"{len(templates)} templates for {text_features.shape[0]} rows of text features")
    unlabelled = test_features if unlabelled_features is None else unlabelled_features
    rows = [head_row(label, head, test_features, labels, worst_k) for label, head in (heads or {}).items()]
    for method in methods:
        weights, kept = ensemble_weights(unlabelled, text_features, method, logit_scale=logit_scale, **params)
        rows.append(head_row(ensemble_label(method, logit_scale=logit_scale, **params),
                             ensemble_head(text_features, weights, kept, method), test_features, labels, worst_k,
                             templates, weights, kept))
    return rows


def row_metrics(row: dict) -> dict[str, float | None]:
    """The columns of Table 2 from a row: overall, worst@k for each configured k, HM, GM (None: not a number)."""
    class_wise = row["class_wise"]
    if isinstance(class_wise, dict):
        class_wise = ClassWise.from_json(class_wise)
    return {"overall": row["overall"], **{f"worst@{k}": v for k, v in class_wise.worst.items()},
            "hm": class_wise.harmonic_mean, "gm": class_wise.geometric_mean}


def average_rows(tables: Sequence[Sequence[dict]]) -> list[dict]:
    """Rows of several datasets' tables averaged by label (the seed's Table 2 averages its datasets): the mean of
    each column, None where any dataset has None; `datasets` counts the tables that hold the row (a row missing
    from one of them gets no average)."""
    order = list(dict.fromkeys(row["ensemble"] for table in tables for row in table))
    found = [{row["ensemble"]: row_metrics(row) for row in table} for table in tables]
    averaged = []
    for label in order:
        values = [table[label] for table in found if label in table]
        columns = list(dict.fromkeys(c for v in values for c in v))
        complete = len(values) == len(tables)
        averaged.append({"ensemble": label, "datasets": len(values), **{
            c: (sum(v[c] for v in values) / len(values)
                if complete and all(v.get(c) is not None for v in values) else None) for c in columns}})
    return averaged


__all__ = ["average_rows", "comparison_table", "head_row", "row_metrics"]
