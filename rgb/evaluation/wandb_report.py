"""Send an evaluation to Weights & Biases: every number of the scores record, a settings table, the plots and
scores.json as an artifact (using the train run's `model` artifact); and a pool's leaderboard: both boards as tables and
its files (the site too) as an artifact (using the scores artifacts it read).

Works offline (WANDB_MODE=offline writes real run files to sync later); the run id derives from the output
directory, so re-evaluating the same model (or re-ranking the same pool) updates the same W&B run.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

import wandb

from rgb.core.files import distinct_name, file_sha256, sha256_alias
from rgb.data.catalog import WHITE_BOX
from rgb.evaluation.exports import MODEL_INFO_DIR
from rgb.evaluation.leaderboard import LEADERBOARD_FILES, Leaderboard, table_rows
from rgb.evaluation.records import ATTACK_SETTING_NORMS, PROTOCOLS, ScoresRecord
from rgb.evaluation.scores import record_sum
from rgb.evaluation.site import SITE_DIR
from rgb.runs.store import wandb_run_under
from rgb.runs.wandb_report import wandb_run

log = logging.getLogger(__name__)

# What the W&B reports leave out, said once per run that logs artifacts.
SKIPPED = ("W&B skipped: model weights are not uploaded (the train run's `model` artifact holds them by reference; "
           "log_weights=true at train time uploads them), attack results stay on disk (their summaries are in the "
           "attack runs)")
LEADERBOARD_GROUP = "leaderboard"


def use_inputs(run, inputs: list[str]) -> list[str]:
    """Declare the artifacts (`name:alias`) this run read: its lineage. Online, each is a `use_artifact`; offline W&B
    refuses use_artifact, so the intent is kept in the run's config (`inputs`, always written) and declared when the
    same command runs online after `wandb sync` (the run id is the same: it resumes the synced run)."""
    inputs = [name for name in dict.fromkeys(inputs) if name]
    if not inputs:
        return []
    run.config.update({"inputs": inputs}, allow_val_change=True)
    if run.offline:
        log.info("W&B offline: inputs %s recorded in the config; after `wandb sync`, run the command again online "
                 "to declare them", ", ".join(inputs))
        return inputs
    for name in inputs:
        try:
            run.use_artifact(name)
        except (wandb.errors.CommError, ValueError) as err:  # not synced yet, or logged to another project
            log.warning("W&B: input %s not found (%s): sync its run, then run this command again", name, err)
    return inputs


def scores_artifact(record: ScoresRecord) -> str:
    """The name of the artifact an evaluation logs its scores.json as."""
    return f"scores-{distinct_name(record.model.run_name or '?', record.dataset)}"


def logged_scores(records: dict[Path, ScoresRecord]) -> list[str]:
    """`name:alias` of the scores artifacts of a pool's records that were logged (their eval folder holds the W&B
    run that logged them), aliased by the file's hash: the very version read."""
    return [f"{scores_artifact(record)}:{sha256_alias(file_sha256(file))}" for file, record in records.items()
            if wandb_run_under(file.parent)]


def log_evaluation(record: ScoresRecord, out_dir: Path, project: str, job_type: str = "evaluate",
                   train: dict | None = None) -> Path:
    """Log one scores record (its `metrics()` as the run summary, with each protocol's status beside its score as
    the leaderboard marks it); returns the local W&B run directory. `train`: the training run it scores (its
    dir, W&B id, sweep, weights hash), in the config."""
    config = {"model": record.model.to_json(), "eps": record.eps, "train": train}
    # tags to filter the project's runs by: the dataset, each protocol the record is scored under, the family
    tags = [record.dataset, *(p for p in PROTOCOLS if record.score_under(p) is not None), record.model.family]
    with wandb_run(project, out_dir, name=f"{record.model.run_name}@{record.dataset}", job_type=job_type,
                   group=record.dataset, tags=[str(t)[:64] for t in dict.fromkeys(tags) if t], config=config) as run:
        statuses = {protocol: record_sum(record, protocol).status_line() for protocol in PROTOCOLS
                    if record.score_under(protocol) is not None}
        run.summary.update({**record.metrics(), **{f"{protocol}/status": s for protocol, s in statuses.items()}})
        table = wandb.Table(columns=["setting", "accuracy", "correct", "total", "partial", "eps", "status"])
        for setting, acc in record.white_box.settings.items():
            norm = ATTACK_SETTING_NORMS.get(setting)
            table.add_data(setting, *((acc.value, acc.correct, acc.total, acc.partial) if acc else (None,) * 4),
                           record.eps.get(norm.key) if norm else None, statuses[WHITE_BOX])
        logged = {"settings": table}
        for plot in record.plots:
            logged[f"plots/{Path(plot).stem}"] = wandb.Image(str(out_dir / plot))
        run.log(logged)
        scores = wandb.Artifact(scores_artifact(record), type="scores",
                                metadata={"weights_sha256": record.model.weights_sha256, "train": train,
                                          "partial": record.partial})
        scores.add_file(str(out_dir / record.file_name))
        use_inputs(run, [(train or {}).get("model_artifact")])
        run.log_artifact(scores, aliases=["latest", sha256_alias(file_sha256(out_dir / record.file_name))])
        log.info("%s", SKIPPED)
        return Path(run.dir).parent


def log_leaderboard(board: Leaderboard, leaderboard_dir: Path, project: str, others: Sequence[Leaderboard] = (),
                    inputs: Sequence[str] = ()) -> Path:
    """Log a pool's leaderboard: its rows as a W&B table (leaderboard.csv's columns and numbers), the Sum and
    Borda of each model in the summary, and its files (and site/, when written) as a `leaderboard` artifact; the
    pool's other boards (the other protocol) as tables `boards/<protocol>` and summaries `<protocol>/<model>/...`.
    `inputs`: the scores artifacts the pool read (use_inputs)."""
    config = {"protocol": board.protocol, "datasets": board.datasets, "rank_by": board.rank_by,
              "boards": [board.protocol, *(other.protocol for other in others)]}
    with wandb_run(project, leaderboard_dir, name=f"leaderboard:{board.protocol}", job_type="leaderboard",
                   group=LEADERBOARD_GROUP, tags=[board.protocol, *board.datasets][:64], config=config) as run:
        logged = {}
        for shown in (board, *others):
            columns, rows = table_rows(shown)
            key = "leaderboard" if shown is board else f"boards/{shown.protocol}"
            logged[key] = wandb.Table(columns=columns, data=[[row[c] for c in columns] for row in rows])
            prefix = "" if shown is board else f"{shown.protocol}/"
            run.summary.update({f"{prefix}{row.model}/{key}": value for row in shown.rows for key, value in (
                ("partial_sum", row.sum.partial_sum), ("borda", row.borda), ("status", row.sum.status_line()))
                if value is not None})  # no Borda outside a ranking, no partial Sum of nothing measured
        run.log(logged)
        use_inputs(run, list(inputs))
        files = wandb.Artifact(f"leaderboard-{board.protocol}", type="leaderboard",
                               metadata={"datasets": board.datasets, "rank_by": board.rank_by})
        for name in LEADERBOARD_FILES:
            if (leaderboard_dir / name).is_file():
                files.add_file(str(leaderboard_dir / name))
        for folder in (MODEL_INFO_DIR, SITE_DIR):
            if (leaderboard_dir / folder).is_dir():
                files.add_dir(str(leaderboard_dir / folder), name=folder)
        run.log_artifact(files)
        log.info("%s", SKIPPED)
        return Path(run.dir).parent


def log_text_robustness(result, project: str) -> Path:
    """Log one model's text robustness (rgb.evaluation.text_robustness.TextRobustnessResult): the summary and
    classification view as tables, their numbers as the run summary, the plots as images."""
    out_dir = result.out_dir
    config = {key: result.record[key] for key in ("model", "weights_sha256", "dataset", "split", "queries", "types",
                                                  "seeds", "ks", "p")}
    with wandb_run(project, out_dir, name=f"{result.model}@text_robustness", job_type="text_robustness",
                   group=result.record["dataset"], config=config) as run:
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
