"""PNG figures next to the scores: where people would rather look than read.

Every bar carries its value (a zero bar is drawn as a visible sliver labelled 0.00, a missing one as a hatched
outline labelled "missing"), classes are named, model names each get a row of their own, and curves or points
that coincide stay visible (markers, offsets, one panel per series).
The `*_figure` functions return the figure (tests read it); `record_figures` saves those of one record.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from rgb.data.catalog import WHITE_BOX
from rgb.evaluation.records import ATTACK_SETTING_NORMS, WHITE_BOX_SETTINGS, BlackBoxScore, ScoresRecord  # noqa: E402

ZERO_SLIVER = 0.006  # height (in accuracy units) that keeps a zero bar visible


def save(fig, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=120, bbox_inches="tight")  # keeps a legend placed outside the axes in the picture
    plt.close(fig)
    return path


def grouped_bars(ax, groups: Sequence[str], series: dict[str, Sequence[float | None]], horizontal: bool = False,
                 texts: dict[str, Sequence[str]] | None = None, faded: dict[str, Sequence[bool]] | None = None,
                 limit: float = 1.0, quantity: str = "accuracy") -> list[Patch]:
    """Bars of series[name][i] in group i, each labelled with its value (or texts[name][i]); None is a hatched
    'missing' outline, a `faded` bar (a number that is not a full one) is drawn light with a dotted hatch.
    Returns one legend handle per series (a legend built from the bars would copy a missing bar's hatch)."""
    handles = []
    width = 0.8 / max(len(series), 1)
    bar = ax.barh if horizontal else ax.bar
    for j, (name, values) in enumerate(series.items()):
        positions = np.arange(len(groups)) + (j - (len(series) - 1) / 2) * width
        heights = [ZERO_SLIVER * limit if v is None or v == 0 else v for v in values]
        bars = bar(positions, heights, width, label=name)
        color = bars.patches[0].get_facecolor() if bars.patches else None
        handles.append(Patch(facecolor=color, label=name))
        light = (faded or {}).get(name, [False] * len(values))
        for patch, value, pale in zip(bars.patches, values, light):
            if value is None:
                patch.set_facecolor("none")
                patch.set_edgecolor(color)
                patch.set_hatch("//")
            elif pale:
                patch.set_alpha(0.45)
                patch.set_edgecolor("black")
                patch.set_hatch("..")
            elif value == 0:
                patch.set_edgecolor(color)  # a sliver with an outline stays visible at any size
        labels = (texts or {}).get(name) or ["missing" if v is None else f"{v:.4f}" for v in values]
        ax.bar_label(bars, list(labels), padding=2, fontsize=7, rotation=0 if horizontal else 90)
    (ax.set_yticks if horizontal else ax.set_xticks)(np.arange(len(groups)), groups)
    (ax.set_xlim if horizontal else ax.set_ylim)(0, 1.15 * limit)  # headroom for the labels above bars near 1
    (ax.set_xlabel if horizontal else ax.set_ylabel)(quantity)
    if horizontal:
        ax.invert_yaxis()  # first row on top
    return handles


def _legend_outside(ax, handles: list[Patch], right: bool = False) -> None:
    # Outside the axes: inside, it would cover the bars of accuracies near 1. Under vertical bars (nothing but
    # the group names below them); `right` of horizontal ones, whose axis label sits below. None without bars
    # (no transfer split).
    if not handles:
        return
    if right:
        ax.legend(handles=handles, fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
        return
    ax.legend(handles=handles, fontsize=8, ncol=min(len(handles), 5), loc="upper center",
              bbox_to_anchor=(0.5, -0.12), frameon=False)


def settings_figure(per_group: dict[str, dict[str, float | None]], title: str,
                    absent_text: dict[str, str] | None = None):
    """Accuracy per setting, grouped (by dataset for one record); a setting without a number is labelled
    `absent_text[setting]` (as the table labels it, e.g. "n/a (API model)"), else "missing"."""
    groups = list(per_group)
    settings = list(dict.fromkeys(s for g in groups for s in per_group[g]))
    absent_text = absent_text or {}

    def text(value: float | None, setting: str) -> str:
        return absent_text.get(setting, "missing") if value is None else f"{value:.4f}"  # as the tables print it

    fig, ax = plt.subplots(figsize=(max(6.0, 1.2 * len(groups) * len(settings) / 2), 4.2))
    handles = grouped_bars(ax, groups, {s: [per_group[g].get(s) for g in groups] for s in settings},
                           texts={s: [text(per_group[g].get(s), s) for g in groups] for s in settings})
    ax.set_title(title, fontsize=10)
    _legend_outside(ax, handles)
    return fig


def leaderboard_figure(panels: dict[str, dict[str, dict[str, tuple[float | None, str, bool]]]], title: str,
                       n_settings: int):
    """One panel per group of the leaderboard (ranked entries first, then those ranked apart: incomplete,
    PARTIAL, another protocol, n/a), so a bar is only ever set beside bars it may be compared with. In a panel,
    one row per model (names never overlap), one bar per dataset: (sum over its settings, the text the table
    shows for it, whether it is complete); an incomplete sum is drawn light, a missing dataset or an n/a model
    as an outline labelled as the table labels it."""
    panels = {name: rows for name, rows in panels.items() if rows}
    datasets = list(dict.fromkeys(d for rows in panels.values() for m in rows for d in rows[m]))
    heights = [1.0 + 0.28 * len(rows) * max(len(datasets), 1) for rows in panels.values()] or [1.0]
    fig, axes = plt.subplots(len(heights), 1, figsize=(8, sum(heights) + 0.4 * len(heights)), squeeze=False,
                             gridspec_kw={"height_ratios": heights})
    for ax, (name, per_model) in zip(axes[:, 0], panels.items()):
        models = list(per_model)
        cell = {d: [per_model[m].get(d, (None, "missing", False)) for m in models] for d in datasets}
        handles = grouped_bars(ax, models, {d: [c[0] for c in cells] for d, cells in cell.items()},
                               horizontal=True, texts={d: [c[1] for c in cells] for d, cells in cell.items()},
                               faded={d: [not c[2] for c in cells] for d, cells in cell.items()}, limit=n_settings,
                               quantity=f"sum over the {n_settings} settings (light: incomplete)")
        ax.set_title(name, fontsize=9)
        _legend_outside(ax, handles, right=True)
    fig.suptitle(title, fontsize=10)
    return fig


def attack_stages_figure(stages_by_norm: dict[str, dict[str, float]], title: str):
    """Robust accuracy after each AutoAttack stage (clean first), one line per norm, and the values in a table
    under the axes (a row per norm in its line's colour, a column per stage): norms often reach the same or nearby
    accuracies, where values written at the points overlap. Each line has its own marker and dash and a small
    sideways offset, so a line under another stays visible."""
    order = list(dict.fromkeys(s for stages in stages_by_norm.values() for s in stages))
    longest = max(map(len, stages_by_norm), default=0)  # a run under another implementation: "linf [impl ...]"
    fig, ax = plt.subplots(figsize=(6.5 + 0.12 * max(longest - 6, 0), 4 + 0.22 * len(stages_by_norm)))
    step = 0.08
    colours = []
    for j, (norm, stages) in enumerate(stages_by_norm.items()):
        shift = (j - (len(stages_by_norm) - 1) / 2) * step
        style = {"color": plt.get_cmap("tab10")(j % 10), "marker": "os^Dv"[j % 5],
                 "linestyle": ("-", "--", ":", "-.")[j % 4]}
        colours.append(style["color"])
        ax.plot([order.index(s) + shift for s in stages], list(stages.values()), label=norm, markersize=6,
                markerfacecolor="none", linewidth=1.4, **style)
    ax.set_xticks(range(len(order)), order)
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("accuracy")
    ax.set_xlabel("after attack stage")
    ax.set_title(title, fontsize=10)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)  # never over a point
    ax.grid(alpha=0.3)
    # the norm's name in the table's first column (inside its box, so a long "[impl ...]" label cannot push the
    # axes aside), sized to the longest name
    rows = [[norm, *(f"{stages[s]:.2f}" if s in stages else "" for s in order)] for norm, stages in stages_by_norm.items()]
    name_share = min(0.5, max(0.1, 0.02 * longest))
    table = ax.table(cellText=rows, colLabels=["", *order], cellLoc="center",
                     colWidths=[name_share] + [(1 - name_share) / max(len(order), 1)] * len(order),
                     bbox=[0.0, -0.28 - 0.07 * len(stages_by_norm), 1.0, 0.07 * (len(stages_by_norm) + 1)])
    table.auto_set_font_size(False)
    table.set_fontsize(7)
    for (row, _), cell in table.get_celld().items():
        cell.set_edgecolor("0.85")
        if row > 0:
            cell.get_text().set_color(colours[row - 1])
    fig.subplots_adjust(bottom=0.2 + 0.06 * len(stages_by_norm), right=0.83)
    return fig


MAX_NAMED_TICKS = 40  # classes per panel that are named under their bars; beyond, the worst are named below


def class_accuracy_figure(per_class: dict[str, list[float | None]], class_names: list[str], title: str,
                          n_named: int = 5):
    """Per-class accuracy per setting, sorted worst first. Up to MAX_NAMED_TICKS classes each bar is named;
    with more, the ticks are class ranks (integers) and the `n_named` worst classes are named under the axes,
    never on the bars."""
    n = len(class_names)
    named = n <= MAX_NAMED_TICKS
    width = max(3.2, 0.16 * n + 1.0) if named else 3.2
    fig, axes = plt.subplots(1, len(per_class), figsize=(width * len(per_class), 3.6 + (0.9 if named else 0)),
                             squeeze=False)
    for ax, (setting, values) in zip(axes[0], per_class.items()):
        values = np.asarray([np.nan if v is None else v for v in values], dtype=float)
        order = np.argsort(np.nan_to_num(values, nan=np.inf), kind="stable")
        present = [int(i) for i in order if not np.isnan(values[i])]
        heights = [max(values[i], ZERO_SLIVER) for i in present]
        ax.bar(range(1, len(present) + 1), heights, color="tab:blue", edgecolor="tab:blue")
        ax.set_ylim(0, 1)
        ax.set_xlim(0.4, len(present) + 0.6)
        ax.set_title(setting, fontsize=9)
        if named:
            ax.set_xticks(range(1, len(present) + 1), [class_names[i] for i in present], rotation=90, fontsize=7)
            ax.set_xlabel("class, worst first", fontsize=8)
        else:
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            worst = "\n".join(f"{class_names[i]}: {values[i]:.2f}" for i in present[:n_named])
            ax.set_xlabel(f"class rank, worst first\nworst {min(n_named, len(present))}:\n{worst}", fontsize=7)
    axes[0][0].set_ylabel("accuracy")
    fig.suptitle(title, fontsize=10)
    return fig


def severity_figure(sweep: dict[str, dict[int, float]], title: str):
    """Accuracy per corruption (rows) and severity (columns) as a heat map with the value in every cell."""
    corruptions = list(sweep)
    severities = sorted({s for by in sweep.values() for s in by})
    grid = np.array([[sweep[c].get(s, np.nan) for s in severities] for c in corruptions], dtype=float)
    fig, ax = plt.subplots(figsize=(1.1 * len(severities) + 3, 0.38 * len(corruptions) + 1.4))
    image = ax.imshow(grid, vmin=0, vmax=1, cmap="viridis", aspect="auto")
    for (i, j), value in np.ndenumerate(grid):
        ax.text(j, i, "missing" if np.isnan(value) else f"{value:.2f}", ha="center", va="center", fontsize=8,
                color="black" if value > 0.6 else "white")
    ax.set_xticks(range(len(severities)), [str(s) for s in severities])
    ax.set_yticks(range(len(corruptions)), corruptions)
    ax.set_xlabel("severity")
    ax.set_title(title, fontsize=10)
    fig.colorbar(image, ax=ax, label="accuracy")
    return fig


def black_box_figure(black_box: BlackBoxScore, title: str):
    """Accuracy on each transfer split per surrogate: the card's (an absent one drawn missing) and, marked, those
    outside the card (never in the score)."""
    splits = list(black_box.by_surrogate)
    card = sorted({s for split in splits for s in (*black_box.by_surrogate[split],
                                                    *black_box.absent_surrogates.get(split, ()))})
    others = sorted({s for by in black_box.other_surrogates.values() for s in by})

    def values(surrogate: str, found: dict[str, dict]) -> list[float | None]:
        return [found.get(split, {})[surrogate].value if surrogate in found.get(split, {}) else None
                for split in splits]

    series = {s: values(s, black_box.by_surrogate) for s in card}
    series.update({f"{s} (not the card's)": values(s, black_box.other_surrogates) for s in others})
    fig, ax = plt.subplots(figsize=(max(7.0, 0.5 * len(splits) * max(len(series), 1)), 4.2))
    handles = grouped_bars(ax, splits, series)
    ax.set_title(title, fontsize=10)
    _legend_outside(ax, handles)
    return fig


def record_figures(record: ScoresRecord, class_names: list[str], out: Path) -> list[Path]:
    """Every figure of one scores record, saved under `out`."""
    title = record.title
    settings = {s: (a.value if a else None) for s, a in record.white_box.settings.items()}
    na = record.not_applicable(WHITE_BOX)
    absent = {s: na for s in settings if na and s in ATTACK_SETTING_NORMS}
    figures = [save(settings_figure({record.dataset: settings}, f"five settings: {title}", absent),
                    out / "settings.png")]
    stages = {n: a.accuracy_after for n, a in record.attacks.items()}
    stages.update({f"{n} [{a.label()}]": a.accuracy_after for n, a in record.non_standard.items()})
    if stages:
        figures.append(save(attack_stages_figure(stages, f"AutoAttack stages: {title}"), out / "attack_stages.png"))
    per_class = {k: v.per_class for k, v in record.class_wise.items()
                 if k in WHITE_BOX_SETTINGS}
    figures.append(save(class_accuracy_figure(per_class, class_names, f"per-class accuracy: {title}"),
                        out / "class_accuracy.png"))
    if record.severity_sweep:
        sweep = {c: {s: a.value for s, a in by.items()} for c, by in record.severity_sweep.items()}
        figures.append(save(severity_figure(sweep, f"severity sweep: {title}"), out / "severity_sweep.png"))
    if record.black_box is not None:
        figures.append(save(black_box_figure(record.black_box, f"black-box transfer: {title}"),
                            out / "black_box.png"))
    return figures


# --- text robustness of zero-shot models (rgb.evaluation.text_robustness) --------------------------------------------

MAX_SCATTER_POINTS = 4000  # per perturbation type: enough to see the cloud, few enough for a small PNG


def _series_style(i: int) -> dict:
    """Colour, marker and line style of series i: the 10 colours again with another marker and dash after 10,
    so the 12 perturbation types never share a look."""
    cycle = i // 10 % 3
    return {"color": plt.get_cmap("tab10")(i % 10), "marker": "os^"[cycle], "linestyle": ("-", "--", ":")[cycle]}


def overlap_curves_figure(curves: dict[str, tuple[Sequence[int], Sequence[float]]], title: str):
    """Mean overlap@k against k (log axis), one line per perturbation type."""
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    for i, (name, (ks, values)) in enumerate(curves.items()):
        ax.plot(ks, values, markersize=3, label=name, **_series_style(i))
    ax.set_xscale("log")
    ax.set_ylim(0, 1.02)
    ax.set_xlabel("k (top-k images)")
    ax.set_ylabel("mean overlap@k")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2, loc="lower right")
    return fig


def instability_distance_figure(points: dict[str, tuple[np.ndarray, np.ndarray]], title: str):
    """Instability against intra / inter distance per edit, one panel per perturbation type on shared axes (in
    one cloud, thousands of points hide each other's types), each a fixed sample of at most MAX_SCATTER_POINTS
    with its count in the title. Edits at distance 0 tokenize like the query: their B is undefined."""
    columns = min(math.ceil(math.sqrt(len(points))), 4) or 1
    rows = -(-len(points) // columns) or 1
    fig, axes = plt.subplots(rows, columns, figsize=(2.6 * columns + 0.6, 2.3 * rows + 0.8), squeeze=False)
    finite = [v for x, _ in points.values() for v in np.asarray(x, dtype=float) if np.isfinite(v)]
    right = max(finite, default=1.0) * 1.05 or 1.0
    rng = np.random.default_rng(0)
    for i, (ax, (name, (x, y))) in enumerate(zip(axes.flat, points.items())):
        shown = rng.permutation(len(x))[:MAX_SCATTER_POINTS] if len(x) > MAX_SCATTER_POINTS else slice(None)
        style = _series_style(i)
        ax.scatter(np.asarray(x)[shown], np.asarray(y)[shown], s=5, alpha=0.35, rasterized=True,
                   color=style["color"], marker=style["marker"], linewidths=0)
        ax.set_title(f"{name} (n={len(x)})", fontsize=8)
        ax.set(xlim=(0, right), ylim=(-0.02, 1.02))  # the same axes in every panel
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
        if i + columns >= len(points):  # the lowest panel of its column
            ax.set_xlabel("intra / inter distance", fontsize=8)
        if i % columns == 0:
            ax.set_ylabel("1 - RBO_ext", fontsize=8)
    for ax in list(axes.flat)[len(points):]:
        ax.set_visible(False)
    fig.suptitle(f"{title} (one panel per perturbation type)", fontsize=10)
    return fig


def brittleness_heatmap_figure(panels: dict[str, dict[str, dict[str, float]]], title: str):
    """One heat map per panel (e.g. mean instability, mean finite B): models as rows, perturbation types as
    columns, the value in every cell ("undef" where no finite value exists, "missing" where not measured)."""
    first = next(iter(panels.values()))
    models = list(first)
    types = list(dict.fromkeys(t for panel in panels.values() for by in panel.values() for t in by))
    fig, axes = plt.subplots(len(panels), 1, squeeze=False,
                             figsize=(max(6.0, 0.75 * len(types) + 2.5), len(panels) * (0.45 * len(models) + 1.6)))
    for ax, (label, panel) in zip(axes[:, 0], panels.items()):
        grid = np.array([[np.nan if panel[m].get(t) is None else panel[m][t] for t in types] for m in models],
                        dtype=float)
        image = ax.imshow(np.ma.masked_invalid(grid), cmap="magma", aspect="auto")
        for (i, j), value in np.ndenumerate(grid):
            text = f"{value:.2f}" if np.isfinite(value) else (
                "missing" if panel[models[i]].get(types[j]) is None else "undef")
            ax.text(j, i, text, ha="center", va="center", fontsize=7,
                    color="black" if np.isfinite(value) and image.norm(value) > 0.6 else "white")  # light cells
        ax.set_facecolor("0.6")  # undefined cells
        ax.set_xticks(range(len(types)), types, rotation=40, ha="right", fontsize=8)
        ax.set_yticks(range(len(models)), models, fontsize=8)
        fig.colorbar(image, ax=ax, label=label)
        ax.set_title(label, fontsize=9)
    fig.suptitle(title, fontsize=10)
    return fig
