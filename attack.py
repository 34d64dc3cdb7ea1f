"""White-box AutoAttack of a fine-tuned model on its dataset's clean test split:
`python attack.py run=outputs/train/<dataset>/<run_name> data=<dataset config>` (resumable; see conf/attack.yaml
for norms, shards and the adversarial-image export)."""

import sys

import hydra
from omegaconf import DictConfig

from rgb.data import BenchmarkError
from rgb.evaluation import AttackRunError, attack_from_config


@hydra.main(version_base="1.3", config_path="conf", config_name="attack")
def main(cfg: DictConfig) -> float | None:
    try:
        summaries = attack_from_config(cfg)
    except (AttackRunError, BenchmarkError) as err:
        sys.exit(f"attack.py: error: {err}")
    # For sweepers: the lowest robust accuracy over the merged norms (None while shards are still missing).
    return min((s["robust_accuracy"] for s in summaries.values()), default=None)


if __name__ == "__main__":
    main()
