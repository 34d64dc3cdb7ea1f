"""Prompt ensembles as pure functions of features: `single`, `mean`, `zpe`, `cpe` (docs/zeroshot-spec.md §2).

Everything here takes L2-normalised image features F (N, D) and text features E (M, C, D) (template t, class c)
and never sees a label: CPE's class-wise matching margins use pseudo-labels from the `mean` ensemble of the same
features. Logit units (s * cosine, s = the CLIP logit scale) throughout, as the spec fixes.

ZPE (Allingham et al. 2023, test-time form, as implemented here): with l_t(x) = s * F(x) . E[t]^T (C logits),
score_t = mean_x max_c (l_t(x)_c - mean_x' l_t(x')_c) (the max logit after removing the template's average logit
per class over the same unlabelled images), w = softmax(score / tau). Its head, like `mean`'s, is the
renormalised weighted sum of the text features; CPE's head is the weighted average without renormalising.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F


class EnsembleError(ValueError):
    """Prompt ensemble inputs that cannot give a head (one line)."""


def _check(image_features: torch.Tensor, text_features: torch.Tensor) -> None:
    if text_features.ndim != 3 or text_features.shape[0] == 0:
        raise EnsembleError(f"text features must be (templates M >= 1, classes, dim); got {tuple(text_features.shape)}")
    if image_features.ndim != 2 or image_features.shape[1] != text_features.shape[2]:
        raise EnsembleError(
            f"image features {tuple(image_features.shape)} do not match text features {tuple(text_features.shape)}"
        )


def mean_head(text_features: torch.Tensor) -> torch.Tensor:
    """CLIP's ensemble: W[c] = normalise(sum_t E[t, c])."""
    return F.normalize(text_features.sum(0), dim=-1)


def pseudo_labels(image_features: torch.Tensor, text_features: torch.Tensor) -> torch.Tensor:
    """The one shared labeller of the spec: argmax_c f(x) . W_mean[c]."""
    return (image_features @ mean_head(text_features).T).argmax(1)


def class_means(image_features: torch.Tensor, labels: torch.Tensor, num_classes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(mean feature of each labelled class (C', D), the C' class ids), classes without an image left out."""
    present = torch.unique(labels)
    sums = torch.zeros(num_classes, image_features.shape[1], dtype=image_features.dtype).index_add_(0, labels, image_features)
    counts = torch.bincount(labels, minlength=num_classes).to(image_features.dtype)
    return sums[present] / counts[present, None], present


def matching_margins(image_features: torch.Tensor, heads: torch.Tensor, labels: torch.Tensor,
                     logit_scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Cmm (spec §2 cpe steps 2-3) of each head in `heads` (..., C, D) for the classes that have an image under
    `labels`: Hhat[i, j] = mean over {x : label i} of s * f(x) . W[j] (the mean of dot products is the dot product
    with the mean feature), Cmm[i] = Hhat[i, i] - max_{j != i} Hhat[i, j]. Returns (Cmm (..., C'), class ids (C',))."""
    num_classes = heads.shape[-2]
    centres, present = class_means(image_features, labels, num_classes)
    similarity = logit_scale * centres @ heads.transpose(-1, -2)  # (..., C', C)
    rows = torch.arange(len(present))
    own = similarity[..., rows, present]
    others = similarity.clone()
    others[..., rows, present] = -math.inf
    return own - others.amax(-1), present


def worst_k_mean(values: torch.Tensor, k: float) -> torch.Tensor:
    """Mean of the ceil(k * n) smallest values along the last axis (at least one)."""
    count = max(1, math.ceil(k * values.shape[-1]))
    return values.sort(-1).values[..., :count].mean(-1)


def median_selection(weights: torch.Tensor) -> torch.Tensor:
    """Keep templates with w_t >= median(w) (even M: the mean of the two middle values)."""
    return weights >= torch.quantile(weights, 0.5)


@dataclass(frozen=True)
class EnsembleParams:
    logit_scale: float = 100.0
    k: float = 0.1
    tau: float = 1.0
    template_index: int = 0


def _single(F_img, E, p: EnsembleParams):
    if not 0 <= p.template_index < E.shape[0]:
        raise EnsembleError(f"single template index {p.template_index} is outside the pool of {E.shape[0]}")
    weights = torch.zeros(E.shape[0], dtype=E.dtype)
    weights[p.template_index] = 1.0
    return weights, weights > 0


def _mean(F_img, E, p: EnsembleParams):
    return torch.full((E.shape[0],), 1.0 / E.shape[0], dtype=E.dtype), torch.ones(E.shape[0], dtype=torch.bool)


def _zpe(F_img, E, p: EnsembleParams):
    if F_img.shape[0] == 0:
        raise EnsembleError("zpe needs unlabelled images to score the templates; the split is empty")
    logits = p.logit_scale * torch.einsum("nd,mcd->mnc", F_img, E)
    score = (logits - logits.mean(1, keepdim=True)).amax(-1).mean(-1)
    return torch.softmax(score / p.tau, 0), torch.ones(E.shape[0], dtype=torch.bool)


def cpe_scores(image_features: torch.Tensor, text_features: torch.Tensor, logit_scale: float, k: float) -> dict:
    """CPE steps 1-4: pseudo-labels, per-template Cmm over the pseudo-labelled classes, worst-k score."""
    labels = pseudo_labels(image_features, text_features)
    cmm, present = matching_margins(image_features, text_features, labels, logit_scale)
    return {"pseudo_labels": labels, "cmm": cmm, "classes": present, "score": worst_k_mean(cmm, k),
            "classes_without_images": text_features.shape[1] - len(present)}


def _cpe(F_img, E, p: EnsembleParams):
    if F_img.shape[0] == 0:
        raise EnsembleError("cpe needs unlabelled images to pseudo-label; the split has none")
    weights = torch.softmax(cpe_scores(F_img, E, p.logit_scale, p.k)["score"] / p.tau, 0)
    return weights, median_selection(weights)


@dataclass(frozen=True)
class Ensemble:
    weigh: Callable  # (image features, text features, params) -> (weights (M,), kept (M,))
    renormalise: bool  # head = normalise(sum w E) (CLIP style) or the weighted average (CPE, similarity space)


ENSEMBLES: dict[str, Ensemble] = {
    "single": Ensemble(_single, renormalise=True),
    "mean": Ensemble(_mean, renormalise=True),
    "zpe": Ensemble(_zpe, renormalise=True),
    "cpe": Ensemble(_cpe, renormalise=False),
}


def _ensemble(method: str) -> Ensemble:
    if method not in ENSEMBLES:
        raise EnsembleError(f"unknown prompt ensemble {method!r}; choose one of {', '.join(ENSEMBLES)}")
    return ENSEMBLES[method]


def ensemble_weights(image_features: torch.Tensor, text_features: torch.Tensor, method: str, *,
                     logit_scale: float = 100.0, k: float = 0.1, tau: float = 1.0,
                     template_index: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights (M,), kept (M,) bool) of the templates under `method` in single | mean | zpe | cpe.

    image_features (N, D) and text_features (M, C, D), both L2-normalised; no labels are taken. `k` and `tau` are
    CPE's worst-k fraction and softmax temperature (tau also ZPE's); `template_index` is `single`'s template.
    """
    _check(image_features, text_features)
    params = EnsembleParams(float(logit_scale), float(k), float(tau), int(template_index))
    weights, kept = _ensemble(method).weigh(image_features.float(), text_features.float(), params)
    return weights, kept


def ensemble_head(text_features: torch.Tensor, weights: torch.Tensor, kept: torch.Tensor, method: str) -> torch.Tensor:
    """The (C, D) head W of an ensemble from its template weights and kept mask (spec §2)."""
    w = torch.where(kept, weights, torch.zeros_like(weights)).to(text_features.dtype)
    combined = torch.einsum("m,mcd->cd", w, text_features)
    if _ensemble(method).renormalise:
        return F.normalize(combined, dim=-1)
    return combined / w.sum()
