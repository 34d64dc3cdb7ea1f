"""The protocol a score was made under: one typed value, recorded in every scores record and leaderboard.

A Sum or a Borda count adds only numbers made under one protocol. The card's white-box protocol for a dataset is
its stored image size (224 for the card's six, 32 for the mini benchmark, the snapshot's for a user's own data),
the three budgets of the card at that size (the mini benchmark's scaled budgets are its card), AutoAttack
'standard' and whole splits. A record made under anything else is still shown, labelled with what differs
("L2 1, card 2"), and never summed or ranked with card entries.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

from rgb.core.jsonrecord import JsonRecord
from rgb.core.threat import Norm, parse_norm
from rgb.data.catalog import CARD_IMAGE_SIZE, DATASETS, MINI, WHITE_BOX
from rgb.data.errors import DataConfigError
from rgb.data.resolvers import budgets as card_budgets_at
from rgb.data.snapshot import snapshot_shape

STANDARD_VERSION = "standard"


def card_image_size(dataset: str, source: str | None = None) -> int:
    """The image side a dataset is stored at: the card's for its six, the mini builder's, else the local
    snapshot's (a user's own data, `data=custom`)."""
    if dataset in DATASETS:
        return CARD_IMAGE_SIZE
    if dataset == MINI.name:
        from rgb.data.mini import IMAGE_SIZE

        return IMAGE_SIZE
    if source is None:
        raise DataConfigError(f"dataset {dataset!r} is none of the card's ({', '.join(DATASETS)}) nor {MINI.name!r}: "
                              f"give its snapshot folder (source, data.source) to read its image size")
    return snapshot_shape(source, dataset)[1]


def budget_text(norm: str, eps: float) -> str:
    """A budget as papers write it: Linf in 1/255 units, L1 and L2 in [0,1] pixel units."""
    norm = parse_norm(norm)
    if norm is Norm.LINF:
        return f"{eps * 255:.4g}/255"
    return f"{eps:.4g}"


@dataclass(frozen=True)
class Protocol(JsonRecord):
    """What one (model, dataset) record was evaluated under; `card_image_size` is the size its images are
    stored at, which fixes the card's budgets for it."""

    dataset: str
    image_size: int
    card_image_size: int
    budgets: dict[str, float]  # white-box eps per norm key, [0,1] pixel units at `image_size`
    version: str = STANDARD_VERSION
    whole_splits: bool = True
    DERIVED: ClassVar[tuple[str, ...]] = ("card_budgets", "differences", "is_card")

    @classmethod
    def of(cls, dataset: str, image_size: int, budgets: dict[str, float], *, source: str | None = None,
           whole_splits: bool = True) -> Protocol:
        return cls(dataset, int(image_size), card_image_size(dataset, source),
                   {parse_norm(k).key: float(v) for k, v in budgets.items()}, STANDARD_VERSION, whole_splits)

    @property
    def card_budgets(self) -> dict[str, float]:
        """The card's white-box budgets for this dataset (at the size its images are stored at)."""
        return card_budgets_at(WHITE_BOX, self.card_image_size)

    def budget_differences(self) -> list[str]:
        card = self.card_budgets
        return [f"{parse_norm(norm).value} {budget_text(norm, eps)}, card {budget_text(norm, card[norm])}"
                for norm, eps in sorted(self.budgets.items())
                if norm in card and not math.isclose(eps, card[norm], rel_tol=1e-6)]

    def input_differences(self) -> list[str]:
        """What changes the images a model sees (every protocol): another image size than the stored one."""
        if self.image_size == self.card_image_size:
            return []
        return [f"image size {self.image_size}, card {self.card_image_size}"]

    def differences_for(self, protocol: str) -> list[str]:
        """How this record departs from the card under `protocol` ("white_box": images and budgets; "black_box":
        images only, the transfer splits carry their own budgets). PARTIAL splits are marked apart."""
        return self.input_differences() + (self.budget_differences() if protocol == WHITE_BOX else [])

    @property
    def differences(self) -> list[str]:
        return self.differences_for(WHITE_BOX)

    @property
    def is_card(self) -> bool:
        return not self.differences


__all__ = ["CARD_IMAGE_SIZE", "Protocol", "budget_text", "card_image_size"]
