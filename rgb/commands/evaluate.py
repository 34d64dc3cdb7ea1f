"""evaluate.py's config half: the composed config becomes one request (a model to score, a pool to rank, or one of
the reports that replace the scores) and rgb.evaluation runs it. A pool builds one request per member, each named
and placed as run=DIR would be. Plain Python at import, so that its SCHEMA (and its reports') is read before torch
loads: the modules that score are imported by the functions that run them."""

from __future__ import annotations

import glob
import importlib
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from rgb.commands.schema import DATA, MACHINE, RUN, WANDB
from rgb.core.configs import config_dir
from rgb.core.values import BOOL, TEXT, list_of, one_of, optional
from rgb.data.catalog import BLACK_BOX, WHITE_BOX
from rgb.endpoints.client import RequestCaps
from rgb.evaluation.leaderboard import RANK_KEYS
from rgb.evaluation.request import EvalRequest, RunOutputs
from rgb.runs.store import missing_sweep_jobs, train_runs

if TYPE_CHECKING:
    from rgb.evaluation.run import PoolRequest

# Flags of evaluate.py that make another report instead of the scores: flag -> (module, function(cfg)).
REPORTS = {
    "text_robustness": ("rgb.commands.text_robustness", "run_text_robustness"),
    "zeroshot_report": ("rgb.commands.zeroshot_report", "run_zeroshot_report"),
}



# A pool entry: a train run or sweep dir, a dir of scores.json files, a comparison.json, or a glob of run dirs.
POOL_ENTRY = (lambda v: isinstance(v, str) and bool(glob.glob(v) if glob.has_magic(v) else Path(v).exists()),
              "existing directories or files (or globs matching some)")
# conf/evaluate.yaml's schema (rgb.commands.schema; the reports of REPORTS add theirs).
# The request's own rules (EvalRequest), and rows for the keys no request field reads.
SCHEMA = {
    **DATA, **MACHINE, **WANDB, **EvalRequest.rules(), "run": optional(RUN["run"]),
    "pool": optional(list_of(POOL_ENTRY)),
    "rank_by": one_of(RANK_KEYS), **dict.fromkeys(("text_robustness", "zeroshot_report", "site"), BOOL),
    "leaderboard_datasets": optional(list_of(TEXT)),
}


def member(cfg: DictConfig, run) -> DictConfig:
    """The config of one pool model: its run_name and output_dir resolve as they would for run=DIR."""
    return OmegaConf.merge(cfg, {"run": str(run), "pool": None})


def run_outputs(cfg: DictConfig) -> RunOutputs:
    """The model of `cfg.run`, its name and output dir."""
    return RunOutputs(Path(str(cfg.run)), str(cfg.run_name), Path(str(cfg.output_dir)))


def price_table() -> dict:
    """conf/prices.yaml: api_model -> {input, output, cached_input} USD per 1M tokens."""
    return OmegaConf.to_container(OmegaConf.load(config_dir() / "prices.yaml"))


def request_caps(cfg: DictConfig) -> RequestCaps:
    """The API caps, each read from its key of conf/evaluate.yaml by its field's name."""
    return RequestCaps.from_config(cfg)


def eval_request(cfg: DictConfig) -> EvalRequest:
    """conf/evaluate.yaml's keys onto EvalRequest's fields by name; the model, data, prices and W&B project built."""
    tracking = cfg.wandb
    return EvalRequest.from_config(
        cfg, model=run_outputs(cfg), data=partial(instantiate, cfg.data), prices=price_table(),
        wandb_project=str(tracking.project) if tracking.enabled else None)


def pool_request(cfg: DictConfig) -> PoolRequest:
    """pool=[...]: a train sweep or run dir names its models (one request each), any other entry is a dir of
    scores.json files."""
    from rgb.evaluation.run import PoolRequest

    entries, missing = [], []
    for entry in cfg.pool:
        runs = train_runs(entry)
        entries += [eval_request(member(cfg, run)) for run in runs] if runs else [Path(str(entry))]
        missing += missing_sweep_jobs(entry)
    datasets = cfg.get("leaderboard_datasets")
    return PoolRequest(tuple(entries), str(cfg.protocol), Path(str(cfg.leaderboard_dir)),
                       None if datasets is None else tuple(str(d) for d in datasets), str(cfg.get("rank_by", "borda")),
                       bool(cfg.get("site", False)),
                       str(cfg.wandb.project) if cfg.wandb.enabled else None, tuple(missing))


def run_evaluation(cfg: DictConfig) -> float | None:
    """Returns the score of the model, for sweepers: the `protocol`'s (black-box also for an API model, which has
    no white-box one); None in pool mode, for a dry run, while incomplete or under another protocol."""
    from rgb.evaluation.model_eval import EvaluationError
    from rgb.evaluation.run import evaluate, evaluate_pool

    asked = [flag for flag in REPORTS if cfg.get(flag)]
    if len(asked) > 1:
        raise EvaluationError(f"{' and '.join(asked)} are separate reports: set one of them per command")
    if asked:
        module, function = REPORTS[asked[0]]
        return getattr(importlib.import_module(module), function)(cfg)
    if cfg.pool:
        return evaluate_pool(pool_request(cfg))
    if cfg.run is None:
        raise EvaluationError("nothing to evaluate: give run=<train output dir or .safetensors> or pool=[DIR,...]")
    record = evaluate(eval_request(cfg))[0]
    if record is None:  # dry_run: nothing scored
        return None
    return record.card_score(BLACK_BOX if record.white_box_na or cfg.protocol == BLACK_BOX else WHITE_BOX)
