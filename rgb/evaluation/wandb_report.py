"""Send an evaluation (or a leaderboard) to Weights & Biases: summary metrics, tables and the PNG plots.

Works offline (WANDB_MODE=offline writes real run files to sync later); the run id derives from the output
directory, so re-evaluating the same model updates the same W&B run.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import wandb


def run_id(out_dir: Path) -> str:
    return hashlib.sha1(str(Path(out_dir).resolve()).encode()).hexdigest()[:16]


def log_evaluation(record: dict, out_dir: Path, project: str, job_type: str = "evaluate") -> Path:
    """Log one scores.json record; returns the local W&B run directory."""
    name = f"{record['model']['run_name']}@{record['dataset']}"
    run = wandb.init(project=project, name=name, group=record["dataset"], job_type=job_type, dir=str(out_dir),
                     id=run_id(out_dir), resume="allow", config={"model": record["model"], "eps": record["eps"]})
    try:
        summary = {"white_box/score": record["white_box"]["score"]}
        table = wandb.Table(columns=["setting", "accuracy", "correct", "total", "partial"])
        for setting, acc in record["white_box"]["settings"].items():
            if acc is not None:
                summary[f"white_box/{setting}"] = acc["accuracy"]
                table.add_data(setting, acc["accuracy"], acc["correct"], acc["total"], acc["partial"])
            else:
                table.add_data(setting, None, None, None, None)
        if "black_box" in record:
            summary["black_box/score"] = record["black_box"]["score"]
        for setting, cw in record["class_wise"].items():
            for key in ("worst_1", "harmonic_mean", "geometric_mean"):
                summary[f"class_wise/{setting}/{key}"] = cw[key]
        run.summary.update(summary)
        logged = {"settings": table}
        for plot in record.get("plots", []):
            logged[f"plots/{Path(plot).stem}"] = wandb.Image(str(out_dir / plot))
        run.log(logged)
        return Path(run.dir).parent
    finally:
        run.finish()
