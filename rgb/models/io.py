"""Exported models: `model.safetensors` (weights) + `model.json` (family, how to rebuild it, what it was trained on)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import safetensors.torch
import timm
import torch
from torch import nn

import rgb
from rgb.core import atomic_write_json
from rgb.models.families import DEFAULT_FAMILY, family_named, family_of
from rgb.models.user_factory import build_from_factory

WEIGHTS_FILE = "model.safetensors"
META_FILE = "model.json"


def library_versions() -> dict[str, str]:
    """Recorded next to every result: numbers depend on them."""
    return {"torch": torch.__version__, "timm": timm.__version__, "rgb": rgb.__version__}


def write_export(model: nn.Module, out_dir: str | Path, record: dict) -> Path:
    """Weights, then the record plus library versions (each written whole: temp file + rename); the record last,
    so a model.json always has its weights beside it. The record must say how to rebuild (or name) the model."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    weights = out_dir / WEIGHTS_FILE
    tmp = weights.with_name(f"{weights.name}.tmp.{os.getpid()}")
    safetensors.torch.save_model(model, str(tmp), metadata={"format": "pt"})
    os.replace(tmp, weights)
    atomic_write_json(out_dir / META_FILE, {**record, "versions": library_versions()})
    return weights


def export_model(model: nn.Module, out_dir: str | Path, meta: dict) -> Path:
    """Write `model.safetensors` and `model.json` (family, its rebuild fields, versions, plus the caller's `meta`)."""
    family = family_of(model)
    return write_export(model, out_dir, {**meta, "family": family.name, **family.describe(model)})


def export_factory_model(model: nn.Module, out_dir: str | Path, factory: str, kwargs: dict | None = None,
                         meta: dict | None = None) -> Path:
    """Export any `nn.Module` on [0,1] images: `factory` ("module:function") called with `kwargs` rebuilds it.

    The factory is called once here, so a record that would not load is refused now rather than at attack time."""
    kwargs = dict(kwargs or {})
    rebuilt = build_from_factory(factory, kwargs)
    mine, theirs = model.state_dict(), rebuilt.state_dict()
    if mine.keys() != theirs.keys() or any(mine[k].shape != theirs[k].shape for k in mine):
        raise ValueError(f"factory {factory!r} builds a module whose state_dict does not match the model's")
    return write_export(model, out_dir, {**(meta or {}), "family": "factory", "factory": factory, "kwargs": kwargs})


def _locate(path: Path) -> tuple[Path, Path]:
    if path.is_dir():
        weights, meta = path / WEIGHTS_FILE, path / META_FILE
    else:
        weights, meta = path, path.with_suffix(".json")
    for needed in (weights, meta):
        if not needed.is_file():
            raise FileNotFoundError(f"{needed} not found (rgb.models.load needs {WEIGHTS_FILE} and {META_FILE})")
    return weights, meta


def rebuild(record: dict) -> nn.Module:
    """The architecture of an export record (or a model's `recipe` plus `family`), weights not loaded."""
    return family_named(record.get("family", DEFAULT_FAMILY)).rebuild(record)


def rebuild_like(model: nn.Module) -> nn.Module:
    """A fresh copy of `model`'s architecture (weights not copied), e.g. to load a checkpoint's state into."""
    family = family_of(model)
    return family.rebuild(family.describe(model))


def load_with_meta(path: str | Path) -> tuple[nn.Module, dict]:
    """(eval-mode model for [0,1] inputs, export record) from a train run dir or an exported safetensors file.
    A record without `family` is a timm export (written before families existed)."""
    weights, meta_file = _locate(Path(path))
    meta = json.loads(meta_file.read_text())
    meta.setdefault("family", DEFAULT_FAMILY)
    model = rebuild(meta)
    safetensors.torch.load_model(model, str(weights), strict=True)
    return model.eval(), meta


def origin_line(meta: dict) -> str | None:
    """Where an exported model's weights came from, in one line (evaluate.py logs it): the hub / local-dir name and
    revision it was made from, and for CLIP which file or tag each tower came from; None when there is nothing
    beyond the architecture's name."""
    parts = []
    source = meta.get("source")
    if source:
        where = source.get("revision") or source.get("path")
        parts.append(f"from {source['name']}" + (f" (revision {where})" if where else ""))
    for tower, origin in (meta.get("towers") or {}).items():
        parts.append(f"{tower} tower: {origin}")
    return "; ".join(parts) or None


def load(path: str | Path) -> nn.Module:
    """Eval-mode model for [0,1] inputs from a train run dir or an exported `model.safetensors`."""
    return load_with_meta(path)[0]
