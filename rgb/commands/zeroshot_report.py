"""evaluate.py zeroshot_report=true, its config half: the `zeroshot_report_options` block (with evaluate's
`worst_k`) and the entries (run=, or each pool member: a run named and placed as run=DIR would be, or an earlier
report's comparison.json) become one ZeroShotReportRequest. Plain Python at import (its SCHEMA is read before torch
loads): the report's modules are imported by the functions that run it."""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from rgb.commands.evaluate import member, run_outputs
from rgb.core.values import EXISTING_FILE, NON_NEGATIVE, TEXT, list_of, one_of, optional
from rgb.runs.store import ZEROSHOT_REPORT_DIR as REPORT_DIR
from rgb.zeroshot.settings import CMM_UNITS, ENSEMBLE_NAMES

if TYPE_CHECKING:
    from rgb.evaluation.zeroshot_report import ZeroShotReportOptions, ZeroShotReportRequest

# The `zeroshot_report_options` block of conf/evaluate.yaml (rgb.commands.schema).
SCHEMA = {
    "zeroshot_report_options.ensembles": list_of(one_of(ENSEMBLE_NAMES)),
    "zeroshot_report_options.unlabelled_split": optional(TEXT),
    "zeroshot_report_options.cmm_units": optional(one_of(CMM_UNITS)),
    "zeroshot_report_options.mad_t": optional(NON_NEGATIVE),
    "zeroshot_report_options.zpe_pretraining_features": optional(EXISTING_FILE),
    "zeroshot_report_options.descriptions": optional(EXISTING_FILE),
}


def zeroshot_report_options(cfg: DictConfig) -> ZeroShotReportOptions:
    from rgb.core.machine import resolve_device
    from rgb.evaluation.zeroshot_report import ZeroShotReportOptions

    block = OmegaConf.to_container(cfg.zeroshot_report_options, resolve=True)
    paths = {key: None if block.get(key) is None else Path(str(block[key]))
             for key in ("cache_dir", "zpe_pretraining_features", "descriptions", "pool_dir")}
    return ZeroShotReportOptions(
        ensembles=tuple(str(m) for m in block["ensembles"]),
        unlabelled_split=None if block["unlabelled_split"] is None else str(block["unlabelled_split"]),
        device=resolve_device(str(cfg.device)), worst_k=tuple(OmegaConf.to_container(cfg.worst_k)),
        cmm_units=block.get("cmm_units"), mad_t=None if block.get("mad_t") is None else float(block["mad_t"]), **paths)


def zeroshot_report_request(cfg: DictConfig) -> ZeroShotReportRequest:
    from rgb.evaluation.zeroshot_report import ZeroShotReportRequest

    options = zeroshot_report_options(cfg)
    data = partial(instantiate, cfg.data)
    if cfg.pool:
        paths = [Path(str(p)) for p in cfg.pool]
        entries = tuple(path if path.suffix == ".json" else run_outputs(member(cfg, path)) for path in paths)
        return ZeroShotReportRequest(options, entries, data,
                                     options.pool_dir or Path(str(cfg.leaderboard_dir)) / REPORT_DIR)
    return ZeroShotReportRequest(options, () if cfg.run is None else (run_outputs(cfg),), data, None)


def run_zeroshot_report(cfg: DictConfig) -> None:
    """`zeroshot_report=true run=DIR`: one zero-shot run; `pool=[...]` (runs or earlier reports' comparison.json):
    each reported, then the rows averaged over them."""
    from rgb.evaluation.zeroshot_report import zeroshot_reports

    zeroshot_reports(zeroshot_report_request(cfg))
