"""Model families: the table `rgb.models.load` dispatches on (`family` in model.json; a record without it is timm).

A family owns everything a caller needs to know about its models: which fields of model.json rebuild the
architecture (`describe` / `rebuild`), the name a record gives the model (`model_name`), how many classes it
tells apart, which module is its head and which its backbone (what training splits and freezes), whether it has
weights and a CLIP text tower. Callers go through the family, never through a family's attributes or names, so
adding a family = one module with a `FAMILY` + one entry here.
"""

from __future__ import annotations

import difflib
from typing import Protocol

from torch import nn

from rgb.models import chat, openclip, timm_family, user_factory
from rgb.models.factory import ModelLoadError, ModelSpecError


class ModelFamily(Protocol):
    """What `rgb.models.load`, export and training ask of a family of models; one instance per family in `FAMILIES`.

    A new family is one module with a `FAMILY` (an object with these attributes and methods) and one entry in
    `FAMILIES`; callers go through the family, never through a family's attributes or names.

    Attributes:
        name: The `family` of model.json.
        weights: False for a model behind an endpoint (`api`): model.json alone rebuilds it.
        text_tower: True for CLIP (`openclip`): heads can be built from prompts, texts perturbed.
    """

    name: str
    weights: bool  # False (`api`: a model behind an endpoint): model.json alone rebuilds it
    text_tower: bool  # True (`openclip`): heads can be built from prompts, texts perturbed

    def describe(self, model: nn.Module) -> dict:
        """The model.json fields from which `rebuild` makes the same architecture.

        Args:
            model: A model of this family.

        Returns:
            The record's fields (JSON values), without weights.

        Raises:
            ModelSpecError: The family cannot describe the model (a factory model is exported with
                `rgb.models.export_factory_model` instead).
        """

    def rebuild(self, record: dict) -> nn.Module:
        """The architecture of an export record, weights not loaded yet.

        Args:
            record: A model.json of this family.

        Returns:
            The model, with freshly initialised weights (or, without weights, ready to use).

        Raises:
            ModelLoadError: The record cannot be rebuilt (a module handed to rgb.benchmark in memory).
            ModelSpecError: The model the record names cannot be made (an unknown architecture, a factory that does not
                import or returns no module).
        """

    def model_name(self, record: dict) -> str | None:
        """The model's name in scores.json and summary.json.

        What its record says was built: a timm or open_clip architecture, a factory, an endpoint's model, a class.

        Args:
            record: A model.json of this family.

        Returns:
            The name, or None where the record gives none.
        """

    def num_classes(self, model: nn.Module) -> int:
        """How many logits the model gives (the width of its head).

        Args:
            model: A model of this family.

        Returns:
            The class count.

        Raises:
            ModelSpecError: A factory model whose `classifier` has no `out_features`.
        """

    def head(self, model: nn.Module) -> nn.Module:
        """The classification head (what linear probing trains).

        Args:
            model: A model of this family.

        Returns:
            The head module.

        Raises:
            ModelSpecError: A factory model without a `classifier` submodule.
            InferenceOnlyError: An endpoint model, which has no head.
        """

    def backbone(self, model: nn.Module) -> nn.Module:
        """The module holding every trainable parameter, head included (what the optimiser walks).

        The names its `no_weight_decay()` lists are relative to it; what is outside it (normalisation) never trains.

        Args:
            model: A model of this family.

        Returns:
            The module.

        Raises:
            InferenceOnlyError: An endpoint model, which has no parameters to train.
        """


FAMILIES: dict[str, ModelFamily] = {
    family.name: family
    for family in (timm_family.FAMILY, openclip.FAMILY, user_factory.FAMILY, user_factory.IN_MEMORY_FAMILY,
                   chat.FAMILY)
}
# The family of a record written before families existed.
DEFAULT_FAMILY = timm_family.FAMILY.name


def family_named(name: str) -> ModelFamily:
    if name not in FAMILIES:
        close = difflib.get_close_matches(name, FAMILIES, n=3, cutoff=0.0)
        raise ModelLoadError(f"unknown model family {name!r}; known: {', '.join(close)}")
    return FAMILIES[name]


def family_of_record(record: dict) -> ModelFamily:
    """The family of an export record (timm for a record written before families existed)."""
    return family_named(record.get("family", DEFAULT_FAMILY))


def model_name(record: dict) -> str | None:
    """The name scores.json and summary.json give the model of `record` (one rule for every writer)."""
    return family_of_record(record).model_name(record)


def family_of(model: nn.Module) -> ModelFamily:
    """The family that exports `model` (its `family` attribute; plain modules need `export_factory_model`)."""
    name = getattr(model, "family", None)
    if name is None:
        raise ModelSpecError(
            f"{type(model).__name__} belongs to no model family: export it with "
            "rgb.models.export_factory_model(model, out_dir, factory='module:function', ...)"
        )
    return family_named(name)
