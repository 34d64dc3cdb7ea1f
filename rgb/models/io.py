"""Exported models: `model.safetensors` (weights) + `model.json` (how to rebuild it, and what it was trained on)."""

from __future__ import annotations

import json
from pathlib import Path

import safetensors.torch
import timm
import torch

import rgb
from rgb.models.factory import NormalizedClassifier, create_model

WEIGHTS_FILE = "model.safetensors"
META_FILE = "model.json"


def library_versions() -> dict[str, str]:
    """Recorded next to every result: numbers depend on them."""
    return {"torch": torch.__version__, "timm": timm.__version__, "rgb": rgb.__version__}


def export_model(model: NormalizedClassifier, out_dir: str | Path, meta: dict) -> Path:
    """Write `model.safetensors` and `model.json` (recipe, mean/std, versions, plus the caller's `meta`)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    record = {
        **meta,
        "timm_name": model.recipe["name"],
        "num_classes": model.recipe["num_classes"],
        "timm_kwargs": model.recipe["timm_kwargs"],
        "mean": model.mean,
        "std": model.std,
        "versions": library_versions(),
    }
    safetensors.torch.save_model(model, str(out_dir / WEIGHTS_FILE), metadata={"format": "pt"})
    (out_dir / META_FILE).write_text(json.dumps(record, indent=2) + "\n")
    return out_dir / WEIGHTS_FILE


def _locate(path: Path) -> tuple[Path, Path]:
    if path.is_dir():
        weights, meta = path / WEIGHTS_FILE, path / META_FILE
    else:
        weights, meta = path, path.with_suffix(".json")
    for needed in (weights, meta):
        if not needed.is_file():
            raise FileNotFoundError(f"{needed} not found (rgb.models.load needs {WEIGHTS_FILE} and {META_FILE})")
    return weights, meta


def load_with_meta(path: str | Path) -> tuple[NormalizedClassifier, dict]:
    """(eval-mode model for [0,1] inputs, export record) from a train run dir or an exported safetensors file."""
    weights, meta_file = _locate(Path(path))
    meta = json.loads(meta_file.read_text())
    model = create_model(meta["timm_name"], meta["num_classes"], pretrained=False, **meta["timm_kwargs"])
    safetensors.torch.load_model(model, str(weights), strict=True)
    return model.eval(), meta


def load(path: str | Path) -> NormalizedClassifier:
    """Eval-mode model for [0,1] inputs from a train run dir or an exported `model.safetensors`."""
    return load_with_meta(path)[0]
