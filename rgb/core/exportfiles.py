"""The two files of an exported model, where they lie, and the one reader of its record: plain Python, no torch, so a
command can find and read a run's record (and say what is wrong with its config) before the model stack loads.
rgb.models.io writes them and reads the weights."""

from __future__ import annotations

from pathlib import Path

from rgb.core.files import CorruptFileError
from rgb.core.jsonrecord import RecordError, check_fields, read_json

WEIGHTS_FILE = "model.safetensors"
META_FILE = "model.json"


class ExportFileError(CorruptFileError):
    """An exported model whose model.json or model.safetensors does not read (truncated, overwritten): named."""


def export_paths(run: str | Path) -> tuple[Path, Path]:
    """(weights file, model.json) of an export: a train run dir, or an exported weights file (its record beside
    it, same stem). Neither need exist."""
    run = Path(str(run))
    if run.is_dir():
        return run / WEIGHTS_FILE, run / META_FILE
    return run, run.with_suffix(".json")


# The keys of a model.json rgb reads as values, and their types (checked when the record is read; the family's
# own rebuild fields are checked by its rebuild).
RECORD_TYPES = {"family": str, "num_classes": int, "class_names": list[str], "run_name": str | None,
                "dataset": str | None, "image_size": int | None, "epochs": int | None,
                "parameters": dict[str, int] | None, "training": dict | None, "card": dict | None,
                "sweep": dict | None, "wandb": dict | None}


def read_model_record(meta_file: Path) -> dict:
    """The export record of a model.json, its one reader: anything but a JSON object whose recorded keys have
    their types (a directory, invalid JSON, a list, `epochs` as a string) is one ExportFileError naming the file."""
    meta = read_json(meta_file, ExportFileError, "export the model again (train.py writes it)")
    try:
        check_fields(meta, RECORD_TYPES)
    except RecordError as err:
        raise ExportFileError(f"{meta_file}: {err}; export the model again (train.py writes it)") from None
    return meta
