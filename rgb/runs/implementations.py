"""Which AutoAttack code attacks a batch: ours (`impl=ours`, the default) or the authors' reference package
(`impl=reference`, `pyautoattack`, an optional extra) through the same run store, so a surprising number can be
cross-checked with one flag. Adding an implementation = one class + one entry of IMPLEMENTATIONS. Plain Python at
import (each runs its attack code inside `run`), so attack.py's schema reads the table's names before torch loads.
"""

from __future__ import annotations

from importlib import metadata
from typing import TYPE_CHECKING

import rgb
from rgb.attacks.registry import REFERENCE_VERSIONS
from rgb.core.threat import ThreatModel
from rgb.runs.errors import AttackRunError

if TYPE_CHECKING:
    from rgb.attacks.autoattack import AutoAttackResult

REFERENCE_PACKAGE = "pyautoattack"


class OursImplementation:
    name = "ours"

    @staticmethod
    def fooled_steps(options) -> int:
        """APGD-CE steps a falling image is counted with in the dry run's cost model (rgb.runs.cost): ours drops it
        within 5 steps of its success, taken to come within the first 10."""
        return min(10, options.steps)

    @staticmethod
    def version() -> str:
        return rgb.__version__

    def check(self, model, threat: ThreatModel, request) -> None:
        """Fail on a bad budget before any directory is written (the options were checked when made)."""
        from rgb.attacks.autoattack import AutoAttack

        try:
            AutoAttack(model, threat.norm.value, threat.eps, request.options)
        except ValueError as err:
            raise AttackRunError(f"{threat.name}: {err}") from err

    def run(self, model, x, y, threat: ThreatModel, request, device: str, progress, on_leave=None, on_rows=None
            ) -> AutoAttackResult:
        """`progress(name, *position)` hears the stages and steps, `on_leave(n)` the images that finished,
        `on_rows(stage, entered, attacked, fooled)` each stage's images (AutoAttack's hooks)."""
        from rgb.attacks.autoattack import AutoAttack

        # A fresh instance per batch: no RNG state carries over between batches.
        attack = AutoAttack(model, threat.norm.value, threat.eps, request.options, device=device, progress=progress,
                            on_leave=on_leave, on_rows=on_rows)
        return attack.run(x, y, batch_size=request.batch_size)


class ReferenceImplementation:
    name = "reference"

    @staticmethod
    def fooled_steps(options) -> int:
        """The reference iterates a fooled image to the end of the attack that fooled it (docs/performance.md)."""
        return options.steps

    @staticmethod
    def version() -> str:
        try:
            return metadata.version(REFERENCE_PACKAGE)
        except metadata.PackageNotFoundError:
            raise AttackRunError(f"impl=reference needs the reference AutoAttack: pip install "
                                 f"'robustgenbench[reference]' (package {REFERENCE_PACKAGE})") from None

    def check(self, model, threat: ThreatModel, request) -> None:
        self.version()
        options = request.options
        if options.precision != "fp32":
            raise AttackRunError("impl=reference runs in fp32 only (precision=fp32)")
        if options.tail_rows:
            raise AttackRunError("impl=reference runs targets one after another (tail_rows=0)")
        if options.schedule != "batch":
            raise AttackRunError("impl=reference runs its cascade a batch at a time (schedule=batch)")
        if options.version not in REFERENCE_VERSIONS:
            raise AttackRunError(f"impl=reference has versions {', '.join(REFERENCE_VERSIONS)}; got {options.version!r}")
        if options.off_protocol():
            raise AttackRunError(f"impl=reference runs the protocol's step and query counts: leave "
                                 f"{', '.join(options.off_protocol())} at the default")

    def run(self, model, x, y, threat: ThreatModel, request, device: str, progress, on_leave=None, on_rows=None
            ) -> AutoAttackResult:
        from rgb.runs.reference import run_reference

        return run_reference(model, x, y, threat, request, device, progress, on_leave, on_rows)


IMPLEMENTATIONS = {impl.name: impl for impl in (OursImplementation(), ReferenceImplementation())}


def attack_implementation(name: str):
    if name not in IMPLEMENTATIONS:
        raise AttackRunError(f"impl must be one of {list(IMPLEMENTATIONS)}, got {name!r}")
    return IMPLEMENTATIONS[name]
