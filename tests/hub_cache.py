"""A local Hugging Face Hub cache in the standard layout (models--ORG--NAME/snapshots/REV/, refs/main), written by
tests so that hub names load through the libraries' own loaders with HF_HUB_OFFLINE=1."""

from __future__ import annotations

import json
from pathlib import Path

import safetensors.torch

REVISION = "0123456789abcdef0123456789abcdef01234567"


def write_repo(cache: Path, repo_id: str, files: dict[str, object], revision: str = REVISION) -> Path:
    """Write a repo snapshot: dict values are JSON, tensors dicts go to safetensors, bytes are written as is."""
    repo = Path(cache) / f"models--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / revision
    snapshot.mkdir(parents=True, exist_ok=True)
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(revision)
    for name, content in files.items():
        path = snapshot / name
        if name.endswith(".safetensors"):
            safetensors.torch.save_file({k: v.contiguous() for k, v in content.items()}, str(path))
        elif isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(json.dumps(content))
    return snapshot


def use_cache(monkeypatch, cache: Path) -> None:
    """Point huggingface_hub (already imported, offline) at `cache`, as HF_HUB_CACHE does for a new process."""
    import huggingface_hub.constants as constants

    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
