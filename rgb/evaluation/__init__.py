"""Scoring a model: the five settings and the transfer protocol from attack runs and clean predictions,
class-wise metrics, leaderboards (Sum and Borda), plots and W&B, all from one typed record (ScoresRecord)."""

from rgb.core.lazy import lazy_names

# Each name from its module on first use (rgb.core.lazy): the package's option types load without torch.
__getattr__ = lazy_names(__name__, {
    "EvaluationError": "rgb.evaluation.model_eval",
    "ScoresRecord": "rgb.evaluation.records",
    "EvalRequest": "rgb.evaluation.request",
    "PoolRequest": "rgb.evaluation.run",
    "evaluate": "rgb.evaluation.run",
    "evaluate_pool": "rgb.evaluation.run",
})

__all__ = ["EvalRequest", "EvaluationError", "PoolRequest", "ScoresRecord", "evaluate", "evaluate_pool"]
