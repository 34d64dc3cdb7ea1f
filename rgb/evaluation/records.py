"""The typed scores record: what evaluate.py computes about one (model, dataset), as dataclasses.

scores.json, the printed table, the leaderboard, the plots and W&B all read these classes, and JSON goes both ways
through one codec driven by the field types: a new metric is one field (plus, when derived, one property named in
`DERIVED`), and it reaches scores.json, `ScoresRecord.metrics()` (W&B) and the readers without further code.
"""

from __future__ import annotations

import math
import typing
from dataclasses import dataclass, field, fields, is_dataclass, make_dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from rgb.core.classwise import ClassWise
from rgb.core.files import atomic_write_json
from rgb.core.jsonrecord import JsonRecord, RecordError, load_record
from rgb.core.secrets import redact_url
from rgb.core.threat import NORMS, Norm, parse_norm
from rgb.core.values import name_problem, shown_name
from rgb.data.catalog import BLACK_BOX, TRANSFER_SPLITS, WHITE_BOX
from rgb.data.protocol import Protocol
from rgb.endpoints.answers import CARD_PARSER
from rgb.endpoints.client import RequestStats
from rgb.runs.store import RunSummary, partial_dir

# 3: the protocol each record was made under, the random-noise control, black-box surrogates not asked yet.
SCORES_SCHEMA = 3
# The settings' names in scores.json, owned here: clean test split, common corruptions, AutoAttack per norm.
CLEAN_SETTING = "test"
COMMON_SETTING = "common"
ATTACK_SETTING_PREFIX = "autoattack_"
# The white-box norms in the protocol's column order (smallest ball first).
WHITE_BOX_NORMS = (Norm.L1, Norm.L2, Norm.LINF)


def attack_setting(norm: str | Norm) -> str:
    """The white-box setting of AutoAttack at `norm` ("linf", "Linf", Norm.LINF -> "autoattack_linf")."""
    return ATTACK_SETTING_PREFIX + parse_norm(norm).key


WHITE_BOX_SETTINGS = (CLEAN_SETTING, COMMON_SETTING, *map(attack_setting, WHITE_BOX_NORMS))
# The same five as users write them (`rgb.benchmark(settings=...)`, error messages): an attack setting by its norm key.
WHITE_BOX_SETTING_NAMES = (CLEAN_SETTING, COMMON_SETTING, *(norm.key for norm in WHITE_BOX_NORMS))
BLACK_BOX_SETTINGS = (CLEAN_SETTING, COMMON_SETTING, *TRANSFER_SPLITS)
PROTOCOLS = {WHITE_BOX: WHITE_BOX_SETTINGS, BLACK_BOX: BLACK_BOX_SETTINGS}
# A complete evaluation writes SCORES_FILE (what a leaderboard pool collects); a PARTIAL one (max_images) writes
# PARTIAL_SCORES_FILE in rgb.runs.store.partial_dir, so it never replaces the complete record nor enters a pool unasked.
SCORES_FILE = "scores.json"
PARTIAL_SCORES_FILE = "scores.partial.json"


# The AutoAttack settings of WHITE_BOX_SETTINGS and the norm each is run at.
ATTACK_SETTING_NORMS = {attack_setting(norm): norm for norm in NORMS}


def white_box_setting(name: str) -> str:
    """A white-box setting as users write it, in its WHITE_BOX_SETTINGS spelling: "test", "Common", a norm in any
    case ("Linf", "l2": read by rgb.core.threat) or "AutoAttack_L1"."""
    key = str(name).strip().lower()
    if key in WHITE_BOX_SETTINGS:
        return key
    try:
        return attack_setting(key.removeprefix(ATTACK_SETTING_PREFIX))
    except ValueError:
        raise RecordError(f"unknown white-box setting {name!r}: one of {', '.join(WHITE_BOX_SETTING_NAMES)} "
                          f"(any case)") from None


def percent_text(value: float) -> str:
    """An accuracy as RobustBench writes it: its percentage with 2 decimals ("89.69"); the site and the exports
    show it so, the records keep the fraction."""
    return f"{100 * value:.2f}"


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
    loss: str | dict | None  # model.json's: a train run's loss config ({"name": ..., ...}), or a name
    strategy: str | None
    weights_sha256: str

    @classmethod
    def of(cls, meta: dict, weights_sha256: str) -> ModelIdentity:
        """The identity of the model whose model.json is `meta`: its family and name as rgb.models gives them (a
        record without `family` is timm's, as summary.json has it)."""
        from rgb.models.families import family_of_record  # imports torch: evaluate.py's schema reads this module first

        family = family_of_record(meta)
        return cls(meta.get("run_name"), family.name, family.model_name(meta), meta.get("loss"), meta.get("strategy"),
                   weights_sha256)


# The training identity's keys that say what a model started from (pretrained weights, a tag, a local file).
PRETRAINING_KEYS = ("model.pretrained", "model.pretrained_tag", "model.weights")


@dataclass(frozen=True)
class TrainRun(JsonRecord):
    """The training run of the scored model as its model.json and W&B know it, carried by the record so that a
    pool of eval folders (no train run at hand) still shows it: the run (its dir relative to the output root), the
    W&B run and `model` artifact when they exist, epochs, what it started from, its parameter counts, card
    and seed."""

    run_name: str | None
    run_dir: str | None
    sweep: dict | None
    wandb_id: str | None
    model_artifact: str | None
    epochs: int | None
    pretraining: dict[str, Any]
    parameters: dict[str, int] | None
    card: dict[str, Any]
    seed: int | None = None  # absent from records written before it was carried

    @classmethod
    def of(cls, reference: dict, meta: dict) -> TrainRun:
        """`reference`: rgb.runs.store.train_reference of the run; `meta`: its model.json."""
        identity = (meta.get("training") or {}).get("identity") or {}
        pretraining = {key.removeprefix("model."): Path(str(value)).name if key == "model.weights" else value
                       for key, value in identity.items() if key in PRETRAINING_KEYS and value not in (None, "")}
        return cls(reference.get("run_name"), reference.get("run_dir"), reference.get("sweep"),
                   reference.get("wandb_id"), reference.get("model_artifact"), meta.get("epochs"), pretraining,
                   meta.get("parameters"), dict(meta.get("card") or {}), meta.get("seed"))


@dataclass(frozen=True)
class ProtocolScore(JsonRecord):
    """One dataset's settings under a protocol and their sum (max 5 white-box, 9 black-box). A missing setting
    stays None and is listed; it never counts as 0. `score` is None unless every setting holds a full number
    (over the whole split); otherwise `partial_sum` over `covered` of `max` settings says what there is."""

    protocol: str
    settings: dict[str, Accuracy | None]
    DERIVED: ClassVar[tuple[str, ...]] = ("score", "partial_sum", "covered", "max", "missing", "partial",
                                          "partial_settings")

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
    def covered(self) -> int:
        return len(self.present)

    @property
    def max(self) -> int:
        return len(self.names)

    @property
    def partial(self) -> bool:
        return any(a.partial for a in self.present.values())

    @property
    def without_number(self) -> list[str]:
        """Settings with no number a sum may add: missing ones here; subclasses add their own reasons."""
        return self.missing

    @property
    def partial_settings(self) -> list[str]:
        """Settings measured over part of their split (allow_partial): a number, never a full one."""
        return [s for s, a in self.present.items() if a.partial and s not in self.without_number]

    @property
    def measured(self) -> dict[str, Accuracy]:
        """What a partial sum adds up: the full numbers and those over part of a split."""
        return {s: a for s, a in self.present.items() if s not in self.without_number}

    @property
    def incomplete(self) -> list[str]:
        """Settings without a full number: no number, or one over part of a split."""
        short = set(self.without_number) | set(self.partial_settings)
        return [s for s in self.names if s in short]

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

    def _shortfalls(self) -> list[str]:
        parts = [f"missing: {', '.join(self.missing)}"] if self.missing else []
        return parts + ([f"over part of the split: {', '.join(self.partial_settings)}"] if self.partial else [])

    def describe(self) -> str:
        """`2.3000 / 5`, or the partial sum "over 3 of 5 settings" and why there is no score yet."""
        if self.score is not None:
            return f"{self.score:.4f} / {self.max}"
        return (f"{'PARTIAL' if self.partial else 'incomplete'} ({self.partial_sum:.4f} over {self.covered} of "
                f"{self.max} settings; {'; '.join(self._shortfalls())})")

    def __str__(self) -> str:
        return self.describe()


@dataclass(frozen=True)
class BlackBoxScore(ProtocolScore):
    """The card's transfer protocol: per split the strongest of the card's surrogates (lowest accuracy).

    A setting is complete only when every card surrogate of it was scored over its whole split. One absent from
    the snapshot makes the minimum an upper bound (`absent_surrogates`: no number for the setting); one in the
    snapshot but not asked yet (an API model under `max_requests`: `not_asked`) or asked over part of its split
    makes the setting PARTIAL. Surrogates the card does not list are scored in `other_surrogates`, never in the
    score. `own_surrogates`: transfer splits made from this very model (a white-box transfer), named wherever
    the score is shown.
    """

    strongest_surrogate: dict[str, str | None]
    by_surrogate: dict[str, dict[str, Accuracy]]
    absent_surrogates: dict[str, list[str]]
    other_surrogates: dict[str, dict[str, Accuracy]]
    not_asked: dict[str, list[str]] = field(default_factory=dict)
    own_surrogates: list[str] = field(default_factory=list)
    DERIVED: ClassVar[tuple[str, ...]] = ProtocolScore.DERIVED + ("complete", "surrogate_status")

    @property
    def without_number(self) -> list[str]:
        """Missing settings and upper bounds (a card surrogate absent)."""
        return [s for s in self.names if s in self.missing or self.absent_surrogates.get(s)]

    @property
    def surrogate_status(self) -> dict[str, dict[str, str]]:
        """Per transfer setting, each card surrogate: "whole split", "PARTIAL (n asked)", "not asked yet" or
        "absent" (not in the snapshot)."""
        status: dict[str, dict[str, str]] = {}
        for split, found in self.by_surrogate.items():
            status[split] = {s: f"PARTIAL ({a.total} asked)" if a.partial else "whole split" for s, a in found.items()}
            status[split].update({s: "not asked yet" for s in self.not_asked.get(split, [])})
            status[split].update({s: "absent" for s in self.absent_surrogates.get(split, [])})
        return status

    def _shortfalls(self) -> list[str]:
        parts = super()._shortfalls()
        for label, by_split in (("absent surrogates", self.absent_surrogates), ("not asked yet", self.not_asked)):
            named: dict[str, list[str]] = {}
            for split, names in by_split.items():
                for name in names:
                    named.setdefault(name, []).append(split)
            parts += [f"{label}: " + "; ".join(f"{s} ({', '.join(v)})" for s, v in named.items())] if named else []
        return parts

    def describe(self) -> str:
        own = (f" [includes the model's own adversarial examples ({', '.join(self.own_surrogates)}): a white-box "
               f"transfer, not a black-box score]" if self.own_surrogates else "")
        if self.complete or not self.absent_surrogates:
            return super().describe() + own
        return (f"incomplete (upper bound {self.partial_sum:.4f} of {self.max}; {'; '.join(self._shortfalls())})"
                + own)


# What a scores record keeps of an attack run's summary.json, in the record's order; the fields are RunSummary's.
KEPT_FROM_RUN = ("norm", "eps", "version", "standard", "impl", "impl_version", "precision", "attacks", "seed",
                 "accuracy_after", "forward_rows_per_image", "backward_rows_per_image", "versions", "warnings")
_RUN_TYPES = typing.get_type_hints(RunSummary)
_KeptFromRun = make_dataclass("_KeptFromRun", [(name, _RUN_TYPES[name]) for name in KEPT_FROM_RUN], frozen=True)


@dataclass(frozen=True)
class AttackSummary(JsonRecord, _KeptFromRun):
    """What the scores record keeps of an attack run (`KEPT_FROM_RUN` of rgb.runs.store.RunSummary) and the
    robust accuracy computed from its checked per-image results."""

    robust: Accuracy

    @classmethod
    def of(cls, summary: RunSummary, robust: Accuracy) -> AttackSummary:
        return cls(robust=robust, **{name: getattr(summary, name) for name in KEPT_FROM_RUN})

    def label(self) -> str:
        """How a result that is not the protocol's number is labelled wherever it is shown."""
        parts = [self.version] if self.version != "standard" else []
        parts += [self.precision] if self.precision != "fp32" else []
        if not parts and not self.standard:
            parts.append("attacks " + "+".join(self.attacks))  # a subset of the cascade
        parts += [f"impl {self.impl} {self.impl_version}"] if self.impl != "ours" else []
        return ", ".join(parts)


@dataclass(frozen=True)
class EndpointUsage(JsonRecord):
    """An API model's requests per split (test, common, `<surrogate>/<split>`) and in total. `partial`: some
    images were not asked (max_requests reached); their splits are scored over the answered prefix, marked
    PARTIAL, and a re-run asks only the rest. `answer_parser` and `parser_version`: the reader that mapped the
    answers to classes (rgb.endpoints.answers.READERS: `strict`, version 4, the card's; `lenient`, version 3;
    None in records made before they were kept: a lenient parser, version 1 when that is None too). A reader other
    than the card's puts the record under another protocol (`reader_differences`). `answer_format`: the answer
    format the requests asked for (rgb.endpoints.settings.ANSWER_FORMATS). `clarify`: an unparsed answer was
    followed by a clarifying turn (`model.clarify=true`); another protocol too: the card evaluates API models "by
    inference alone" on each image and says nothing of a second turn, which gives exactly the answers a one-turn
    entry counts wrong a second chance, so its numbers can only be above what one turn would score."""

    base_url: str
    api_model: str
    per_split: dict[str, RequestStats]  # rgb.endpoints.client's, one per split
    max_requests: int | None
    parser_version: int | None = None
    price: dict | None = None  # rgb.endpoints.cost.Price's fields (None: unknown, no money shown)
    answer_parser: str | None = None
    stopped_by: str | None = None  # the cap that stopped the asking, `name=value` (None: none, or recorded before)
    # the format the answers were asked in: model.answer_format, or "text" when the endpoint refused choice's
    # response_format for some (counted per split: answered_in_text); None: recorded before it was kept
    answer_format: str | None = None
    clarify: bool = False  # model.clarify=true asked unparsed answers once more (False: one turn, or recorded before)
    DERIVED: ClassVar[tuple[str, ...]] = ("total", "partial", "spent", "list_cost", "unparsed_rate")

    def __post_init__(self):  # a record written before secrets were redacted is shown without them
        object.__setattr__(self, "base_url", redact_url(self.base_url))

    @property
    def total(self) -> dict[str, float | None]:
        """Each count summed over the splits (money: None when a split lacks it)."""
        values = {f.name: [getattr(c, f.name) for c in self.per_split.values()] for f in fields(RequestStats)}
        return {name: None if None in v else sum(v) for name, v in values.items()}

    @property
    def partial(self) -> bool:
        return self.total["unanswered"] > 0

    def waiting(self) -> str:
        """What a PARTIAL record waits for: the images not answered yet and why (the cap that stopped the asking,
        answers cut by the token limit)."""
        total = self.total
        reasons = [f"{self.stopped_by} reached"] if self.stopped_by else []
        reasons += ["answers cut by the token limit"] if total["truncated"] else []
        if not reasons:  # recorded before the cap was
            reasons = [f"max_requests={self.max_requests}, or max_tokens_total / max_cost"]
        return f"{int(total['unanswered'])} images not asked yet ({'; '.join(reasons)})"

    @property
    def unparsed_rate(self) -> float | None:
        """The share of all answers used that were read as no class (counted wrong; None: none answered)."""
        return RequestStats(**{k: int(self.total[k]) for k in ("images", "unanswered", "unparsed")}).unparsed_rate

    @property
    def reader(self) -> str:
        """The reader as shown: "strict v4", "lenient v3", "lenient v1" (a record from before it was kept)."""
        return f"{self.answer_parser or 'lenient'} v{self.parser_version or 1}"

    def unparsed_line(self) -> str:
        """The answers read as no class, their rate, the reader and the format asked, as every table shows them:
        "12 unparsed (50.0% of 24 answers; answer parser strict v4; answer format choice)", with the lenient
        reader's denials and alternatives among them."""
        total, rate = self.total, self.unparsed_rate
        lenient = (f"{int(total['negations'])} denying a class, {int(total['alternatives'])} alternatives; "
                   if self.answer_parser != CARD_PARSER else "")
        answered = int(total["images"] - total["unanswered"])
        share = "no answer" if rate is None else f"{100 * rate:.1f}% of {answered} answers"
        asked = f"; answer format {self.answer_format}" if self.answer_format else ""
        return f"{int(total['unparsed'])} unparsed ({share}; {lenient}answer parser {self.reader}{asked})"

    def reader_differences(self) -> list[str]:
        """How the asking and reading depart from the card's protocol (empty: one turn, the strict reader)."""
        return ([] if self.answer_parser == CARD_PARSER else [f"answer parser {self.reader}, card {CARD_PARSER}"]) + \
            (["clarifying turn (model.clarify=true), card one turn"] if self.clarify else [])

    @property
    def spent(self) -> float | None:
        """USD the provider billed for the answers used, each once (online or Batch rate, its prompt-cached input
        at the cached price), whichever run asked it: a resumed run totals as an uninterrupted one. None: no
        price, or recorded before it was kept."""
        return None if self.price is None else self.total["spent"]

    @property
    def list_cost(self) -> float | None:
        """USD of the answers used, each once, at list price (online, no prompt cache)."""
        return None if self.price is None else self.total["list_cost"]


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
    max_images: int | None = None  # the first N images of each split were evaluated (allow_partial)
    schema: int = SCORES_SCHEMA
    white_box_na: str | None = None  # why white-box settings do not apply ("API model"): shown as n/a, never 0
    api: EndpointUsage | None = None
    protocol: Protocol | None = None  # required (checked): a default only because the fields above have one
    control: Accuracy | None = None  # random_linf_30, the card's control: shown, never summed
    train: TrainRun | None = None  # the model's training run (None: a model scored without its run record)
    DERIVED: ClassVar[tuple[str, ...]] = ("partial", "protocol_differences")

    def __post_init__(self):
        if self.protocol is None:
            raise RecordError(f"scores record of {self.model.run_name} on {self.dataset} without its protocol")
        # every file a pool writes for a record is named from these (rgb.core.files.distinct_name): each must be one
        # path component, never `..`, `a/b` or a name no file system takes
        for what, name in (("model run_name", self.model.run_name), ("dataset", self.dataset)):
            if name is not None and (problem := name_problem(name)):
                raise RecordError(f"scores record with {what} {shown_name(name)}: {problem}; evaluate the model "
                                  f"again under a {what} that is one directory name")
        for plot in self.plots:  # a plot is a file beside scores.json, copied under its name into the site
            if problem := name_problem(plot):
                raise RecordError(f"scores record of {shown_name(self.model.run_name)} with plot {shown_name(plot)}: "
                                  f"{problem}; a plot is a file name beside scores.json (evaluate the model again)")

    @classmethod
    def from_json(cls, data: dict, where: str = "") -> ScoresRecord:
        if isinstance(data, dict) and data.get("schema") != SCORES_SCHEMA:
            raise RecordError(f"scores schema {data.get('schema')} (this rgb writes {SCORES_SCHEMA})")
        return super().from_json(data, where)

    @classmethod
    def load(cls, path: Path) -> ScoresRecord:
        """The record of a scores.json; anything malformed is one RecordError naming the file and what to do."""
        return load_record(cls, path, RecordError, "re-run evaluate.py for this model (or move the file out of the "
                                                   "pool)")

    def save(self, path: Path) -> None:
        atomic_write_json(Path(path), self.to_json())

    @property
    def title(self) -> str:
        return f"{self.model.run_name} on {self.dataset}" + (" (PARTIAL)" if self.partial else "")

    @property
    def partial(self) -> bool:
        """Some setting was scored over part of its split."""
        return self.white_box.partial or bool(self.black_box and self.black_box.partial)

    def folder(self, out_dir: Path) -> Path:
        """Where this record's files go under an evaluation's output dir (a PARTIAL one apart)."""
        return partial_dir(out_dir) if self.partial else Path(out_dir)

    @property
    def file_name(self) -> str:
        return PARTIAL_SCORES_FILE if self.partial else SCORES_FILE

    def score_under(self, name: str) -> ProtocolScore | None:
        return {WHITE_BOX: self.white_box, BLACK_BOX: self.black_box}[name]

    def differences_for(self, name: str) -> list[str]:
        """How this record departs from the card's protocol `name` (empty: a card entry of its Sum and Borda)."""
        found = self.protocol.differences_for(name) + (self.api.reader_differences() if self.api else [])
        if name == BLACK_BOX and self.black_box and self.black_box.own_surrogates:
            found.append(f"own adversarial examples as transfer ({', '.join(self.black_box.own_surrogates)})")
        return found

    @property
    def protocol_differences(self) -> dict[str, list[str]]:
        return {name: self.differences_for(name) for name in PROTOCOLS}

    def not_applicable(self, protocol: str) -> str | None:
        """`n/a (API model)` where a protocol cannot apply to this model (a leaderboard lists it, unranked)."""
        return f"n/a ({self.white_box_na})" if protocol == WHITE_BOX and self.white_box_na else None

    def card_score(self, name: str) -> float | None:
        """The score of protocol `name` (its sum over this dataset's settings, every one a full number) when the
        record was made under the card's protocol; None otherwise: a sum at other budgets, image size or
        surrogates is no score anywhere (printed, W&B, model_info, a sweep's objective)."""
        found = self.score_under(name)
        return None if found is None or self.differences_for(name) else found.score

    def metrics(self) -> dict[str, float]:
        """Every number of the record under a slash-separated key (accuracies as their value), for W&B; a
        protocol's `score` only where `card_score` gives one."""
        found = dict(_flatten(self, ""))
        for name in PROTOCOLS:
            if self.card_score(name) is None:
                found.pop(f"{name}/score", None)
        return found


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
