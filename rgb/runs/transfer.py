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

from rgb.runs.runner import execute
from rgb.runs.request import AttackRequest
from rgb.runs.store import AttackRunError, RunSummary


def make_transfer_splits(request: AttackRequest, source: str | Path) -> dict[str, RunSummary]:
    """Attack the surrogate `request.run` at each of its budgets and write the splits into the local benchmark
    snapshot `source` (the data module's)."""
    if not Path(str(source)).is_dir():
        raise AttackRunError(f"data.source={source} is not a local benchmark directory to write into")
    if not request.export:
        raise AttackRunError("transfer splits are the exported adversarial images: export_adversarial must stay true")
    return execute(request)
