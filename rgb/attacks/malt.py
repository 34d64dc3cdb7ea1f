"""MALT targeting (Melamed, Yehudai & Shamir, NeurIPS 2024) and the APGD-T run over its targets (`version="fast"`).

APGD-T tries the classes with the highest clean logits. MALT instead ranks candidate targets t by the
distance to the y/t decision boundary of the model linearised at the clean point,
    s_t = (z_y - z_t) / ||grad_x (z_t - z_y)||_q,  q the dual of the attack's norm,
which is the exact distance for a linear model, and attacks the nearest boundaries first. The candidates are
the min(100, K-1) highest clean logits other than y. A candidate with a zero gradient gets +inf (ranked last;
the authors' code ranks it first). All candidates' gradients come from one forward and one batched backward
(`is_grads_batched`), never from a Python loop over classes or images.
"""

from __future__ import annotations

import math
from dataclasses import replace

import torch
from torch import nn
from torch.nn.functional import one_hot

from rgb.attacks.apgd import APGDResult, apgd_over_targets
from rgb.attacks.common import EvalCounter, Progress, lp_norm
from rgb.core.threat import Norm, parse_norm

# Candidate classes ranked by MALT (the authors' default).
N_CANDIDATES = 100
# Candidate gradients computed together; bounds memory at this many copies of the batch's input gradient.
_GRADIENT_CHUNK = 16


def malt_scores(model: nn.Module, x: torch.Tensor, y: torch.Tensor, candidates: torch.Tensor, norm: str | Norm,
                counter: EvalCounter | None = None) -> torch.Tensor:
    """s_t for each candidate class t (N, k) at the points x: the linearised distance to the y/t boundary."""
    norm = parse_norm(norm)
    counter = EvalCounter(parent=counter)
    with torch.enable_grad():
        x = x.detach().requires_grad_(True)
        logits = model(x).float()
        counter.forward(x.shape[0])
        true_logit = logits.gather(1, y[:, None])
        gaps = true_logit - logits.gather(1, candidates)  # z_y - z_t
        dual_norms = []
        for start in range(0, candidates.shape[1], _GRADIENT_CHUNK):
            chunk = candidates[:, start:start + _GRADIENT_CHUNK]
            # Row j of the cotangents selects z_t - z_y for the j-th candidate of every image.
            cotangents = (one_hot(chunk.T, logits.shape[1]) - one_hot(y, logits.shape[1])[None]).to(logits.dtype)
            (grads,) = torch.autograd.grad(logits, x, cotangents, retain_graph=True, is_grads_batched=True)
            counter.backward(x.shape[0] * chunk.shape[1])
            dual_norms.append(lp_norm(grads.float().flatten(0, 1), norm.dual).view(chunk.shape[1], -1).T)
    dual_norm = torch.cat(dual_norms, dim=1)
    return torch.where(dual_norm > 0, gaps.detach() / dual_norm, math.inf)


def malt_targets(model: nn.Module, x: torch.Tensor, y: torch.Tensor, clean_logits: torch.Tensor, *, norm: str | Norm,
                 n_targets: int, n_candidates: int = N_CANDIDATES, counter: EvalCounter | None = None) -> torch.Tensor:
    """(N, n_targets) target classes, nearest linearised boundary first, among the n_candidates (at most K-1)
    highest clean logits other than y."""
    n_classes = clean_logits.shape[1]
    n_candidates = min(n_candidates, n_classes - 1)
    if not 1 <= n_targets <= n_candidates:
        raise ValueError(f"n_targets must be in [1, {n_candidates}] (the candidates), got {n_targets}")
    others = clean_logits.float().scatter(1, y[:, None], -math.inf)
    candidates = others.topk(n_candidates, dim=1).indices
    scores = malt_scores(model, x, y, candidates, norm, counter)
    order = scores.argsort(dim=1, stable=True)[:, :n_targets]
    return candidates.gather(1, order)


def apgd_malt(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    norm: str | Norm,
    eps: float | torch.Tensor,
    n_targets: int = 9,
    n_candidates: int = N_CANDIDATES,
    clean_logits: torch.Tensor | None = None,
    generator: torch.Generator | int | None = None,
    counter: EvalCounter | None = None,
    progress: Progress | None = None,
    **apgd_kwargs,
) -> APGDResult:
    """APGD-T (targeted DLR, any misclassification counts) against the MALT targets of each point, nearest
    first, each target only on the points still robust. Other keyword arguments go to `apgd`."""
    x = x.detach().float()
    call_counter = EvalCounter(parent=counter)
    if clean_logits is None:
        with torch.no_grad():
            clean_logits = model(x).float()
        call_counter.forward(x.shape[0])
    targets = malt_targets(model, x, y, clean_logits, norm=norm, n_targets=n_targets, n_candidates=n_candidates,
                           counter=call_counter)
    result = apgd_over_targets(model, x, y, targets, norm=norm, eps=eps, clean_logits=clean_logits,
                               generator=generator, counter=call_counter, progress=progress, **apgd_kwargs)
    return replace(result, forward_rows=call_counter.forward_rows, backward_rows=call_counter.backward_rows)
