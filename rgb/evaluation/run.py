"""What evaluate.py does with its config: score one model, or rank a pool of scored models.

What it reports goes through `logging` (Hydra writes it to the console and to evaluate.log alike).
"""

from __future__ import annotations

import importlib
import logging
from pathlib import Path

from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from rgb.core.machine import resolve_device
from rgb.evaluation.leaderboard import LeaderboardError, find_records, to_markdown, write_leaderboard
from rgb.evaluation.model_eval import EvalOptions, EvaluationError, evaluate_model, format_table
from rgb.evaluation.records import RecordError
from rgb.models import load_with_meta
from rgb.models.io import WEIGHTS_FILE, origin_line

log = logging.getLogger(__name__)
# Flags of evaluate.py that make another report instead of the scores: flag -> (module, function(cfg)).
REPORTS = {
    "text_robustness": ("rgb.evaluation.text_robustness", "run_text_robustness"),
    "zeroshot_report": ("rgb.evaluation.zeroshot_report", "run_zeroshot_report"),
}


def run_evaluation(cfg: DictConfig) -> float | None:
    """Returns the (white-box) score of the model, for sweepers; None in pool mode or while incomplete."""
    asked = [flag for flag in REPORTS if cfg.get(flag)]
    if len(asked) > 1:
        raise EvaluationError(f"{' and '.join(asked)} are separate reports: set one of them per command")
    if asked:
        module, function = REPORTS[asked[0]]
        return getattr(importlib.import_module(module), function)(cfg)
    if cfg.pool:
        datasets = cfg.get("leaderboard_datasets")
        try:
            board = write_leaderboard(find_records(list(cfg.pool)), Path(cfg.leaderboard_dir), str(cfg.protocol),
                                      None if datasets is None else [str(d) for d in datasets],
                                      str(cfg.get("rank_by", "borda")))
        except (LeaderboardError, RecordError) as err:
            raise EvaluationError(str(err)) from err
        log.info("%s", to_markdown(board).rstrip("\n"))
        log.info("leaderboard written to %s", cfg.leaderboard_dir)
        return None
    if cfg.run is None:
        raise EvaluationError("nothing to evaluate: give run=<train output dir or .safetensors> or pool=[DIR,...]")
    if cfg.max_images is not None and not cfg.allow_partial:
        raise EvaluationError("max_images scores part of each split: add allow_partial=true to accept that")
    run = Path(str(cfg.run))
    model, meta = load_with_meta(run)
    meta.setdefault("run_name", str(cfg.run_name))
    origin = origin_line(meta)
    if origin:
        log.info("model %s: %s", meta["run_name"], origin)
    options = EvalOptions(
        attack_dir=Path(str(cfg.attack_dir)), out_dir=Path(str(cfg.output_dir)), transfer=bool(cfg.transfer),
        severity_sweep=bool(cfg.severity_sweep), allow_partial=bool(cfg.allow_partial),
        max_images=cfg.max_images, worst_k=tuple(OmegaConf.to_container(cfg.worst_k)),
        device=resolve_device(str(cfg.device)), batch_size=int(cfg.batch_size),
    )
    record = evaluate_model(model, meta, run / WEIGHTS_FILE if run.is_dir() else run, instantiate(cfg.data), options)
    log.info("%s", format_table(record))
    log.info("results in %s", options.out_dir)
    if cfg.wandb.enabled:
        from rgb.evaluation.wandb_report import log_evaluation

        log_evaluation(record, options.out_dir, str(cfg.wandb.project))
    return record.white_box.score
