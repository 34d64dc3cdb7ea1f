"""The timm family: a `NormalizedClassifier` rebuilt from its timm name, class count and timm kwargs."""

from __future__ import annotations

from dataclasses import dataclass

from rgb.models.factory import NormalizedClassifier, RecipeModelParts, create_model


@dataclass(frozen=True)
class TimmFamily(RecipeModelParts):
    """The `timm` family: a `NormalizedClassifier` rebuilt from its timm name, class count and timm kwargs.

    The family of a record without `family` (written before families existed).
    """

    name: str = NormalizedClassifier.family  # the models' own word, written into model.json
    weights: bool = True
    text_tower: bool = False

    def describe(self, model: NormalizedClassifier) -> dict:
        """model.json fields of a timm model: `timm_name`, `num_classes`, `timm_kwargs`, `mean`, `std`.

        `timm_name` is always a registry architecture; a model made from an `hf-hub:` / `local-dir:` name adds `source`
        (that name, and the hub commit or folder it was loaded from).

        Args:
            model: A `NormalizedClassifier` made by `rgb.models.create_model`.

        Returns:
            The record's fields.
        """
        source = model.recipe.get("source")
        return {
            "timm_name": model.recipe["name"],
            "num_classes": model.recipe["num_classes"],
            "timm_kwargs": model.recipe["timm_kwargs"],
            "mean": model.mean,
            "std": model.std,
            **({"source": source} if source else {}),
        }

    def rebuild(self, record: dict) -> NormalizedClassifier:
        """The registry architecture, weights not loaded.

        A hub / local-dir `source` stays in the recipe, so the export of a rebuilt model (training exports its best
        weights that way) still says where they came from. A `num_classes` among the kwargs is the hub model's own
        head, which earlier rgb recorded there: the head exported is `record["num_classes"]`.

        Args:
            record: A timm model.json (`timm_name`, `num_classes`, `timm_kwargs`).

        Returns:
            The `NormalizedClassifier`, randomly initialised.

        Raises:
            ModelSpecError: `timm_name` is not a timm architecture.
        """
        kwargs = {k: v for k, v in record["timm_kwargs"].items() if k != "num_classes"}
        model = create_model(record["timm_name"], record["num_classes"], pretrained=False, **kwargs)
        if record.get("source"):
            model.recipe["source"] = record["source"]
        return model

    def model_name(self, record: dict) -> str | None:
        """The record's `timm_name`.

        Args:
            record: A timm model.json.

        Returns:
            The timm architecture's name.
        """
        return record.get("timm_name")


FAMILY = TimmFamily()
