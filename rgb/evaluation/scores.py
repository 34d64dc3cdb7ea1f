"""The benchmark's aggregates: the Sum score over the card's datasets, Borda points and the black-box protocol.

A missing setting stays missing (None) and is listed; it never counts as 0 and is never skipped silently.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import ClassVar

from rgb.data.catalog import BLACK_BOX, DATASETS, TRANSFER_SPLITS, WHITE_BOX
from rgb.evaluation.records import (CLEAN_SETTING, COMMON_SETTING, PROTOCOLS, Accuracy, BlackBoxScore, JsonRecord,
                                    ProtocolScore, ScoresRecord)

# The benchmark Sum is over the card's six datasets (x five white-box settings = 30).
BENCHMARK_DATASETS = tuple(DATASETS)
# The status of numbers made under budgets, image sizes or surrogates other than the card's.
OTHER_PROTOCOL = "other protocol"
# The Sum of a model none of whose records holds a number under the protocol (e.g. black-box without transfer).
NOT_MEASURED = "not measured"


@dataclass(frozen=True)
class SumScore(JsonRecord):
    """Sum of a model's settings over a list of datasets; `score` only when every (dataset, setting) holds a full
    number, else the partial sum over `covered` of `max` settings, with what is missing and what was measured
    over part of a split (PARTIAL) listed. A sum of records made under another protocol than the card's is no
    Sum (`score` None) and says so wherever it is shown: `status` and `marked` are the one rule every surface
    (leaderboard.md, .csv, .json, the site, W&B) marks its numbers by."""

    protocol: str
    datasets: list[str]
    partial_sum: float | None  # None: nothing measured under this protocol (no partial Sum of 0 shown or logged)
    covered: int
    missing: list[str]
    partial_settings: list[str]  # "dataset/setting" scored over part of its split
    # dataset -> how its record departs from the card's protocol ("L2 1, card 2"); empty: the card's
    protocol_differences: dict[str, list[str]] = field(default_factory=dict)
    DERIVED: ClassVar[tuple[str, ...]] = ("score", "max", "partial", "complete", "card_protocol", "status")

    @property
    def max(self) -> int:
        return len(PROTOCOLS[self.protocol]) * len(self.datasets)

    @property
    def partial(self) -> bool:
        return bool(self.partial_settings)

    @property
    def complete(self) -> bool:
        return not self.missing and not self.partial_settings

    @property
    def card_protocol(self) -> bool:
        return not any(self.protocol_differences.values())

    @property
    def score(self) -> float | None:
        return self.partial_sum if self.complete and self.card_protocol else None

    @property
    def status(self) -> str:
        """complete, incomplete (a setting missing), PARTIAL (a setting over part of its split) or another
        protocol (budgets, image size or surrogates other than the card's); not measured: no number at all."""
        if not self.measured:
            return NOT_MEASURED
        if not self.card_protocol:
            return OTHER_PROTOCOL
        return "PARTIAL" if self.partial else "complete" if self.complete else "incomplete"

    def protocol_label(self) -> str:
        """What departs from the card's protocol, per dataset ("caltech101: L2 1, card 2"); empty for the card's."""
        return "; ".join(f"{d}: {', '.join(v)}" for d, v in self.protocol_differences.items() if v)

    def status_line(self) -> str:
        """The status and, under another protocol, what differs: "other protocol (caltech101: L2 1, card 2)"."""
        return f"{self.status} ({self.protocol_label()})" if self.protocol_label() else self.status

    def marked(self, text: str) -> str:
        """A number of these records as shown anywhere: under another protocol, said so beside it."""
        return text if self.card_protocol else f"{text} ({OTHER_PROTOCOL})"

    @property
    def measured(self) -> bool:
        """Some setting holds a number under this protocol (else the row is shown outside every ranking)."""
        return self.covered > 0

    def describe(self, digits: int = 2) -> str:
        if not self.measured:
            return NOT_MEASURED
        if self.score is not None:
            return f"{self.score:.{digits}f}"
        text = f"{self.partial_sum:.{digits}f} / {self.covered}"
        text += f" (partial, of {self.max})" if self.missing else ""
        text += f" PARTIAL ({len(self.partial_settings)} over part of a split)" if self.partial else ""
        return self.marked(text)


def sum_score(per_dataset: Mapping[str, ProtocolScore | None], datasets: Sequence[str],
              protocol: str = WHITE_BOX, differences: Mapping[str, list[str]] | None = None) -> SumScore:
    """Sum over `datasets`; a dataset without a record counts all its settings as missing. `differences`: per
    dataset, how its record departs from the card's protocol (ScoresRecord.differences_for)."""
    missing, partial, total, covered = [], [], 0.0, 0
    for dataset in datasets:
        found = per_dataset.get(dataset) or ProtocolScore(protocol, {})
        missing += [f"{dataset}/{s}" for s in found.without_number]
        partial += [f"{dataset}/{s}" for s in found.partial_settings]
        total += sum(a.value for a in found.measured.values())
        covered += len(found.measured)
    return SumScore(protocol, list(datasets), total if covered else None, covered, missing, partial,
                    {d: list(v) for d, v in (differences or {}).items() if v})


def record_sum(record: ScoresRecord, protocol: str) -> SumScore:
    """One record's sum under `protocol`, with its protocol status: what a single evaluation (its W&B run) shows
    beside its numbers, by the rule of the leaderboard's rows."""
    return sum_score({record.dataset: record.score_under(protocol)}, [record.dataset], protocol,
                     {record.dataset: record.differences_for(protocol)})


def borda_scores(pool: Mapping[str, Mapping[tuple[str, str], float]]) -> dict:
    """Borda points per model over the (dataset, setting) pairs every model of the pool has.

    In each pair a model gets one point per model it beats and half a point per model it ties with, so tied
    models share the points of the places they occupy. Pairs some model lacks are listed, not guessed.
    """
    models = list(pool)
    pairs = sorted(set().union(*(set(v) for v in pool.values()))) if pool else []
    complete = [p for p in pairs if all(p in pool[m] for m in models)]
    points = {m: 0.0 for m in models}
    for pair in complete:
        values = {m: pool[m][pair] for m in models}
        for m in models:
            points[m] += sum(1.0 for o in models if values[o] < values[m])
            points[m] += 0.5 * sum(1 for o in models if o != m and values[o] == values[m])
    return {"points": points, "pairs": complete, "excluded_pairs": [p for p in pairs if p not in complete]}


def strongest_surrogate(by_surrogate: Mapping[str, Accuracy | None]) -> tuple[str | None, Accuracy | None]:
    """The transfer protocol's choice: the surrogate whose split gives the lowest accuracy (ties: first name)."""
    available = {s: a for s, a in sorted(by_surrogate.items()) if a is not None}
    if not available:
        return None, None
    name = min(available, key=lambda s: available[s].value)
    return name, available[name]


def black_box_score(
    clean: Accuracy | None,
    common: Accuracy | None,
    transfer: Mapping[str, Mapping[str, Accuracy | None]],
    card: Mapping[str, Sequence[str]] | None,
    own: Sequence[str] = (),
) -> BlackBoxScore:
    """The 9 black-box settings of one dataset from transfer[split][surrogate] (the splits found; None: in the
    snapshot but not asked yet).

    `card`: surrogate -> splits the card lists for this dataset; only those surrogates enter the score, and one
    of them absent makes that split's minimum an upper bound (named in `absent_surrogates`). A setting is a full
    number only when every card surrogate of it was scored over its whole split: one not asked yet or asked over
    part of it makes the setting PARTIAL. Others are reported beside. None (a dataset the card does not
    describe): every surrogate found counts. `own`: surrogates that are the evaluated model itself.
    """
    settings: dict[str, Accuracy | None] = {CLEAN_SETTING: clean, COMMON_SETTING: common}
    chosen, by, absent, not_asked, others = {}, {}, {}, {}, {}
    for split in TRANSFER_SPLITS:
        found = transfer.get(split, {})
        listed = sorted(found) if card is None else sorted(s for s, splits in card.items() if split in splits)
        by[split] = {s: found[s] for s in listed if found.get(s) is not None}
        absent[split] = [s for s in listed if s not in found]
        not_asked[split] = [s for s in listed if s in found and found[s] is None]
        others[split] = {s: a for s, a in sorted(found.items()) if s not in listed and a is not None}
        chosen[split], settings[split] = strongest_surrogate(by[split])
        short = not_asked[split] or any(a.partial for a in by[split].values())
        if settings[split] is not None and short:
            settings[split] = replace(settings[split], partial=True)  # a minimum over part of the surrogates
    used = {s for split in TRANSFER_SPLITS for s in by[split]}
    return BlackBoxScore(BLACK_BOX, settings, chosen, by, {k: v for k, v in absent.items() if v},
                         {k: v for k, v in others.items() if v}, {k: v for k, v in not_asked.items() if v},
                         sorted(used & set(own)))
