"""The model-family contract: what callers (training, evaluation, attack runs) read goes through the family."""

from types import SimpleNamespace

import pytest
import torch

from rgb.models import (
    FAMILIES,
    ModelLoadError,
    create_model,
    export_meta,
    export_paths,
    family_named,
    family_of,
    load,
    model_name,
    write_export,
)
from rgb.models.user_factory import IN_MEMORY_FAMILY

CONTRACT = ("name", "weights", "text_tower", "describe", "rebuild", "model_name", "num_classes", "head", "backbone")


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_every_family_holds_the_whole_contract(name):
    family = family_named(name)
    assert family.name == name
    assert all(hasattr(family, member) for member in CONTRACT)
    assert isinstance(family.weights, bool) and isinstance(family.text_tower, bool)


@pytest.mark.parametrize("record, expected", [
    ({"family": "timm", "timm_name": "test_resnet", "name": "other"}, "test_resnet"),
    ({"timm_name": "test_resnet"}, "test_resnet"),  # a record from before families: timm
    ({"family": "openclip", "openclip_name": "ViT-B-16"}, "ViT-B-16"),
    ({"family": "factory", "factory": "pkg.models:build", "name": "other"}, "pkg.models:build"),
    ({"family": "python", "name": "pkg.models.Net"}, "pkg.models.Net"),
    ({"family": "api", "api_model": "gpt-4o-mini"}, "gpt-4o-mini"),
])
def test_the_family_names_the_model_of_a_record(record, expected):
    """summary.json and scores.json take the model's name from here (openclip and factory models were `None`
    in summary.json before)."""
    assert model_name(record) == expected


def test_head_backbone_and_classes_of_a_timm_model():
    model = create_model("test_resnet", 4, pretrained=False)
    family = family_of(model)
    assert family.head(model) is model.classifier and family.backbone(model) is model.backbone
    assert family.num_classes(model) == 4
    head = {id(p) for p in family.head(model).parameters()}
    assert head <= {id(p) for p in family.backbone(model).parameters()}


def test_a_module_handed_over_in_memory_says_how_to_make_a_loadable_export(tmp_path):
    model = torch.nn.Linear(3, 2)
    write_export(model, tmp_path, {"family": IN_MEMORY_FAMILY.name, "name": "pkg.Net"})
    with pytest.raises(ModelLoadError, match=r"pkg\.Net was handed to rgb\.benchmark in memory.*export_factory_model"):
        load(tmp_path)


def test_export_paths_of_a_run_dir_and_of_a_weights_file(tmp_path):
    assert export_paths(tmp_path) == (tmp_path / "model.safetensors", tmp_path / "model.json")
    assert export_paths(tmp_path / "best.safetensors") == (tmp_path / "best.safetensors", tmp_path / "best.json")


def test_export_meta_names_the_run_and_its_data():
    datamodule = SimpleNamespace(dataset="digits", source="/data", class_names=["a", "b"], image_size=32)
    meta = export_meta(datamodule, {"run_name": "r", "sweep": None}, loss=None, strategy="api")
    assert meta == {"run_name": "r", "sweep": None, "dataset": "digits", "data_source": "/data",
                    "class_names": ["a", "b"], "num_classes": 2, "image_size": 32, "loss": None, "strategy": "api"}
