"""Model families: the table `rgb.models.load` dispatches on (`family` in model.json; a record without it is timm).

A family owns three things: which fields of model.json rebuild its architecture (`describe` / `rebuild`), and which
module is its head (everything else is backbone). Adding a family = one module with a `FAMILY` + one entry here.
A family whose `weights` is False (`api`: a model behind an endpoint) is rebuilt from its record alone.
"""

from __future__ import annotations

import difflib
from typing import Protocol

from torch import nn

from rgb.models import api, openclip, timm_family, user_factory
from rgb.models.factory import ModelLoadError


class ModelFamily(Protocol):
    name: str

    def describe(self, model: nn.Module) -> dict:
        """model.json fields from which `rebuild` makes the same architecture."""

    def rebuild(self, record: dict) -> nn.Module:
        """The architecture of an export record, weights not loaded yet."""

    def head(self, model: nn.Module) -> nn.Module:
        """The classification head (what linear probing trains); every other parameter is backbone."""


FAMILIES: dict[str, ModelFamily] = {
    family.name: family
    for family in (timm_family.FAMILY, openclip.FAMILY, user_factory.FAMILY, user_factory.IN_MEMORY_FAMILY,
                   api.FAMILY)
}
DEFAULT_FAMILY = "timm"


def family_named(name: str) -> ModelFamily:
    if name not in FAMILIES:
        close = difflib.get_close_matches(name, FAMILIES, n=3, cutoff=0.0)
        raise ModelLoadError(f"unknown model family {name!r}; known: {', '.join(close)}")
    return FAMILIES[name]


def family_of(model: nn.Module) -> ModelFamily:
    """The family that exports `model` (its `family` attribute; plain modules need `export_factory_model`)."""
    name = getattr(model, "family", None)
    if name is None:
        raise ValueError(
            f"{type(model).__name__} belongs to no model family: export it with "
            "rgb.models.export_factory_model(model, out_dir, factory='module:function', ...)"
        )
    return family_named(name)
