"""The typed scores record: what evaluate.py computes about one (model, dataset), as dataclasses.

scores.json, the printed table, the leaderboard, the plots and W&B all read these classes, and JSON goes both ways
through one codec driven by the field types: a new metric is one field (plus, when derived, one property named in
`DERIVED`), and it reaches scores.json, `ScoresRecord.metrics()` (W&B) and the readers without further code.
"""

from __future__ import annotations

import json
import math
import types
import typing
from dataclasses import MISSING, dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from rgb.core.files import atomic_write_bytes
from rgb.data.catalog import TRANSFER_SPLITS

SCORES_SCHEMA = 2
WHITE_BOX_SETTINGS = ("test", "common", "autoattack_l1", "autoattack_l2", "autoattack_linf")
BLACK_BOX_SETTINGS = ("test", "common", *TRANSFER_SPLITS)
PROTOCOLS = {"white_box": WHITE_BOX_SETTINGS, "black_box": BLACK_BOX_SETTINGS}


class RecordError(ValueError):
    """A scores record that cannot be read (another schema, a missing field)."""


def _encode(value: Any) -> Any:
    if isinstance(value, JsonRecord):
        return value.to_json()
    if isinstance(value, dict):
        return {str(k): _encode(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_encode(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None  # strict JSON has no NaN: an absent class is null
    return value


def _decode(kind: Any, value: Any) -> Any:
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if origin in (typing.Union, types.UnionType):
        if value is None:
            return None
        return _decode(next(a for a in args if a is not type(None)), value)
    if value is None:
        return None
    if origin is dict:
        return {_decode(args[0], k): _decode(args[1], v) for k, v in value.items()}
    if origin in (list, tuple):
        return [_decode(args[0], v) for v in value]
    if isinstance(kind, type) and issubclass(kind, JsonRecord):
        return kind.from_json(value)
    if kind in (int, float):
        return kind(value)
    return value


class JsonRecord:
    """to_json / from_json for the dataclasses below; `DERIVED` properties are written too (for readers of the
    file) and recomputed, never trusted, when read back."""

    DERIVED: ClassVar[tuple[str, ...]] = ()

    def to_json(self) -> dict:
        out = {f.name: _encode(getattr(self, f.name)) for f in fields(self)}
        out.update({name: _encode(getattr(self, name)) for name in self.DERIVED})
        return out

    @classmethod
    def from_json(cls, data: dict):
        hints = typing.get_type_hints(cls)
        required = [f.name for f in fields(cls) if f.default is MISSING and f.default_factory is MISSING]
        absent = [name for name in required if name not in data]
        if absent:
            raise RecordError(f"{cls.__name__} record lacks {absent}")
        return cls(**{f.name: _decode(hints[f.name], data[f.name]) for f in fields(cls) if f.name in data})


@dataclass(frozen=True)
class Accuracy(JsonRecord):
    """An accuracy that carries its counts; `partial` only when the user asked for a score over part of a split."""

    correct: int
    total: int
    partial: bool = False
    DERIVED: ClassVar[tuple[str, ...]] = ("accuracy",)

    def __post_init__(self):
        if self.total <= 0 or not 0 <= self.correct <= self.total:
            raise ValueError(f"invalid accuracy counts {self.correct}/{self.total}")

    @property
    def value(self) -> float:
        return self.correct / self.total

    accuracy = value

    @classmethod
    def of(cls, correct_flags, partial: bool = False) -> Accuracy:
        flags = np.asarray(correct_flags, dtype=bool)
        return cls(int(flags.sum()), int(flags.size), partial)

    def counts(self) -> str:
        return f"{self.correct}/{self.total}"

    def __str__(self) -> str:
        return f"{self.value:.4f} ({self.counts()}{', PARTIAL' if self.partial else ''})"


@dataclass(frozen=True)
class ModelIdentity(JsonRecord):
    """Which model was scored: its run name, family and architecture name, recipe and weights hash."""

    run_name: str | None
    family: str | None
    name: str | None
    loss: str | None
    strategy: str | None
    weights_sha256: str

    # The architecture name each model family writes into model.json.
    NAME_KEYS: ClassVar[tuple[str, ...]] = ("timm_name", "openclip_name", "factory", "api_model", "name")

    @classmethod
    def of(cls, meta: dict, weights_sha256: str) -> ModelIdentity:
        name = next((str(meta[k]) for k in cls.NAME_KEYS if meta.get(k)), None)
        return cls(meta.get("run_name"), meta.get("family"), name, meta.get("loss"), meta.get("strategy"),
                   weights_sha256)


@dataclass(frozen=True)
class ProtocolScore(JsonRecord):
    """One dataset's settings under a protocol and their sum (max 5 white-box, 9 black-box). A missing setting
    stays None and is listed; it never counts as 0. `score` is None unless the sum is complete."""

    protocol: str
    settings: dict[str, Accuracy | None]
    DERIVED: ClassVar[tuple[str, ...]] = ("score", "partial_sum", "max", "missing", "partial")

    @property
    def names(self) -> tuple[str, ...]:
        return PROTOCOLS[self.protocol]

    @property
    def present(self) -> dict[str, Accuracy]:
        return {s: self.settings[s] for s in self.names if self.settings.get(s) is not None}

    @property
    def missing(self) -> list[str]:
        return [s for s in self.names if self.settings.get(s) is None]

    @property
    def partial_sum(self) -> float:
        return sum(a.value for a in self.present.values())

    @property
    def max(self) -> int:
        return len(self.names)

    @property
    def partial(self) -> bool:
        return any(a.partial for a in self.present.values())

    @property
    def incomplete(self) -> list[str]:
        """Settings without a full number: missing ones here; subclasses add their own reasons."""
        return self.missing

    @property
    def complete(self) -> bool:
        return not self.incomplete

    @property
    def scored(self) -> dict[str, Accuracy]:
        """The settings with a full number (what a Sum or a Borda count may use)."""
        return {s: a for s, a in self.present.items() if s not in self.incomplete}

    @property
    def score(self) -> float | None:
        return self.partial_sum if self.complete else None

    def describe(self) -> str:
        """`2.3000 / 5`, or why there is no score yet."""
        if self.score is not None:
            return f"{self.score:.4f} / {self.max}"
        return (f"incomplete ({self.partial_sum:.4f} over {self.max - len(self.missing)} of {self.max} settings; "
                f"missing: {', '.join(self.missing)})")


@dataclass(frozen=True)
class BlackBoxScore(ProtocolScore):
    """The card's transfer protocol: per split the strongest of the card's surrogates (lowest accuracy).

    With a card surrogate absent from the snapshot the minimum is an upper bound: `absent_surrogates` names them
    and there is no score. Surrogates the card does not list are scored in `other_surrogates`, never in the score.
    """

    strongest_surrogate: dict[str, str | None]
    by_surrogate: dict[str, dict[str, Accuracy]]
    absent_surrogates: dict[str, list[str]]
    other_surrogates: dict[str, dict[str, Accuracy]]
    DERIVED: ClassVar[tuple[str, ...]] = ProtocolScore.DERIVED + ("complete",)

    @property
    def incomplete(self) -> list[str]:
        return [s for s in self.names if s in self.missing or self.absent_surrogates.get(s)]

    def describe(self) -> str:
        if self.complete:
            return super().describe()
        absent: dict[str, list[str]] = {}
        for split, names in self.absent_surrogates.items():
            for name in names:
                absent.setdefault(name, []).append(split)
        parts = [f"missing: {', '.join(self.missing)}"] if self.missing else []
        parts += ["absent surrogates: " + "; ".join(f"{s} ({', '.join(v)})" for s, v in absent.items())] if absent else []
        return f"incomplete (upper bound {self.partial_sum:.4f} of {self.max}; {'; '.join(parts)})"


@dataclass(frozen=True)
class ClassWise(JsonRecord):
    """Per-class accuracy of one setting (None for a class absent from the split) and its summaries."""

    per_class: list[float | None]
    mean: float
    worst: dict[str, float | None]  # worst-k mean by k as configured ("1", "5", "10%"); None: fewer classes
    harmonic_mean: float
    geometric_mean: float
    worst_classes: list[int]


@dataclass(frozen=True)
class AttackSummary(JsonRecord):
    """What the scores record keeps of an attack run (rgb.runs.store.RunSummary, same field names) and the
    robust accuracy computed from its checked per-image results."""

    norm: str
    eps: float
    version: str
    standard: bool
    impl: str
    impl_version: str
    precision: str
    attacks: list[str]
    seed: int
    accuracy_after: dict[str, float]
    forward_rows_per_image: float
    backward_rows_per_image: float
    versions: dict[str, str]
    warnings: list[str]
    robust: Accuracy

    @classmethod
    def of(cls, summary, robust: Accuracy) -> AttackSummary:
        return cls(robust=robust, **{f.name: getattr(summary, f.name) for f in fields(cls) if f.name != "robust"})

    def label(self) -> str:
        """How a result that is not the protocol's number is labelled wherever it is shown."""
        parts = [self.version] if self.version != "standard" else []
        parts += [self.precision] if self.precision != "fp32" else []
        if not parts and not self.standard:
            parts.append("attacks " + "+".join(self.attacks))  # a subset of the cascade
        parts += [f"impl {self.impl} {self.impl_version}"] if self.impl != "ours" else []
        return ", ".join(parts)


@dataclass(frozen=True)
class RequestCounts(JsonRecord):
    """What one split cost an API model (rgb.models.api.RequestStats, same field names)."""

    images: int
    requests: int
    cached: int
    retries: int
    abstained: int
    unanswered: int
    prompt_tokens: int
    completion_tokens: int
    backoff_s: float


@dataclass(frozen=True)
class ApiUsage(JsonRecord):
    """An API model's requests per split (test, common, `<surrogate>/<split>`) and in total. `partial`: some
    images were not asked (max_requests reached); their splits are scored over the answered prefix, marked
    PARTIAL, and a re-run asks only the rest."""

    base_url: str
    api_model: str
    per_split: dict[str, RequestCounts]
    max_requests: int | None
    DERIVED: ClassVar[tuple[str, ...]] = ("total", "partial")

    @property
    def total(self) -> dict[str, float]:
        names = [f.name for f in fields(RequestCounts)]
        return {n: sum(getattr(c, n) for c in self.per_split.values()) for n in names}

    @property
    def partial(self) -> bool:
        return self.total["unanswered"] > 0


@dataclass(frozen=True)
class ScoresRecord(JsonRecord):
    """scores.json: everything evaluate.py knows about one model on one dataset."""

    model: ModelIdentity
    dataset: str
    source: str
    n_test: int
    eps: dict[str, float]
    white_box: ProtocolScore
    common_by_corruption: dict[str, Accuracy]
    class_wise: dict[str, ClassWise]
    attacks: dict[str, AttackSummary]  # the standard runs behind the white-box settings, by norm key
    non_standard: dict[str, AttackSummary] = field(default_factory=dict)  # shown beside, never in a score
    black_box: BlackBoxScore | None = None
    severity_sweep: dict[str, dict[int, Accuracy]] | None = None
    versions: dict[str, str] = field(default_factory=dict)
    plots: list[str] = field(default_factory=list)
    schema: int = SCORES_SCHEMA
    white_box_na: str | None = None  # why white-box settings do not apply ("API model"): shown as n/a, never 0
    api: ApiUsage | None = None

    @classmethod
    def from_json(cls, data: dict) -> ScoresRecord:
        if data.get("schema") != SCORES_SCHEMA:
            raise RecordError(f"scores schema {data.get('schema')} (this rgb writes {SCORES_SCHEMA}); re-run "
                              f"evaluate.py for this model")
        return super().from_json(data)

    @classmethod
    def load(cls, path: Path) -> ScoresRecord:
        try:
            return cls.from_json(json.loads(Path(path).read_text()))
        except (OSError, ValueError, TypeError) as err:
            raise RecordError(f"unreadable scores record {path}: {err}") from err

    def save(self, path: Path) -> None:
        atomic_write_bytes(Path(path), (json.dumps(self.to_json(), indent=2) + "\n").encode())

    @property
    def title(self) -> str:
        return f"{self.model.run_name} on {self.dataset}"

    def protocol(self, name: str) -> ProtocolScore | None:
        return {"white_box": self.white_box, "black_box": self.black_box}[name]

    def not_applicable(self, protocol: str) -> str | None:
        """`n/a (API model)` where a protocol cannot apply to this model (a leaderboard lists it, unranked)."""
        return f"n/a ({self.white_box_na})" if protocol == "white_box" and self.white_box_na else None

    def metrics(self) -> dict[str, float]:
        """Every number of the record under a slash-separated key (accuracies as their value), for W&B."""
        return dict(_flatten(self, ""))


def _flatten(value: Any, prefix: str):
    if isinstance(value, Accuracy):
        yield prefix.rstrip("/"), value.value
    elif is_dataclass(value):
        for name in [f.name for f in fields(value)] + list(value.DERIVED):
            yield from _flatten(getattr(value, name), f"{prefix}{name}/")
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _flatten(item, f"{prefix}{key}/")
    elif isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        yield prefix.rstrip("/"), float(value)
