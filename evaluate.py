"""Score models: `python evaluate.py run=<train output dir>` (five settings, class-wise metrics, plots) or
`python evaluate.py pool=[DIR,...]` (leaderboard with Sum and Borda scores). See conf/evaluate.yaml."""

import sys

import hydra
from omegaconf import DictConfig

from rgb.data import BenchmarkError
from rgb.evaluation import EvaluationError, run_evaluation


@hydra.main(version_base="1.3", config_path="conf", config_name="evaluate")
def main(cfg: DictConfig) -> float | None:
    try:
        return run_evaluation(cfg)
    except (EvaluationError, BenchmarkError, FileNotFoundError) as err:
        sys.exit(f"evaluate.py: error: {err}")


if __name__ == "__main__":
    main()
