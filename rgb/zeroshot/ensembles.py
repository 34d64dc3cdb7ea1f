"""Prompt ensembles as pure functions of features: `single`, `mean`, `zpe`, `zpe_select`, `cpe`
(zeroshot-spec §2, summarised in docs/specs.md).

Everything here takes L2-normalised image features F (N, D) and text features E (M, C, D) (template t, class c)
and never sees a label: CPE's class-wise matching margins use pseudo-labels from the `mean` ensemble of the same
features. Logit units (s * cosine, s = the CLIP logit scale) unless CPE's `cmm_units="cosine"` is asked for.

ZPE (Allingham et al. 2023, arXiv 2302.06235), with l_t(x) = s * F(x) . E[t]^T (C logits) over the unlabelled
images X: score_t = mean_x max_c (l_t(x)_c - b_t,c), w = softmax(score / tau). Two variants run, each labelled:
- `zpe`, labelled `zpe (test debias)`: the authors' ablation. b_t = mean over X of l_t (the unlabelled images'
  mean logit per class), every template kept, head = the renormalised weighted sum of the text features.
- `zpe_select`, the published form as far as it runs offline: b_t = (mean over P of l_t + mean over X of l_t) / 2
  when the user gives features P of unlabelled pretraining-like images (`pretraining+test debias`), else the
  test term alone; templates kept where score_t >= median(score) + t * MAD(score) (MAD = median absolute
  deviation; the best template is always kept); head = the weighted average of the kept templates' text features
  without renormalising, so the logits are the weighted average of the templates' logits.
CPE's head is the weighted average without renormalising too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

from rgb.zeroshot.settings import (  # the names and parameters the configs' schemas read without torch
    EnsembleError,
    EnsembleParams,
    cmm_scale,
    ensemble_params,
)


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
    with the mean feature), Cmm[i] = Hhat[i, i] - max_{j != i} Hhat[i, j]. Returns (Cmm (..., C'), class ids (C',)).
    `logit_scale` is s (logit units) or 1 (cosine units): see `cmm_scale`."""
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


def mad_selection(scores: torch.Tensor, t: float) -> torch.Tensor:
    """ZPE's selection: keep templates with score >= median + t * MAD (median of M values, even M: the mean of
    the two middle); the best-scoring template is kept even when the threshold lies above it."""
    median = torch.quantile(scores, 0.5)
    threshold = median + t * torch.quantile((scores - median).abs(), 0.5)
    kept = scores >= threshold
    kept[scores.argmax()] = True
    return kept


def _single(F_img, E, p: EnsembleParams):
    if p.template_index is None:
        raise EnsembleError("the single template is not in the template pool")
    if not 0 <= p.template_index < E.shape[0]:
        raise EnsembleError(f"single template index {p.template_index} is outside the pool of {E.shape[0]}")
    weights = torch.zeros(E.shape[0], dtype=E.dtype)
    weights[p.template_index] = 1.0
    return weights, weights > 0


def _mean(F_img, E, p: EnsembleParams):
    return torch.full((E.shape[0],), 1.0 / E.shape[0], dtype=E.dtype), torch.ones(E.shape[0], dtype=torch.bool)


def _mean_logits(features: torch.Tensor, E: torch.Tensor, logit_scale: float) -> torch.Tensor:
    """(M, C) mean over the images of l_t(x)_c (the mean of dot products is the dot product with the mean)."""
    return logit_scale * torch.einsum("d,mcd->mc", features.mean(0), E)


def zpe_scores(image_features: torch.Tensor, text_features: torch.Tensor, logit_scale: float,
               pretraining_features: torch.Tensor | None = None) -> torch.Tensor:
    """score_t = mean_x max_c (l_t(x)_c - b_t,c): b_t the unlabelled images' mean logit, or with pretraining
    features the average of that and their mean logit (the module docstring)."""
    if image_features.shape[0] == 0:
        raise EnsembleError("zpe needs unlabelled images to score the templates; the split is empty")
    logits = logit_scale * torch.einsum("nd,mcd->mnc", image_features, text_features)
    bias = _mean_logits(image_features, text_features, logit_scale)
    if pretraining_features is not None:
        if pretraining_features.ndim != 2 or pretraining_features.shape[0] == 0 \
                or pretraining_features.shape[1] != text_features.shape[2]:
            raise EnsembleError(f"zpe pretraining features must be (images >= 1, {text_features.shape[2]}); got "
                                f"{tuple(pretraining_features.shape)}")
        bias = (bias + _mean_logits(F.normalize(pretraining_features.float(), dim=-1), text_features, logit_scale)) / 2
    return (logits - bias[:, None, :]).amax(-1).mean(-1)


def _zpe(F_img, E, p: EnsembleParams):
    score = zpe_scores(F_img, E, p.logit_scale)
    return torch.softmax(score / p.tau, 0), torch.ones(E.shape[0], dtype=torch.bool)


def _zpe_select(F_img, E, p: EnsembleParams):
    score = zpe_scores(F_img, E, p.logit_scale, p.pretraining_features)
    return torch.softmax(score / p.tau, 0), mad_selection(score, p.mad_t)


def cpe_scores(image_features: torch.Tensor, text_features: torch.Tensor, logit_scale: float, k: float,
               cmm_units: str = "logit") -> dict:
    """CPE steps 1-4: pseudo-labels, per-template Cmm over the pseudo-labelled classes, worst-k score."""
    labels = pseudo_labels(image_features, text_features)
    cmm, present = matching_margins(image_features, text_features, labels, cmm_scale(logit_scale, cmm_units))
    return {"pseudo_labels": labels, "cmm": cmm, "classes": present, "score": worst_k_mean(cmm, k),
            "classes_without_images": text_features.shape[1] - len(present)}


def _cpe(F_img, E, p: EnsembleParams):
    if F_img.shape[0] == 0:
        raise EnsembleError("cpe needs unlabelled images to pseudo-label; the split has none")
    weights = torch.softmax(cpe_scores(F_img, E, p.logit_scale, p.k, p.cmm_units)["score"] / p.tau, 0)
    return weights, median_selection(weights)


def _zpe_select_label(p: EnsembleParams) -> str:
    debias = "test" if p.pretraining_features is None else "pretraining+test"
    return f"zpe (median+{p.mad_t:g}*MAD, logit average, {debias} debias)"


@dataclass(frozen=True)
class Ensemble:
    weigh: Callable  # (image features, text features, params) -> (weights (M,), kept (M,))
    renormalise: bool  # head = normalise(sum w E) (CLIP style) or the weighted average (CPE, similarity space)
    label: Callable[[EnsembleParams], str]  # what ran, as reports and model.json name it


def _named(name: str) -> Callable[[EnsembleParams], str]:
    return lambda params: name


# One per name of ENSEMBLE_NAMES (rgb.zeroshot.settings, which the schemas read), in its order.
ENSEMBLES: dict[str, Ensemble] = {
    "single": Ensemble(_single, renormalise=True, label=_named("single")),
    "mean": Ensemble(_mean, renormalise=True, label=_named("mean")),
    "zpe": Ensemble(_zpe, renormalise=True, label=_named("zpe (test debias)")),
    "zpe_select": Ensemble(_zpe_select, renormalise=False, label=_zpe_select_label),
    "cpe": Ensemble(_cpe, renormalise=False, label=_named("cpe (weights)")),
}


def _ensemble(method: str) -> Ensemble:
    if method not in ENSEMBLES:
        raise EnsembleError(f"unknown prompt ensemble {method!r}; choose one of {', '.join(ENSEMBLES)}")
    return ENSEMBLES[method]


def ensemble_label(method: str, **params) -> str:
    """How reports and model.json name what `method` runs with these parameters (e.g. `zpe (test debias)`)."""
    return _ensemble(method).label(ensemble_params(**params))


def ensemble_weights(image_features: torch.Tensor, text_features: torch.Tensor, method: str,
                     **params) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights (M,), kept (M,) bool) of the templates under `method` (a key of ENSEMBLES), with the parameters
    of `ensemble_params`. image_features (N, D) and text_features (M, C, D), both L2-normalised; no labels."""
    _check(image_features, text_features)
    weights, kept = _ensemble(method).weigh(image_features.float(), text_features.float(), ensemble_params(**params))
    return weights, kept


def ensemble_head(text_features: torch.Tensor, weights: torch.Tensor, kept: torch.Tensor, method: str) -> torch.Tensor:
    """The (C, D) head W of an ensemble from its template weights and kept mask (spec §2)."""
    w = torch.where(kept, weights, torch.zeros_like(weights)).to(text_features.dtype)
    combined = torch.einsum("m,mcd->cd", w, text_features)
    if _ensemble(method).renormalise:
        return F.normalize(combined, dim=-1)
    return combined / w.sum()
