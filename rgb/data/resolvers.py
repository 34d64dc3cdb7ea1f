"""The values behind the data configs' resolvers: their budgets from the catalog, so no number is written twice.

    num_classes: ${rgb.num_classes:${.dataset}}              # the catalog's classes of this dataset
    budgets:
      linf: ${rgb.budget:linf,${..image_size}}           # WHITE_BOX_BUDGETS["linf"] at this image size
    transfer_budgets:
      l2_8: ${rgb.transfer_budget:l2_8,${..image_size}}  # TRANSFER_BUDGETS["l2_8"] at this image size

One resolver per value (not one per dict), so a single budget stays overridable: `data.budgets.linf=0.03`.
rgb.commands.resolvers registers them with OmegaConf (the entry points, and tests that compose configs, call its
`register_resolvers()` before resolving a config).
"""

from __future__ import annotations

from rgb.core.threat import parse_norm
from rgb.data.catalog import (MINI, SURROGATES, TRANSFER_BUDGETS, WHITE_BOX, WHITE_BOX_BUDGETS, check_dataset,
                              scale_budget, split_budget)


def image_dim(image_size: int) -> int:
    """Values in one RGB image of side `image_size`."""
    return 3 * int(image_size) ** 2


def budgets(kind: str, image_size: int) -> dict[str, float]:
    """Every budget of `kind` ("white_box": norm key -> eps, "transfer": split -> eps) at this image size."""
    dim = image_dim(image_size)
    if kind == WHITE_BOX:
        return {norm: scale_budget(norm, eps, dim) for norm, eps in WHITE_BOX_BUDGETS.items()}
    if kind == "transfer":
        return {split: split_budget(split, dim)[1] for split in TRANSFER_BUDGETS}
    raise ValueError(f"budget kind must be {WHITE_BOX!r} or 'transfer', got {kind!r}")


def white_box_budget(norm: str, image_size: int) -> float:
    """The protocol's white-box eps for `norm` ("l1", "l2", "linf"), at the per-pixel budget of 224x224."""
    return budgets(WHITE_BOX, image_size)[parse_norm(norm).key]


def transfer_budget(split: str, image_size: int) -> float:
    """The eps of transfer split `split` (l1_75 ... linf_30) at this image size."""
    return split_budget(split, image_dim(image_size))[1]


def card_surrogates() -> list[str]:
    """The card's transfer surrogates (the catalog's SURROGATES), as the card datasets' configs record them under
    `surrogates`: a key no code reads, kept because every training run's identity holds it (conf/data/_benchmark.yaml)."""
    return list(SURROGATES)


def catalog_classes(dataset: str) -> int:
    """Classes of a catalog dataset (the card's six, the mini benchmark): the catalog owns the count, the data
    configs read it."""
    return MINI.num_classes if dataset == MINI.name else check_dataset(dataset).num_classes


def snapshot_classes(source: str, dataset: str) -> int:
    """Classes of a local snapshot's config (`data=custom`)."""
    from rgb.data.snapshot import snapshot_shape  # the datasets stack: only for a config that reads a snapshot

    return snapshot_shape(source, dataset)[0]


def snapshot_image_size(source: str, dataset: str) -> int:
    """Image side of a local snapshot's config (`data=custom`)."""
    from rgb.data.snapshot import snapshot_shape

    return snapshot_shape(source, dataset)[1]

