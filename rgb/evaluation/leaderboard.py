"""Pools of evaluated models: Sum score (pool-independent) and Borda score (rank-based within the pool).

A model is a run name (the same recipe trained on each dataset); its records are the per-dataset scores.json
files written by evaluate.py. Output: leaderboard.md / .csv / .json and one model_info JSON per (model, dataset).
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

from rgb.evaluation.attack_run import atomic_write_bytes
from rgb.evaluation.metrics import Accuracy
from rgb.evaluation.plots import settings_bars
from rgb.evaluation.scores import PROTOCOLS, borda_scores, sum_score


def find_records(paths) -> list[dict]:
    """Every scores.json under the given files or directories (recursively)."""
    records = []
    for path in map(Path, paths):
        files = [path] if path.is_file() else sorted(path.rglob("scores.json"))
        if not files:
            raise FileNotFoundError(f"no scores.json in {path}")
        for file in files:
            record = json.loads(file.read_text())
            record["_file"] = str(file)
            records.append(record)
    return records


def _accuracies(record: dict, protocol: str) -> dict[str, Accuracy | None]:
    block = record.get(protocol, {}).get("settings", {})
    return {s: (Accuracy(v["correct"], v["total"], v["partial"]) if v else None) for s, v in block.items()}


def build_leaderboard(records: list[dict], protocol: str = "white_box", datasets=None) -> dict:
    """Rows sorted by Sum score; a model missing a (dataset, setting) shows it as missing, never as 0."""
    by_model: dict[str, dict[str, dict]] = {}
    for record in records:
        name = record["model"]["run_name"]
        if record["dataset"] in by_model.setdefault(name, {}):
            raise ValueError(f"two records for model {name!r} on {record['dataset']!r}: "
                             f"{by_model[name][record['dataset']]['_file']} and {record['_file']}")
        by_model[name][record["dataset"]] = record
    datasets = sorted({r["dataset"] for r in records}) if datasets is None else list(datasets)
    settings = PROTOCOLS[protocol]
    values = {m: {(d, s): a.value for d, rec in recs.items() for s, a in _accuracies(rec, protocol).items() if a}
              for m, recs in by_model.items()}
    borda = borda_scores(values)
    rows = []
    for model, recs in by_model.items():
        per_dataset = {d: _accuracies(recs[d], protocol) if d in recs else {} for d in datasets}
        total = sum_score(per_dataset, datasets, protocol)
        rows.append({
            "model": model, "sum": total["score"], "partial_sum": total["partial_sum"], "max": total["max"],
            "missing": total["missing"], "partial": total["partial"], "borda": borda["points"][model],
            **{f"{d}/{s}": (per_dataset[d].get(s).value if per_dataset[d].get(s) else None)
               for d in datasets for s in settings},
        })
    rows.sort(key=lambda r: (r["sum"] is None, -(r["sum"] if r["sum"] is not None else r["partial_sum"])))
    return {"protocol": protocol, "datasets": datasets, "settings": list(settings), "rows": rows,
            "borda_pairs": len(borda["pairs"]), "borda_excluded_pairs": [list(p) for p in borda["excluded_pairs"]]}


def model_info(record: dict) -> dict:
    """One RobustBench-style record per (model, dataset)."""
    wb = record["white_box"]["settings"]
    attacks = record.get("attacks", {})
    return {
        "name": record["model"]["run_name"], "timm_name": record["model"]["timm_name"],
        "training": {"loss": record["model"]["loss"], "strategy": record["model"]["strategy"]},
        "weights_sha256": record["model"]["weights_sha256"], "dataset": record["dataset"],
        "clean_acc": (wb.get("test") or {}).get("accuracy"), "common_acc": (wb.get("common") or {}).get("accuracy"),
        "autoattack_acc": {n: (wb.get(f"autoattack_{n}") or {}).get("accuracy") for n in ("l1", "l2", "linf")},
        "eps": record["eps"], "seed": {n: a.get("seed") for n, a in attacks.items()},
        "settings": wb, "score": record["white_box"]["score"], "versions": record["versions"],
    }


def _fmt(value) -> str:
    return "missing" if value is None else f"{value:.4f}" if isinstance(value, float) else str(value)


def to_markdown(board: dict) -> str:
    columns = ["model", "sum", "borda"] + [f"{d}/{s}" for d in board["datasets"] for s in board["settings"]]
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for row in board["rows"]:
        shown = dict(row)
        if row["sum"] is None:
            shown["sum"] = f"incomplete ({row['partial_sum']:.4f}, {len(row['missing'])} missing)"
        lines.append("| " + " | ".join(_fmt(shown[c]) for c in columns) + " |")
    lines.append("")
    lines.append(f"Sum: max {board['rows'][0]['max'] if board['rows'] else 0}; Borda over {board['borda_pairs']} "
                 f"(dataset, setting) pairs every model has"
                 + (f"; {len(board['borda_excluded_pairs'])} pairs excluded (missing for some model)"
                    if board["borda_excluded_pairs"] else "") + ".")
    return "\n".join(lines) + "\n"


def _mean_over_datasets(row: dict, datasets: list[str], setting: str) -> float | None:
    values = [row[f"{d}/{setting}"] for d in datasets]
    return None if any(v is None for v in values) else sum(values) / len(values)


def write_leaderboard(records: list[dict], out_dir: Path, protocol: str = "white_box") -> dict:
    board = build_leaderboard(records, protocol)
    out_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(out_dir / "leaderboard.md", to_markdown(board).encode())
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=[k for k in board["rows"][0] if k != "missing"] + ["missing"])
    writer.writeheader()
    for row in board["rows"]:
        writer.writerow({**row, "missing": ";".join(row["missing"])})
    atomic_write_bytes(out_dir / "leaderboard.csv", buffer.getvalue().encode())
    atomic_write_bytes(out_dir / "leaderboard.json", (json.dumps(board, indent=2) + "\n").encode())
    for record in records:
        info = model_info(record)
        (out_dir / "model_info" / record["dataset"]).mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(out_dir / "model_info" / record["dataset"] / f"{info['name']}.json",
                           (json.dumps(info, indent=2) + "\n").encode())
    settings_bars({row["model"]: {s: _mean_over_datasets(row, board["datasets"], s) for s in board["settings"]}
                   for row in board["rows"]}, out_dir / "leaderboard.png",
                  f"{protocol} pool: accuracy per setting, mean over {len(board['datasets'])} dataset(s)")
    return board
