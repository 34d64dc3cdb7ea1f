"""The benchmark's aggregates: per-dataset scores, the Sum score, Borda ranks and the black-box protocol.

A missing setting stays missing (None) and is listed; it never counts as 0 and is never skipped silently.
"""

from __future__ import annotations

from collections.abc import Mapping

from rgb.data.catalog import TRANSFER_SPLITS
from rgb.evaluation.metrics import Accuracy

WHITE_BOX_SETTINGS = ("test", "common", "autoattack_l1", "autoattack_l2", "autoattack_linf")
BLACK_BOX_SETTINGS = ("test", "common", *TRANSFER_SPLITS)
PROTOCOLS = {"white_box": WHITE_BOX_SETTINGS, "black_box": BLACK_BOX_SETTINGS}


def dataset_score(settings: Mapping[str, Accuracy | None], protocol: str = "white_box") -> dict:
    """Sum of one dataset's accuracies over the protocol's settings (max 5 white-box, 9 black-box)."""
    names = PROTOCOLS[protocol]
    missing = [s for s in names if settings.get(s) is None]
    present = {s: settings[s] for s in names if settings.get(s) is not None}
    return {
        "score": None if missing else sum(a.value for a in present.values()),
        "partial_sum": sum(a.value for a in present.values()),
        "max": len(names),
        "missing": missing,
        "partial": any(a.partial for a in present.values()),
    }


def sum_score(per_dataset: Mapping[str, Mapping[str, Accuracy | None]], datasets, protocol="white_box") -> dict:
    """Sum score over `datasets` (max 30 white-box on six datasets); None while anything is missing."""
    missing, total, partial = [], 0.0, False
    for dataset in datasets:
        scored = dataset_score(per_dataset.get(dataset, {}), protocol)
        missing += [f"{dataset}/{s}" for s in scored["missing"]]
        total += scored["partial_sum"]
        partial |= scored["partial"]
    return {
        "score": None if missing else total,
        "partial_sum": total,
        "max": len(PROTOCOLS[protocol]) * len(list(datasets)),
        "missing": missing,
        "partial": partial,
    }


def borda_scores(pool: Mapping[str, Mapping[tuple[str, str], float]]) -> dict:
    """Borda points per model over the (dataset, setting) pairs every model of the pool has.

    In each pair a model gets one point per model it beats and half a point per model it ties with, so tied
    models share the points of the places they occupy. Pairs some model lacks are listed, not guessed.
    """
    models = list(pool)
    pairs = sorted(set().union(*(set(v) for v in pool.values()))) if pool else []
    complete = [p for p in pairs if all(p in pool[m] for m in models)]
    points = {m: 0.0 for m in models}
    for pair in complete:
        values = {m: pool[m][pair] for m in models}
        for m in models:
            points[m] += sum(1.0 for o in models if values[o] < values[m])
            points[m] += 0.5 * sum(1 for o in models if o != m and values[o] == values[m])
    return {"points": points, "pairs": complete, "excluded_pairs": [p for p in pairs if p not in complete]}


def strongest_surrogate(by_surrogate: Mapping[str, Accuracy | None]) -> tuple[str | None, Accuracy | None]:
    """The transfer protocol's choice: the surrogate whose split gives the lowest accuracy (ties: first name)."""
    available = {s: a for s, a in sorted(by_surrogate.items()) if a is not None}
    if not available:
        return None, None
    name = min(available, key=lambda s: available[s].value)
    return name, available[name]


def black_box_settings(
    clean: Accuracy | None, common: Accuracy | None, transfer: Mapping[str, Mapping[str, Accuracy | None]]
) -> tuple[dict[str, Accuracy | None], dict[str, str | None]]:
    """The 9 black-box settings of one dataset from transfer[split][surrogate], and which surrogate won each."""
    settings: dict[str, Accuracy | None] = {"test": clean, "common": common}
    chosen: dict[str, str | None] = {}
    for split in TRANSFER_SPLITS:
        chosen[split], settings[split] = strongest_surrogate(transfer.get(split, {}))
    return settings, chosen
