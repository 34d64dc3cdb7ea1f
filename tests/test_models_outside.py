"""Models from outside the registries: timm `hf-hub:` / `local-dir:` and open_clip `hf-hub:` names through a local
Hub cache the tests write (offline), and image-tower-only CLIP checkpoints (RobustVLM's FARE / TeCoA format)."""

import json

import pytest
import safetensors.torch
import timm
import torch

from hub_cache import REVISION, use_cache, write_repo
from rgb.models import (
    META_FILE,
    WeightsMismatchError,
    create_model,
    create_openclip_classifier,
    export_model,
    load_clip,
    load_clip_of,
    load_with_meta,
)
from rgb.models.embedded_clip import (
    CAPTION_TEMPLATES,
    DEFAULTS,
    EMBEDDED_ARCH,
    MINI_CLIP_CONFIG,
    embedded_clip_classifier,
    register_embedded_architecture,
    save_checkpoint,
)
from rgb.models.hub import HubModelMissingError
from rgb.models.io import origin_line


def timm_source():
    torch.manual_seed(3)
    model = timm.create_model("test_resnet", pretrained=False)
    pretrained_cfg = {k: v for k, v in model.pretrained_cfg.items() if k != "architecture"}
    config = {"architecture": "test_resnet", "num_classes": 1000, "pretrained_cfg": pretrained_cfg}
    return model.state_dict(), config


@pytest.fixture
def hub(tmp_path, monkeypatch):
    cache = tmp_path / "hub"
    cache.mkdir()
    use_cache(monkeypatch, cache)
    return cache


def assert_backbone_equal(model, state, head="fc."):
    loaded = model.backbone.state_dict()
    for key, value in state.items():
        if not key.startswith(head):
            torch.testing.assert_close(loaded[key], value, msg=key)


def test_timm_hub_name_loads_from_the_local_cache_offline_and_records_the_revision(hub, tmp_path):
    state, config = timm_source()
    write_repo(hub, "someorg/tiny-resnet", {"config.json": config, "model.safetensors": state})
    model = create_model("hf-hub:someorg/tiny-resnet", 7)
    assert_backbone_equal(model, state)
    assert model.classifier.out_features == 7
    export_model(model, tmp_path / "run", {"dataset": "digits"})
    meta = json.loads((tmp_path / "run" / META_FILE).read_text())
    assert meta["timm_name"] == "test_resnet"
    assert meta["source"] == {"name": "hf-hub:someorg/tiny-resnet", "source": "hf-hub", "repo_id": "someorg/tiny-resnet",
                              "requested_revision": None, "revision": REVISION}
    assert REVISION in origin_line(meta)
    for child in list(hub.iterdir()):  # the reload needs no hub: it rebuilds the registry architecture
        child.rename(tmp_path / child.name)
    loaded, _ = load_with_meta(tmp_path / "run")
    x = torch.rand(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), model.eval()(x))


def test_timm_local_dir_name(tmp_path):
    state, config = timm_source()
    folder = tmp_path / "mymodel"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    safetensors.torch.save_file(state, str(folder / "model.safetensors"))
    model = create_model(f"local-dir:{folder}", 4)
    assert_backbone_equal(model, state)
    assert model.recipe["source"]["path"] == str(folder.resolve())
    with pytest.raises(FileNotFoundError, match="config.json not found"):
        create_model(f"local-dir:{tmp_path / 'nothing'}", 4)


def test_timm_hub_name_absent_offline_is_one_line_naming_repo_and_fetch(hub):
    with pytest.raises(HubModelMissingError, match=r"someorg/absent.*hf download someorg/absent.*HF_HUB_OFFLINE=1") as err:
        create_model("hf-hub:someorg/absent", 7)
    assert "\n" not in str(err.value)
    _, config = timm_source()
    write_repo(hub, "someorg/config-only", {"config.json": config})  # weights never downloaded
    with pytest.raises(HubModelMissingError, match="someorg/config-only") as err:
        create_model("hf-hub:someorg/config-only", 7)
    assert "\n" not in str(err.value)


def test_timm_hub_weights_that_do_not_fit_are_a_mismatch(hub):
    state, config = timm_source()
    del state["conv1.0.weight"]
    write_repo(hub, "someorg/broken", {"config.json": config, "model.safetensors": state})
    with pytest.raises(WeightsMismatchError, match="conv1.0.weight"):
        create_model("hf-hub:someorg/broken", 7)


# ------------------------------------------------------------------ open_clip

@pytest.fixture(scope="module")
def mini_clip():
    register_embedded_architecture()
    torch.manual_seed(5)
    clip = load_clip(EMBEDDED_ARCH)
    return {k: v + 0.01 * torch.randn_like(v) for k, v in clip.model.state_dict().items()}


PREPROCESS_CFG = {"size": [32, 32], "mean": [0.5, 0.5, 0.5], "std": [0.25, 0.25, 0.25], "interpolation": "bicubic",
                  "resize_mode": "shortest"}


def test_open_clip_hub_name_loads_both_towers_from_the_cache(hub, mini_clip, tmp_path):
    write_repo(hub, "robust/FARE-mini", {"open_clip_config.json": {"model_cfg": MINI_CLIP_CONFIG,
                                                                   "preprocess_cfg": PREPROCESS_CFG},
                                         "open_clip_model.safetensors": mini_clip})
    clip = load_clip("hf-hub:robust/FARE-mini")
    for key, value in mini_clip.items():
        torch.testing.assert_close(clip.model.state_dict()[key], value, msg=key)
    assert clip.preprocess["std"] == [0.25, 0.25, 0.25]
    model = create_openclip_classifier("hf-hub:robust/FARE-mini", 3)
    export_model(model, tmp_path / "run", {"dataset": "digits"})
    loaded, meta = load_with_meta(tmp_path / "run")
    assert meta["openclip_name"] == "hf-hub:robust/FARE-mini" and meta["source"]["revision"] == REVISION
    x = torch.rand(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), model.eval()(x))
    text = load_clip_of(loaded)  # the text tower back from the cache, for zero-shot heads
    torch.testing.assert_close(text.model.state_dict()["text_projection"], mini_clip["text_projection"])


def test_open_clip_hub_name_absent_offline_is_one_line(hub, mini_clip):
    with pytest.raises(HubModelMissingError, match=r"robust/absent.*hf download robust/absent") as err:
        load_clip("hf-hub:robust/absent")
    assert "\n" not in str(err.value)
    write_repo(hub, "robust/no-weights", {"open_clip_config.json": {"model_cfg": MINI_CLIP_CONFIG}})
    with pytest.raises(HubModelMissingError, match="robust/no-weights"):  # open_clip alone warns, random weights
        load_clip("hf-hub:robust/no-weights")


def test_rebuild_goes_through_open_clips_public_factory(tmp_path):
    import inspect

    import rgb.models.openclip

    register_embedded_architecture()
    model = create_openclip_classifier(EMBEDDED_ARCH, 3)
    export_model(model, tmp_path / "run", {"dataset": "digits"})
    loaded, _ = load_with_meta(tmp_path / "run")
    x = torch.rand(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), model.eval()(x))
    assert "_build_vision_tower" not in inspect.getsource(rgb.models.openclip)  # private: may go in any release


def visual_only(state, prefix):
    return {(k if prefix else k.removeprefix("visual.")): v for k, v in state.items() if k.startswith("visual.")}


@pytest.mark.parametrize("prefix", [True, False])
@pytest.mark.parametrize("suffix", [".pt", ".safetensors"])
def test_image_tower_checkpoint_with_text_tower_from_a_second_file(mini_clip, tmp_path, prefix, suffix):
    register_embedded_architecture()
    text_file = tmp_path / "whole.safetensors"
    safetensors.torch.save_file(mini_clip, str(text_file))
    robust = {k: v + 1.0 for k, v in visual_only(mini_clip, prefix).items()}
    image_file = tmp_path / f"fare{suffix}"
    if suffix == ".pt":
        torch.save(robust, image_file)
    else:
        safetensors.torch.save_file(robust, str(image_file))
    model = create_openclip_classifier(EMBEDDED_ARCH, 3, weights=str(image_file), text_weights=str(text_file))
    tower = model.backbone.visual.state_dict()
    for key, value in robust.items():
        torch.testing.assert_close(tower[key.removeprefix("visual.")], value, msg=key)
    clip = load_clip_of(model)  # the text tower the zero-shot head would use: from the second file
    torch.testing.assert_close(clip.model.state_dict()["text_projection"], mini_clip["text_projection"])
    torch.testing.assert_close(clip.model.state_dict()["visual.conv1.weight"], tower["conv1.weight"])
    export_model(model, tmp_path / "run", {"dataset": "digits"})
    meta = json.loads((tmp_path / "run" / META_FILE).read_text())
    assert meta["towers"] == {"image": f"file {image_file} (image tower only)", "text": f"file {text_file}"}
    assert "image tower: file" in origin_line(meta)


def test_image_tower_checkpoint_needs_a_text_tower_and_mismatches_name_keys(mini_clip, tmp_path):
    register_embedded_architecture()
    image_file = tmp_path / "fare.pt"
    robust = visual_only(mini_clip, prefix=False)
    torch.save(robust, image_file)
    with pytest.raises(ValueError, match="image tower only: give the text tower with model.pretrained"):
        create_openclip_classifier(EMBEDDED_ARCH, 3, weights=str(image_file))
    text_file = tmp_path / "whole.safetensors"
    safetensors.torch.save_file(mini_clip, str(text_file))
    del robust["conv1.weight"]
    robust["extra.weight"] = torch.zeros(1)
    torch.save(robust, image_file)
    with pytest.raises(WeightsMismatchError, match=r"conv1\.weight.*extra\.weight") as err:
        create_openclip_classifier(EMBEDDED_ARCH, 3, weights=str(image_file), text_weights=str(text_file))
    assert "\n" not in str(err.value)


def test_openclip_mini_takes_an_image_tower_checkpoint_text_from_the_embedded_clip(mini_clip, tmp_path):
    register_embedded_architecture()
    clip_dir = tmp_path / "mini_clip"
    embedded = load_clip(EMBEDDED_ARCH)  # stands in for the trained embedded CLIP (same file format)
    save_checkpoint(embedded.model, embedded.preprocess, clip_dir, {**DEFAULTS, "templates": list(CAPTION_TEMPLATES)})
    image_file = tmp_path / "fare.safetensors"
    robust = visual_only(mini_clip, prefix=True)
    safetensors.torch.save_file(robust, str(image_file))
    model = embedded_clip_classifier("rgb-mini-clip", 10, str(clip_dir), weights=str(image_file))
    torch.testing.assert_close(model.backbone.visual.state_dict()["conv1.weight"], robust["visual.conv1.weight"])
    text = load_clip_of(model)
    torch.testing.assert_close(text.model.state_dict()["text_projection"],
                               embedded.model.state_dict()["text_projection"])
    assert model.recipe["towers"]["text"] == f"file {clip_dir / 'open_clip_model.safetensors'}"
