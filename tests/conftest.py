"""Shared fixtures: no network, offline W&B, and one mini benchmark build per test session."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session", autouse=True)
def _config_resolvers():
    """The `${rgb.*:...}` config resolvers, as every entry point registers them."""
    from rgb.cli import register_resolvers

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
    from toy_models import train_mlp

    return train_mlp()


@pytest.fixture(scope="session")
def toy(trained_mlp):
    """The trained toy MLP with 32 held-out images it classifies (almost) perfectly."""
    from toy_models import separable_data

    return trained_mlp, *separable_data(32, seed=1)
