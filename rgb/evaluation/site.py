"""The leaderboard as a static site (`evaluate.py pool=[...] site=true`): `site/index.html` beside leaderboard.md,
one page per model, every script and stylesheet inside the folder, readable from file:// and without JavaScript.

One owner for the numbers: the site is drawn from the in-memory `Leaderboard` rows that leaderboard.json is written
from (never recomputed). Every number it shows carries `data-json="<protocol>:<path>"`, the place of that number in
the board's JSON (leaderboard.json for the pool's protocol, `site/data/leaderboard.<protocol>.json` for both), so a
test can check the site against the JSON number by number. Accuracies show in % with 2 decimals (the JSON keeps
fractions). Each board states the threat model of its numbers ("digits, Linf, eps = 4/255"), read from every
record's protocol. Plots are inline SVG whose marks carry `<title>` tooltips and the same `data-json` paths.
Templates and assets are package data (rgb/evaluation/site_templates); site.js adds search, "show N entries" with
its pages, sorting (by mouse or keyboard) and filters whose state lives in the URL's hash, so a filtered view can be
shared, from file:// too, and keeps rank, model, Sum and Borda in view while a wide table scrolls. A model keeps one
colour in every chart; the model card's paper, venue and extra data are columns when any model has a card.
"""

from __future__ import annotations

import functools
import json
import re
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape
from pathlib import Path

from rgb.core.files import DistinctFiles, atomic_write_bytes, atomic_write_json, distinct_name
from rgb.core.jsonrecord import RecordError
from rgb.core.secrets import redact, redact_text
from rgb.core.threat import parse_norm
from rgb.core.values import shown_name
from rgb.data.catalog import BLACK_BOX, TRANSFER_SPLITS, WHITE_BOX, split_budget
from rgb.data.protocol import budget_text
from rgb.data.resolvers import transfer_budget
from rgb.evaluation.exports import TEMPLATES, templates
from rgb.evaluation.leaderboard import (
    INCOMPLETE_HEADING,
    NOT_MEASURED_HEADING,
    OTHER_PROTOCOL_HEADING,
    Leaderboard,
    LeaderboardRow,
    sum_heading,
)
from rgb.evaluation.records import (ATTACK_SETTING_NORMS, CLEAN_SETTING, PROTOCOLS, SCORES_FILE, ScoresRecord,
                                    percent_text)
from rgb.models import FAMILIES
from rgb.models.card import CARD_FIELDS
from rgb.runs.store import SUMMARY_FILE, TEXT_ROBUSTNESS_DIR, ZEROSHOT_REPORT_DIR, train_reference

ASSETS = ("site.css", "site.js")
SITE_DIR = "site"
# The column titles of the settings: the clean split, the attack settings by their norm; any other setting (common,
# a black-box transfer split) shows its own name.
SETTING_LABELS = {CLEAN_SETTING: "clean", **{setting: norm.value for setting, norm in ATTACK_SETTING_NORMS.items()}}
# What a side folder of an evaluation holds, shown on the model page when present (evaluate.py's other reports).
REPORT_FOLDERS = {ZEROSHOT_REPORT_DIR: "zero-shot report", TEXT_ROBUSTNESS_DIR: "text robustness"}
MISSING = "—"
# The models' colours (Tableau 20), one per model across every chart of the site.
PALETTE = ("#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#ff9da7", "#9c755f",
           "#bab0ac", "#a0cbe8", "#ffbe7d", "#8cd17d", "#b6992d", "#499894", "#86bcb6", "#f1ce63", "#d37295",
           "#fabfd2", "#d4a6c8")
BOARD_TITLES = {WHITE_BOX: "White-box (AutoAttack)", BLACK_BOX: "Black-box (transfer from the card's surrogates)"}
# The benchmark's own citation (the dataset card's), shown under the boards.
CITATION = TEMPLATES / "robustgenbench.bib"


def page_names(models) -> dict[str, str]:
    """Each model's page and folder name under `models/` (rgb.core.files.distinct_name): `x 1`, `x+1` and `x_1` get
    three pages, the same ones on every rebuild. Two models that would still share a file (one name in NFC and in
    NFD) are refused, never shown on one page."""
    files = DistinctFiles()
    return {model: files.claim(distinct_name(model), f"model {shown_name(model)}") for model in sorted(set(models))}


@dataclass(frozen=True)
class SiteEntry:
    """One scored (model, dataset) of the pool: its scores.json and record and, for a model the pool evaluated
    from its train run, the run (its model.json as `meta`) and the attack dir (the attack runs' summary.json)."""

    file: Path
    record: ScoresRecord
    run: Path | None = None
    meta: dict | None = None
    attack_dir: Path | None = None


def setting_label(setting: str) -> str:
    return SETTING_LABELS.get(setting, setting)


def percent(value: float) -> str:
    """An accuracy as the site shows it: in %, 2 decimals (RobustBench's format)."""
    return f"{percent_text(value)}%"


def _text(value) -> str:
    """A recipe field as the records hold it (the loss is a dict in model.json: its name), or the missing mark."""
    if isinstance(value, dict):
        value = value.get("name", json.dumps(value, sort_keys=True))
    return MISSING if value is None or value == "" else str(value)


def _pretraining(entries: Sequence[SiteEntry], meta: dict) -> str:
    """The pretrained weights the run started from, as its training identity records them (or, for a pool of
    eval folders, as the scores record's train run carries them)."""
    identity = (meta.get("training") or {}).get("identity") or {}
    parts = {k.removeprefix("model."): v for k, v in identity.items()
             if k in ("model.pretrained", "model.weights", "model.pretrained_tag") and v not in (None, "")}
    parts = parts or recorded(entries, "pretraining") or {}
    return ", ".join(f"{k}={v}" for k, v in sorted(parts.items())) or MISSING


def recorded(entries: Sequence[SiteEntry], *names: str):
    """A field recorded at train time (parameter counts, the model card) wherever the records keep it: the scores
    record's model identity, the record itself or the run's model.json; None when none holds it."""
    for entry in entries:
        for name in names:
            for value in (getattr(entry.record.model, name, None), getattr(entry.record, name, None),
                          (entry.meta or {}).get(name), getattr(entry.record.train, name, None)):
                if value not in (None, "", {}, []):
                    return value.to_json() if hasattr(value, "to_json") else value
    return None


def _parameters(value, short: bool = False) -> str:
    """Parameter counts as recorded: a number, or {"total": n, "trainable": m}. `short` (a table's cell): the total
    in millions, `0.37 M` (below 10,000, the count itself); the model page keeps every count in full."""
    total = value.get("total") if isinstance(value, dict) else value
    if short and isinstance(total, int):
        return f"{total / 1e6:.2f} M" if total >= 10_000 else f"{total:,}"
    if isinstance(value, dict):
        return ", ".join(f"{k} {v:,}" if isinstance(v, int) else f"{k} {v}" for k, v in value.items()) or MISSING
    return f"{value:,}" if isinstance(value, int) else _text(value)


def model_card(entries: Sequence[SiteEntry]) -> dict[str, str]:
    """The model card's fields (paper title, authors, venue, url, extra data, BibTeX) the records hold; {} if none."""
    card = recorded(entries, "model_card", "card") or {}
    shown = {}
    for key in (*CARD_FIELDS, *sorted(set(card) - set(CARD_FIELDS))):
        value = card.get(key)
        if value not in (None, "", []):
            shown[key] = ", ".join(map(str, value)) if isinstance(value, list) else str(value)
    return shown


def _epochs(entries: Sequence[SiteEntry]) -> str:
    """The epochs trained; a model behind an endpoint (a family without weights) was never trained here: "—",
    never "0"."""
    family = FAMILIES.get(entries[0].record.model.family or "")
    return MISSING if family is not None and not family.weights else _text(recorded(entries, "epochs"))


def model_columns(entries: Sequence[SiteEntry], short: bool = True) -> dict[str, str]:
    """The descriptive columns of a model (its first record, completed by the run's model.json when known);
    `short`: parameters as a table shows them (`0.37 M`), else every count."""
    record = entries[0].record
    meta = next((e.meta for e in entries if e.meta), None) or {}
    return {"architecture": _text(record.model.name), "family": _text(record.model.family),
            "parameters": _parameters(recorded(entries, "parameters", "num_parameters"), short),
            "pretraining": _pretraining(entries, meta),
            "loss": _text(record.model.loss), "strategy": _text(record.model.strategy),
            "epochs": _epochs(entries), "weights_sha256": record.model.weights_sha256,
            "rgb": _text(record.versions.get("rgb"))}


def card_columns(entries: Sequence[SiteEntry]) -> dict[str, str]:
    """RobustBench's first columns from the model card: venue, paper (its title; linked by the template when the
    card has a url) and extra data (training data beyond the benchmark's split); "—" where the card says nothing."""
    card = recorded(entries, "model_card", "card") or {}
    extra = card.get("additional_data")
    return {"venue": _text(card.get("venue")), "paper": _text(card.get("title")), "url": card.get("url") or "",
            "extra data": MISSING if extra is None else ("yes" if extra else "no")}


def model_colours(models: Sequence[str]) -> dict[str, str]:
    """One colour per model, the same in every chart of the site (by the sorted names of the pool's models)."""
    return {model: PALETTE[i % len(PALETTE)] for i, model in enumerate(sorted(set(models)))}


@dataclass(frozen=True)
class Cell:
    """A number on the site: what it shows, its value and its place in the board's JSON."""

    text: str
    value: float | None
    path: str  # "<protocol>:rows/<i>/..." or "" for a cell without a number


def setting_cell(board: Leaderboard, index: int, dataset: str, setting: str) -> Cell:
    """An accuracy of the board, marked PARTIAL or under another protocol as leaderboard.md marks it."""
    row = board.rows[index]
    score = row.per_dataset[dataset]
    accuracy = score.settings.get(setting) if score else None
    if accuracy is None:
        return Cell("missing", None, "")
    path = f"{board.protocol}:rows/{index}/per_dataset/{dataset}/settings/{setting}/accuracy"
    return Cell(row.sum.marked(percent(accuracy.value) + (" PARTIAL" if accuracy.partial else "")), accuracy.value,
                path)


def shared_cell(boards: Sequence[Leaderboard], board: Leaderboard, index: int, dataset: str, setting: str) -> Cell:
    """`setting_cell`, where a setting both protocols share (clean, common) that this board has no number for is
    read from the board that has it: a model evaluated without transfer has no black-box score, yet its clean
    accuracy is the white-box board's (and its `data-json` points there)."""
    cell = setting_cell(board, index, dataset, setting)
    model = board.rows[index].model
    for other in boards:
        if cell.value is not None or other is board or setting not in other.settings or dataset not in other.datasets:
            continue
        found = next((i for i, r in enumerate(other.rows) if r.model == model), None)
        if found is not None and other.rows[found].per_dataset.get(dataset) is not None:
            cell = setting_cell(other, found, dataset, setting)
    return cell


def setting_norm(setting: str) -> str | None:
    """The norm an attack setting is made at ("Linf": white-box AutoAttack or a transfer split); None for clean
    and common."""
    if setting in ATTACK_SETTING_NORMS:
        return ATTACK_SETTING_NORMS[setting].value
    return parse_norm(split_budget(setting)[0]).value if setting in TRANSFER_SPLITS else None


def board_norms(board: Leaderboard) -> list[str]:
    """The norms of a board's attack settings, in its column order."""
    return list(dict.fromkeys(filter(None, map(setting_norm, board.settings))))


def record_budgets(protocol: str, record: ScoresRecord) -> list[tuple[str, str]]:
    """(norm, eps text) of every budget behind a record's numbers under `protocol`: its white-box budgets
    (`protocol.budgets`), or the transfer splits' at its image size."""
    if protocol == WHITE_BOX:
        return [(norm.value, budget_text(norm.key, record.protocol.budgets[norm.key]))
                for norm in ATTACK_SETTING_NORMS.values() if norm.key in record.protocol.budgets]
    return [(setting_norm(split), budget_text(split_budget(split)[0], transfer_budget(split, record.protocol.image_size)))
            for split in PROTOCOLS[protocol] if split in TRANSFER_SPLITS]


def threat_lines(board: Leaderboard, entries: dict[str, list[SiteEntry]]) -> list[str]:
    """What a board's numbers were made under, RobustBench-style: one line per dataset, "digits, L1, eps = 2.5;
    L2, eps = 0.2857; Linf, eps = 4/255", from every record the board shows; a budget only some records were
    attacked at names them ("L2, eps = 0.2857 (big-eps: eps = 1)")."""
    lines = []
    for dataset in board.datasets:
        by_norm: dict[str, dict[str, list[str]]] = {}
        for row in board.rows:
            for entry in entries.get(row.model, []):
                if entry.record.dataset == dataset and entry.record.score_under(board.protocol) is not None:
                    for norm, eps in record_budgets(board.protocol, entry.record):
                        models = by_norm.setdefault(norm, {}).setdefault(eps, [])
                        models += [] if row.model in models else [row.model]
        if not by_norm:
            continue
        parts = []
        for norm in (n for n in board_norms(board) if n in by_norm):
            ordered = sorted(by_norm[norm].items(), key=lambda item: -len(item[1]))  # the most used budget first
            if board.protocol == BLACK_BOX:
                parts.append(f"{norm}, eps = {', '.join(eps for eps, _ in ordered)}")
                continue
            others = "; ".join(f"{', '.join(models)}: eps = {eps}" for eps, models in ordered[1:])
            parts.append(f"{norm}, eps = {ordered[0][0]}" + (f" ({others})" if others else ""))
        lines.append(f"{dataset}, " + "; ".join(parts))
    return lines


def sum_cell(board: Leaderboard, index: int) -> Cell:
    row = board.rows[index]
    if not row.measured:  # no partial Sum of nothing
        return Cell(row.sum.describe(), None, "")
    return Cell(row.sum.describe(), row.sum.partial_sum, f"{board.protocol}:rows/{index}/sum/partial_sum")


def borda_cell(board: Leaderboard, index: int) -> Cell:
    row = board.rows[index]
    if row.borda is None:  # outside every ranking
        return Cell(MISSING, None, "")
    return Cell(f"{row.borda:.1f}".removesuffix(".0"), row.borda, f"{board.protocol}:rows/{index}/borda")


def _svg_attrs(cell: Cell) -> str:
    return f' data-json="{escape(cell.path)}" data-value="{cell.value!r}"'


def bars_svg(groups: Sequence[str], series: dict[str, Sequence[Cell]], title: str, colours: Sequence[str]) -> str:
    """Grouped vertical bars (accuracies in [0, 1]), series s in `colours[s]` (its model's: model_colours), each
    bar's value in its <title>; a setting without a number is a cross in its series' colour."""
    n = max(len(series), 1)
    bar, gap, height, left, top = 14, 16, 160, 36, 24
    step = max(n * bar + gap, 48)  # a group wide enough for its label
    width = left + len(groups) * step + 10
    legend_h = 16 * n
    parts = [f'<svg class="plot" xmlns="http://www.w3.org/2000/svg" width="{width}" '
             f'height="{top + height + 40 + legend_h}" role="img" aria-label="{escape(title)}">',
             f'<text x="4" y="14" class="plot-title">{escape(title)}</text>']
    for tick in (0, 0.5, 1):
        y = top + height * (1 - tick)
        parts.append(f'<line x1="{left}" x2="{width}" y1="{y}" y2="{y}" class="grid"/>'
                     f'<text x="2" y="{y + 4}" class="tick">{tick:g}</text>')
    for g, group in enumerate(groups):
        x0 = left + g * step
        for s, (name, cells) in enumerate(series.items()):
            cell = cells[g]
            if cell.value is None:  # marked, so that a missing setting never reads as an accuracy of 0
                parts.append(f'<text x="{x0 + s * bar + 2}" y="{top + height - 4}" class="tick missing" '
                             f'fill="{colours[s]}">&#215;<title>{escape(name)}, {escape(group)}: '
                             f'{escape(cell.text or MISSING)}</title></text>')
                continue
            h = max(height * cell.value, 1.5)  # an accuracy of 0 still shows as a (flat) bar
            parts.append(f'<rect x="{x0 + s * bar}" y="{top + height - h:.2f}" width="{bar - 2}" height="{h:.2f}" '
                         f'fill="{colours[s]}"{_svg_attrs(cell)}><title>{escape(name)}, '
                         f'{escape(group)}: {escape(cell.text)}</title></rect>')
        parts.append(f'<text x="{x0}" y="{top + height + 14}" class="tick">{escape(group)}</text>')
    for s, name in enumerate(series):
        y = top + height + 30 + 16 * s
        parts.append(f'<rect x="{left}" y="{y - 10}" width="10" height="10" fill="{colours[s]}"/>'
                     f'<text x="{left + 14}" y="{y}" class="tick">{escape(name)}</text>')
    return "".join(parts) + "</svg>"


def scatter_svg(points: Sequence[tuple[str, Cell, Cell]], x_label: str, y_label: str, y_max: float,
                title: str, colours: dict[str, str]) -> str:
    """One point per (label, x in [0, 1], y in [0, y_max]) in its label's colour (model_colours), labelled beside
    it, its numbers in its <title>. Points
    that coincide are set side by side and their labels stacked, so that two models at equal scores both show."""
    width, height, left, top = 360, 220, 44, 24
    label_width = 7 * max((len(label) for label, _, _ in points), default=0)
    parts = [f'<svg class="plot" xmlns="http://www.w3.org/2000/svg" width="{width + left + 10 + label_width}" '
             f'height="{top + height + 36}" role="img" aria-label="{escape(title)}">',
             f'<text x="4" y="14" class="plot-title">{escape(title)}</text>',
             f'<line x1="{left}" x2="{left + width}" y1="{top + height}" y2="{top + height}" class="axis"/>',
             f'<line x1="{left}" x2="{left}" y1="{top}" y2="{top + height}" class="axis"/>',
             f'<text x="{left + width / 2}" y="{top + height + 30}" class="tick">{escape(x_label)}</text>',
             f'<text x="{left + 4}" y="{top + 10}" class="tick">{escape(y_label)} (max {y_max:g})</text>']
    for tick in (0, 0.5, 1):
        parts.append(f'<text x="{left + width * tick - 6:.0f}" y="{top + height + 14}" class="tick">{tick * 100:g}%</text>'
                     f'<text x="{left - 30}" y="{top + height * (1 - tick) + 4:.0f}" class="tick">'
                     f'{y_max * tick:g}</text>')
    placed: dict[tuple[int, int], int] = {}  # how many points already sit at one spot (rounded to pixels)
    for label, x, y in points:
        if x.value is None or y.value is None:
            continue
        cx, cy = left + width * x.value, top + height * (1 - y.value / y_max)
        k = placed.get((round(cx), round(cy)), 0)
        placed[round(cx), round(cy)] = k + 1
        parts.append(f'<circle cx="{cx + 7 * k:.2f}" cy="{cy:.2f}" r="5" class="point" fill="{colours[label]}"{_svg_attrs(y)}>'
                     f'<title>{escape(label)}: {escape(x_label)} {escape(x.text)}, {escape(y_label)} '
                     f'{escape(y.text)}</title></circle>'
                     f'<text x="{cx + 9:.2f}" y="{cy + 4 + 12 * k:.2f}" class="point-label">{escape(label)}</text>')
    return "".join(parts) + "</svg>"


def board_view(board: Leaderboard, boards: Sequence[Leaderboard], entries: dict[str, list[SiteEntry]],
               pages: dict[str, str], colours: dict[str, str]) -> dict:
    """What a board's templates show: its title and budgets, its groups (as leaderboard.md groups them), each
    row's cells and plots; the card's columns when any model of the pool has a card."""
    settings = board.settings

    def row_view(index: int, row: LeaderboardRow) -> dict:
        columns = model_columns(entries[row.model]) if row.model in entries else {}
        card = card_columns(entries[row.model]) if row.model in entries else {}
        counts = recorded(entries[row.model], "parameters", "num_parameters") if row.model in entries else None
        total = counts.get("total") if isinstance(counts, dict) else counts
        return {"row": row, "rank": row.rank or MISSING, "page": f"models/{pages[row.model]}.html",
                "columns": columns, "card": card,
                "sort_values": {"parameters": total if isinstance(total, int) else ""}, "sum": sum_cell(board, index), "borda": borda_cell(board, index),
                "cells": [(d, s, shared_cell(boards, board, index, d, s)) for d in board.datasets for s in settings],
                "search": " ".join([row.model, *(columns.get(k, "") for k in ("architecture", "family", "loss",
                                                                              "strategy", "pretraining"))]).lower()}

    rows = {row.model: row_view(i, row) for i, row in enumerate(board.rows)}
    max_sum = len(settings) * len(board.datasets)
    groups = [(heading, [rows[r.model] for r in members], sum_heading(card, max_sum)) for heading, members, card in (
        ("Ranked: complete, the card's protocol", board.complete_rows, True),
        (INCOMPLETE_HEADING, board.incomplete_rows, True), (OTHER_PROTOCOL_HEADING, board.other_protocol_rows, False),
        (NOT_MEASURED_HEADING, board.not_measured_rows, True))
        if members]
    index = {r.model: i for i, r in enumerate(board.rows)}
    has_numbers = any(score is not None for r in board.rows for score in r.per_dataset.values())
    plots = []
    for dataset in board.datasets if has_numbers else ():
        series = {r.sum.marked(r.model): [shared_cell(boards, board, index[r.model], dataset, s) for s in settings]
                  for r in board.rows}
        if any(c.value is not None for cells in series.values() for c in cells):
            plots.append(bars_svg([setting_label(s) for s in settings], series,
                                  f"{dataset}: accuracy per setting ({board.protocol})",
                                  [colours[r.model] for r in board.rows]))
    # complete card entries only: a partial Sum drawn beside a complete one would look comparable (issue 33)
    sums = [(r.model, _clean_mean(board, index[r.model]), sum_cell(board, index[r.model]))
            for r in board.complete_rows]
    if any(x.value is not None for _, x, _ in sums):
        plots.append(scatter_svg(sums, "clean accuracy (mean over datasets)", "Sum", board.rows[0].sum.max,
                                 f"Sum vs clean accuracy ({board.protocol}; complete entries)", colours))
    return {"board": board, "groups": groups, "plots": plots, "threats": threat_lines(board, entries),
            "title": f"{BOARD_TITLES[board.protocol]}: {', '.join(board.datasets)}, {', '.join(board_norms(board))}",
            "settings": [(s, setting_label(s)) for s in settings], "max_sum": max_sum,
            "has_numbers": has_numbers, "card_columns": any(
                recorded(entries[r.model], "model_card", "card") for r in board.rows if r.model in entries),
            "not_applicable": sorted(board.not_applicable.items())}


def _clean_mean(board: Leaderboard, index: int) -> Cell:
    """The clean accuracy a Sum is plotted against: the board's one clean number when the pool has one dataset,
    else the mean of the row's clean numbers (shown as computed here, the inputs being the board's)."""
    cells = [setting_cell(board, index, d, CLEAN_SETTING) for d in board.datasets]
    values = [c.value for c in cells if c.value is not None]
    if len(board.datasets) == 1:
        return cells[0]
    return Cell(percent(sum(values) / len(values)), sum(values) / len(values), "") if values else Cell("", None, "")


def setting_groups(boards: Sequence[Leaderboard]) -> list[tuple[str, list[tuple[str, str]]]]:
    """The setting filter's option groups: the settings every board has (clean, common), then each board's own
    (white-box AutoAttack, transfer), so that choosing one says which board it belongs to."""
    shared = [s for s in boards[0].settings if all(s in b.settings for b in boards)]
    groups = [("every board", shared)] + [(BOARD_TITLES[b.protocol], [s for s in b.settings if s not in shared])
                                          for b in boards]
    return [(title, [(s, setting_label(s)) for s in settings]) for title, settings in groups if settings]


_TABLE_RULE = re.compile(r"^\|?\s*:?-{3,}:?\s*(\|\s*:?-{3,}:?\s*)*\|?$")


def _inline(text: str) -> str:
    """Markdown's inline code and emphasis of our reports, escaped."""
    text = re.sub(r"`([^`]+)`", r"<code>\1</code>", escape(text))
    return re.sub(r"\*\*([^*]+)\*\*", r"<strong>\1</strong>", text)


def markdown_html(text: str) -> str:
    """The Markdown rgb's reports write (headings, bullet lists, pipe tables, paragraphs; see
    leaderboard.markdown_table) as HTML, so a report reads as tables on a model page, not as raw text."""
    html, lines, i = [], text.splitlines(), 0
    while i < len(lines):
        line = lines[i].strip()
        if line.startswith("|") and i + 1 < len(lines) and _TABLE_RULE.match(lines[i + 1].strip()):
            def cells(row: str) -> list[str]:
                return [c.strip() for c in row.strip().strip("|").split("|")]
            align = ["right" if a.endswith(":") else "left" for a in cells(lines[i + 1])]
            rows = []
            i += 2
            while i < len(lines) and lines[i].strip().startswith("|"):
                rows.append("<tr>" + "".join(f'<td style="text-align:{a}">{_inline(c)}</td>'
                                             for c, a in zip(cells(lines[i]), align)) + "</tr>")
                i += 1
            html.append('<table class="report"><thead><tr>' + "".join(f"<th>{_inline(c)}</th>" for c in cells(line))
                        + "</tr></thead><tbody>" + "".join(rows) + "</tbody></table>")
            continue
        if line.startswith("#"):
            level = min(len(line) - len(line.lstrip("#")) + 3, 6)  # under the page's own h1-h3
            html.append(f"<h{level}>{_inline(line.lstrip('#').strip())}</h{level}>")
        elif line.startswith("- "):
            items = []
            while i < len(lines) and lines[i].strip().startswith("- "):
                items.append(f"<li>{_inline(lines[i].strip()[2:])}</li>")
                i += 1
            html.append("<ul>" + "".join(items) + "</ul>")
            continue
        elif line:
            html.append(f"<p>{_inline(line)}</p>")
        i += 1
    return "\n".join(html)


TEXT_FILES = (".json", ".md", ".csv", ".txt")


def _copy(source: Path, target: Path, folder: Path, claimed: DistinctFiles) -> str | None:
    """Copy one file into a model's `folder` of the site (`<site>/models/<slug>/`), its path there claimed (a plot
    named like the copied scores.json is refused, never written over it); its path relative to the model pages
    (`<site>/models/`), or None when absent. A target outside `folder` is refused (records refuse such names)."""
    if not source.is_file():
        return None
    if not target.resolve().is_relative_to(folder.resolve()):
        raise RecordError(f"{source} would be copied to {target}, outside its model's folder {folder}")
    claimed.claim(target.resolve().relative_to(folder.resolve()).as_posix(), str(source))
    target.parent.mkdir(parents=True, exist_ok=True)
    if source.suffix in TEXT_FILES:  # a record written before secrets were redacted is published without them
        atomic_write_bytes(target, redact_text(source.read_text()).encode())
    else:
        shutil.copyfile(source, target)
    models = next(p for p in target.parents if p.name == "models")
    return target.relative_to(models).as_posix()


def model_view(name: str, entries: Sequence[SiteEntry], boards: Sequence[Leaderboard], folder: Path,
               colour: str) -> dict:
    """A model's page: its columns, provenance, per dataset its settings (board numbers), class-wise metrics,
    plots and files (copied into its `folder`, `models/<page>/<dataset>/`, each path claimed once)."""
    datasets, claimed = [], DistinctFiles()
    for entry in sorted(entries, key=lambda e: e.record.dataset):
        record = entry.record
        files_dir = folder / record.dataset
        copy = functools.partial(_copy, folder=folder, claimed=claimed)
        files = {SCORES_FILE: copy(entry.file, files_dir / SCORES_FILE)}
        if entry.attack_dir is not None:
            for summary in sorted(entry.attack_dir.glob(f"*/{SUMMARY_FILE}")):
                files[f"{summary.parent.name}/{SUMMARY_FILE}"] = copy(
                    summary, files_dir / f"summary.{summary.parent.name}.json")
        images = [p for p in (copy(entry.file.parent / plot, files_dir / plot) for plot in record.plots) if p]
        reports = []
        for sub, title in REPORT_FOLDERS.items():
            found = sorted((entry.file.parent / sub).glob("*")) if (entry.file.parent / sub).is_dir() else []
            copied = {p.name: copy(p, files_dir / sub / p.name) for p in found if p.suffix in (".md", ".png", ".csv")}
            if copied:
                reports.append({"title": title, "files": copied,
                                "html": "\n".join(markdown_html(redact_text(p.read_text()))
                                                  for p in found if p.suffix == ".md")})
        tables = []
        for board in boards:
            index = next((i for i, r in enumerate(board.rows) if r.model == name), None)
            if index is None or record.dataset not in board.datasets:
                continue
            row = board.rows[index]
            score = row.per_dataset[record.dataset]
            if score is None:  # nothing scored under this protocol (no transfer evaluation)
                continue
            cells = [(s, setting_cell(board, index, record.dataset, s),
                      score.settings.get(s) if score else None) for s in board.settings]
            budgets = "; ".join(f"{n}, eps = {eps}" for n, eps in record_budgets(board.protocol, record))
            tables.append({"protocol": board.protocol, "status": row.sum.status_line(), "cells": cells,
                           "threat": f"{record.dataset}, {budgets}",
                           "plot": bars_svg([setting_label(s) for s, _, _ in cells],
                                            {row.sum.marked(name): [c for _, c, _ in cells]},
                                            f"{record.dataset}: {board.protocol}", [colour])})
        datasets.append({"record": record, "files": files, "images": images, "reports": reports,
                         "tables": tables, "class_wise": record.class_wise, "entry": entry})
    meta = next((e.meta for e in entries if e.meta), None)
    run = next((e for e in entries if e.run is not None), None)
    train = next((e.record.train for e in entries if e.record.train is not None), None)
    provenance = {"train run": train and train.run_dir, "W&B id of the train run": train and train.wandb_id}
    if run is not None:
        reference = train_reference(run.run, run.record.model.weights_sha256)
        provenance = {"train run": reference["run_dir"], "W&B id of the train run": reference["wandb_id"]}
    record = entries[0].record
    provenance.update({"sweep": (meta or {}).get("sweep"), "data source": record.source, "seed": recorded(entries, "seed"),
                       "versions": ", ".join(f"{k} {v}" for k, v in sorted(record.versions.items())) or None})
    config = {k: v for k, v in (meta or {}).items() if k not in ("training", "class_names", "zeroshot")}
    return {"name": name, "columns": model_columns(entries, short=False), "datasets": datasets, "card": model_card(entries),
            "provenance": {k: _text(v) for k, v in provenance.items()},
            "config": json.dumps(redact(config or record.model.to_json()), indent=2, sort_keys=True, default=str)}


def write_site(boards: Sequence[Leaderboard], entries: Sequence[SiteEntry], out: Path) -> Path:
    """Write the site into `out` (index.html, models/, data/, assets); returns index.html's path."""
    by_model: dict[str, list[SiteEntry]] = {}
    for entry in entries:
        by_model.setdefault(entry.record.model.run_name or "?", []).append(entry)
    pages = page_names([*by_model, *(row.model for board in boards for row in board.rows)])
    env = templates()
    out.mkdir(parents=True, exist_ok=True)
    for asset in ASSETS:
        shutil.copyfile(TEMPLATES / asset, out / asset)
    (out / "data").mkdir(exist_ok=True)
    for board in boards:
        atomic_write_json(out / "data" / f"leaderboard.{board.protocol}.json", board.to_json())
    colours = model_colours([*by_model, *(row.model for board in boards for row in board.rows)])
    views = [board_view(board, boards, by_model, pages, colours) for board in boards]
    filters = {key: sorted({model_columns(e)[key] for e in by_model.values()}) for key in ("family", "loss", "strategy")}
    datasets = sorted({d for board in boards for d in board.datasets})
    index = out / "index.html"
    atomic_write_bytes(index, env.get_template("index.html.j2").render(
        boards=views, filters=filters, datasets=datasets, setting_groups=setting_groups(boards), missing=MISSING,
        label=setting_label, citation=CITATION.read_text()).encode())
    (out / "models").mkdir(exist_ok=True)
    for name, model_entries in sorted(by_model.items()):
        view = model_view(name, model_entries, boards, out / "models" / pages[name], colours[name])
        atomic_write_bytes(out / "models" / f"{pages[name]}.html", env.get_template("model.html.j2").render(
            model=view, missing=MISSING, label=setting_label).encode())
    return index


__all__ = ["SITE_DIR", "SiteEntry", "page_names", "write_site"]
