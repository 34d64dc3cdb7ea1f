"""Attack runs: the validated request, the run store (directory layout, summary schema, checked reads), the
resumable batch loop, the attack implementations (ours, the reference) and the mini transfer splits."""

from rgb.runs.request import AttackRequest, Budget
from rgb.runs.store import RESULT_COLUMNS, AttackRunError, RunDirectory, RunResult, RunSummary, read_run, run_name_for

__all__ = [
    "RESULT_COLUMNS",
    "AttackRequest",
    "AttackRunError",
    "Budget",
    "RunDirectory",
    "RunResult",
    "RunSummary",
    "read_run",
    "run_name_for",
]
