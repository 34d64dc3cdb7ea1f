"""PNG figures next to the scores: where people would rather look than read."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402


def _save(fig, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=120, bbox_inches="tight")  # keeps a legend placed outside the axes in the picture
    plt.close(fig)
    return path


def settings_bars(per_dataset: dict[str, dict[str, float | None]], path: Path, title: str) -> Path:
    """Accuracy per setting, grouped by dataset; a missing setting is drawn as a hatched 'missing' bar."""
    datasets = list(per_dataset)
    settings = list(dict.fromkeys(s for d in datasets for s in per_dataset[d]))
    width = 0.8 / max(len(settings), 1)
    fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(datasets) * max(1, len(settings) / 4)), 4))
    for j, setting in enumerate(settings):
        xs = np.arange(len(datasets)) + j * width
        values = [per_dataset[d].get(setting) for d in datasets]
        ax.bar(xs, [v if v is not None else 0 for v in values], width, label=setting)
        for x, v in zip(xs, values):
            if v is None:
                ax.text(x, 0.02, "missing", rotation=90, ha="center", va="bottom", fontsize=7)
    ax.set_xticks(np.arange(len(datasets)) + width * (len(settings) - 1) / 2, datasets)
    ax.set_ylim(0, 1)
    ax.set_ylabel("accuracy")
    ax.set_title(title, fontsize=10)
    # Below the axes: inside, it would cover the bars of accuracies near 1.
    ax.legend(fontsize=8, ncol=min(len(settings), 5), loc="upper center", bbox_to_anchor=(0.5, -0.1), frameon=False)
    return _save(fig, path)


def attack_stages(stages_by_norm: dict[str, dict[str, float]], path: Path, title: str) -> Path:
    """Robust accuracy after each AutoAttack stage (clean first), one line per norm."""
    fig, ax = plt.subplots(figsize=(6, 4))
    for norm, stages in stages_by_norm.items():
        ax.plot(list(stages), list(stages.values()), marker="o", label=norm)
    ax.set_ylim(0, 1)
    ax.set_ylabel("accuracy")
    ax.set_xlabel("after attack stage")
    ax.set_title(title)
    ax.legend()
    ax.grid(alpha=0.3)
    return _save(fig, path)


def class_accuracy(per_class: dict[str, list[float]], class_names: list[str], path: Path, title: str,
                   n_named: int = 5) -> Path:
    """Per-class accuracy distribution per setting, sorted, with the worst classes of each named."""
    fig, axes = plt.subplots(1, len(per_class), figsize=(3.2 * len(per_class), 3.6), squeeze=False)
    for ax, (setting, values) in zip(axes[0], per_class.items()):
        values = np.asarray(values, dtype=float)
        order = np.argsort(np.nan_to_num(values, nan=np.inf))
        present = [i for i in order if not np.isnan(values[i])]
        ax.bar(range(len(present)), values[present], color="tab:blue")
        ax.set_ylim(0, 1)
        ax.set_title(setting, fontsize=9)
        ax.set_xlabel("classes, worst first", fontsize=8)
        worst = ", ".join(f"{class_names[i]} {values[i]:.2f}" for i in present[:n_named])
        ax.text(0.02, 0.98, "worst: " + worst, transform=ax.transAxes, va="top", fontsize=6, wrap=True)
    axes[0][0].set_ylabel("accuracy")
    fig.suptitle(title)
    return _save(fig, path)
