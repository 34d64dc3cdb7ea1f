"""Models from outside the registries: timm `hf-hub:` / `local-dir:` and open_clip `hf-hub:` names through a local
Hub cache the tests fill with the libraries' own writers (offline), and image-tower-only CLIP checkpoints as
RobustVLM's FARE / TeCoA training saves them (`torch.save` of the tower's state dict, DDP's `module.` keys)."""

import copy
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import safetensors.torch
import timm
import torch

from helpers import FAST, REPO, raises_one_line
from hub_cache import REVISION, save_open_clip, timm_writer, use_cache, write_repo
from rgb.attacks import AutoAttack, within_budget
from rgb.core.files import CorruptFileError
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
from rgb.models.hub import HubCacheCorruptError, HubModelMissingError
from rgb.models.io import origin_line

SOURCE_CLASSES = 5  # the hub model's own head (a model fine-tuned and pushed with timm); the tests' heads differ


def timm_source(**kwargs):
    """A tiny timm model as someone fine-tuned it before pushing it with timm's save_for_hf."""
    torch.manual_seed(3)
    return timm.create_model("test_resnet", pretrained=False, num_classes=SOURCE_CLASSES, **kwargs)


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


def assert_same_outputs(a, b):
    x = torch.rand(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(a.eval()(x), b.eval()(x))


def test_timm_hub_name_loads_from_the_local_cache_offline_and_records_the_revision(hub, tmp_path):
    source = timm_source()
    write_repo(hub, "someorg/tiny-resnet", timm_writer(source))
    model = create_model("hf-hub:someorg/tiny-resnet", 7)
    assert_backbone_equal(model, source.state_dict())
    assert model.classifier.out_features == 7 and model.recipe["num_classes"] == 7
    assert "num_classes" not in model.recipe["timm_kwargs"]  # the hub head's count (timm's model_args): not ours
    export_model(model, tmp_path / "run", {"dataset": "digits"})
    meta = json.loads((tmp_path / "run" / META_FILE).read_text())
    assert meta["timm_name"] == "test_resnet"
    assert meta["source"] == {"name": "hf-hub:someorg/tiny-resnet", "source": "hf-hub", "repo_id": "someorg/tiny-resnet",
                              "requested_revision": None, "revision": REVISION}
    assert REVISION in origin_line(meta)
    for child in list(hub.iterdir()):  # the reload needs no hub: it rebuilds the registry architecture
        child.rename(tmp_path / child.name)
    loaded, _ = load_with_meta(tmp_path / "run")
    assert_same_outputs(loaded, model)
    assert loaded.recipe["source"] == meta["source"]  # kept by a rebuild: a re-export still names it
    meta["timm_kwargs"]["num_classes"] = SOURCE_CLASSES  # as earlier rgb recorded it (the hub head's count)
    (tmp_path / "run" / META_FILE).write_text(json.dumps(meta))
    assert_same_outputs(load_with_meta(tmp_path / "run")[0], model)


def test_timm_hub_vit_keeps_its_model_args_and_normalisation_through_the_reload(hub, tmp_path):
    """timm records what rebuilds the hub model (img_size, global_pool) beside its head's class count, and the
    mean/std its weights were trained with (which the registry architecture's defaults are not)."""
    torch.manual_seed(4)
    source = timm.create_model("test_vit", pretrained=False, num_classes=SOURCE_CLASSES, img_size=32)
    mean, std = [0.2, 0.3, 0.4], [0.1, 0.2, 0.3]
    write_repo(hub, "someorg/tiny-vit", timm_writer(source, data_config={"mean": mean, "std": std}))
    model = create_model("hf-hub:someorg/tiny-vit", 3)
    assert model.recipe["timm_kwargs"]["img_size"] == [32, 32]
    assert (model.mean, model.std) == (pytest.approx(mean), pytest.approx(std))
    export_model(model, tmp_path / "run", {"dataset": "digits"})
    for child in list(hub.iterdir()):
        child.rename(tmp_path / child.name)
    loaded, meta = load_with_meta(tmp_path / "run")
    assert (loaded.mean, meta["std"]) == (pytest.approx(mean), pytest.approx(std))
    assert_same_outputs(loaded, model)


def test_timm_local_dir_name(tmp_path):
    source = timm_source()
    folder = tmp_path / "mymodel"
    timm_writer(source)(folder)
    model = create_model(f"local-dir:{folder}", 4)
    assert_backbone_equal(model, source.state_dict())
    assert model.recipe["source"]["path"] == str(folder.resolve())
    export_model(model, tmp_path / "run", {"dataset": "digits"})
    folder.rename(tmp_path / "moved")  # the reload needs no folder either
    loaded, _ = load_with_meta(tmp_path / "run")
    assert_same_outputs(loaded, model)
    with pytest.raises(FileNotFoundError, match="config.json not found"):
        create_model(f"local-dir:{tmp_path / 'nothing'}", 4)
    (tmp_path / "moved" / "config.json").write_text('{"architecture": ')
    with raises_one_line(CorruptFileError, match=r"moved/config.json is not JSON") as err:
        create_model(f"local-dir:{tmp_path / 'moved'}", 4)


def test_timm_hub_name_absent_offline_is_one_line_naming_repo_and_fetch(hub):
    with raises_one_line(HubModelMissingError,
                         match=r"someorg/absent.*hf download someorg/absent.*HF_HUB_OFFLINE=1") as err:
        create_model("hf-hub:someorg/absent", 7)

    def config_only(folder):  # weights never downloaded
        timm_writer(timm_source())(folder)
        (folder / "model.safetensors").unlink()

    write_repo(hub, "someorg/config-only", config_only)
    with raises_one_line(HubModelMissingError, match="someorg/config-only") as err:
        create_model("hf-hub:someorg/config-only", 7)


def test_registry_weights_absent_offline_are_one_line_naming_the_hub_repo(hub):
    """A registry name whose pretrained weights timm takes from the hub (resnet18.a1_in1k: timm/resnet18.a1_in1k)."""
    with raises_one_line(HubModelMissingError, match=r"model resnet18\.a1_in1k: files of hub repo "
                                                     r"timm/resnet18\.a1_in1k .*hf download timm/resnet18\.a1_in1k"):
        create_model("resnet18.a1_in1k", 7)


def offline_error(tmp_path: Path, *overrides: str) -> str:
    """The error line of train.py run offline with an empty Hugging Face home, checked to be its only one (no
    traceback, no Hydra wrap)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf"),
           "WANDB_MODE": "offline", "PYTHONPATH": str(REPO)}
    for moved in ("HF_HUB_CACHE", "HF_DATASETS_CACHE", "RGB_BENCHMARK", "RGB_ROOT"):
        env.pop(moved, None)
    done = subprocess.run([sys.executable, str(REPO / "train.py"), *overrides, f"paths.root_dir={tmp_path}"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    output = done.stdout + done.stderr
    errors = [line for line in output.splitlines() if "error" in line.lower()]
    assert done.returncode == 2 and len(errors) == 1, output[-3000:]
    assert "Traceback" not in output and "full_key" not in output
    return errors[0]


@pytest.mark.slow
def test_the_design_cards_train_command_offline_without_a_cache_says_what_to_download(tmp_path, mini_dir):
    """`train.py model=vit_b16 data=stanford_cars` offline with nothing cached: the data is checked before the
    weights, one line naming the dataset snapshot to download; with the data there, one line naming the weights'
    hub repo and its `hf download` (not Hydra's 4-line wrap of the hub's error)."""
    data = offline_error(tmp_path, "model=vit_b16", "data=stanford_cars")
    assert "train.py: error: cannot load hub dataset" in data and "snapshot_download" in data
    weights = offline_error(tmp_path, "model=vit_b16", f"data.source={mini_dir}")
    assert re.search(r"train.py: error: model vit_base_patch16_224\.augreg_in21k: files of hub repo "
                     r"timm/vit_base_patch16_224\.augreg_in21k .*run `hf download timm/vit_base_patch16_224"
                     r"\.augreg_in21k`", weights)


def truncate(blob):  # a download cut off
    blob.write_bytes(blob.read_bytes()[: blob.stat().st_size // 2])


@pytest.mark.parametrize("broken", ["config.json", "model.safetensors"])
@pytest.mark.parametrize("damage", [truncate, Path.unlink], ids=["truncated", "blob_missing"])
def test_a_broken_hub_cache_file_is_one_line_naming_the_file_and_the_repo(hub, broken, damage):
    snapshot = write_repo(hub, "someorg/broken-cache", timm_writer(timm_source()))
    damage((snapshot / broken).resolve())
    with raises_one_line(HubCacheCorruptError,
                         match=rf"file {broken} of hub repo someorg/broken-cache .* does not read .*--force-download"
                       ) as err:
        create_model("hf-hub:someorg/broken-cache", 7)


def test_timm_hub_weights_that_do_not_fit_are_a_mismatch(hub):
    source = timm_source()
    source.conv1[0] = torch.nn.Conv2d(3, 8, 3, stride=2, padding=1, bias=False)  # changed after timm built it
    write_repo(hub, "someorg/broken", timm_writer(source))
    with pytest.raises(WeightsMismatchError, match="conv1.0.weight"):
        create_model("hf-hub:someorg/broken", 7)


@pytest.mark.slow
def test_hub_model_trains_exports_reloads_without_the_hub_and_is_attacked(hub, tmp_path, mini_dir):
    """The whole path of a model pushed with timm: train.py fine-tunes it from the cache (offline), exports it;
    the export loads with the cache gone and is attacked."""
    write_repo(hub, "someorg/tiny-resnet", timm_writer(timm_source()))
    run_dir = tmp_path / "run"
    env = {**os.environ, "HF_HUB_CACHE": str(hub), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1",
           "WANDB_MODE": "offline"}
    done = subprocess.run(
        [sys.executable, str(REPO / "train.py"), "model.name=hf-hub:someorg/tiny-resnet", "debug=fdr",
         f"data.source={mini_dir}", f"paths.root_dir={tmp_path}", f"hydra.run.dir={run_dir}", *FAST],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    for child in list(hub.iterdir()):
        child.rename(tmp_path / child.name)
    model, meta = load_with_meta(run_dir)
    assert (meta["timm_name"], meta["num_classes"], meta["source"]["revision"]) == ("test_resnet", 10, REVISION)
    x, y = torch.rand(4, 3, 32, 32, generator=torch.Generator().manual_seed(0)), torch.arange(4)
    result = AutoAttack(model, "Linf", 8 / 255, version="fast", steps=3, seed=0).run(x, y)
    assert within_budget(result.x_adv - x, "Linf", 8 / 255).all()
    with torch.no_grad():
        assert torch.equal(model(result.x_adv).argmax(dim=1) == y, result.robust)


# ------------------------------------------------------------------ open_clip

@pytest.fixture(scope="module")
def mini_clip():
    """The mini CLIP with weights of its own (not the seed-0 init a random load gives) and its own preprocessing,
    as someone trained it before pushing it with open_clip."""
    register_embedded_architecture()
    torch.manual_seed(5)
    model = copy.deepcopy(load_clip(EMBEDDED_ARCH).model)
    with torch.no_grad():
        for value in model.state_dict().values():
            value.add_(0.01 * torch.randn_like(value))
    model.visual.image_std = (0.25, 0.25, 0.25)
    return model


def test_open_clip_hub_name_loads_both_towers_from_the_cache(hub, mini_clip, tmp_path):
    write_repo(hub, "robust/FARE-mini", lambda folder: save_open_clip(mini_clip, MINI_CLIP_CONFIG, folder))
    clip = load_clip("hf-hub:robust/FARE-mini")
    for key, value in mini_clip.state_dict().items():
        torch.testing.assert_close(clip.model.state_dict()[key], value, msg=key)
    assert clip.preprocess["std"] == [0.25, 0.25, 0.25]
    model = create_openclip_classifier("hf-hub:robust/FARE-mini", 3)
    export_model(model, tmp_path / "run", {"dataset": "digits"})
    loaded, meta = load_with_meta(tmp_path / "run")
    assert meta["openclip_name"] == "hf-hub:robust/FARE-mini" and meta["source"]["revision"] == REVISION
    assert_same_outputs(loaded, model)
    text = load_clip_of(loaded)  # the text tower back from the cache, for zero-shot heads
    torch.testing.assert_close(text.model.state_dict()["text_projection"], mini_clip.state_dict()["text_projection"])


def test_open_clip_local_dir_name(mini_clip, tmp_path):
    folder = tmp_path / "fare-mini"
    save_open_clip(mini_clip, MINI_CLIP_CONFIG, folder)
    model = create_openclip_classifier(f"local-dir:{folder}", 3)
    torch.testing.assert_close(model.backbone.visual.state_dict()["conv1.weight"],
                               mini_clip.state_dict()["visual.conv1.weight"])
    assert model.std == pytest.approx([0.25, 0.25, 0.25])
    export_model(model, tmp_path / "run", {"dataset": "digits"})
    folder.rename(tmp_path / "moved")  # the image tower reloads from the export alone
    assert_same_outputs(load_with_meta(tmp_path / "run")[0], model)


def test_open_clip_hub_name_absent_offline_is_one_line(hub, mini_clip):
    with raises_one_line(HubModelMissingError, match=r"robust/absent.*hf download robust/absent") as err:
        load_clip("hf-hub:robust/absent")
    write_repo(hub, "robust/no-weights",
               lambda folder: save_open_clip(mini_clip, MINI_CLIP_CONFIG, folder, skip_weights=True))
    with pytest.raises(HubModelMissingError, match="robust/no-weights"):  # open_clip alone warns, random weights
        load_clip("hf-hub:robust/no-weights")


@pytest.mark.parametrize("damage", [truncate, Path.unlink], ids=["truncated", "blob_missing"])
def test_a_broken_open_clip_hub_weights_file_names_the_file_and_the_repo(hub, mini_clip, damage):
    snapshot = write_repo(hub, "robust/broken", lambda folder: save_open_clip(mini_clip, MINI_CLIP_CONFIG, folder))
    damage((snapshot / "open_clip_model.safetensors").resolve())
    with raises_one_line(HubCacheCorruptError,
                         match="file open_clip_model.safetensors of hub repo robust/broken") as err:
        load_clip("hf-hub:robust/broken")


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


def robust_tower(mini_clip):
    """An image tower as FARE / TeCoA training leaves it: the CLIP's tower with weights of its own."""
    visual = copy.deepcopy(mini_clip.visual)
    with torch.no_grad():
        for value in visual.state_dict().values():
            value.add_(1.0)
    return visual


# How image-tower checkpoints are written: RobustVLM's `torch.save(unwrap_model(model).model.state_dict(), ...)`,
# the same without unwrapping DDP (`module.` keys), safetensors' own module writer, and the tower's keys filtered
# out of a whole CLIP's state dict (`visual.` kept).
TOWER_WRITERS = {
    "torch_save": lambda visual, path: torch.save(visual.state_dict(), path.with_suffix(".pt")),
    "torch_save_ddp": lambda visual, path: torch.save({f"module.{k}": v for k, v in visual.state_dict().items()},
                                                      path.with_suffix(".pt")),
    "safetensors_save_model": lambda visual, path: safetensors.torch.save_model(visual, str(path)),
    "visual_prefixed": lambda visual, path: safetensors.torch.save_file(
        {f"visual.{k}": v.contiguous() for k, v in visual.state_dict().items()}, str(path)),
}


def write_tower(writer, visual, tmp_path) -> Path:
    TOWER_WRITERS[writer](visual, tmp_path / "fare.safetensors")
    return next(tmp_path.glob("fare.*"))


def whole_clip_file(mini_clip, tmp_path) -> Path:
    text_file = tmp_path / "whole.safetensors"
    safetensors.torch.save_model(mini_clip, str(text_file))
    return text_file


@pytest.mark.parametrize("writer", sorted(TOWER_WRITERS))
def test_image_tower_checkpoint_with_text_tower_from_a_second_file(mini_clip, tmp_path, writer):
    register_embedded_architecture()
    text_file = whole_clip_file(mini_clip, tmp_path)
    robust = robust_tower(mini_clip)
    image_file = write_tower(writer, robust, tmp_path)
    model = create_openclip_classifier(EMBEDDED_ARCH, 3, weights=str(image_file), text_weights=str(text_file))
    tower = model.backbone.visual.state_dict()
    for key, value in robust.state_dict().items():
        torch.testing.assert_close(tower[key], value, msg=key)
    clip = load_clip_of(model)  # the text tower the zero-shot head would use: from the second file
    torch.testing.assert_close(clip.model.state_dict()["text_projection"], mini_clip.state_dict()["text_projection"])
    torch.testing.assert_close(clip.model.state_dict()["visual.conv1.weight"], tower["conv1.weight"])
    export_model(model, tmp_path / "run", {"dataset": "digits"})
    meta = json.loads((tmp_path / "run" / META_FILE).read_text())
    assert meta["towers"] == {"image": f"file {image_file} (image tower only)", "text": f"file {text_file}"}
    assert "image tower: file" in origin_line(meta)


def test_image_tower_checkpoint_needs_a_text_tower_and_mismatches_name_keys(mini_clip, tmp_path):
    register_embedded_architecture()
    image_file = tmp_path / "fare.pt"
    torch.save(mini_clip.visual.state_dict(), image_file)
    with pytest.raises(ValueError, match="image tower only: give the text tower with model.pretrained"):
        create_openclip_classifier(EMBEDDED_ARCH, 3, weights=str(image_file))
    text_file = whole_clip_file(mini_clip, tmp_path)
    other = dict(mini_clip.visual.state_dict())  # a tower of another architecture: a key gone, one added
    del other["conv1.weight"]
    other["extra.weight"] = torch.zeros(1)
    torch.save(other, image_file)
    with raises_one_line(WeightsMismatchError, match=r"conv1\.weight.*extra\.weight") as err:
        create_openclip_classifier(EMBEDDED_ARCH, 3, weights=str(image_file), text_weights=str(text_file))


def test_openclip_mini_takes_an_image_tower_checkpoint_text_from_the_embedded_clip(mini_clip, tmp_path):
    register_embedded_architecture()
    clip_dir = tmp_path / "mini_clip"
    embedded = load_clip(EMBEDDED_ARCH)  # stands in for the trained embedded CLIP (same file format)
    save_checkpoint(embedded.model, embedded.preprocess, clip_dir, {**DEFAULTS, "templates": list(CAPTION_TEMPLATES)})
    robust = robust_tower(mini_clip)
    image_file = write_tower("torch_save", robust, tmp_path)
    model = embedded_clip_classifier("rgb-mini-clip", 10, str(clip_dir), weights=str(image_file))
    torch.testing.assert_close(model.backbone.visual.state_dict()["conv1.weight"], robust.state_dict()["conv1.weight"])
    text = load_clip_of(model)
    torch.testing.assert_close(text.model.state_dict()["text_projection"],
                               embedded.model.state_dict()["text_projection"])
    assert model.recipe["towers"]["text"] == f"file {clip_dir / 'open_clip_model.safetensors'}"


def test_the_embedded_clip_checkpoint_reads_as_open_clip_local_dir(mini_clip, tmp_path):
    """rgb writes the embedded CLIP's folder itself (save_checkpoint): open_clip's own local-dir loader reads it
    back whole, with its preprocessing."""
    register_embedded_architecture()
    clip_dir = tmp_path / "mini_clip"
    preprocess = {"size": [32, 32], "mean": [0.5, 0.5, 0.5], "std": [0.25, 0.25, 0.25], "interpolation": "bicubic"}
    save_checkpoint(mini_clip, preprocess, clip_dir, {**DEFAULTS, "templates": list(CAPTION_TEMPLATES)})
    clip = load_clip(f"local-dir:{clip_dir}")
    for key, value in mini_clip.state_dict().items():
        torch.testing.assert_close(clip.model.state_dict()[key], value, msg=key)
    assert clip.preprocess == preprocess
