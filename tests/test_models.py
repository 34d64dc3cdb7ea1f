"""rgb.models: timm names, strict weight loading, normalisation inside the model, export / load round trip."""

import json

import pytest
import safetensors.torch
import timm
import torch

from helpers import raises_one_line
from rgb.models import (
    META_FILE,
    WEIGHTS_FILE,
    WeightsMismatchError,
    create_model,
    export_factory_model,
    export_model,
    load,
    load_with_meta,
)


@pytest.fixture
def source_weights(tmp_path):
    """A test_resnet state dict with its 1000-class head, as a hub download would be."""
    torch.manual_seed(1)
    source = timm.create_model("test_resnet", pretrained=False)
    path = tmp_path / "test_resnet.safetensors"
    safetensors.torch.save_file(source.state_dict(), str(path))
    return source.state_dict(), path


def test_unknown_name_names_close_matches():
    with pytest.raises(ValueError, match=r"unknown timm model 'resnet5O'.*resnet50"):
        create_model("resnet5O", 10, pretrained=False)


def test_unknown_pretrained_tag_names_existing_tags():
    with pytest.raises(ValueError, match=r"unknown pretrained tag in 'resnet50.a1_in1kk'.*resnet50.a1_in1k"):
        create_model("resnet50.a1_in1kk", 10, pretrained=False)


@pytest.mark.parametrize("name", ["test_resnet", "test_efficientnet"])
def test_normalisation_comes_from_the_timm_pretrained_cfg(name):
    model = create_model(name, 7, pretrained=False).eval()
    cfg = timm.models.get_pretrained_cfg(name)
    assert model.mean == pytest.approx(list(cfg.mean)) and model.std == pytest.approx(list(cfg.std))
    x = torch.rand(2, 3, 32, 32)
    mean, std = torch.tensor(cfg.mean).view(1, 3, 1, 1), torch.tensor(cfg.std).view(1, 3, 1, 1)
    torch.testing.assert_close(model(x), model.backbone((x - mean) / std))
    assert model.classifier.out_features == 7


def test_local_weights_load_backbone_and_replace_head(source_weights):
    state, path = source_weights
    model = create_model("test_resnet", 10, weights=str(path))
    loaded = model.backbone.state_dict()
    for key, value in state.items():
        if not key.startswith("fc."):
            torch.testing.assert_close(loaded[key], value, msg=key)
    assert loaded["fc.weight"].shape == (10, state["fc.weight"].shape[1])
    assert "state_dict" not in model.backbone.pretrained_cfg


def test_headless_weights_file_loads(source_weights, tmp_path):
    state, _ = source_weights
    path = tmp_path / "headless.pth"
    torch.save({k: v for k, v in state.items() if not k.startswith("fc.")}, path)
    model = create_model("test_resnet", 3, weights=str(path))
    torch.testing.assert_close(model.backbone.state_dict()["conv1.0.weight"], state["conv1.0.weight"])


def ddp_state_dict(model, path):
    torch.save({f"module.{k}": v for k, v in model.state_dict().items()}, path)


def timm_train_checkpoint(model, path):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    timm.utils.CheckpointSaver(model, optimizer, checkpoint_dir=str(path.parent)).save_checkpoint(0, metric=0.5)
    (path.parent / "last.pth.tar").rename(path)


@pytest.mark.parametrize("write", [ddp_state_dict, timm_train_checkpoint])
def test_weights_as_training_scripts_save_them(source_weights, tmp_path, write):
    """A DDP-wrapped model's state dict saved without unwrapping (`module.` keys), and timm's train.py checkpoint
    (CheckpointSaver: the state dict beside optimizer, epoch and metric)."""
    state, _ = source_weights
    source = timm.create_model("test_resnet", pretrained=False)
    source.load_state_dict(state)
    path = tmp_path / "checkpoints" / "trained.pth"
    path.parent.mkdir()
    write(source, path)
    model = create_model("test_resnet", 10, weights=str(path))
    loaded = model.backbone.state_dict()
    for key, value in state.items():
        if not key.startswith("fc."):
            torch.testing.assert_close(loaded[key], value, msg=key)


def test_weights_with_wrong_keys_fail_naming_them(source_weights, tmp_path):
    state, _ = source_weights
    path = tmp_path / "prefixed.pth"
    torch.save({f"encoder.{k}" if k.startswith("layer1.") else k: v for k, v in state.items()}, path)
    with raises_one_line(WeightsMismatchError, match=r"Missing key\(s\).*layer1\.0\.conv1\.weight") as err:
        create_model("test_resnet", 10, weights=str(path))


def test_weights_with_wrong_shapes_fail(source_weights, tmp_path):
    state, _ = source_weights
    path = tmp_path / "reshaped.pth"
    torch.save({k: (v[:1] if k == "layer1.0.conv1.weight" else v) for k, v in state.items()}, path)
    with pytest.raises(WeightsMismatchError, match="size mismatch for layer1.0.conv1.weight"):
        create_model("test_resnet", 10, weights=str(path))


def test_missing_weights_file_and_contradictory_flags(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        create_model("test_resnet", 10, weights=str(tmp_path / "nope.pth"))
    with pytest.raises(ValueError, match="pretrained=False"):
        create_model("test_resnet", 10, pretrained=False, weights=str(tmp_path / "nope.pth"))


@pytest.mark.parametrize("name, kwargs", [("test_resnet", {}), ("test_vit", {"img_size": 32})])
def test_export_load_round_trip_gives_identical_logits(tmp_path, name, kwargs):
    torch.manual_seed(0)
    model = create_model(name, 4, pretrained=False, **kwargs).eval()
    export_model(model, tmp_path, {"dataset": "digits", "class_names": list("abcd")})
    x = torch.rand(3, 3, 32, 32)
    loaded, meta = load_with_meta(tmp_path)
    assert not loaded.training
    assert torch.equal(loaded(x), model(x))
    assert torch.equal(load(tmp_path / WEIGHTS_FILE)(x), model(x))
    assert meta["timm_name"] == name and meta["num_classes"] == 4 and meta["timm_kwargs"] == kwargs
    assert meta["class_names"] == list("abcd") and meta["mean"] == model.mean
    assert set(meta["versions"]) == {"torch", "timm", "rgb"}
    assert json.loads((tmp_path / META_FILE).read_text()) == meta


def test_load_names_the_missing_file(tmp_path):
    safetensors.torch.save_model(create_model("test_resnet", 2, pretrained=False), str(tmp_path / WEIGHTS_FILE))
    with pytest.raises(FileNotFoundError, match=META_FILE):
        load(tmp_path)


def test_record_without_family_loads_as_timm(tmp_path):
    """Exports written before model families existed have no `family`: they are timm models."""
    model = create_model("test_resnet", 3, pretrained=False).eval()
    export_model(model, tmp_path, {"dataset": "digits"})
    record = json.loads((tmp_path / META_FILE).read_text())
    assert record.pop("family") == "timm"
    (tmp_path / META_FILE).write_text(json.dumps(record))
    loaded, meta = load_with_meta(tmp_path)
    assert meta["family"] == "timm"
    x = torch.rand(2, 3, 32, 32)
    assert torch.equal(loaded(x), model(x))


def test_user_module_exports_and_loads_through_its_factory(tmp_path):
    from user_models import build_pixel_mlp

    torch.manual_seed(0)
    model = build_pixel_mlp(num_classes=4, hidden=8).eval()
    meta = {"dataset": "digits", "num_classes": 4, "class_names": list("abcd"), "image_size": 32}
    export_factory_model(model, tmp_path, factory="user_models:build_pixel_mlp",
                         kwargs={"num_classes": 4, "hidden": 8}, meta=meta)
    loaded, record = load_with_meta(tmp_path)
    assert record["family"] == "factory" and record["factory"] == "user_models:build_pixel_mlp"
    assert record["kwargs"] == {"num_classes": 4, "hidden": 8} and record["class_names"] == list("abcd")
    assert not loaded.training and type(loaded).__name__ == "PixelMLP"
    x = torch.rand(3, 3, 32, 32)
    assert torch.equal(loaded(x), model(x))


@pytest.mark.parametrize("factory, message", [
    ("user_models.build_pixel_mlp", "must be 'module:function'"),
    ("no_such_module_xyz:build", "cannot import 'no_such_module_xyz'"),
    ("user_models:nope", "has no callable 'nope'"),
])
def test_bad_factory_is_one_line(tmp_path, factory, message):
    from user_models import build_pixel_mlp

    with raises_one_line(ValueError, match=message) as err:
        export_factory_model(build_pixel_mlp(), tmp_path, factory=factory)
    assert not (tmp_path / META_FILE).exists()


def test_factory_that_builds_another_architecture_is_refused(tmp_path):
    from user_models import build_pixel_mlp

    with pytest.raises(ValueError, match="does not match"):
        export_factory_model(build_pixel_mlp(hidden=8), tmp_path, factory="user_models:build_pixel_mlp")


def test_plain_module_without_family_names_the_factory_export():
    from user_models import build_pixel_mlp

    with pytest.raises(ValueError, match="export_factory_model"):
        export_model(build_pixel_mlp(), "unused", {})
