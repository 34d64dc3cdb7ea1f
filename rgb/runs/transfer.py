"""Transfer splits for the mini benchmark, made the way the real ones were: AutoAttack a surrogate at the seven
transfer budgets of the data config (already scaled to 32x32) and write config `<dataset>-<surrogate>` into
the benchmark snapshot itself, so the black-box protocol can be run end to end without the real benchmark.

    python train.py run_name=resnet_ce                                    # any train run is a surrogate
    rgb-transfer run=outputs/train/digits/resnet_ce                       # -> data/digits/resnet_ce/<split>.parquet

Images the surrogate already misclassifies are copied unchanged (is_modified = false), as on the real benchmark;
attack runs are resumable (outputs/transfer/<dataset>/<surrogate>/<split>/), see conf/transfer.yaml.
"""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig

from rgb.runs.runner import execute
from rgb.runs.settings import AttackRunError, AttackSettings, transfer_budgets
from rgb.runs.store import RunSummary


def make_transfer_splits(cfg: DictConfig, threads: int = 1) -> dict[str, RunSummary]:
    """Attack the surrogate `cfg.run` at every requested budget and write the splits into `cfg.data.source`."""
    if not Path(str(cfg.data.source)).is_dir():
        raise AttackRunError(f"data.source={cfg.data.source} is not a local benchmark directory to write into")
    if not cfg.export_adversarial:
        raise AttackRunError("transfer splits are the exported adversarial images: export_adversarial must stay true")
    budgets = transfer_budgets(cfg.splits, cfg.data)
    return execute(AttackSettings.from_config(cfg, budgets, surrogate=str(cfg.surrogate), threads=threads))
