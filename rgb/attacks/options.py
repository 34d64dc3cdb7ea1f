"""The options of an AutoAttack run, declared once: `AttackOptions`.

AutoAttack, an attack run's settings (and its summary.json and run identity), robust validation and the
reference implementation all take one `AttackOptions`; the config and `rgb.benchmark` map onto its fields by name.
A field (`rgb.core.options.ruled`) says what it is to the rest of the suite, so a new option is its field here (and
its key in conf/attack.yaml) and nothing else:
  - `rule`: the value it must have (`rgb.core.values`), checked when the options are made and by the commands
    before anything runs;
  - `feeds`: the cascade input of `rgb.attacks.registry` it supplies (`only`: to these attacks, overriding the
    option that feeds the same input to every attack; None leaves that option's value);
  - `identity`: part of a run's identity (`ALWAYS`, or `WHEN_SET`: only when not its default, so directories of
    earlier runs keep theirs); options that change float rounding only are not;
  - `protocol`: a value other than its default is not the protocol's number (the run is not standard).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from rgb.attacks.registry import VERSIONS
from rgb.core.errors import UserError
from rgb.core.options import Ruled, ruled
from rgb.core.values import BOOL, INT, NON_NEGATIVE_INT, POSITIVE_INT, one_of, optional

PRECISIONS = ("fp32", "tf32", "bf16")
INPUT_FORMATS = ("auto", "contiguous", "channels_last")
CAPTURES = ("auto", "eager", "trace")
SCHEDULES = ("batch", "pooled", "pooled_by_need")
ALWAYS, WHEN_SET = "always", "when set"


class AttackOptionsError(UserError, ValueError):
    """Options AutoAttack cannot run, or cannot run on the model given (capture='trace' on a model a trace would
    change, input_format='channels_last' on one that refuses NHWC): one line naming the option, its rule or the
    model's problem, and the value."""


@dataclass(frozen=True)
class AttackOptions(Ruled):
    """What AutoAttack is asked to run, validated once when made.

    See `rgb.attacks.AutoAttack` for what each option does. Options marked "not the protocol's" make a run whose
    number is not the benchmark's (`off_protocol`).

    Args:
        version: "standard", "plus", "fast" or "rand" (`rgb.attacks.registry.VERSIONS`).
        seed: The seed of every attack's random starts.
        attacks: A non-empty subset of the version's attacks, run in the version's order (diagnostics: not
            AutoAttack); None: the version's whole cascade.
        precision: "fp32", or "tf32" / "bf16" (attacks under TF32 matmuls / bf16 autocast; every success
            re-verified in fp32; not the protocol's).
        steps: Iterations of each gradient attack (not the protocol's unless 100).
        fab_steps: Iterations of FAB and FAB-T; None: `steps` (not the protocol's when set).
        queries: Square's query budget (not the protocol's unless 5000).
        tail_rows: > 0 runs the targets left of APGD-T and FAB-T side by side once they fit in that many rows.
        input_format: "auto", "contiguous" or "channels_last": the memory format of the attacks' model calls.
        capture: "auto", "eager" or "trace": whether the attacks call a TorchScript trace of the model.
        schedule: "batch", "pooled" or "pooled_by_need": how an attack run (rgb.runs) orders the cascade over its
            images.
        cudnn_benchmark: cudnn picks the fastest convolution algorithm per shape (CUDA only; rounding only).

    Raises:
        AttackOptionsError: A value outside its rule (one line naming the option, its rule and the value),
            `attacks` not a non-empty subset of the version's, or capture="trace" without precision="fp32".
    """

    version: str = ruled("standard", rule=one_of(VERSIONS), identity=ALWAYS)
    seed: int = ruled(0, rule=INT, identity=ALWAYS, feeds="generator")
    attacks: tuple[str, ...] | None = ruled(None, identity=ALWAYS)
    precision: str = ruled("fp32", rule=one_of(PRECISIONS), identity=ALWAYS)
    steps: int = ruled(100, rule=POSITIVE_INT, identity=WHEN_SET, protocol=True, feeds="n_iter")
    fab_steps: int | None = ruled(None, rule=optional(POSITIVE_INT), identity=WHEN_SET, protocol=True,
                                    feeds="n_iter", only=("fab", "fab-t"))
    queries: int = ruled(5000, rule=POSITIVE_INT, identity=WHEN_SET, protocol=True, feeds="n_queries")
    tail_rows: int = ruled(0, rule=NON_NEGATIVE_INT, identity=WHEN_SET, feeds="tail_rows")
    input_format: str = ruled("auto", rule=one_of(INPUT_FORMATS))
    capture: str = ruled("auto", rule=one_of(CAPTURES))
    # How an attack run (rgb.runs) orders the cascade over its images: "batch" runs the whole cascade on one batch
    # after another; "pooled" runs each stage over the survivors of all of a shard's batches, re-cut into full
    # batches (rgb.runs.pooled); "pooled_by_need" pools only the batches whose survivors fall below the rows per call
    # at which the model saturates (measured once per run), the others' images get the batch schedule's results bit
    # for bit. AutoAttack.run on one tensor is one pool either way. Other chunks draw other random starts (never a
    # weaker attack), so it is part of a run's identity once set.
    schedule: str = ruled("batch", rule=one_of(SCHEDULES), identity=WHEN_SET)
    # cudnn's benchmark mode (CUDA only) picks the fastest convolution algorithm per shape, by timing: another
    # algorithm rounds differently (float rounding only, spec §6.3 item 6), so neither identity nor protocol.
    cudnn_benchmark: bool = ruled(False, rule=BOOL)

    def __post_init__(self):
        self.check(error=AttackOptionsError)
        order = VERSIONS[self.version].attacks
        if self.attacks is not None:
            attacks = tuple(str(a) for a in self.attacks)
            if not attacks or any(a not in order for a in attacks):
                raise AttackOptionsError(f"attacks of version {self.version!r} must be a non-empty subset of {order}, got "
                                 f"{list(attacks)}")
            object.__setattr__(self, "attacks", attacks)
        if self.capture == "trace" and self.precision == "bf16":
            raise AttackOptionsError("capture='trace' needs precision='fp32' or 'tf32' (a trace does not follow "
                                     "autocast)")

    def changed(self) -> dict[str, object]:
        """The options that differ from their defaults, by name."""
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) != f.default}

    def identity(self, when: str) -> dict[str, object]:
        """The options of a run's identity recorded `when` (ALWAYS, or WHEN_SET and not at their defaults)."""
        changed = self.changed()
        return {f.name: list(value) if isinstance(value := getattr(self, f.name), tuple) else value
                for f in fields(self) if f.metadata.get("identity") == when and (when == ALWAYS or f.name in changed)}

    def off_protocol(self) -> list[str]:
        """The options set to other values than the protocol's (such a run's number is not the benchmark's)."""
        return [f.name for f in fields(self) if f.metadata.get("protocol") and f.name in self.changed()]

    def cascade_inputs(self, attack: str) -> dict[str, object]:
        """The cascade inputs (`rgb.attacks.registry.CASCADE_INPUTS`) the options supply to `attack`: an option fed
        to named attacks only overrides the one fed to all, unless it is None."""
        inputs: dict[str, object] = {}
        for specific in (False, True):
            for f in fields(self):
                feeds, only, value = f.metadata.get("feeds"), f.metadata.get("only"), getattr(self, f.name)
                if feeds and (only is not None) == specific and value is not None and (only is None or attack in only):
                    inputs[feeds] = value
        return inputs
