"""Exported models: `model.safetensors` (weights) + `model.json` (family, how to rebuild it, what it was trained on)."""

from __future__ import annotations

import platform
from dataclasses import dataclass
from pathlib import Path

import safetensors.torch
from safetensors import SafetensorError
import timm
import torch
from torch import nn

import rgb
from rgb.core.errors import UserError
from rgb.core.exportfiles import META_FILE, WEIGHTS_FILE, ExportFileError, export_paths, read_model_record
from rgb.core.files import atomic_output, atomic_write_json, file_sha256
from rgb.core.values import ConfigValueError
from rgb.models.factory import ModelLoadError, ModelSpecError
from rgb.models.families import DEFAULT_FAMILY, family_of, family_of_record
from rgb.models.user_factory import FAMILY as FACTORY_FAMILY
from rgb.models.user_factory import build_from_factory


def library_versions() -> dict[str, str]:
    """Recorded next to every result: numbers depend on them."""
    return {"torch": torch.__version__, "timm": timm.__version__, "rgb": rgb.__version__}


def result_versions() -> dict[str, str]:
    """The libraries' versions and Python's: what a score or an attack run records it was made with."""
    return {**library_versions(), "python": platform.python_version()}


class ExportNotFoundError(UserError, FileNotFoundError):
    """A path given as an export (a run dir, or a weights file with its record beside it) that lacks one of them."""


class ExportConflictError(UserError, FileExistsError):
    """An export directory that already holds other weights (and the results made for them)."""


@dataclass(frozen=True)
class InMemoryModel:
    """A model handed over in Python (rgb.benchmark) with the record of its exported weights: attacked and scored
    as it is (its class may not be rebuildable from the record), the export tying its results to those weights."""

    module: nn.Module
    meta: dict


def write_export(model: nn.Module, out_dir: str | Path, record: dict, *, replace: bool = True) -> Path:
    """Weights, then the record plus library versions (each written whole: temp file + rename, mode per the
    umask); the record last, so a model.json always has its weights beside it. The record must say how to rebuild
    (or name) the model. `replace=False`: other weights already in `out_dir` are refused, nothing changed."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    weights = out_dir / WEIGHTS_FILE
    with atomic_output(weights) as tmp:
        safetensors.torch.save_model(model, str(tmp), metadata={"format": "pt"})
        if not replace and weights.is_file() and file_sha256(weights) != file_sha256(tmp):
            raise ExportConflictError(
                f"{out_dir} holds an export of other weights, which its results were made for: give this model "
                f"another name or delete {out_dir}"
            )
    atomic_write_json(out_dir / META_FILE, {**record, "versions": library_versions()})
    return weights


def export_meta(datamodule, names: dict, **fields) -> dict:
    """The caller's part of a model.json (the family's fields are added on export): the run's `names` (its
    `run_name`, and `sweep` for a job of a multirun), the data the model was made for (dataset, source, class
    names and their count, image size), then `fields` (how it was made). Every writer of model.json (training,
    zero-shot and api runs, rgb.benchmark) builds it here, so every record names its run and data alike."""
    class_names = list(datamodule.class_names)
    return {**names, "dataset": datamodule.dataset, "data_source": datamodule.source, "class_names": class_names,
            "num_classes": len(class_names), "image_size": datamodule.image_size, **fields}


def parameter_counts(model: nn.Module, trained: bool = True) -> dict[str, int]:
    """Total, trainable and non-trainable parameters, as lightning-hydra-template logs them (`model/params/*`):
    trainable are those that require grad when the run trains (`trained=False`, a head built from prompts: none)."""
    total = sum(p.numel() for p in model.parameters())
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad) if trained else 0
    return {"total": total, "trainable": trainable, "non_trainable": total - trainable}


def export_model(model: nn.Module, out_dir: str | Path, meta: dict) -> Path:
    """Write `model.safetensors` and `model.json` (family, its rebuild fields, versions, plus the caller's `meta`).
    A family without weights (`api`) gets the record alone; its path is returned then."""
    family = family_of(model)
    record = {**meta, "family": family.name, **family.describe(model)}
    if not family.weights:
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        atomic_write_json(Path(out_dir) / META_FILE, {**record, "versions": library_versions()})
        return Path(out_dir) / META_FILE
    return write_export(model, out_dir, record)


def export_factory_model(model: nn.Module, out_dir: str | Path, factory: str, kwargs: dict | None = None,
                         meta: dict | None = None) -> Path:
    """Export any `nn.Module` on [0,1] images: `factory` ("module:function") called with `kwargs` rebuilds it.

    The factory is called once here, so a record that would not load is refused now rather than at attack time.

    Example:
        >>> import json, torchvision
        >>> from rgb.models import export_factory_model
        >>> model = torchvision.models.squeezenet1_1(num_classes=10)  # trained as you like
        >>> weights = export_factory_model(model, "exports/squeezenet", factory="torchvision.models:squeezenet1_1",
        ...                                kwargs={"num_classes": 10})
        >>> weights.name, json.loads(weights.with_name("model.json").read_text())["factory"]
        ('model.safetensors', 'torchvision.models:squeezenet1_1')
    """
    kwargs = dict(kwargs or {})
    rebuilt = build_from_factory(factory, kwargs)
    mine, theirs = model.state_dict(), rebuilt.state_dict()
    if mine.keys() != theirs.keys() or any(mine[k].shape != theirs[k].shape for k in mine):
        raise ModelSpecError(f"factory {factory!r} with kwargs {kwargs} builds a module whose state_dict does not "
                             f"match the model's: give the factory and kwargs that build this model")
    return write_export(model, out_dir, {**(meta or {}), "family": FACTORY_FAMILY.name, "factory": factory,
                                         "kwargs": kwargs})


def _required(file: Path) -> Path:
    if not file.is_file():
        raise ExportNotFoundError(f"{file} not found (rgb.models.load needs {WEIGHTS_FILE} and {META_FILE})")
    return file


def rebuild(record: dict) -> nn.Module:
    """The architecture of an export record (or a model's `recipe` plus `family`), weights not loaded."""
    return family_of_record(record).rebuild(record)


def rebuild_like(model: nn.Module) -> nn.Module:
    """A fresh copy of `model`'s architecture (weights not copied), e.g. to load a checkpoint's state into."""
    family = family_of(model)
    return family.rebuild(family.describe(model))


def load_with_meta(path: str | Path) -> tuple[nn.Module, dict]:
    """(eval-mode model for [0,1] inputs, export record) from a train run dir or an exported safetensors file.
    A record without `family` is a timm export (written before families existed); a family without weights
    (`api`) is rebuilt from the record alone."""
    weights, meta_file = export_paths(path)
    meta = read_model_record(_required(meta_file) if not meta_file.is_dir() else meta_file)
    meta.setdefault("family", DEFAULT_FAMILY)
    try:
        model = rebuild(meta)
    except ModelLoadError as err:
        raise ModelLoadError(f"{meta_file}: {err}") from None
    except ConfigValueError as err:  # a recorded setting its family refuses (an endpoint's REDACTED secret)
        raise ConfigValueError(f"{meta_file}: {err}") from None
    if not family_of_record(meta).weights:
        return model, meta
    try:
        safetensors.torch.load_model(model, str(_required(weights)), strict=True)
    except SafetensorError as err:
        raise ExportFileError(f"{weights} is corrupt ({err}): truncated or not a safetensors file; export the "
                              f"model again") from None
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
    """Load an exported model: the architecture its model.json describes, with its weights, in eval mode.

    The model takes [0,1] images (normalisation inside). Which family rebuilds it is the record's `family`
    (timm for a record written before families existed); an endpoint (`api`) model is rebuilt from the record alone.

    Args:
        path: A train run dir (holding model.safetensors and model.json), or an exported weights file with its
            record beside it under the same stem (`x.safetensors`, `x.json`).

    Returns:
        The model, in eval mode.

    Raises:
        FileNotFoundError: The record or the weights file is missing.
        ExportFileError: The record or the weights file does not read (truncated, not JSON / safetensors).
        ModelLoadError: The record names no family this rgb can rebuild (unknown, or a module handed to
            rgb.benchmark in memory, which records no code to rebuild it).
        ConfigValueError: A setting the record holds is refused (an endpoint's secret recorded as REDACTED).
        ModelSpecError: A factory record whose `module:function` does not import or returns no module.

    Example:
        >>> import torch, torchvision, rgb
        >>> from rgb.models import export_factory_model
        >>> _ = export_factory_model(torchvision.models.squeezenet1_1(num_classes=10), "exports/squeezenet",
        ...                          factory="torchvision.models:squeezenet1_1", kwargs={"num_classes": 10})
        >>> model = rgb.load_model("exports/squeezenet")  # or a train run dir: outputs/train/digits/demo
        >>> model(torch.rand(2, 3, 32, 32)).shape
        torch.Size([2, 10])
    """
    return load_with_meta(path)[0]
