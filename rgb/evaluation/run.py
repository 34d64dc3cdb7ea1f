"""What evaluate.py does with its config: score one model, or rank a pool of scored models.

What it reports goes through `logging` (Hydra writes it to the console and to evaluate.log alike).
"""

from __future__ import annotations

import importlib
import logging
from dataclasses import replace
from pathlib import Path

from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from rgb.core.files import replaced_whole
from rgb.core.machine import resolve_device
from rgb.evaluation.leaderboard import (
    LeaderboardError,
    find_records,
    seed_spread,
    seed_spread_markdown,
    to_markdown,
    write_leaderboard,
    write_seed_spread,
)
from rgb.evaluation.model_eval import EvalOptions, EvaluationError, evaluate_model, format_table, request_plan
from rgb.evaluation.records import RecordError, ScoresRecord
from rgb.models import export_paths, load_with_meta
from rgb.models.io import origin_line
from rgb.runs.store import train_reference, train_runs

log = logging.getLogger(__name__)
# Flags of evaluate.py that make another report instead of the scores: flag -> (module, function(cfg)).
REPORTS = {
    "text_robustness": ("rgb.evaluation.text_robustness", "run_text_robustness"),
    "zeroshot_report": ("rgb.evaluation.zeroshot_report", "run_zeroshot_report"),
}


def run_evaluation(cfg: DictConfig) -> float | None:
    """Returns the score of the model, for sweepers (white-box; black-box for an API model); None in pool mode,
    for a dry run or while incomplete."""
    asked = [flag for flag in REPORTS if cfg.get(flag)]
    if len(asked) > 1:
        raise EvaluationError(f"{' and '.join(asked)} are separate reports: set one of them per command")
    if asked:
        module, function = REPORTS[asked[0]]
        return getattr(importlib.import_module(module), function)(cfg)
    if cfg.pool:
        return _pool(cfg)
    if cfg.run is None:
        raise EvaluationError("nothing to evaluate: give run=<train output dir or .safetensors> or pool=[DIR,...]")
    record = _score(cfg)[0]
    if record is None:  # dry_run: nothing scored
        return None
    return record.black_box.score if record.white_box_na else record.white_box.score


def _pool(cfg: DictConfig) -> None:
    """pool=[...]: a train sweep or run dir is evaluated first, each model as run=DIR would be; a dir of scores.json
    files is taken as it is. Then the leaderboard, and mean +- std over seeds when the trained models of the pool
    differ in their seed only."""
    sources, trained = [], []
    for entry in cfg.pool:
        runs = train_runs(entry)
        sources += [Path(str(entry))] if not runs else []
        for run in runs:
            member = OmegaConf.merge(cfg, {"run": str(run), "pool": None})
            record, meta = _score(member)
            if record is None:  # dry_run
                continue
            sources.append(Path(str(member.output_dir)))
            trained.append((record, meta))
    datasets = cfg.get("leaderboard_datasets")
    spread = seed_spread([record for record, _ in trained], [meta for _, meta in trained], str(cfg.protocol))
    try:
        records = find_records(sources)
        with replaced_whole(Path(cfg.leaderboard_dir)) as staging:  # all files new, or all as they were
            board = write_leaderboard(records, staging, str(cfg.protocol),
                                      None if datasets is None else [str(d) for d in datasets],
                                      str(cfg.get("rank_by", "borda")))
            write_seed_spread(spread, staging)
    except (LeaderboardError, RecordError) as err:
        raise EvaluationError(str(err)) from err
    log.info("%s", to_markdown(board).rstrip("\n"))
    if spread is not None:
        log.info("%s", seed_spread_markdown(spread).rstrip("\n"))
    log.info("leaderboard written to %s", cfg.leaderboard_dir)
    return None


def _score(cfg: DictConfig) -> tuple[ScoresRecord | None, dict]:
    """Evaluate the model of `cfg.run` (its scores record, None for a dry run, and model.json), named as its run
    record says."""
    if cfg.max_images is not None and not cfg.allow_partial:
        raise EvaluationError("max_images scores part of each split: add allow_partial=true to accept that")
    run = Path(str(cfg.run))
    model, meta = load_with_meta(run)
    meta["run_name"] = str(cfg.run_name)  # rgb.runs.store.run_name_for: a sweep job's unique name, as attack.py's
    origin = origin_line(meta)
    if origin:
        log.info("model %s: %s", meta["run_name"], origin)
    api_model = getattr(model, "inputs", "tensor") != "tensor"
    if (cfg.get("dry_run") or cfg.get("max_requests") is not None) and not api_model:
        raise EvaluationError(f"dry_run and max_requests count API requests; {run} holds a model of family "
                              f"{meta['family']!r}")
    out_dir = Path(str(cfg.output_dir))
    options = EvalOptions(
        attack_dir=Path(str(cfg.attack_dir)), out_dir=out_dir,
        transfer=bool(cfg.transfer) or str(cfg.protocol) == "black_box",
        severity_sweep=bool(cfg.severity_sweep), allow_partial=bool(cfg.allow_partial) or cfg.max_requests is not None,
        max_images=cfg.max_images, worst_k=tuple(OmegaConf.to_container(cfg.worst_k)),
        device=resolve_device(str(cfg.device)), batch_size=int(cfg.batch_size),
        api_cache_dir=Path(str(cfg.api_cache_dir)), max_requests=cfg.get("max_requests"),
    )
    if cfg.get("dry_run"):
        plan = request_plan(model, instantiate(cfg.data), options)
        log.info("dry run of %s on %s: %d distinct requests to send (%d images in %d splits: %d answered by the "
                 "cache, %d duplicates of other images)%s", meta["run_name"], meta["dataset"], plan["requests"],
                 plan["images"], len(plan["splits"]), plan["answered_by_cache"], plan["duplicates"],
                 "" if plan["tokens_estimate"] is None else
                 f"; about {plan['tokens_estimate']} tokens at the cached answers' mean usage")
        return None, meta
    with replaced_whole(out_dir) as staging:  # all outputs written, then they replace the previous ones together
        weights, _ = export_paths(run)
        record = evaluate_model(model, meta, weights, instantiate(cfg.data), replace(options, out_dir=staging))
    log.info("%s", format_table(record))
    log.info("results in %s", record.folder(out_dir))
    if cfg.wandb.enabled:
        from rgb.evaluation.wandb_report import log_evaluation

        log_evaluation(record, record.folder(out_dir), str(cfg.wandb.project),
                       train=train_reference(run, record.model.weights_sha256))
    return record, meta
