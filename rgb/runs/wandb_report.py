"""attack.py's W&B run: per norm the accuracy after each stage of the cascade, the throughput and the summary.

Works offline (WANDB_MODE=offline); the run id derives from the attack's output dir, so a requeued shard that
merges, or a repeated command, updates the same W&B run. Its config names the training run of the model.
"""

from __future__ import annotations

from pathlib import Path

from rgb.core.files import stable_id
from rgb.runs.store import RunSummary, train_reference


def log_attack(summaries: dict[str, RunSummary], output_dir: Path, project: str) -> Path:
    """Log the merged budgets of one attack run; returns the local W&B run directory."""
    import wandb

    first = next(iter(summaries.values()))
    settings = {k: getattr(first, k) for k in ("impl", "version", "standard", "attacks", "seed", "precision",
                                               "batch_size", "threads", "split", "split_sha256")}
    run = wandb.init(project=project, name=f"attack:{first.run_name}@{first.dataset}", group=first.dataset,
                     job_type="attack", dir=str(output_dir), id=stable_id(output_dir), resume="allow",
                     config={"train": train_reference(first.run, first.weights_sha256), "attack": settings,
                             "eps": {norm: s.eps for norm, s in summaries.items()}})
    try:
        for norm, summary in summaries.items():
            stages = wandb.Table(columns=["stage", "accuracy"], data=list(map(list, summary.accuracy_after.items())))
            run.log({f"{norm}/accuracy_after": stages})
            run.summary.update({
                f"{norm}/robust_accuracy": summary.robust_accuracy, f"{norm}/clean_accuracy": summary.clean_accuracy,
                f"{norm}/images_per_second": summary.throughput(), f"{norm}/attack_seconds": summary.attack_seconds,
                f"{norm}/forward_rows_per_image": summary.forward_rows_per_image,
                f"{norm}/backward_rows_per_image": summary.backward_rows_per_image, f"{norm}/n": summary.n,
                **{f"{norm}/accuracy_after/{stage}": value for stage, value in summary.accuracy_after.items()},
            })
        return Path(run.dir).parent
    finally:
        run.finish()
