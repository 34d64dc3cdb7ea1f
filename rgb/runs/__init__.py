"""Attack runs: the validated request, the run store (directory layout, summary schema, checked reads), the
resumable batch loop, the attack implementations (ours, the reference) and the mini transfer splits."""

from rgb.core.lazy import lazy_names

# Each name from its module on first use (rgb.core.lazy): the package's option types load without torch.
__getattr__ = lazy_names(__name__, {
    "AttackRequest": "rgb.runs.request",
    "Budget": "rgb.runs.request",
    "RESULT_COLUMNS": "rgb.runs.store",
    "AttackRunError": "rgb.runs.store",
    "RunDirectory": "rgb.runs.store",
    "RunResult": "rgb.runs.store",
    "RunSummary": "rgb.runs.store",
    "read_run": "rgb.runs.store",
    "run_name_for": "rgb.runs.store",
})

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
