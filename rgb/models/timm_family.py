"""The timm family: a `NormalizedClassifier` rebuilt from its timm name, class count and timm kwargs."""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from rgb.models.factory import NormalizedClassifier, create_model


@dataclass(frozen=True)
class TimmFamily:
    name: str = "timm"
    weights: bool = True
    text_tower: bool = False

    def describe(self, model: NormalizedClassifier) -> dict:
        """`timm_name` is always a registry architecture; a model made from an `hf-hub:` / `local-dir:` name adds
        `source` (that name, and the hub commit or folder it was loaded from)."""
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
        """The registry architecture, weights not loaded; a hub / local-dir `source` stays in the recipe, so the
        export of a rebuilt model (training exports its best weights that way) still says where they came from.
        A `num_classes` among the kwargs is the hub model's own head, which earlier rgb recorded there: the head
        exported is `record["num_classes"]`."""
        kwargs = {k: v for k, v in record["timm_kwargs"].items() if k != "num_classes"}
        model = create_model(record["timm_name"], record["num_classes"], pretrained=False, **kwargs)
        if record.get("source"):
            model.recipe["source"] = record["source"]
        return model

    def model_name(self, record: dict) -> str | None:
        return record.get("timm_name")

    def num_classes(self, model: NormalizedClassifier) -> int:
        return model.recipe["num_classes"]

    def head(self, model: NormalizedClassifier) -> nn.Module:
        return model.classifier

    def backbone(self, model: NormalizedClassifier) -> nn.Module:
        return model.backbone


FAMILY = TimmFamily()
