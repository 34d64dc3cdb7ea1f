"""Where a model meets data, files and labels (issue 19 items 6, 9, 11, 13, 19, 21, 23): wrong shapes, other
weights, damaged files and bad labels are one clear error before anything is written, never a number."""

import json
import logging
import os
import re
import stat

import pytest
import torch
from torch import nn

import rgb
from rgb.attacks import AttackError
from rgb.attacks.autoattack import AutoAttack
from rgb.core.errors import UserError
from rgb.core.files import CorruptFileError
from rgb.evaluation.model_eval import EvaluationError, evaluate_model
from rgb.evaluation.records import RecordError, white_box_setting
from rgb.models import WEIGHTS_FILE, create_model, export_factory_model, load, write_export
from rgb.models.factory import ModelLoadError
from rgb.models.io import ExportConflictError, ExportNotFoundError
from rgb.runs.store import AttackRunError
from rgb.runs.store import MANIFEST, RunDirectory
from helpers import datamodule, raises_one_line, scoring
from rgb.models.toy import separable_data
from user_models import small_cnn


def files_under(root):
    return {p: p.read_bytes() for p in root.rglob("*") if p.is_file()}


@pytest.fixture
def umask():
    """Set the process umask for one test (restored after)."""
    previous = os.umask(0o022)
    yield lambda mask: os.umask(mask)
    os.umask(previous)


# -- 6, 13: the export of rgb.benchmark --------------------------------------------------------------------


def test_benchmark_with_other_weights_is_refused_before_anything_is_written(mini_dir, tmp_path):
    kwargs = dict(source=str(mini_dir), settings=("test", "common"), name="cnn", output_dir=tmp_path, progress=False)
    rgb.benchmark(small_cnn(seed=0), "mini", **kwargs)
    before = files_under(tmp_path)
    assert tmp_path / "models" / "digits" / "cnn" / WEIGHTS_FILE in before
    with pytest.raises(ExportConflictError, match="holds an export of other weights"):
        rgb.benchmark(small_cnn(seed=1), "mini", **kwargs)
    assert files_under(tmp_path) == before  # the export and its scores.json untouched


@pytest.mark.parametrize("kwargs, message", [
    ({"batch_size": 0}, "^batch_size must be null or an integer >= 1, got 0"),  # was run at the default batch size
    ({"batch_size": -3}, "^batch_size must be null or an integer >= 1, got -3"),  # was torch's DataLoader traceback
    ({"budgets": {"linf": float("nan")}}, r"Linf eps must be a finite number > 0 .* got nan"),  # was recorded
    ({"budgets": {"l2": float("inf")}}, r"L2 eps must be a finite number > 0 .* got inf"),
    ({"budgets": {"linf": 0.0}}, r"Linf eps must be a finite number > 0 .* got 0.0"),
    ({"output_dir": "FILE/out"}, r"cannot create .*/a_file/out: .*/a_file is a file, not a directory"),
    ({"device": "gpu0"}, "device='gpu0' names no torch device"),
])
def test_benchmark_turns_degenerate_arguments_into_one_line_before_writing(mini_dir, tmp_path, kwargs, message):
    (tmp_path / "a_file").write_text("")
    kwargs = {"output_dir": tmp_path / "out", **kwargs}
    kwargs["output_dir"] = str(kwargs["output_dir"]).replace("FILE", str(tmp_path / "a_file"))
    with raises_one_line(UserError, match=message):
        rgb.benchmark(small_cnn(seed=0), "mini", source=str(mini_dir), settings=("test",), progress=False, **kwargs)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("given", ["missing_dir", "a_dir_without_export", "weights.pt"])
def test_load_model_of_no_export_is_a_one_line_user_error(tmp_path, given):
    (tmp_path / "a_dir_without_export").mkdir()
    torch.save({"w": torch.zeros(3)}, tmp_path / "weights.pt")
    with raises_one_line(ExportNotFoundError, match="not found .rgb.models.load needs model.safetensors and model.json."):
        rgb.load_model(tmp_path / given)


@pytest.mark.parametrize("mask, mode", [(0o022, 0o644), (0o027, 0o640)])
def test_exported_weights_follow_the_umask(tmp_path, umask, mask, mode):
    umask(mask)
    weights = write_export(small_cnn(), tmp_path, {"dataset": "digits"})
    assert stat.S_IMODE(weights.stat().st_mode) == mode  # safetensors alone writes 0600
    assert stat.S_IMODE((tmp_path / "model.json").stat().st_mode) == mode
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.json", WEIGHTS_FILE]  # no temp file left


def test_embedded_clip_checkpoint_follows_the_umask(tmp_path, umask):
    from rgb.models import load_clip
    from rgb.models.embedded_clip import EMBEDDED_ARCH, register_embedded_architecture, save_checkpoint

    umask(0o022)
    register_embedded_architecture()
    clip = load_clip(EMBEDDED_ARCH)
    weights = save_checkpoint(clip.model, clip.preprocess, tmp_path, {})
    assert stat.S_IMODE(weights.stat().st_mode) == 0o644


# -- 9: an rgb.benchmark export loaded by path -------------------------------------------------------------


def test_loading_a_benchmark_export_says_how_to_rebuild_it(tmp_path):
    meta = {"family": "python", "name": "user_models.SmallCNN", "run_name": "cnn", "dataset": "digits"}
    write_export(small_cnn(), tmp_path, meta)
    with raises_one_line(ModelLoadError, match="export_factory_model") as err:
        load(tmp_path)
    message = str(err.value)
    assert str(tmp_path / "model.json") in message and "user_models.SmallCNN" in message
    assert isinstance(err.value, UserError)  # attack.py / evaluate.py print it as one line


def test_unknown_family_is_a_one_line_user_error(tmp_path):
    write_export(small_cnn(), tmp_path, {"family": "keras"})
    with pytest.raises(ModelLoadError, match="unknown model family 'keras'") as err:
        load(tmp_path)
    assert isinstance(err.value, UserError)


# -- 11: settings as users write them ----------------------------------------------------------------------


@pytest.mark.parametrize("written, setting", [
    ("Linf", "autoattack_linf"), ("LINF", "autoattack_linf"), ("l2", "autoattack_l2"), ("L1", "autoattack_l1"),
    ("AutoAttack_L2", "autoattack_l2"), ("Test", "test"), (" common ", "common"),
])
def test_white_box_settings_are_read_in_any_case(written, setting):
    assert white_box_setting(written) == setting


def test_unknown_setting_is_refused():
    with pytest.raises(RecordError, match="unknown white-box setting 'l3'"):
        white_box_setting("l3")


def test_benchmark_takes_settings_in_any_case(mini_dir, tmp_path):
    """"Linf" passes the settings check; the model is then refused for its logits, before anything is written."""
    five = small_cnn(num_classes=5)
    with pytest.raises(EvaluationError, match=r"logits of shape \(1, 5\) for one image, the test split has 10"):
        rgb.benchmark(five, "mini", source=str(mini_dir), settings=["Test", "Linf"], output_dir=tmp_path,
                      progress=False)
    assert not any(tmp_path.iterdir())


# -- 19: AutoAttack's labels -------------------------------------------------------------------------------


@pytest.mark.parametrize("labels, message", [
    (lambda y: y.float(), "integer class indices, got dtype torch.float32"),
    (lambda y: y == 1, "integer class indices, got dtype torch.bool"),
    (lambda y: torch.where(torch.arange(len(y)) == 3, 10, y), r"labels must lie in \[0, 10\).*y\[3\] = 10"),
    (lambda y: torch.where(torch.arange(len(y)) == 0, -1, y), r"y\[0\] = -1, 1 label\(s\) outside"),
])
def test_autoattack_refuses_labels_that_are_no_class_of_the_model(trained_mlp, labels, message):
    x, y = separable_data(8, seed=1)
    with raises_one_line(UserError, match=message):
        AutoAttack(trained_mlp, "Linf", 0.01, attacks=["apgd-ce"]).run(x, labels(y))


class InfLogits(nn.Module):
    def forward(self, x):
        logits = torch.zeros(len(x), 10)
        logits[:, 2] = float("inf")
        return logits


def test_autoattack_refuses_infinite_logits():
    x, y = separable_data(8, seed=1)
    with pytest.raises(AttackError, match="NaN/inf logits"):
        AutoAttack(InfLogits(), "Linf", 0.01).run(x, y)


# -- 21: damaged files -------------------------------------------------------------------------------------


def truncate(path):
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def test_truncated_text_feature_cache_entry_is_rebuilt(tmp_path, caplog):
    from rgb.models import load_clip
    from rgb.models.embedded_clip import EMBEDDED_ARCH, register_embedded_architecture
    from rgb.zeroshot.text import TextFeatureCache

    register_embedded_architecture()
    clip = load_clip(EMBEDDED_ARCH)
    texts = ["a photo of a zero.", "a photo of a one."]
    fresh = TextFeatureCache(clip, tmp_path).features(texts)
    (entry,) = tmp_path.glob("*.safetensors")
    truncate(entry)
    cache = TextFeatureCache(clip, tmp_path)
    with caplog.at_level(logging.WARNING):
        again = cache.features(texts)
    assert torch.equal(again, fresh) and cache.computed == len(texts)
    assert f"text-feature cache entry {entry} does not read" in caplog.text
    assert torch.equal(TextFeatureCache(clip, tmp_path).features(texts), fresh)  # rewritten whole


def test_truncated_embedded_clip_checkpoint_is_called_corrupt(tmp_path, mini_dir):
    from rgb.models import load_clip
    from rgb.models.embedded_clip import (
        CAPTION_TEMPLATES, DEFAULTS, EMBEDDED_ARCH, ensure_embedded_clip, register_embedded_architecture,
        save_checkpoint,
    )

    register_embedded_architecture()
    clip = load_clip(EMBEDDED_ARCH)
    weights = save_checkpoint(clip.model, clip.preprocess, tmp_path, {**DEFAULTS, "templates": list(CAPTION_TEMPLATES)})
    truncate(weights)
    with raises_one_line(CorruptFileError, match=f"embedded CLIP checkpoint {weights} is corrupt .*: delete") as err:
        ensure_embedded_clip(tmp_path, mini_dir)
    assert isinstance(err.value, UserError)
    with raises_one_line(CorruptFileError, match=f"CLIP weights file {weights} is corrupt") as err:
        load_clip(EMBEDDED_ARCH, weights=str(weights))


@pytest.mark.parametrize("content", [b"not a checkpoint at all" * 4, "truncated"])
def test_corrupt_timm_weights_file_is_called_corrupt_without_torch_advice(tmp_path, content):
    path = tmp_path / "weights.pth"
    if content == "truncated":
        torch.save(create_model("test_resnet", 2, pretrained=False).state_dict(), path)
        truncate(path)
    else:
        path.write_bytes(content)
    with raises_one_line(CorruptFileError, match=f"weights file {path} is corrupt") as err:
        create_model("test_resnet", 2, weights=str(path))
    assert "weights_only" not in str(err.value)


# -- 23: the model's classes against the dataset's -----------------------------------------------------------


def test_evaluate_refuses_other_class_names_and_other_logit_counts(mini_dir, tmp_path):
    dm = datamodule(mini_dir)
    names = dm.split("test").class_names
    options = scoring(tmp_path / "attack", tmp_path / "eval")
    model = small_cnn()
    swapped = [names[1], names[0], *names[2:]]
    message = re.escape(f"class 0 is {swapped[0]!r}, the test split's is {names[0]!r}")
    with pytest.raises(EvaluationError, match=message):
        evaluate_model(model, {"dataset": "digits", "class_names": swapped}, tmp_path / "w", dm, options)
    with pytest.raises(EvaluationError, match=r"logits of shape \(1, 5\)"):
        evaluate_model(small_cnn(num_classes=5), {"dataset": "digits"}, tmp_path / "w", dm, options)
    assert not (tmp_path / "eval").exists()


def test_attack_refuses_a_model_with_other_logit_counts_or_infinite_logits(mini_dir, tmp_path, compose):
    from rgb.commands.attack import attack_from_config

    five, infinite = small_cnn(num_classes=5), small_cnn()
    with torch.no_grad():
        infinite.head.bias[3] = float("inf")
    for name, model, message in (("five", five, r"logits of shape \(1, 5\)"), ("inf", infinite, "NaN/inf logits")):
        run = tmp_path / name
        kwargs = {"num_classes": model.head.out_features}
        export_factory_model(model, run, "user_models:small_cnn", kwargs, meta={"dataset": "digits"})
        cfg = compose("attack", f"run={run}", f"paths.mini_dir={mini_dir}", f"output_dir={tmp_path / 'out'}",
                      "norms=[linf]")
        with pytest.raises(AttackRunError, match=message):
            attack_from_config(cfg)
    assert not (tmp_path / "out").exists()


def test_a_run_directory_without_results_is_adopted_by_the_next_run(tmp_path):
    """A run that died before its first batch (a broken model) leaves only run.json: the fixed model's run goes on;
    once a batch exists, the directory is refused to another run."""
    identity = {"weights_sha256": "bad", "n_images": 4, "batch_size": 2}
    RunDirectory(tmp_path, identity).claim()
    fixed = RunDirectory(tmp_path, {**identity, "weights_sha256": "fixed"})
    fixed.claim()
    assert json.loads((tmp_path / MANIFEST).read_text())["weights_sha256"] == "fixed"
    fixed.save(0, 1, 0, {"image_id": torch.arange(2)})
    with pytest.raises(AttackRunError, match="made for another run: weights_sha256 'fixed'"):
        RunDirectory(tmp_path, identity).claim()

