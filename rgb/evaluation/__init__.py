"""Scoring a model: the five settings and the transfer protocol from attack runs and clean predictions,
class-wise metrics, leaderboards (Sum and Borda), plots and W&B, all from one typed record (ScoresRecord)."""

from rgb.evaluation.model_eval import EvaluationError
from rgb.evaluation.records import ScoresRecord
from rgb.evaluation.run import run_evaluation

__all__ = ["EvaluationError", "ScoresRecord", "run_evaluation"]
