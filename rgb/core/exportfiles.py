"""The two files of an exported model and where they lie: plain names, no torch, so a command can find a run's
record (and say what is wrong with its config) before the model stack loads. rgb.models.io writes and reads them."""

from __future__ import annotations

from pathlib import Path

WEIGHTS_FILE = "model.safetensors"
META_FILE = "model.json"


def export_paths(run: str | Path) -> tuple[Path, Path]:
    """(weights file, model.json) of an export: a train run dir, or an exported weights file (its record beside
    it, same stem). Neither need exist."""
    run = Path(str(run))
    if run.is_dir():
        return run / WEIGHTS_FILE, run / META_FILE
    return run, run.with_suffix(".json")
