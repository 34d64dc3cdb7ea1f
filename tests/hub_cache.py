"""A local Hugging Face Hub cache in the standard layout (models--ORG--NAME/blobs/, snapshots/REV/FILE linking to
its blob, refs/main), its repos written by the libraries' own writers (timm's and open_clip's `save_for_hf`, what
their push_to_hf_hub uploads), so that hub names load through the libraries' own loaders with HF_HUB_OFFLINE=1."""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

import timm
from torch import nn

REVISION = "0123456789abcdef0123456789abcdef01234567"


def write_repo(cache: Path, repo_id: str, write: Callable[[Path], object], revision: str = REVISION) -> Path:
    """The snapshot of `repo_id` holding what `write(folder)` puts in an empty folder: each file becomes a blob
    (named by its content) that the snapshot links to, as huggingface_hub stores a download."""
    repo = Path(cache) / f"models--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / revision
    snapshot.mkdir(parents=True, exist_ok=True)
    (repo / "blobs").mkdir(exist_ok=True)
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(revision)
    with tempfile.TemporaryDirectory() as tmp:
        write(Path(tmp))
        for file in sorted(Path(tmp).iterdir()):
            blob = repo / "blobs" / hashlib.sha256(file.read_bytes()).hexdigest()
            file.replace(blob)
            (snapshot / file.name).symlink_to(os.path.relpath(blob, snapshot))
    return snapshot


def timm_writer(model: nn.Module, **save_kwargs) -> Callable[[Path], None]:
    """timm's own export of `model` (config.json with model_args and pretrained_cfg, model.safetensors);
    `save_kwargs` go to timm's save_for_hf (e.g. data_config: the preprocessing the weights were trained with)."""
    return lambda folder: timm.models.save_for_hf(model, str(folder), safe_serialization=True, **save_kwargs)


def save_open_clip(model: nn.Module, model_config: dict, folder: Path, skip_weights: bool = False) -> None:
    """open_clip's own export of `model` (open_clip_config.json, open_clip_model.safetensors). Its writer also
    saves the tokenizer; a model with open_clip's built-in BPE tokenizer (the mini CLIP's) has no tokenizer files
    (open_clip ships the vocabulary), so there is nothing to save for it."""
    import open_clip
    from open_clip.push_to_hf_hub import save_for_hf

    class BuiltInTokenizer(open_clip.SimpleTokenizer):
        def save_pretrained(self, dest):
            pass

    save_for_hf(model, BuiltInTokenizer(), model_config, str(folder), safe_serialization=True,
                skip_weights=skip_weights)


def use_cache(monkeypatch, cache: Path) -> None:
    """Point huggingface_hub (already imported, offline) at `cache`, as HF_HUB_CACHE does for a new process."""
    import huggingface_hub.constants as constants

    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
