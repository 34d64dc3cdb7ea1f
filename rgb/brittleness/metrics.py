"""Ranking instability and the brittleness index of text queries (zeroshot-spec section 4), as pure functions.

Rankings are (Q, D) tensors of image row indices, best first; everything is batched over queries with torch
(scatter / cumsum), never a Python loop over images. Definitions, with X_d = |A_d ∩ B_d| for the top-d sets:

- overlap@k = X_k / k
- RBO_ext(p) = (X_D / D) p^D + ((1 - p) / p) sum_{d=1..D} (X_d / d) p^d   (Webber et al. 2010, extrapolated)
- instability = 1 - RBO_ext(0.99)
- d(u, v) = 1 - cos(u, v); intra = d(q, q'); inter = mean d over all pairs of original queries
- B = ln(instability * inter / intra). Where instability = 0 but the text moved (intra > 0) the ranking did not
  change at all: the least brittle case, B = -inf, counted apart (`brittleness_stable`) rather than dropped as
  undefined. NaN (undefined, counted) only where intra = 0 (the spec leaves both undefined; this split is ours).

Numerics: since p^D + ((1 - p) / p) sum_d p^d = 1, instability is computed as the equal sum of deficits
(1 - X_D / D) p^D + ((1 - p) / p) sum_d (1 - X_d / d) p^d, so identical rankings give instability exactly 0 and
RBO exactly 1 (the direct form leaves ~1e-16 of rounding, which would make B defined where it must not be).
Likewise 1 - cos is computed as |u - v|^2 / 2 of the normalised vectors: exactly 0 for identical features.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch
from tqdm import tqdm

from rgb.brittleness.perturb import Perturbation, perturbation_type
from rgb.brittleness.settings import DEFAULT_KS, DEFAULT_P


def _as_batch(ranking: torch.Tensor) -> torch.Tensor:
    ranking = torch.as_tensor(ranking)
    if ranking.dim() not in (1, 2) or ranking.numel() == 0:
        raise ValueError(f"a ranking is a non-empty (D,) or (Q, D) tensor of item indices, got shape {tuple(ranking.shape)}")
    if ranking.dtype.is_floating_point or ranking.dtype == torch.bool:
        raise ValueError(f"rankings hold integer item indices, got {ranking.dtype}")
    return ranking.long().reshape(-1, ranking.shape[-1])


def _positions(ranking: torch.Tensor, n_items: int) -> torch.Tensor:
    """(Q, n_items) position of each item in each ranking, D where absent; repeated items are an error."""
    n_rows, depth = ranking.shape
    positions = torch.full((n_rows, n_items), depth, dtype=torch.long)
    positions.scatter_(1, ranking, torch.arange(depth).expand(n_rows, depth))
    if not bool(((positions < depth).sum(1) == depth).all()):
        raise ValueError("a ranking lists the same item twice")
    return positions


def overlap_counts(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """X[..., d - 1] = |A_d ∩ B_d| for d = 1..D, for rankings a, b of equal length D (item indices >= 0, such as
    collection row indices: the work and memory grow with the largest index).

    An item enters both top-d sets at depth max(position in a, position in b) + 1, so X is the cumulative
    histogram of those depths."""
    a_rows, b_rows = _as_batch(a), _as_batch(b)
    if a_rows.shape != b_rows.shape:
        raise ValueError(f"rankings must have the same shape, got {tuple(torch.as_tensor(a).shape)} and {tuple(torch.as_tensor(b).shape)}")
    if bool((a_rows < 0).any()) or bool((b_rows < 0).any()):
        raise ValueError("rankings hold item indices >= 0")
    n_rows, depth = a_rows.shape
    n_items = int(torch.maximum(a_rows.max(), b_rows.max())) + 1
    entry = torch.maximum(_positions(a_rows, n_items), _positions(b_rows, n_items))
    histogram = torch.zeros(n_rows, depth + 1, dtype=torch.long).scatter_add_(1, entry, torch.ones_like(entry))
    counts = histogram[:, :depth].cumsum(1)
    return counts.reshape(*torch.as_tensor(a).shape[:-1], depth)


def _check_p(p: float) -> None:
    if not 0.0 < p < 1.0:
        raise ValueError(f"RBO persistence p must be in (0, 1), got {p}")


def instability_from_counts(counts: torch.Tensor, p: float = DEFAULT_P) -> torch.Tensor:
    """1 - RBO_ext(p) from overlap counts X (..., D), in float64 (the deficit form: see the module docstring)."""
    _check_p(p)
    depth = counts.shape[-1]
    d = torch.arange(1, depth + 1, dtype=torch.float64)
    deficit = 1.0 - counts.to(torch.float64) / d
    return deficit[..., -1] * p**depth + (1.0 - p) / p * (deficit * p**d).sum(-1)


def instability(a: torch.Tensor, b: torch.Tensor, p: float = DEFAULT_P) -> torch.Tensor:
    """1 - RBO_ext(p) of rankings a, b ((D,) -> scalar tensor, (Q, D) -> (Q,)), float64."""
    return instability_from_counts(overlap_counts(a, b), p)


def rbo_ext(a: torch.Tensor, b: torch.Tensor, p: float = DEFAULT_P) -> torch.Tensor:
    """Extrapolated rank-biased overlap of rankings a, b of equal length ((D,) -> scalar, (Q, D) -> (Q,))."""
    return 1.0 - instability(a, b, p)


def overlap_at_k(a: torch.Tensor, b: torch.Tensor, k: int) -> torch.Tensor:
    """|A_k ∩ B_k| / k of rankings a, b, for 1 <= k <= D."""
    depth = torch.as_tensor(a).shape[-1]
    if not 1 <= k <= depth:
        raise ValueError(f"overlap@k needs 1 <= k <= {depth} (the ranking length), got k={k}")
    return overlap_counts(a, b)[..., k - 1].to(torch.float64) / k


def _normalise(features: torch.Tensor, name: str) -> torch.Tensor:
    features = torch.as_tensor(features)
    if features.dim() != 2 or features.shape[1] == 0:
        raise ValueError(f"{name} must be a (rows, dim) tensor, got shape {tuple(features.shape)}")
    return torch.nn.functional.normalize(features.to(torch.float64), dim=1)


def text_distance(u: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Row-wise d(u, v) = 1 - cos(u, v), float64, computed as |u/|u| - v/|v||^2 / 2 (exactly 0 for equal rows)."""
    u_unit, v_unit = _normalise(u, "u"), _normalise(v, "v")
    if u_unit.shape != v_unit.shape:
        raise ValueError(f"text features must have the same shape, got {tuple(u_unit.shape)} and {tuple(v_unit.shape)}")
    return (u_unit - v_unit).pow(2).sum(1) / 2


def inter_distance(query_features: torch.Tensor) -> float:
    """Mean of 1 - cos over all pairs of distinct original queries, in closed form:
    sum_{i != j} u_i . u_j = |sum_i u_i|^2 - sum_i |u_i|^2 for unit vectors (no Q x Q matrix)."""
    units = _normalise(query_features, "query features")
    n = units.shape[0]
    if n < 2:
        raise ValueError(f"the inter-query distance needs at least 2 queries, got {n}")
    cross = units.sum(0).pow(2).sum() - units.pow(2).sum()
    return float(1.0 - cross / (n * (n - 1)))


def brittleness_index(instability_values, intra, inter: float) -> torch.Tensor:
    """B = ln(instability * inter / intra), float64; -inf where instability = 0 < intra (a stable ranking, the
    least brittle case), NaN where intra = 0 (undefined)."""
    inst = torch.as_tensor(instability_values, dtype=torch.float64)
    intra = torch.as_tensor(intra, dtype=torch.float64)
    moved = intra > 0
    ratio = torch.where(moved, inst * inter / torch.where(moved, intra, 1.0), torch.nan)
    return torch.log(ratio)


def rank_images(query_features: torch.Tensor, image_features: torch.Tensor) -> torch.Tensor:
    """(Q, N) image row indices by cosine similarity, descending; ties by row index (stable sort)."""
    similarity = (torch.nn.functional.normalize(torch.as_tensor(query_features).float(), dim=1)
                  @ torch.nn.functional.normalize(torch.as_tensor(image_features).float(), dim=1).T)
    return torch.sort(similarity, dim=1, descending=True, stable=True).indices


def query_table(image_features: torch.Tensor, query_features: torch.Tensor, perturbed_features: torch.Tensor,
                perturbations: Sequence[Perturbation], *, ks: Sequence[int] = DEFAULT_KS, p: float = DEFAULT_P,
                batch_size: int = 256, progress: bool = True) -> dict[str, np.ndarray]:
    """One row per perturbation: its tags, intra distance, inter distance, instability, overlap@k and B (a bar
    counts the perturbed queries when there is more than one batch: about a minute at 188k queries).

    image_features (N, D) of the collection; query_features (Q, D) of the original queries; perturbed_features
    (P, D), row i for perturbations[i], whose `query_index` points into the original queries. Columns are numpy
    arrays (pandas.DataFrame(table) works). overlap@k is NaN where k > N (the collection is shorter than k).
    Encode identical texts / token sequences once, so that edits that tokenize identically get identical
    features, intra = 0 and an undefined B (better: leave them out, rgb.brittleness.perturb.drop_non_edits)."""
    image_features, query_features, perturbed_features = (
        torch.as_tensor(t) for t in (image_features, query_features, perturbed_features))
    n_queries, n_images = query_features.shape[0], image_features.shape[0]
    if n_images < 2:
        raise ValueError(f"a collection of {n_images} image(s): ranking instability needs at least 2 images")
    if n_queries == 0 or not perturbations:
        raise ValueError("empty query set: no queries or no perturbations to measure")
    if perturbed_features.shape[0] != len(perturbations):
        raise ValueError(f"{perturbed_features.shape[0]} perturbed feature rows for {len(perturbations)} perturbations")
    dims = {t.shape[-1] for t in (image_features, query_features, perturbed_features)}
    if len(dims) != 1:
        raise ValueError(f"image, query and perturbed features must share one feature size, got {sorted(dims)}")
    source = torch.tensor([item.query_index for item in perturbations], dtype=torch.long)
    if bool((source < 0).any()) or bool((source >= n_queries).any()):
        raise ValueError(f"a perturbation's query_index is outside the {n_queries} original queries")
    if batch_size < 1 or any(k < 1 for k in ks):
        raise ValueError(f"batch_size and every k must be >= 1, got batch_size={batch_size}, ks={tuple(ks)}")
    _check_p(p)

    original_rankings = torch.cat([rank_images(query_features[i:i + batch_size], image_features)
                                   for i in range(0, n_queries, batch_size)]).to(torch.int32)
    inter = inter_distance(query_features) if n_queries > 1 else math.nan
    intras, instabilities, overlaps = [], [], {k: [] for k in ks}
    bar = tqdm(total=len(perturbations), unit="query", desc="text robustness", dynamic_ncols=True, leave=False,
               disable=not progress or len(perturbations) <= batch_size)
    for start in range(0, len(perturbations), batch_size):
        rows, edited = source[start:start + batch_size], perturbed_features[start:start + batch_size]
        intras.append(text_distance(query_features[rows], edited))
        counts = overlap_counts(original_rankings[rows], rank_images(edited, image_features))
        instabilities.append(instability_from_counts(counts, p))
        for k in ks:
            overlaps[k].append(counts[:, k - 1].to(torch.float64) / k if k <= n_images
                               else torch.full((len(rows),), math.nan, dtype=torch.float64))
        bar.update(len(rows))
    bar.close()
    intra, instability_values = torch.cat(intras), torch.cat(instabilities)
    table = {
        "query_index": source.numpy(),
        "query": np.array([item.query for item in perturbations], dtype=object),
        "perturbed": np.array([item.text for item in perturbations], dtype=object),
        "perturbation_class": np.array([item.perturbation_class for item in perturbations], dtype=object),
        "perturbation_type": np.array([item.type for item in perturbations], dtype=object),
        "seed": np.array([item.seed for item in perturbations], dtype=np.int64),
        "intra": intra.numpy(),
        "inter": np.full(len(perturbations), inter),
        "instability": instability_values.numpy(),
    }
    table.update({f"overlap@{k}": torch.cat(overlaps[k]).numpy() for k in ks})
    table["brittleness"] = brittleness_index(instability_values, intra, inter).numpy()
    return table


def summarize(table: dict[str, np.ndarray], dropped: dict[str, dict[str, int]] | None = None) -> list[dict]:
    """One row per (perturbation class, type), in order of first appearance: mean/median instability, mean
    overlap@k, mean intra, inter, the mean of the finite B, the median of the defined B (-inf for a stable
    ranking is the lowest B, so it counts there), the counts of stable (B = -inf) and undefined (NaN) B, and with
    `dropped` (rgb.brittleness.perturb.drop_non_edits) the edits of each type left out (`n_noop`, `n_same_tokens`);
    a type whose edits were all left out gets a row with n = 0."""
    n_rows = len(table["perturbation_type"])
    if n_rows == 0:
        raise ValueError("empty table: nothing to summarise")
    dropped = dropped or {}
    groups: dict[tuple[str, str], list[int]] = {}
    for row, key in enumerate(zip(table["perturbation_class"], table["perturbation_type"])):
        groups.setdefault(key, []).append(row)
    overlap_columns = [name for name in table if name.startswith("overlap@")]
    summary = []
    for (perturbation_class, type_name), rows in groups.items():
        index = np.array(rows)
        brittleness = table["brittleness"][index]
        finite = brittleness[np.isfinite(brittleness)]
        defined = brittleness[~np.isnan(brittleness)]
        summary.append({
            "perturbation_class": perturbation_class,
            "perturbation_type": type_name,
            "n": len(index),
            "instability_mean": float(table["instability"][index].mean()),
            "instability_median": float(np.median(table["instability"][index])),
            **{f"{name}_mean": float(table[name][index].mean()) for name in overlap_columns},
            "intra_mean": float(table["intra"][index].mean()),
            "inter": float(table["inter"][index][0]),
            "brittleness_mean": float(finite.mean()) if finite.size else math.nan,
            "brittleness_median": float(np.median(defined)) if defined.size else math.nan,
            "brittleness_stable": int(np.isneginf(brittleness).sum()),
            "brittleness_undefined": int(np.isnan(brittleness).sum()),
            **dropped.get(type_name, {"n_noop": 0, "n_same_tokens": 0}),
        })
    inter = float(table["inter"][0])
    for type_name in [t for t in dropped if t not in {row["perturbation_type"] for row in summary}]:
        summary.append({
            "perturbation_class": perturbation_type(type_name).perturbation_class, "perturbation_type": type_name,
            "n": 0, "instability_mean": math.nan, "instability_median": math.nan,
            **{f"{name}_mean": math.nan for name in overlap_columns}, "intra_mean": math.nan, "inter": inter,
            "brittleness_mean": math.nan, "brittleness_median": math.nan, "brittleness_stable": 0,
            "brittleness_undefined": 0, **dropped[type_name],
        })
    return summary


def classification_view(image_features: torch.Tensor, class_features: torch.Tensor,
                        perturbed_class_features: torch.Tensor, labels: torch.Tensor) -> dict:
    """Accuracy of the zero-shot head before and after every class prompt got the same edit, and the rate of
    images whose prediction changes. Class features are the heads W (C, D) used as given (a CPE head is not
    normalised); the prediction is argmax_c f(x) . W[c], first index on ties."""
    image_features = torch.as_tensor(image_features)
    labels = torch.as_tensor(labels).long()
    if image_features.dim() != 2 or image_features.shape[0] == 0:
        raise ValueError(f"image features must be a non-empty (N, D) tensor, got shape {tuple(image_features.shape)}")
    if labels.shape != (image_features.shape[0],):
        raise ValueError(f"labels must be ({image_features.shape[0]},), got shape {tuple(labels.shape)}")
    heads = [torch.as_tensor(class_features), torch.as_tensor(perturbed_class_features)]
    if heads[0].shape != heads[1].shape or heads[0].dim() != 2 or heads[0].shape[1] != image_features.shape[1]:
        raise ValueError(f"class features must both be (C, {image_features.shape[1]}), got "
                         f"{tuple(heads[0].shape)} and {tuple(heads[1].shape)}")
    if bool((labels < 0).any()) or bool((labels >= heads[0].shape[0]).any()):
        raise ValueError(f"labels must lie in [0, {heads[0].shape[0]})")
    original, perturbed = ((image_features.float() @ head.float().T).argmax(1) for head in heads)
    return {
        "n_images": int(labels.numel()),
        "accuracy": float((original == labels).double().mean()),
        "perturbed_accuracy": float((perturbed == labels).double().mean()),
        "flip_rate": float((original != perturbed).double().mean()),
    }
