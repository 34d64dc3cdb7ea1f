"""Pools of evaluated models: the Sum score (pool-independent) and Borda points (rank-based within the pool).

A model is a run name (the same recipe trained on each dataset); its records are the per-dataset scores.json
files written by evaluate.py. The Sum is over the benchmark's datasets (the card's six unless told otherwise) x
the protocol's settings; anything less is shown partial with its denominator. Borda uses the same datasets.
Complete entries (every setting a full number) are ranked first, by `rank_by` (Borda, as in the paper, or Sum;
both are shown) with Borda among themselves; incomplete ones (a setting missing, or scored over part of a split:
PARTIAL) are ranked apart, below them, with their own Borda over the pairs they share: a skim never crowns an
entry that was not fully scored. Output: leaderboard.md (one row per model, then the accuracies per setting),
.csv, .json, .png and one model_info JSON per (model, dataset) in rgb's format, plus the exports for other boards
(rgb.evaluation.exports: RobustBench's model_info/<dataset>/<norm>/, CLIP_benchmark's JSON of zero-shot models).
"""

from __future__ import annotations

import csv
import io
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import ClassVar

from rgb.core.errors import UserError
from rgb.core.files import DistinctFiles, atomic_write_bytes, atomic_write_json, distinct_name, is_staging
from rgb.core.values import shown_name
from rgb.data.catalog import BLACK_BOX, WHITE_BOX
from rgb.evaluation.exports import MODEL_INFO_DIR, plan_exports
from rgb.evaluation.records import (
    CLEAN_SETTING,
    COMMON_SETTING,
    PARTIAL_SCORES_FILE,
    PROTOCOLS,
    SCORES_FILE,
    JsonRecord,
    ProtocolScore,
    RecordError,
    ScoresRecord,
    WHITE_BOX_NORMS,
    attack_setting,
)
from rgb.evaluation.scores import BENCHMARK_DATASETS, OTHER_PROTOCOL, SumScore, borda_scores, sum_score


# A pool's board as files (write_leaderboard, write_seed_spread), named here alone: W&B logs LEADERBOARD_FILES as
# the board's artifact.
LEADERBOARD_MD = "leaderboard.md"
LEADERBOARD_CSV = "leaderboard.csv"
LEADERBOARD_JSON = "leaderboard.json"
LEADERBOARD_PNG = "leaderboard.png"
SEEDS_MD = "seeds.md"
SEEDS_JSON = "seeds.json"
LEADERBOARD_FILES = (LEADERBOARD_MD, LEADERBOARD_CSV, LEADERBOARD_JSON, LEADERBOARD_PNG, SEEDS_MD, SEEDS_JSON)


class LeaderboardError(UserError, ValueError):
    """A pool that cannot be ranked (no records, two records of one model on one dataset, a bad ranking key)."""


@dataclass(frozen=True)
class LeaderboardRow(JsonRecord):
    """One model of a board; `rank` and `borda` None outside every ranking (another protocol, nothing measured)."""

    model: str
    rank: int | None
    borda: float | None
    sum: SumScore
    per_dataset: dict[str, ProtocolScore | None]
    non_standard: dict[str, list[str]]  # dataset -> "linf 0.1200 (plus)" lines, shown beside, never scored
    DERIVED: ClassVar[tuple[str, ...]] = ("complete", "card_protocol", "status", "protocol_differences")

    @property
    def protocol_differences(self) -> dict[str, list[str]]:
        """dataset -> how its record departs from the card's protocol ("L2 1, card 2"): never ranked with card
        entries. The row's Sum holds them (SumScore: the one owner of a number's protocol status)."""
        return self.sum.protocol_differences

    @property
    def card_protocol(self) -> bool:
        return self.sum.card_protocol

    @property
    def complete(self) -> bool:
        """Every setting a full number, under the card's protocol: what may be ranked with the other entries."""
        return self.sum.complete and self.card_protocol

    @property
    def status(self) -> str:
        return self.sum.status

    @property
    def measured(self) -> bool:
        return self.sum.measured

    def protocol_label(self) -> str:
        return self.sum.protocol_label()


# The headings of the groups below the ranked entries, in leaderboard.md and on the site alike.
INCOMPLETE_HEADING = "Incomplete entries: ranked apart, below every complete entry"
OTHER_PROTOCOL_HEADING = "Under another protocol: shown, never in the Sum or Borda of card entries"
NOT_MEASURED_HEADING = "Nothing measured under this protocol: no rank, no Borda, no Sum"


# Ranking keys within a group (smaller sorts first); ties fall back to the other score, then the name.
RANK_KEYS: dict[str, Callable[[LeaderboardRow], tuple]] = {
    "borda": lambda r: (-r.borda, -r.sum.covered, -r.sum.partial_sum, r.model),
    "sum": lambda r: (-r.sum.covered, -r.sum.partial_sum, -r.borda, r.model),
}


@dataclass(frozen=True)
class Leaderboard(JsonRecord):
    protocol: str
    datasets: list[str]
    rank_by: str
    rows: list[LeaderboardRow]  # the complete entries first (ranks 1..), then the incomplete ones, then those
    # under another protocol and those with nothing measured under it (rank and Borda None: shown, never ranked)
    borda_pairs: int  # pairs of the complete entries' Borda (all of them)
    incomplete_borda_pairs: int  # pairs every incomplete entry has a full number for
    borda_excluded_pairs: list[list[str]]  # pairs some incomplete entry lacks: not in their Borda
    ignored: list[str]  # records of datasets outside `datasets` (not counted), as "model@dataset"
    # models the protocol cannot apply to (an API model under white_box): "n/a (API model)", never ranked or 0
    not_applicable: dict[str, str] = field(default_factory=dict)

    @property
    def settings(self) -> tuple[str, ...]:
        return PROTOCOLS[self.protocol]

    @property
    def complete_rows(self) -> list[LeaderboardRow]:
        return [r for r in self.rows if r.complete]

    @property
    def incomplete_rows(self) -> list[LeaderboardRow]:
        return [r for r in self.rows if not r.complete and r.card_protocol and r.measured]

    @property
    def other_protocol_rows(self) -> list[LeaderboardRow]:
        return [r for r in self.rows if not r.card_protocol and r.measured]

    @property
    def not_measured_rows(self) -> list[LeaderboardRow]:
        return [r for r in self.rows if not r.measured]


def find_records(paths) -> dict[Path, ScoresRecord]:
    """Every scores.json under the given files or directories (recursively), by file; never one inside a staging
    copy (`.NAME.new.PID`: an evaluation in progress, or one a kill left). A PARTIAL evaluation's
    scores.partial.json enters only when named as a file (and is then ranked apart, marked PARTIAL)."""
    records = {}
    for path in map(Path, paths):
        files = [path] if path.is_file() else sorted(f for f in path.rglob(SCORES_FILE)
                                                     if not any(map(is_staging, f.relative_to(path).parents)))
        if not files:
            partial = next(path.rglob(PARTIAL_SCORES_FILE), None) if path.is_dir() else None
            raise FileNotFoundError(f"no {SCORES_FILE} in {path}" + (
                f" (PARTIAL records such as {partial} enter only when named as files)" if partial else ""))
        for file in files:
            records[file] = ScoresRecord.load(file)
    return records


def build_leaderboard(pool: Mapping[Path, ScoresRecord], protocol: str = WHITE_BOX,
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
    stems = DistinctFiles()  # two models whose files would be one (names one in NFC) stop the pool here
    for file, record in pool.items():
        name = record.model.run_name or "?"
        if (name, record.dataset) in files:
            raise LeaderboardError(f"two records for model {name!r} on {record.dataset!r}: "
                                   f"{files[name, record.dataset]} and {file}")
        if name not in by_model:
            stems.claim(distinct_name(name), f"model {shown_name(name)} ({file})")
        files[name, record.dataset] = file
        by_model.setdefault(name, {})
        if record.dataset in datasets:
            by_model[name][record.dataset] = record
        else:
            ignored.append(f"{name}@{record.dataset}")
    not_applicable = {m: na for m, recs in by_model.items() for r in recs.values()
                      if (na := r.not_applicable(protocol))}
    by_model = {m: recs for m, recs in by_model.items() if m not in not_applicable}
    if not by_model and not not_applicable:
        raise LeaderboardError("no scores records in the pool")
    scores = {m: {d: recs[d].score_under(protocol) if d in recs else None for d in datasets}
              for m, recs in by_model.items()}
    differences = {m: {d: r.differences_for(protocol) for d, r in recs.items() if r.differences_for(protocol)}
                   for m, recs in by_model.items()}
    values = {m: {(d, s): a.value for d, score in per.items() if score for s, a in score.scored.items()}
              for m, per in scores.items()}
    sums = {m: sum_score(scores[m], datasets, protocol, differences[m]) for m in by_model}
    measured = [m for m in by_model if sums[m].measured]
    groups = {"complete": [m for m in measured if not differences[m] and sums[m].complete],
              "incomplete": [m for m in measured if not differences[m] and not sums[m].complete]}
    borda = {g: borda_scores({m: values[m] for m in models}) for g, models in groups.items()}
    unranked = [m for m in measured if differences[m]] + [m for m in by_model if not sums[m].measured]
    rows = []
    for group, models in groups.items():  # complete entries first: an incomplete one never ranks above them
        rows += sorted((_row(m, borda[group]["points"][m], sums[m], scores[m], by_model[m]) for m in models),
                       key=RANK_KEYS[rank_by])
    rows = [replace(row, rank=i) for i, row in enumerate(rows, start=1)]
    # outside every ranking: no rank, no Borda (never a 0 that reads as a last place)
    rows += sorted((_row(m, None, sums[m], scores[m], by_model[m]) for m in unranked),
                   key=lambda r: (r.measured is False, r.model))
    return Leaderboard(protocol, datasets, rank_by, rows, len(borda["complete"]["pairs"]),
                       len(borda["incomplete"]["pairs"]), [list(p) for p in borda["incomplete"]["excluded_pairs"]],
                       ignored, not_applicable)


def _row(model: str, borda: float | None, total: SumScore, scores: dict[str, ProtocolScore | None],
         records: dict[str, ScoresRecord]) -> LeaderboardRow:
    """A model's row, unranked until build_leaderboard numbers the ranked ones."""
    return LeaderboardRow(model=model, rank=None, borda=borda, sum=total, per_dataset=scores,
                          non_standard={d: [f"{n} {a.robust} ({a.label()})" for n, a in r.non_standard.items()]
                                        for d, r in records.items() if r.non_standard})


def model_info(record: ScoresRecord) -> dict:
    """rgb's record of one (model, dataset): every setting as a fraction (RobustBench's own format:
    rgb.evaluation.exports)."""
    wb = record.white_box.settings
    accuracy = {s: (a.value if a else None) for s, a in wb.items()}
    return {
        "name": record.model.run_name, "architecture": record.model.name, "family": record.model.family,
        "training": {"loss": record.model.loss, "strategy": record.model.strategy},
        "weights_sha256": record.model.weights_sha256, "dataset": record.dataset,
        "clean_acc": accuracy[CLEAN_SETTING], "common_acc": accuracy[COMMON_SETTING],
        "autoattack_acc": {n.key: record.not_applicable(WHITE_BOX) or accuracy[attack_setting(n)]
                           for n in WHITE_BOX_NORMS},
        "eps": record.eps, "seed": {n: a.seed for n, a in record.attacks.items()},
        "settings": {s: (a.to_json() if a else None) for s, a in wb.items()}, "score": record.card_score(WHITE_BOX),
        "partial": record.partial, "max_images": record.max_images,
        "black_box_score": record.card_score(BLACK_BOX), "versions": record.versions,
        "protocol": record.protocol.to_json(), "control_acc": record.control.value if record.control else None,
    }


def _points(value: float) -> str:
    """Borda points are multiples of 0.5: 18 or 18.5, never 18.0000."""
    return f"{value:.1f}".removesuffix(".0")


def _dataset_sum(score: ProtocolScore | None) -> float | None:
    """What a dataset cell shows: the sum over the settings measured (full numbers and PARTIAL ones)."""
    return None if score is None else sum(a.value for a in score.measured.values())


def dataset_cell(score: ProtocolScore | None) -> str:
    """The text of a dataset cell, in the markdown table and on the leaderboard figure alike."""
    if score is None:
        return "missing"
    if score.complete:
        return f"{score.score:.2f}"
    partial = ", PARTIAL" if score.partial_settings else ""
    return f"{_dataset_sum(score):.2f} ({len(score.measured)}/{score.max}{partial})"


def _setting_cell(accuracy) -> str:
    if accuracy is None:
        return "missing"
    return f"{accuracy.value:.4f}" + (f" PARTIAL ({accuracy.counts()})" if accuracy.partial else "")


def sum_heading(card_protocol: bool, max_sum: int) -> str:
    """The Sum column's title, in leaderboard.md and on the site alike: sums under another protocol are no Sums."""
    return f"Sum (/{max_sum})" if card_protocol else f"sum (not a Sum /{max_sum})"


def markdown_table(header: list[str], rows: list[list[str]], align: list[str]) -> list[str]:
    """The lines of a markdown table; `align` holds one `---` / `---:` marker per column."""
    return ["| " + " | ".join(header) + " |", "|" + "|".join(align) + "|",
            *("| " + " | ".join(row) + " |" for row in rows)]


def to_markdown(board: Leaderboard) -> str:
    """Ranking first (one row per model: the complete entries, then the incomplete ones in a table of their
    own), then every accuracy, one row per (model, dataset)."""
    n_settings = len(board.settings)
    max_sum = n_settings * len(board.datasets)
    header = ["rank", "model", "Borda", sum_heading(True, max_sum)] + [f"{d} (/{n_settings})" for d in board.datasets]
    align = ["---:", "---", "---:", "---:"] + ["---:"] * len(board.datasets)

    def ranking(rows: list[LeaderboardRow], unranked: Sequence[list[str]] = ()) -> list[str]:
        return markdown_table(header, [[str(r.rank), r.model, _points(r.borda), r.sum.describe()]
                                       + [dataset_cell(r.per_dataset[d]) for d in board.datasets] for r in rows]
                              + list(unranked), align)

    # models the protocol cannot apply to (an API model under white_box): shown n/a below the ranks, never 0
    unranked = [["-", m, "-", na] + [na] * len(board.datasets) for m, na in sorted(board.not_applicable.items())]

    lines = [f"# Leaderboard ({board.protocol}), ranked by {board.rank_by}", ""]
    other = next(k for k in ("borda", "sum") if k != board.rank_by)
    lines += (ranking(board.complete_rows, unranked) if board.complete_rows or unranked
              else ["No complete entry in this pool."])
    lines += ["", f"Ranked by {board.rank_by} (rank_by={other} ranks by {other.capitalize()}). Sum over "
                  f"{len(board.datasets)} datasets x {n_settings} settings = {max_sum}"
                  + (f"; Borda among the complete entries over the {board.borda_pairs} (dataset, setting) pairs."
                     if board.complete_rows else ".")]
    if board.incomplete_rows:
        lines += ["", f"## {INCOMPLETE_HEADING}", ""]
        lines += ranking(board.incomplete_rows)
        lines += ["", "A setting missing, or scored over part of its split (PARTIAL): no Sum, no Borda with the "
                      "complete entries. A partial Sum shows its total / settings measured; Borda among these "
                      f"entries over the {board.incomplete_borda_pairs} pairs each has a full number for"
                      + (f"; {len(board.borda_excluded_pairs)} pairs excluded (missing or PARTIAL for some entry)"
                         if board.borda_excluded_pairs else "") + "."]
    if board.other_protocol_rows:
        other_header = ["model", "protocol (what differs from the card)", sum_heading(False, max_sum)]
        lines += ["", f"## {OTHER_PROTOCOL_HEADING}", ""]
        lines += markdown_table(other_header + [f"{d} (/{n_settings})" for d in board.datasets],
                                [[r.model, r.protocol_label(), r.sum.describe()]
                                 + [dataset_cell(r.per_dataset[d]) for d in board.datasets]
                                 for r in board.other_protocol_rows],
                                ["---", "---", "---:"] + ["---:"] * len(board.datasets))
        lines += ["", "Budgets, image size or surrogates other than the card's: these numbers answer another "
                      "question and are not comparable with the ranked entries."]
    if board.not_measured_rows:
        lines += ["", f"## {NOT_MEASURED_HEADING}", "",
                  f"No setting of {board.protocol} measured in their records (no rank, Borda or Sum; e.g. evaluated "
                  f"without transfer): {', '.join(r.model for r in board.not_measured_rows)}."]
    if board.not_applicable:
        lines += ["", f"Not ranked under {board.protocol} (the protocol cannot apply to them; see their other "
                      f"leaderboard): {', '.join(sorted(board.not_applicable))}."]
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
            cells = [_setting_cell(a) if a is None else r.sum.marked(_setting_cell(a))
                     for a in map(score.settings.get, board.settings)]
            detail_rows.append([r.model, d, *cells, "; ".join(r.non_standard.get(d, [])) or "-"])
    lines += ["", "## Accuracy per setting", ""]
    lines += markdown_table(["model", "dataset", *board.settings, "non-standard (not scored)"], detail_rows,
                    ["---", "---"] + ["---:"] * n_settings + ["---"])
    return "\n".join(lines) + "\n"


def _unparsed_markdown(records: Sequence[ScoresRecord]) -> str:
    """leaderboard.md's last section: per API model and dataset, its answers read as no class (counted wrong in
    every accuracy above, shown apart with their rate and reader); empty for a pool without an API model."""
    rows = sorted([r.model.run_name or "?", r.dataset, r.api.unparsed_line()] for r in records if r.api is not None)
    if not rows:
        return ""
    lines = ["", "## Answers read as no class (API models: counted wrong, shown apart)", "",
             *markdown_table(["model", "dataset", "unparsed"], rows, ["---", "---", "---"])]
    return "\n".join(lines) + "\n"


def table_rows(board: Leaderboard) -> tuple[list[str], list[dict]]:
    """leaderboard.csv's columns and rows (one per model; accuracies as numbers, None where missing), also the
    W&B table of the pool."""
    columns = ["rank", "model", "borda", "sum", "partial_sum", "covered", "max"]
    columns += [f"{d}/{s}" for d in board.datasets for s in board.settings]
    columns += ["missing", "partial", "status", "protocol_differences"]
    rows = []
    for r in board.rows:
        row = {"rank": r.rank, "model": r.model, "borda": r.borda, "sum": r.sum.score,
               "partial_sum": r.sum.partial_sum, "covered": r.sum.covered, "max": r.sum.max,
               "missing": ";".join(r.sum.missing), "partial": ";".join(r.sum.partial_settings), "status": r.status,
               "protocol_differences": r.protocol_label()}
        for d in board.datasets:
            settings = r.per_dataset[d].settings if r.per_dataset[d] else {}
            row.update({f"{d}/{s}": (settings[s].value if settings.get(s) else None) for s in board.settings})
        rows.append(row)
    return columns, rows


def to_csv(board: Leaderboard) -> str:
    buffer = io.StringIO()
    columns, rows = table_rows(board)
    writer = csv.DictWriter(buffer, fieldnames=columns)
    writer.writeheader()
    writer.writerows(rows)
    return buffer.getvalue()


def write_leaderboard(pool: Mapping[Path, ScoresRecord], out_dir: Path, protocol: str = WHITE_BOX,
                      datasets: Sequence[str] | None = None, rank_by: str = "borda") -> Leaderboard:
    board = build_leaderboard(pool, protocol, datasets, rank_by)
    names = DistinctFiles()  # every file below named and claimed before one is written
    infos = {names.claim(f"{MODEL_INFO_DIR}/{r.dataset}/{distinct_name(r.model.run_name or '?')}.json",
                         f"model {shown_name(r.model.run_name or '?')} on {r.dataset}"): model_info(r)
             for r in pool.values()}
    exports = plan_exports(pool.values(), names)
    out_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(out_dir / LEADERBOARD_MD, (to_markdown(board) + _unparsed_markdown(list(pool.values()))).encode())
    atomic_write_bytes(out_dir / LEADERBOARD_CSV, to_csv(board).encode())
    atomic_write_json(out_dir / LEADERBOARD_JSON, board.to_json())
    for path, info in infos.items():
        (out_dir / path).parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(out_dir / path, info)
    exports.write(out_dir)
    from rgb.evaluation.plots import save  # matplotlib: not at the top, where evaluate.py's schema (RANK_KEYS) reads

    save(board_figure(board), out_dir / LEADERBOARD_PNG)
    return board


def board_figure(board: Leaderboard):
    """leaderboard.png: the dataset cells of leaderboard.md, the same numbers and texts, one row per model, each
    group of the markdown in a panel of its own (a partial or other-protocol sum is never drawn beside a ranked
    one as if comparable), n/a models as n/a."""
    from rgb.evaluation.plots import leaderboard_figure

    def cells(rows: list[LeaderboardRow]) -> dict:
        return {f"{r.rank}. {r.model}" if r.rank else r.model:
                {d: (_dataset_sum(s), dataset_cell(s), bool(s) and s.complete) for d, s in r.per_dataset.items()}
                for r in rows}

    panels = {
        f"ranked (complete, card protocol; by {board.rank_by})": cells(board.complete_rows),
        "ranked apart: incomplete or PARTIAL (not comparable with the ranked entries)": cells(board.incomplete_rows),
        "another protocol (not comparable, never ranked): "
        + "; ".join(f"{r.model}: {r.protocol_label()}" for r in board.other_protocol_rows): cells(board.other_protocol_rows),
        f"not applicable under {board.protocol}": {m: {d: (None, na, False) for d in board.datasets}
                                                   for m, na in sorted(board.not_applicable.items())},
    }
    return leaderboard_figure(panels, f"{board.protocol}: sum over the {len(board.settings)} settings per "
                                      f"dataset, as in leaderboard.md", len(board.settings))


def seed_spread(records: Sequence[ScoresRecord], metas: Sequence[dict], protocol: str = WHITE_BOX) -> dict | None:
    """Mean and standard deviation (n - 1) over seeds, per setting and of the Sum, when the trained models (their
    scores records and model.json) are one recipe on one dataset that differ in the seed only; else None."""
    identities = [(meta.get("training") or {}).get("identity") for meta in metas]
    if len(records) < 2 or any(identity is None for identity in identities):
        return None
    recipes = [{k: v for k, v in identity.items() if k != "seed"} for identity in identities]
    seeds = [identity.get("seed") for identity in identities]
    if any(r != recipes[0] for r in recipes) or len(set(seeds)) < len(seeds) or len({r.dataset for r in records}) > 1:
        return None
    scores = [record.score_under(protocol) for record in records]

    def spread(values: list) -> dict | None:
        return None if None in values else {"mean": statistics.fmean(values), "std": statistics.stdev(values)}

    return {"dataset": records[0].dataset, "protocol": protocol, "models": [r.model.run_name for r in records],
            "seeds": seeds, "settings": {s: spread([sc.settings[s].value if sc.settings.get(s) else None
                                                    for sc in scores]) for s in PROTOCOLS[protocol]},
            "sum": spread([sc.score for sc in scores])}


def seed_spread_markdown(spread: dict) -> str:
    seeds = ", ".join(str(s) for s in spread["seeds"])
    rows = [[name, "missing" if v is None else f"{v['mean']:.4f} +- {v['std']:.4f}"]
            for name, v in [*spread["settings"].items(), ("Sum", spread["sum"])]]
    lines = [f"# Mean +- std over seeds {seeds} ({spread['dataset']}, {spread['protocol']}; std with n - 1)", "",
             *markdown_table(["setting", "mean +- std"], rows, ["---", "---:"]), "",
             f"Models: {', '.join(spread['models'])} (one recipe, the seed alone differs)."]
    return "\n".join(lines) + "\n"


def write_seed_spread(spread: dict | None, out_dir: Path) -> None:
    """seeds.md and seeds.json beside the leaderboard; with no spread (the pool is not one recipe over seeds, or
    a job is missing), those of an earlier pool are removed: they would describe models no longer ranked."""
    out_dir.mkdir(parents=True, exist_ok=True)
    if spread:
        atomic_write_bytes(out_dir / SEEDS_MD, seed_spread_markdown(spread).encode())
        atomic_write_json(out_dir / SEEDS_JSON, spread)
        return
    for name in (SEEDS_MD, SEEDS_JSON):
        (out_dir / name).unlink(missing_ok=True)


__all__ = ["LEADERBOARD_FILES", "OTHER_PROTOCOL", "Leaderboard", "LeaderboardError", "LeaderboardRow", "RecordError", "build_leaderboard",
           "find_records", "seed_spread", "seed_spread_markdown", "sum_heading", "table_rows", "to_markdown",
           "write_leaderboard", "write_seed_spread"]
