"""A train run's export on W&B: its parameter counts in the config (as lightning-hydra-template logs them) and the
export as a `model` artifact (model.json and what it records; the weights by file:// reference unless uploading
them is asked), aliased by the weights' hash so that an evaluation declares the very weights it scored."""

from __future__ import annotations

from pathlib import Path

from lightning.pytorch.loggers import Logger, WandbLogger

from rgb.core.files import distinct_name, file_sha256, sha256_alias
from rgb.models import META_FILE, WEIGHTS_FILE
from rgb.core.exportfiles import read_model_record

# What the artifact's metadata keeps of model.json: what the model is, never a path of this machine.
ARTIFACT_METADATA = ("run_name", "dataset", "num_classes", "image_size", "family", "loss", "strategy", "epochs",
                     "seed", "weights", "parameters", "card")


def wandb_logger(loggers: list[Logger]) -> WandbLogger | None:
    return next((logger for logger in loggers if isinstance(logger, WandbLogger)), None)


def params_hyperparams(counts: dict[str, int]) -> dict[str, int]:
    """`model/params/total`, `.../trainable`, `.../non_trainable`."""
    return {f"model/params/{key}": value for key, value in counts.items()}


def export_wandb_record(loggers: list[Logger], run_name: str) -> dict | None:
    """What model.json records of the W&B run that logs the export (None: no W&B logger): its project, id and the
    name of the `model` artifact it logs."""
    logger = wandb_logger(loggers)
    if logger is None:
        return None
    run = logger.experiment
    return {"project": run.project, "id": run.id, "artifact": f"model-{distinct_name(run_name)}"}


def log_export(loggers: list[Logger], run_dir: Path, log_weights: bool) -> str | None:
    """Log the export in `run_dir` as the artifact its model.json names (`wandb.artifact`), the artifact's metadata
    read from that model.json (what the export records, not what the request asked); returns `name:alias`."""
    import wandb

    logger = wandb_logger(loggers)
    record = read_model_record(run_dir / META_FILE) if logger is not None else {}
    if not record.get("wandb"):
        return None
    weights = run_dir / WEIGHTS_FILE
    sha256 = file_sha256(weights)
    artifact = wandb.Artifact(record["wandb"]["artifact"], type="model", metadata={
        **{key: record.get(key) for key in ARTIFACT_METADATA}, "weights_sha256": sha256,
        "weights_uploaded": log_weights})
    artifact.add_file(str(run_dir / META_FILE), name=META_FILE)
    if log_weights:
        artifact.add_file(str(weights), name=WEIGHTS_FILE)
    else:
        artifact.add_reference(weights.resolve().as_uri(), name=WEIGHTS_FILE)
    alias = sha256_alias(sha256)
    logger.experiment.log_artifact(artifact, aliases=["latest", alias])
    return f"{artifact.name}:{alias}"
