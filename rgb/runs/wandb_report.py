"""attack.py's W&B run: per norm the accuracy after each stage of the cascade, the throughput and the summary.

Works offline (WANDB_MODE=offline); the run id derives from the attack's output dir, so a requeued shard that
merges, or a repeated command, updates the same W&B run. Its config names the training run of the model.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from pathlib import Path

from rgb.core.files import stable_id
from rgb.runs.store import RunSummary, train_reference


@contextlib.contextmanager
def wandb_run(project: str, directory: Path, *, name: str, job_type: str, group: str, config: dict,
              tags: Sequence[str] | None = None) -> Iterator:
    """The one way rgb opens a W&B run (attack, evaluation, leaderboard, text robustness): its files under
    `directory` (offline ones sync later), its id derived from `directory` and resumed, so a repeated or requeued
    command updates the same run; finished when the block ends, also after an error."""
    import wandb

    run = wandb.init(project=project, name=name, group=group, job_type=job_type, tags=tags, dir=str(directory),
                     id=stable_id(directory), resume="allow", config=config)
    try:
        yield run
    finally:
        run.finish()


def log_attack(summaries: dict[str, RunSummary], output_dir: Path, project: str) -> Path:
    """Log the merged budgets of one attack run; returns the local W&B run directory."""
    import wandb

    first = next(iter(summaries.values()))
    settings = {k: getattr(first, k) for k in ("impl", "version", "standard", "attacks", "seed", "precision",
                                               "batch_size", "threads", "split", "split_sha256")}
    config = {"train": train_reference(first.run, first.weights_sha256), "attack": settings,
              "eps": {norm: s.eps for norm, s in summaries.items()}}
    with wandb_run(project, output_dir, name=f"attack:{first.run_name}@{first.dataset}", job_type="attack",
                   group=first.dataset, config=config) as run:
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
