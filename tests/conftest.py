"""Shared fixtures: no network, offline W&B, one mini benchmark build per test session, Hydra configs of conf/, and
the models several test modules attack or score. Plain shared functions are in helpers.py."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

import helpers  # noqa: E402


@pytest.fixture(scope="session", autouse=True)
def _config_resolvers():
    """The `${rgb.*:...}` config resolvers, as every entry point registers them."""
    from rgb.commands.resolvers import register_resolvers

    register_resolvers()


@pytest.fixture(scope="session", autouse=True)
def _isolated_caches(tmp_path_factory):
    """Keep the Hugging Face Arrow cache of the tests out of the user's home."""
    os.environ["HF_DATASETS_CACHE"] = str(tmp_path_factory.mktemp("hf_cache"))
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))


@pytest.fixture(scope="session")
def mini_dir(tmp_path_factory) -> Path:
    """The mini benchmark, built once per session (about a second)."""
    from rgb.data.mini import build_mini  # imported here: GPU machines may lack the data stack

    return build_mini(tmp_path_factory.mktemp("bench") / "mini")


@pytest.fixture(scope="session")
def compose():
    """`compose(name, *overrides, return_hydra_config=False)`: conf/<name>.yaml with the tests' defaults
    (helpers.TEST_DEFAULTS) and `overrides`, through Hydra's compose API (helpers.compose_config)."""
    return helpers.compose_config


def pytest_collection_modifyitems(config, items):
    if not torch.cuda.is_available():
        skip_gpu = pytest.mark.skip(reason="needs a CUDA device")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip_gpu)
    if os.environ.get("RGB_FAST") == "1":
        skip_slow = pytest.mark.skip(reason="slow test skipped (RGB_FAST=1)")
        for item in items:
            if "slow" in item.keywords:
                item.add_marker(skip_slow)


@pytest.fixture(scope="session")
def trained_mlp():
    from rgb.models.toy import train_mlp

    return train_mlp()


@pytest.fixture(scope="session")
def toy(trained_mlp):
    """The trained toy MLP with 32 held-out images it classifies (almost) perfectly."""
    from rgb.models.toy import separable_data

    return trained_mlp, *separable_data(32, seed=1)


@pytest.fixture(scope="session")
def surrogate(mini_dir, tmp_path_factory) -> Path:
    """Train run dir of the attack tests' small ViT (helpers.trained_surrogate), trained once per session."""
    return helpers.trained_surrogate(tmp_path_factory.getbasetemp(), mini_dir)


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory, mini_dir):
    """An untrained test_resnet exported as a train run of the mini benchmark (the evaluation tests' model)."""
    from rgb.models import create_model, export_model

    model = create_model("test_resnet", num_classes=10, pretrained=False)
    out = tmp_path_factory.mktemp("train") / "tiny-ce"
    export_model(model, out, {"dataset": "digits", "run_name": "tiny-ce", "loss": "ce", "strategy": "fft",
                              "image_size": 32})
    return out


@pytest.fixture(scope="module")
def clean_pred(tiny_run, mini_dir):
    """The tiny model's own predictions on test, as evaluate computes them (attack runs must agree)."""
    from rgb.evaluation.model_eval import predict
    from rgb.models import load_with_meta

    model, _ = load_with_meta(tiny_run)
    return predict(model.eval(), helpers.datamodule(mini_dir).split("test"), helpers.scoring(Path("-"), Path("-")),
                   "test")["pred"]
