"""Send an evaluation to Weights & Biases: every number of the scores record, a settings table, the plots and
scores.json as an artifact; and a pool's leaderboard: its table and its files (the site too) as an artifact.

Works offline (WANDB_MODE=offline writes real run files to sync later); the run id derives from the output
directory, so re-evaluating the same model (or re-ranking the same pool) updates the same W&B run.
"""

from __future__ import annotations

import logging
from pathlib import Path

import wandb

from rgb.core.files import distinct_name, stable_id
from rgb.evaluation.leaderboard import Leaderboard, table_rows
from rgb.evaluation.records import ATTACK_SETTING_NORMS, PROTOCOLS, ScoresRecord
from rgb.evaluation.scores import record_sum

log = logging.getLogger(__name__)

# What the W&B reports leave out, said once per run that logs artifacts. No train run logs its export as an
# artifact, so there is none to `use_artifact` (W&B refuses use_artifact offline anyway): the scores artifact's
# metadata names the weights' sha256 and the train run (its dir and W&B id) instead.
SKIPPED = ("W&B skipped: model weights are not uploaded (the scores artifact's metadata names their sha256 and the "
           "train run), attack results stay on disk (their summaries are in the attack runs)")
LEADERBOARD_FILES = ("leaderboard.md", "leaderboard.csv", "leaderboard.json", "leaderboard.png", "seeds.md",
                     "seeds.json")


def log_evaluation(record: ScoresRecord, out_dir: Path, project: str, job_type: str = "evaluate",
                   train: dict | None = None) -> Path:
    """Log one scores record (its `metrics()` as the run summary, with each protocol's status beside its score as
    the leaderboard marks it); returns the local W&B run directory. `train`: the training run it scores (its
    dir, W&B id, sweep, weights hash), in the config."""
    run = wandb.init(project=project, name=f"{record.model.run_name}@{record.dataset}", group=record.dataset,
                     job_type=job_type, dir=str(out_dir), id=stable_id(out_dir), resume="allow",
                     config={"model": record.model.to_json(), "eps": record.eps, "train": train})
    try:
        statuses = {protocol: record_sum(record, protocol).status_line() for protocol in PROTOCOLS
                    if record.score_under(protocol) is not None}
        run.summary.update({**record.metrics(), **{f"{protocol}/status": s for protocol, s in statuses.items()}})
        table = wandb.Table(columns=["setting", "accuracy", "correct", "total", "partial", "eps", "status"])
        for setting, acc in record.white_box.settings.items():
            norm = ATTACK_SETTING_NORMS.get(setting)
            table.add_data(setting, *((acc.value, acc.correct, acc.total, acc.partial) if acc else (None,) * 4),
                           record.eps.get(norm.key) if norm else None, statuses["white_box"])
        logged = {"settings": table}
        for plot in record.plots:
            logged[f"plots/{Path(plot).stem}"] = wandb.Image(str(out_dir / plot))
        run.log(logged)
        scores = wandb.Artifact(f"scores-{distinct_name(record.model.run_name or '?', record.dataset)}",
                                type="scores", metadata={"weights_sha256": record.model.weights_sha256,
                                                         "train": train, "partial": record.partial})
        scores.add_file(str(out_dir / record.file_name))
        run.log_artifact(scores)
        log.info("%s", SKIPPED)
        return Path(run.dir).parent
    finally:
        run.finish()


def log_leaderboard(board: Leaderboard, leaderboard_dir: Path, project: str) -> Path:
    """Log a pool's leaderboard: its rows as a W&B table (leaderboard.csv's columns and numbers), the Sum and
    Borda of each model in the summary, and its files (and site/, when written) as a `leaderboard` artifact."""
    run = wandb.init(project=project, name=f"leaderboard:{board.protocol}", job_type="leaderboard",
                     dir=str(leaderboard_dir), id=stable_id(leaderboard_dir), resume="allow",
                     config={"protocol": board.protocol, "datasets": board.datasets, "rank_by": board.rank_by})
    try:
        columns, rows = table_rows(board)
        run.log({"leaderboard": wandb.Table(columns=columns, data=[[row[c] for c in columns] for row in rows])})
        run.summary.update({f"{row.model}/{key}": value for row in board.rows for key, value in (
            ("partial_sum", row.sum.partial_sum), ("borda", row.borda), ("status", row.sum.status_line()))})
        files = wandb.Artifact(f"leaderboard-{board.protocol}", type="leaderboard",
                               metadata={"datasets": board.datasets, "rank_by": board.rank_by})
        for name in LEADERBOARD_FILES:
            if (leaderboard_dir / name).is_file():
                files.add_file(str(leaderboard_dir / name))
        for folder in ("model_info", "site"):
            if (leaderboard_dir / folder).is_dir():
                files.add_dir(str(leaderboard_dir / folder), name=folder)
        run.log_artifact(files)
        log.info("%s", SKIPPED)
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
