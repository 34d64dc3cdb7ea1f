"""Transfer splits for the mini benchmark, made the way the real ones were: AutoAttack a surrogate at the seven
transfer budgets of the data config (already scaled to 32x32) and write config `<dataset>-<surrogate>` into
the benchmark snapshot itself, so the black-box protocol can be run end to end without the real benchmark.

    python train.py run_name=resnet_ce                                    # any train run is a surrogate
    python -m rgb.data.transfer run=outputs/train/digits/resnet_ce        # -> data/digits/resnet_ce/<split>.parquet

Images the surrogate already misclassifies are copied unchanged (is_modified = false), as on the real benchmark;
attack runs are resumable (outputs/transfer/<dataset>/<surrogate>/<split>/), see conf/transfer.yaml.
"""

from __future__ import annotations

import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig

from rgb.data.benchmark import BenchmarkError
from rgb.data.catalog import TRANSFER_BUDGETS
from rgb.evaluation.attack_run import AttackRunError, AttackSettings, Budget, execute


def transfer_budgets(splits, data: DictConfig) -> tuple[Budget, ...]:
    """The requested transfer splits (all of the data config's `transfer_budgets` when None) as budgets."""
    available = dict(data.get("transfer_budgets") or {})
    names = list(available) if splits is None else [str(s) for s in splits]
    unknown = [n for n in names if n not in available or n not in TRANSFER_BUDGETS]
    if not names or unknown:
        raise AttackRunError(f"unknown transfer splits {unknown or names}; the data config has {list(available)}")
    return tuple(Budget(name, TRANSFER_BUDGETS[name][0], float(available[name]), name) for name in names)


def make_transfer_splits(cfg: DictConfig) -> dict[str, dict]:
    """Attack the surrogate `cfg.run` at every requested budget and write the splits into `cfg.data.source`."""
    if not Path(str(cfg.data.source)).is_dir():
        raise AttackRunError(f"data.source={cfg.data.source} is not a local benchmark directory to write into")
    if not cfg.export_adversarial:
        raise AttackRunError("transfer splits are the exported adversarial images: export_adversarial must stay true")
    settings = AttackSettings.from_config(cfg, transfer_budgets(cfg.splits, cfg.data), surrogate=str(cfg.surrogate))
    return execute(settings)


@hydra.main(version_base="1.3", config_path="../../conf", config_name="transfer")
def main(cfg: DictConfig) -> None:
    try:
        make_transfer_splits(cfg)
    except (AttackRunError, BenchmarkError) as err:
        sys.exit(f"rgb.data.transfer: error: {err}")


if __name__ == "__main__":
    main()
