"""A train run dir that one process owns, that remembers which config it was made for, and whose checkpoints are
whole or absent.

- `run.lock`: an exclusive `flock` held while a run trains. The kernel drops it when its process dies, so a lock
  left by a killed run on this host is simply taken over; a live holder is named (pid, host) in the refusal.
- `run.json`: the training identity of the first start (rgb.commands.train_config) and one record per start (time, host,
  threads, devices, resumed checkpoint). A start under another identity is refused, naming the differing keys.
- `AtomicCheckpointIO`: Lightning checkpoints via temp file + rename (a full disk leaves the previous checkpoint),
  and a checkpoint that does not load is named in one line.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import socket
import time
from pathlib import Path

import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
from lightning.pytorch.callbacks import Callback

from rgb.core import atomic_write_bytes, atomic_write_json
from rgb.core.files import flock, tensor_file_problem
from rgb.core.rundir import MANIFEST, IdentityManifest, changes_line, identity_changes
from rgb.models import WEIGHTS_FILE
from rgb.core.values import flatten
from rgb.training.config import TrainingError

log = logging.getLogger(__name__)

LOCK_FILE = "run.lock"
CHECKPOINT_DIR = "checkpoints"
HYDRA_RECORD = ".hydra"
# Module hyper-parameters that change speed only (float rounding), never the training: may differ on resume.
SPEED_HPARAMS = ("channels_last", "compile")


def _holder(lock_file: Path) -> str:
    try:
        record = json.loads(lock_file.read_text() or "{}")
    except (OSError, ValueError):
        record = {}
    return f"pid {record.get('pid', '?')} on host {record.get('host', '?')} (since {record.get('since', '?')})"


@contextlib.contextmanager
def locked(run_dir: Path):
    """Hold `<run_dir>/run.lock` for the block; refuse in one line when another live process holds it."""
    run_dir.mkdir(parents=True, exist_ok=True)
    lock_file = run_dir / LOCK_FILE
    try:
        handle = flock(lock_file)  # never truncated before it is held: the holder's record stays readable
    except OSError as err:
        raise TrainingError(f"cannot lock {lock_file} ({err.strerror}): this filesystem has no flock") from err
    if handle is None:
        raise TrainingError(
            f"{run_dir} is in use by another training run: {_holder(lock_file)}; wait for it to finish or "
            f"choose another run_name"
        )
    try:
        record = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.strftime("%Y-%m-%dT%H:%M:%S")}
        handle.seek(0)
        handle.truncate()
        handle.write(json.dumps(record) + "\n")
        handle.flush()
        yield
    finally:
        handle.close()  # releases the flock


def start_record(threads: int, accelerator: str, devices: int, num_nodes: int, precision: str,
                 resumed_from: str | None) -> dict:
    """What this start ran on: recorded in run.json and, through it, in model.json."""
    return {
        "started": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "host": socket.gethostname(),
        "threads": threads,
        "accelerator": accelerator,
        "devices": devices,
        "num_nodes": num_nodes,
        "precision": precision,
        "resumed_from": resumed_from,
    }


def write_hydra_record(run_dir: Path, files: dict[str, bytes]) -> None:
    """The `.hydra/` record (config.yaml, hydra.yaml, overrides.yaml: rgb.commands.train reads them from Hydra) of
    a start whose identity run.json accepted. Hydra itself would write it before the run starts
    (conf/hydra/default.yaml turns that off), so a refused start would rewrite the record of the config that
    trained the weights. No files: train() called from Python, there is no Hydra run to record."""
    if not files:
        return
    record = run_dir / HYDRA_RECORD
    record.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        atomic_write_bytes(record / name, text)


def _training_identity_in(record) -> dict | None:
    if isinstance(record, dict) and record.get("task") == "train" and "identity" in record:
        return record["identity"]
    return None


class RunManifest:
    """`run.json` of a train run dir: {"task": "train", "identity": {...}, "starts": [...]}."""

    def __init__(self, run_dir: Path, elsewhere: str = "another run_name"):
        """`elsewhere`: where a refused start goes instead (a sweep job: another sweep_name=)."""
        self.run_dir = Path(run_dir)
        self.manifest = IdentityManifest(self.run_dir, "a training run", _training_identity_in, TrainingError,
                                         "was made by another training config", elsewhere)

    def claim(self, identity: dict) -> dict:
        """The stored record, (re)written now if nothing in the run dir was trained yet; refuse another identity
        once checkpoints or weights exist, and checkpoints that no record describes (a run dir from before
        run.json, or foreign files)."""
        checkpoints = sorted((self.run_dir / CHECKPOINT_DIR).glob("*.ckpt"))
        made = [f"checkpoints ({checkpoints[0].name}, ...)"] if checkpoints else []
        made += [WEIGHTS_FILE] if (self.run_dir / WEIGHTS_FILE).is_file() else []
        if made and not self.manifest.path.is_file():
            raise TrainingError(
                f"{self.run_dir} holds {' and '.join(made)} but no {MANIFEST}, so the config that made them is "
                f"unknown; {self.manifest.start_over}"
            )
        # A new record on the first start, or after earlier starts that failed before training anything.
        return self.manifest.claim({"task": "train", "identity": identity, "starts": []}, holds_results=bool(made))

    def add_start(self, record: dict, start: dict) -> dict:
        record = {**record, "starts": [*record.get("starts", []), start]}
        atomic_write_json(self.manifest.path, record)
        return record


def unreadable_checkpoint(path) -> TrainingError:
    """The file named, with why it does not read in a few words (rgb.core.files): never torch's advice to
    unpickle it anyway."""
    reason = tensor_file_problem(Path(path)) or "it does not read"
    return TrainingError(
        f"cannot read checkpoint {path} ({reason}); it is truncated or not a checkpoint: delete it to start this run "
        f"over, or pass ckpt_path=<another checkpoint of this run>"
    )


def load_checkpoint_file(path, map_location="cpu") -> dict:
    """A Lightning checkpoint, weights-only (plain values); an unreadable file is a one-line TrainingError."""
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except FileNotFoundError:
        raise
    except Exception:  # truncated zip, foreign pickle, ...: name the file, never a 46-line traceback
        raise unreadable_checkpoint(path) from None


class SameHyperparameters(Callback):
    """Refuse to resume from a checkpoint written under other hyper-parameters than this run's module (an explicit
    ckpt_path from another run; run.json already guards the run dir's own checkpoints)."""

    def on_load_checkpoint(self, trainer, pl_module, checkpoint: dict) -> None:
        def recipe(hparams) -> dict:
            return {k: v for k, v in flatten(dict(hparams)).items() if k not in SPEED_HPARAMS}

        changes = identity_changes(recipe(checkpoint.get("hyper_parameters", {})), recipe(pl_module.hparams))
        if changes:
            raise TrainingError(
                f"the checkpoint to resume from was trained with other hyper-parameters: "
                f"{changes_line(changes)}; resume from a checkpoint of this config, or pass ckpt_path=null"
            )


class AtomicCheckpointIO(TorchCheckpointIO):
    """Checkpoints written whole (serialised in memory, temp file in the same dir, rename) and read weights-only."""

    def save_checkpoint(self, checkpoint: dict, path, storage_options=None) -> None:
        if storage_options is not None:
            raise TypeError(f"{type(self).__name__} takes no storage_options")
        buffer = io.BytesIO()
        torch.save(checkpoint, buffer)
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(Path(path), buffer.getvalue())

    def load_checkpoint(self, path, map_location=lambda storage, loc: storage, weights_only=None) -> dict:
        if not Path(path).is_file():
            raise FileNotFoundError(f"checkpoint {path} not found")
        return load_checkpoint_file(path, map_location=map_location)
