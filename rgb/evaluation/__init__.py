"""Scoring a model: white-box attack runs (resumable, shardable) and what is computed from them."""

from rgb.evaluation.attack_run import AttackRunError, attack_from_config, quantise_within_budget, run_name_for
from rgb.evaluation.model_eval import EvaluationError
from rgb.evaluation.run import run_evaluation

__all__ = [
    "AttackRunError",
    "EvaluationError",
    "attack_from_config",
    "quantise_within_budget",
    "run_evaluation",
    "run_name_for",
]
