"""Pools of evaluated models: the Sum score (pool-independent) and Borda points (rank-based within the pool).

A model is a run name (the same recipe trained on each dataset); its records are the per-dataset scores.json
files written by evaluate.py. The Sum is over the benchmark's datasets (the card's six unless told otherwise) x
the protocol's settings; anything less is shown partial with its denominator. Borda uses the same datasets.
Rows are ranked by `rank_by` (Borda, as in the paper, or Sum); both are shown. Output: leaderboard.md (one row
per model, then the accuracies per setting), .csv, .json, .png and one model_info JSON per (model, dataset).
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from rgb.core.files import atomic_write_bytes
from rgb.evaluation.plots import leaderboard_figure, save
from rgb.evaluation.records import PROTOCOLS, JsonRecord, ProtocolScore, RecordError, ScoresRecord
from rgb.evaluation.scores import BENCHMARK_DATASETS, SumScore, borda_scores, sum_score


class LeaderboardError(ValueError):
    """A pool that cannot be ranked (no records, two records of one model on one dataset, a bad ranking key)."""


@dataclass(frozen=True)
class LeaderboardRow(JsonRecord):
    model: str
    rank: int
    borda: float
    sum: SumScore
    per_dataset: dict[str, ProtocolScore | None]
    non_standard: dict[str, list[str]]  # dataset -> "linf 0.1200 (plus)" lines, shown beside, never scored


# Ranking keys (smaller sorts first); ties fall back to the other score, then the name.
RANK_KEYS: dict[str, Callable[[LeaderboardRow], tuple]] = {
    "borda": lambda r: (-r.borda, r.sum.score is None, -r.sum.partial_sum, r.model),
    "sum": lambda r: (r.sum.score is None, -r.sum.partial_sum, -r.borda, r.model),
}


@dataclass(frozen=True)
class Leaderboard(JsonRecord):
    protocol: str
    datasets: list[str]
    rank_by: str
    rows: list[LeaderboardRow]
    borda_pairs: int
    borda_excluded_pairs: list[list[str]]
    ignored: list[str]  # records of datasets outside `datasets` (not counted), as "model@dataset"

    @property
    def settings(self) -> tuple[str, ...]:
        return PROTOCOLS[self.protocol]


def find_records(paths) -> dict[Path, ScoresRecord]:
    """Every scores.json under the given files or directories (recursively), by file."""
    records = {}
    for path in map(Path, paths):
        files = [path] if path.is_file() else sorted(path.rglob("scores.json"))
        if not files:
            raise FileNotFoundError(f"no scores.json in {path}")
        for file in files:
            records[file] = ScoresRecord.load(file)
    return records


def build_leaderboard(pool: Mapping[Path, ScoresRecord], protocol: str = "white_box",
                      datasets: Sequence[str] | None = None, rank_by: str = "borda") -> Leaderboard:
    """Rows ranked by `rank_by`; a model missing a (dataset, setting) shows it as missing, never as 0."""
    if rank_by not in RANK_KEYS:
        raise LeaderboardError(f"rank_by must be one of {list(RANK_KEYS)}, got {rank_by!r}")
    if protocol not in PROTOCOLS:
        raise LeaderboardError(f"protocol must be one of {list(PROTOCOLS)}, got {protocol!r}")
    datasets = list(BENCHMARK_DATASETS if datasets is None else datasets)
    by_model: dict[str, dict[str, ScoresRecord]] = {}
    files: dict[tuple[str, str], Path] = {}
    ignored = []
    for file, record in pool.items():
        name = record.model.run_name or "?"
        if (name, record.dataset) in files:
            raise LeaderboardError(f"two records for model {name!r} on {record.dataset!r}: "
                                   f"{files[name, record.dataset]} and {file}")
        files[name, record.dataset] = file
        by_model.setdefault(name, {})
        if record.dataset in datasets:
            by_model[name][record.dataset] = record
        else:
            ignored.append(f"{name}@{record.dataset}")
    if not by_model:
        raise LeaderboardError("no scores records in the pool")
    scores = {m: {d: recs[d].protocol(protocol) if d in recs else None for d in datasets}
              for m, recs in by_model.items()}
    values = {m: {(d, s): a.value for d, score in per.items() if score for s, a in score.scored.items()}
              for m, per in scores.items()}
    borda = borda_scores(values)
    rows = [
        LeaderboardRow(
            model=m, rank=0, borda=borda["points"][m], sum=sum_score(scores[m], datasets, protocol),
            per_dataset=scores[m],
            non_standard={d: [f"{n} {a.robust} ({a.label()})" for n, a in r.non_standard.items()]
                          for d, r in by_model[m].items() if r.non_standard},
        )
        for m in by_model
    ]
    rows.sort(key=RANK_KEYS[rank_by])
    rows = [replace(row, rank=i) for i, row in enumerate(rows, start=1)]
    return Leaderboard(protocol, datasets, rank_by, rows, len(borda["pairs"]),
                       [list(p) for p in borda["excluded_pairs"]], ignored)


def model_info(record: ScoresRecord) -> dict:
    """One RobustBench-style record per (model, dataset)."""
    wb = record.white_box.settings
    accuracy = {s: (a.value if a else None) for s, a in wb.items()}
    return {
        "name": record.model.run_name, "architecture": record.model.name, "family": record.model.family,
        "training": {"loss": record.model.loss, "strategy": record.model.strategy},
        "weights_sha256": record.model.weights_sha256, "dataset": record.dataset,
        "clean_acc": accuracy["test"], "common_acc": accuracy["common"],
        "autoattack_acc": {n: accuracy[f"autoattack_{n}"] for n in ("l1", "l2", "linf")},
        "eps": record.eps, "seed": {n: a.seed for n, a in record.attacks.items()},
        "settings": {s: (a.to_json() if a else None) for s, a in wb.items()}, "score": record.white_box.score,
        "versions": record.versions,
    }


def _points(value: float) -> str:
    """Borda points are multiples of 0.5: 18 or 18.5, never 18.0000."""
    return f"{value:.1f}".removesuffix(".0")


def _dataset_cell(score: ProtocolScore | None) -> str:
    if score is None:
        return "missing"
    if score.complete:
        return f"{score.score:.2f}"
    return f"{sum(a.value for a in score.scored.values()):.2f} ({len(score.scored)}/{score.max})"


def markdown_table(header: list[str], rows: list[list[str]], align: list[str]) -> list[str]:
    """The lines of a markdown table; `align` holds one `---` / `---:` marker per column."""
    return ["| " + " | ".join(header) + " |", "|" + "|".join(align) + "|",
            *("| " + " | ".join(row) + " |" for row in rows)]


def to_markdown(board: Leaderboard) -> str:
    """Ranking first (one row per model), then every accuracy, one row per (model, dataset)."""
    n_settings = len(board.settings)
    max_sum = n_settings * len(board.datasets)
    header = ["rank", "model", "Borda", f"Sum (/{max_sum})"] + [f"{d} (/{n_settings})" for d in board.datasets]
    rows = [[str(r.rank), r.model, _points(r.borda), r.sum.describe()]
            + [_dataset_cell(r.per_dataset[d]) for d in board.datasets] for r in board.rows]
    lines = [f"# Leaderboard ({board.protocol}), ranked by {board.rank_by}", ""]
    lines += markdown_table(header, rows, ["---:", "---", "---:", "---:"] + ["---:"] * len(board.datasets))
    other = next(k for k in ("borda", "sum") if k != board.rank_by)
    lines += ["", f"Ranked by {board.rank_by} (rank_by={other} ranks by {other.capitalize()}). Sum over "
                  f"{len(board.datasets)} datasets x {n_settings} settings = {max_sum}; a partial Sum shows its "
                  f"total / settings scored. Borda over the {board.borda_pairs} (dataset, setting) pairs every "
                  f"model has" + (f"; {len(board.borda_excluded_pairs)} pairs excluded (missing for some model)"
                                  if board.borda_excluded_pairs else "") + "."]
    outside = [d for d in board.datasets if d not in BENCHMARK_DATASETS]
    if outside:
        lines += ["", f"Outside the card's six datasets (your own or the mini data; not RobustGenBench scores): "
                      f"{', '.join(outside)}."]
    if board.ignored:
        lines += ["", f"Not counted (dataset outside this leaderboard's list): {', '.join(board.ignored)}."]
    detail_rows = []
    for r in board.rows:
        for d in board.datasets:
            score = r.per_dataset[d]
            if score is None:
                continue
            cells = [f"{score.settings[s].value:.4f}" if score.settings.get(s) else "missing" for s in board.settings]
            detail_rows.append([r.model, d, *cells, "; ".join(r.non_standard.get(d, [])) or "-"])
    lines += ["", "## Accuracy per setting", ""]
    lines += markdown_table(["model", "dataset", *board.settings, "non-standard (not scored)"], detail_rows,
                    ["---", "---"] + ["---:"] * n_settings + ["---"])
    return "\n".join(lines) + "\n"


def to_csv(board: Leaderboard) -> str:
    buffer = io.StringIO()
    columns = ["rank", "model", "borda", "sum", "partial_sum", "covered", "max"]
    columns += [f"{d}/{s}" for d in board.datasets for s in board.settings] + ["missing"]
    writer = csv.DictWriter(buffer, fieldnames=columns)
    writer.writeheader()
    for r in board.rows:
        row = {"rank": r.rank, "model": r.model, "borda": r.borda, "sum": r.sum.score,
               "partial_sum": r.sum.partial_sum, "covered": r.sum.covered, "max": r.sum.max,
               "missing": ";".join(r.sum.missing)}
        for d in board.datasets:
            settings = r.per_dataset[d].settings if r.per_dataset[d] else {}
            row.update({f"{d}/{s}": (settings[s].value if settings.get(s) else None) for s in board.settings})
        writer.writerow(row)
    return buffer.getvalue()


def write_leaderboard(pool: Mapping[Path, ScoresRecord], out_dir: Path, protocol: str = "white_box",
                      datasets: Sequence[str] | None = None, rank_by: str = "borda") -> Leaderboard:
    board = build_leaderboard(pool, protocol, datasets, rank_by)
    out_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(out_dir / "leaderboard.md", to_markdown(board).encode())
    atomic_write_bytes(out_dir / "leaderboard.csv", to_csv(board).encode())
    atomic_write_bytes(out_dir / "leaderboard.json", (json.dumps(board.to_json(), indent=2) + "\n").encode())
    for record in pool.values():
        info = model_info(record)
        (out_dir / "model_info" / record.dataset).mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(out_dir / "model_info" / record.dataset / f"{info['name']}.json",
                           (json.dumps(info, indent=2) + "\n").encode())
    per_model = {r.model: {d: (s.score / s.max if s and s.complete else None) for d, s in r.per_dataset.items()}
                 for r in board.rows}
    save(leaderboard_figure(per_model, f"{protocol}: mean accuracy over the {len(board.settings)} settings, per "
                                       f"dataset (ranked by {rank_by})"), out_dir / "leaderboard.png")
    return board


__all__ = ["Leaderboard", "LeaderboardError", "LeaderboardRow", "RecordError", "build_leaderboard", "find_records",
           "to_markdown", "write_leaderboard"]
