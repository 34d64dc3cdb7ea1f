"""Send an evaluation to Weights & Biases: every number of the scores record, a settings table and the plots.

Works offline (WANDB_MODE=offline writes real run files to sync later); the run id derives from the output
directory, so re-evaluating the same model updates the same W&B run.
"""

from __future__ import annotations

from pathlib import Path

import wandb

from rgb.core.files import stable_id
from rgb.evaluation.records import ScoresRecord


def log_evaluation(record: ScoresRecord, out_dir: Path, project: str, job_type: str = "evaluate",
                   train: dict | None = None) -> Path:
    """Log one scores record (its `metrics()` as the run summary); returns the local W&B run directory. `train`:
    the training run it scores (its dir, W&B id, sweep, weights hash), in the config."""
    run = wandb.init(project=project, name=f"{record.model.run_name}@{record.dataset}", group=record.dataset,
                     job_type=job_type, dir=str(out_dir), id=stable_id(out_dir), resume="allow",
                     config={"model": record.model.to_json(), "eps": record.eps, "train": train})
    try:
        run.summary.update(record.metrics())
        table = wandb.Table(columns=["setting", "accuracy", "correct", "total", "partial"])
        for setting, acc in record.white_box.settings.items():
            table.add_data(setting, *((acc.value, acc.correct, acc.total, acc.partial) if acc else (None,) * 4))
        logged = {"settings": table}
        for plot in record.plots:
            logged[f"plots/{Path(plot).stem}"] = wandb.Image(str(out_dir / plot))
        run.log(logged)
        return Path(run.dir).parent
    finally:
        run.finish()


def log_text_robustness(result, project: str) -> Path:
    """Log one model's text robustness (rgb.evaluation.text_robustness.TextRobustnessResult): the summary and
    classification view as tables, their numbers as the run summary, the plots as images."""
    out_dir = result.out_dir
    run = wandb.init(project=project, name=f"{result.model}@text_robustness", group=result.record["dataset"],
                     job_type="text_robustness", dir=str(out_dir), id=stable_id(out_dir), resume="allow",
                     config={key: result.record[key] for key in ("model", "weights_sha256", "dataset", "split",
                                                                 "queries", "types", "seeds", "ks", "p")})
    try:
        run.summary.update({f"text_robustness/{row['perturbation_type']}/{key}": value
                            for row in result.summary for key, value in row.items()
                            if key not in ("perturbation_class", "perturbation_type")})
        logged = {}
        for name, rows in (("summary", result.summary), ("classification", result.classification)):
            if rows:
                table = wandb.Table(columns=list(rows[0]))
                for row in rows:
                    table.add_data(*row.values())
                logged[f"text_robustness/{name}"] = table
        for plot in result.plots:
            logged[f"text_robustness/plots/{Path(plot).stem}"] = wandb.Image(str(plot))
        run.log(logged)
        return Path(run.dir).parent
    finally:
        run.finish()
