"""One spelling of the threat models: a norm (Linf, L2, L1) and a budget eps in [0,1] pixel units.

`Norm.LINF.value` ("Linf") is the attack-facing name, `Norm.LINF.key` ("linf") the config / run-directory
name; `parse_norm` accepts either in any case. Everything else in the suite imports these.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING

from rgb.core.errors import UserError

if TYPE_CHECKING:
    import torch


class ThreatModelError(UserError, ValueError):
    """A norm or a budget that no threat model has (an unknown norm; eps not a finite number > 0)."""


class Norm(str, Enum):
    LINF = "Linf"
    L2 = "L2"
    L1 = "L1"

    @property
    def key(self) -> str:
        """Lower-case name used by configs, run directories and transfer split names."""
        return self.value.lower()

    @property
    def p(self) -> float:
        return {"Linf": math.inf, "L2": 2.0, "L1": 1.0}[self.value]

    @property
    def dual(self) -> Norm:
        """The dual norm q (1/p + 1/q = 1): a linearised boundary's distance in this norm is |gap| / ||grad||_q."""
        return {"Linf": Norm.L1, "L2": Norm.L2, "L1": Norm.LINF}[self.value]

    @property
    def dual_p(self) -> float:
        """Exponent q of the dual norm."""
        return self.dual.p

    def __str__(self) -> str:
        return self.value


NORMS = tuple(Norm)


def parse_norm(norm: str | Norm) -> Norm:
    """The Norm named by `norm` ("Linf", "linf", "L2", "l1", ... or a Norm)."""
    if isinstance(norm, Norm):
        return norm
    if isinstance(norm, str):
        for candidate in Norm:
            if norm.lower() == candidate.key:
                return candidate
    raise ThreatModelError(f"norm must be one of {[n.value for n in Norm]} (any case), got {norm!r}")


def lp_norm(delta: torch.Tensor, norm: str | Norm) -> torch.Tensor:
    """Per-sample norm of `delta` (leading batch dim, any trailing shape) -> shape (N,). Here, not in rgb.attacks,
    so that rgb.data measures its perturbations with it too; tensor methods only, so this module loads no torch."""
    flat = delta.flatten(1)
    norm = parse_norm(norm)
    if norm == Norm.LINF:
        return flat.abs().amax(dim=1)
    if norm == Norm.L2:
        return flat.norm(p=2, dim=1)
    return flat.abs().sum(dim=1)


@dataclass(frozen=True)
class ThreatModel:
    """A white-box or transfer threat model: (norm, eps). `name` is the run-directory / config key. Every budget a
    user gives (rgb.AutoAttack's eps, rgb.benchmark's and a data config's budgets) is checked here: a finite
    eps > 0 (a zero budget attacks nothing; nan or inf would be recorded as the run's budget)."""

    norm: Norm
    eps: float

    def __post_init__(self):
        object.__setattr__(self, "norm", parse_norm(self.norm))
        try:
            eps = float(self.eps)
        except (TypeError, ValueError):
            eps = math.nan
        if isinstance(self.eps, bool) or not math.isfinite(eps) or eps <= 0:
            raise ThreatModelError(f"{self.norm.value} eps must be a finite number > 0 (in [0,1] pixel units), got "
                                   f"{self.eps!r}")
        object.__setattr__(self, "eps", eps)

    @property
    def name(self) -> str:
        return self.norm.key

    def __str__(self) -> str:
        return f"{self.norm.value} eps={self.eps:.6g}"
