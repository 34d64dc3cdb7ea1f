"""Scoring a model: the five settings and the transfer protocol from attack runs and clean predictions,
class-wise metrics, leaderboards (Sum and Borda), plots and W&B, all from one typed record (ScoresRecord)."""

from rgb.evaluation.model_eval import EvaluationError
from rgb.evaluation.records import ScoresRecord
from rgb.evaluation.request import EvalRequest
from rgb.evaluation.run import PoolRequest, evaluate, evaluate_pool

__all__ = ["EvalRequest", "EvaluationError", "PoolRequest", "ScoresRecord", "evaluate", "evaluate_pool"]
