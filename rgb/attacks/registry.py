"""The attack table and the AutoAttack versions built from it.

An attack is a function following `rgb.attacks.common.Attack`; its entry in `ATTACKS` says which of the
cascade's shared inputs it takes (the batch's clean logits, the seed as `generator`, the iteration or query
budget). A version is an ordered list of steps, each an attack name with its parameters (optionally different
at one norm). Adding an attack or a version is one module and one entry here; nothing else branches on names.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from importlib import import_module
from types import MappingProxyType
from typing import TYPE_CHECKING

from rgb.core.threat import Norm

if TYPE_CHECKING:
    from rgb.attacks.common import Attack

# The inputs AutoAttack can hand an attack besides (model, x, y, norm, eps, counter).
CASCADE_INPUTS = frozenset({"clean_logits", "generator", "n_iter", "n_queries", "tail_rows"})
_GRADIENT_INPUTS = frozenset({"clean_logits", "generator", "n_iter"})
_TARGETED_INPUTS = _GRADIENT_INPUTS | {"tail_rows"}  # targets of a small tail may run side by side


class DeferredAttack:
    """The attack function `name` of rgb.attacks.`module`, imported at its first call: the table, and the versions
    built from it, load without torch (attack.py's schema reads AttackOptions' rules, the version names among them,
    before torch loads)."""

    def __init__(self, module: str, name: str):
        self.module, self.__name__ = module, name

    @property
    def function(self) -> Attack:
        return getattr(import_module(f"rgb.attacks.{self.module}"), self.__name__)

    def __call__(self, *args, **kwargs):
        return self.function(*args, **kwargs)

    def __repr__(self) -> str:
        return f"rgb.attacks.{self.module}.{self.__name__}"


def _freeze(record, *names: str) -> None:
    """Make the named mapping fields of a frozen dataclass read-only (table rows are shared)."""
    for name in names:
        object.__setattr__(record, name, MappingProxyType(dict(getattr(record, name))))


@dataclass(frozen=True)
class AttackEntry:
    """One row of the attack table. `params`: fixed keyword arguments; `inputs`: the cascade inputs it takes;
    `min_classes`: fewer classes is an error; `black_box`: a success where white-box attacks failed hints at
    gradient masking (AutoAttack warns); `position`: the names of the levels of its progress positions, outermost
    first (`rgb.attacks.common.Progress`), so a stage reads `apgd-t target 3/9 step 59/100`; `worst_rows(params,
    n_classes)`: the (forward, backward) rows it spends on an image it never fools, from its parameters (the cost
    model of docs/performance.md; `AutoAttack.worst_case_rows`)."""

    attack: Attack
    inputs: frozenset[str]
    worst_rows: Callable[[Mapping, int], tuple[int, int]]
    params: Mapping = field(default_factory=dict)
    min_classes: int = 2
    black_box: bool = False
    position: tuple[str, ...] = ("step",)

    def __post_init__(self):
        _freeze(self, "params")
        unknown = self.inputs - CASCADE_INPUTS
        if unknown:
            raise ValueError(f"unknown cascade inputs {sorted(unknown)}; known: {sorted(CASCADE_INPUTS)}")


def _apgd_rows(params: Mapping, n_classes: int) -> tuple[int, int]:
    """APGD: a gradient at the start of each eps stage (three under L1's 'largereps') and at each step, per restart
    (or target) and EoT pass."""
    runs = params.get("n_restarts", 1) * params.get("n_targets", 1) * params.get("eot_iter", 1)
    rows = runs * (params.get("n_iter", 100) + (3 if params.get("eps_schedule") == "largereps" else 1))
    return rows, rows


def _malt_rows(params: Mapping, n_classes: int) -> tuple[int, int]:
    """APGD-T over the MALT targets: APGD's, after one forward and a gradient per candidate class to rank them."""
    from rgb.attacks.malt import N_CANDIDATES

    forward, backward = _apgd_rows(params, n_classes)
    return forward + 1, backward + min(params.get("n_candidates", N_CANDIDATES), n_classes - 1)


def _fab_targeted_rows(params: Mapping, n_classes: int) -> tuple[int, int]:
    """FAB-T: per target a start forward, and per step one gradient of the target's gap and one forward of the
    candidate."""
    targets, steps = params.get("n_targets", 9), params.get("n_iter", 100)
    return targets * (2 * steps + 1), targets * steps


def _fab_rows(params: Mapping, n_classes: int) -> tuple[int, int]:
    """Untargeted FAB: as FAB-T per restart, with the gradients of every class's gap (a backward row each)."""
    restarts, steps = params.get("n_restarts", 5), params.get("n_iter", 100)
    return restarts * (2 * steps + 1), restarts * steps * n_classes


def _square_rows(params: Mapping, n_classes: int) -> tuple[int, int]:
    """Square: the initial stripes and one forward per query."""
    return params.get("n_queries", 5000) + 1, 0


_BY_TARGET = ("target", "step")
_APGD, _APGD_T, _MALT = (DeferredAttack("apgd", "apgd"), DeferredAttack("apgd", "apgd_targeted"),
                         DeferredAttack("malt", "apgd_malt"))
_FAB, _FAB_T, _SQUARE = (DeferredAttack("fab", "fab_untargeted"), DeferredAttack("fab", "fab_targeted"),
                         DeferredAttack("square", "square"))
ATTACKS: Mapping[str, AttackEntry] = MappingProxyType({
    "apgd-ce": AttackEntry(_APGD, _GRADIENT_INPUTS, _apgd_rows, {"loss": "ce"}),
    "apgd-dlr": AttackEntry(_APGD, _GRADIENT_INPUTS, _apgd_rows, {"loss": "dlr"}, min_classes=3),
    "apgd-t": AttackEntry(_APGD_T, _TARGETED_INPUTS, _apgd_rows, min_classes=4, position=_BY_TARGET),
    "apgd-t-malt": AttackEntry(_MALT, _TARGETED_INPUTS, _malt_rows, min_classes=4, position=_BY_TARGET),
    "fab-t": AttackEntry(_FAB_T, frozenset({"clean_logits", "n_iter", "tail_rows"}), _fab_targeted_rows,
                         min_classes=4, position=_BY_TARGET),
    "fab": AttackEntry(_FAB, _GRADIENT_INPUTS, _fab_rows, position=("restart", "step")),
    "square": AttackEntry(_SQUARE, frozenset({"generator", "n_queries"}), _square_rows, black_box=True,
                          position=("query",)),
})


def describe_stage(name: str, position: tuple[int, ...] = ()) -> str:
    """`name` and its progress position in words: ("apgd-t", (3, 9, 59, 100)) -> 'apgd-t target 3/9 step 59/100'.
    Names outside the table (another implementation's stages) and unlabelled positions read as 'a/b'."""
    labels = ATTACKS[name].position if name in ATTACKS else ()
    pairs = [position[i : i + 2] for i in range(0, len(position), 2)]
    if len(labels) != len(pairs):
        return " ".join([name, *("/".join(str(p) for p in pair) for pair in pairs)])
    return " ".join([name, *(f"{label} {'/'.join(str(p) for p in pair)}" for label, pair in zip(labels, pairs))])

@dataclass(frozen=True)
class Step:
    """One attack of a version: its name in ATTACKS, its parameters, and overrides at particular norms."""

    attack: str
    params: Mapping = field(default_factory=dict)
    at_norm: Mapping[Norm, Mapping] = field(default_factory=dict)

    def __post_init__(self):
        _freeze(self, "params", "at_norm")
        if self.attack not in ATTACKS:
            raise ValueError(f"unknown attack {self.attack!r}; the table has {list(ATTACKS)}")

    def params_at(self, norm: Norm) -> dict:
        return {**ATTACKS[self.attack].params, **self.params, **self.at_norm.get(norm, {})}


@dataclass(frozen=True)
class Version:
    """An AutoAttack version. `standard`: its numbers are the benchmark's (only the `standard` version);
    `deterministic_model`: assumes a deterministic model (checks it, and re-verifies the flags in fp32);
    `notes`: a warning every run at that norm carries; `caveat`: appended to the warnings of the reference's sanity checks;
    `reference`: the authors' package (impl=reference) has a version of this name."""

    steps: tuple[Step, ...]
    standard: bool = False
    reference: bool = False
    deterministic_model: bool = True
    notes: Mapping[Norm, str] = field(default_factory=dict)
    caveat: str = ""

    def __post_init__(self):
        _freeze(self, "notes")

    @property
    def attacks(self) -> tuple[str, ...]:
        return tuple(step.attack for step in self.steps)


_L1_SCHEDULE = {"eps_schedule": "largereps"}
_TARGETED = {"n_targets": 9}
_RESTARTED = {"n_restarts": 5}
_EOT = {"eot_iter": 20}

VERSIONS: Mapping[str, Version] = MappingProxyType({
    # Spec §1.1: at L1, 5 APGD-CE restarts and 5 APGD-T targets under the 3-2-1 eps schedule.
    "standard": Version(standard=True, reference=True, steps=(
        Step("apgd-ce", at_norm={Norm.L1: {"n_restarts": 5, **_L1_SCHEDULE}}),
        Step("apgd-t", _TARGETED, at_norm={Norm.L1: {"n_targets": 5, **_L1_SCHEDULE}}),
        Step("fab-t", _TARGETED),
        Step("square"),
    )),
    # The untargeted attacks with 5 restarts each, then the targeted ones; no L1 eps schedule (the reference
    # only warns at L1).
    "plus": Version(
        reference=True,
        steps=(Step("apgd-ce", _RESTARTED), Step("apgd-dlr", _RESTARTED), Step("fab", _RESTARTED), Step("square"),
               Step("apgd-t", _TARGETED), Step("fab-t", _TARGETED)),
        notes={Norm.L1: "version 'plus' at L1 runs without the L1 eps schedule (as the reference, which asks to "
                        "check such results); the standard version is the reference's L1 evaluation"}),
    # Cheap screening (checkpoint choice, sweeps): APGD-CE as standard, then APGD-T over the MALT targets; no
    # FAB-T, no Square. Never the benchmark's number.
    "fast": Version(
        steps=(Step("apgd-ce", at_norm={Norm.L1: {"n_restarts": 5, **_L1_SCHEDULE}}),
               Step("apgd-t-malt", _TARGETED, at_norm={Norm.L1: {"n_targets": 5, **_L1_SCHEDULE}})),
        notes={Norm.L1: "version 'fast' is experimental at L1: FAB-T broke images APGD-T over the MALT targets "
                        "left (4 of 128 on one model, docs/performance.md); use the standard version"},
        caveat="version 'fast' runs neither FAB-T nor Square and cannot rule this out: run the standard version"),
    # Randomised defences: untargeted APGD with CE then DLR, each gradient averaged over 20 EoT passes.
    "rand": Version(reference=True, deterministic_model=False, steps=(Step("apgd-ce", _EOT), Step("apgd-dlr", _EOT))),
})

# The versions the authors' package runs under these names (impl=reference runs only those).
REFERENCE_VERSIONS = tuple(name for name, version in VERSIONS.items() if version.reference)


def is_standard(version: str) -> bool:
    """Are `version`'s numbers the benchmark's (the standard AutoAttack)? Unknown versions are not."""
    return version in VERSIONS and VERSIONS[version].standard
