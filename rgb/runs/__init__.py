"""Attack runs: validated settings, the run store (directory layout, summary schema, checked reads), the
resumable batch loop, the attack implementations (ours, the reference) and the mini transfer splits."""

from rgb.runs.settings import AttackSettings, Budget
from rgb.runs.store import RESULT_COLUMNS, AttackRunError, RunDirectory, RunResult, RunSummary, read_run, run_name_for

__all__ = [
    "RESULT_COLUMNS",
    "AttackRunError",
    "AttackSettings",
    "Budget",
    "RunDirectory",
    "RunResult",
    "RunSummary",
    "read_run",
    "run_name_for",
]
