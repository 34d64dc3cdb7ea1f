"""The options of evaluate.py's `text_robustness=true` report (rgb.evaluation.text_robustness runs it), plain Python so
that evaluate.py's schema reads their rules before torch loads."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rgb.brittleness.perturb import DEFAULT_TYPES, PERTURBATION_TYPES, PerturbationError, perturbation_type
from rgb.brittleness.settings import DEFAULT_KS, DEFAULT_P
from rgb.core.options import Ruled, ruled
from rgb.core.values import EXISTING_FILE, FRACTION_OPEN, INT, POSITIVE_INT, TEXT, list_of, one_of, optional


@dataclass(frozen=True)
class TextRobustnessOptions(Ruled):
    """The `text_robustness_options` block of conf/evaluate.yaml, each key a field of its name (rgb.commands.
    text_robustness builds it so, and its schema checks these fields' rules first); types checked against the
    registry."""

    split: str = ruled(rule=TEXT)
    queries: Path | None = ruled(rule=optional(EXISTING_FILE), convert=Path)
    # None: DEFAULT_TYPES
    types: tuple[str, ...] | None = ruled(rule=optional(list_of(one_of(PERTURBATION_TYPES))), convert=tuple)
    seeds: tuple[int, ...] = ruled(rule=list_of(INT), convert=tuple)
    user_edits: Path | None = ruled(rule=optional(EXISTING_FILE), convert=Path)
    ks: tuple[int, ...] = ruled(DEFAULT_KS, list_of(POSITIVE_INT), convert=tuple)
    p: float = ruled(DEFAULT_P, FRACTION_OPEN)
    cache_dir: Path | None = ruled(None, convert=Path)
    device: str = "cpu"
    batch_size: int = 256

    def __post_init__(self):
        if self.types is None:
            object.__setattr__(self, "types", DEFAULT_TYPES)
        for name in self.types:
            perturbation_type(name)  # unknown: one line listing the known ones
        if not self.types or not self.seeds:
            raise PerturbationError("text_robustness_options.types and .seeds must not be empty")
        self.check("text_robustness_options.", PerturbationError)
