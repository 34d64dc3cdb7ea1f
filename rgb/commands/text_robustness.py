"""evaluate.py text_robustness=true, its config half: the `text_robustness_options` block and the models (run=, or
each pool member named and placed as run=DIR would be) become one TextRobustnessRequest."""

from __future__ import annotations

from functools import partial
from pathlib import Path

from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from rgb.brittleness.perturb import DEFAULT_TYPES, PERTURBATION_TYPES, PerturbationError
from rgb.commands.evaluate import member, run_outputs
from rgb.core.machine import resolve_device
from rgb.core.values import EXISTING_FILE, INT, POSITIVE_INT, TEXT, list_of, number, one_of, optional
from rgb.evaluation.model_eval import EvaluationError
from rgb.evaluation.text_robustness import TextRobustnessOptions, TextRobustnessRequest, text_robustness

# The `text_robustness_options` block of conf/evaluate.yaml (rgb.commands.schema).
SCHEMA = {
    "text_robustness_options.split": TEXT, "text_robustness_options.types": optional(list_of(one_of(PERTURBATION_TYPES))),
    "text_robustness_options.seeds": list_of(INT), "text_robustness_options.ks": list_of(POSITIVE_INT),
    "text_robustness_options.p": (lambda v: number(v) and 0 < v < 1, "a number in (0, 1)"),
    "text_robustness_options.queries": optional(EXISTING_FILE), "text_robustness_options.user_edits": optional(EXISTING_FILE),
}


def text_robustness_options(cfg: DictConfig) -> TextRobustnessOptions:
    block = OmegaConf.to_container(cfg.text_robustness_options, resolve=True)
    paths = {key: None if block[key] is None else Path(str(block[key])) for key in ("queries", "user_edits", "cache_dir")}
    types = DEFAULT_TYPES if block["types"] is None else tuple(str(t) for t in block["types"])
    return TextRobustnessOptions(split=str(block["split"]), types=types, seeds=tuple(int(s) for s in block["seeds"]),
                                 ks=tuple(int(k) for k in block["ks"]), p=float(block["p"]),
                                 device=resolve_device(str(cfg.device)), batch_size=int(cfg.batch_size), **paths)


def text_robustness_request(cfg: DictConfig) -> TextRobustnessRequest:
    try:
        options = text_robustness_options(cfg)
    except PerturbationError as error:
        raise EvaluationError(str(error)) from error
    runs = list(cfg.pool or []) or ([cfg.run] if cfg.run is not None else [])
    return TextRobustnessRequest(
        options=options, models=tuple(run_outputs(member(cfg, run)) for run in runs), data=partial(instantiate, cfg.data),
        pool_dir=Path(str(cfg.text_robustness_options.pool_dir)) if cfg.pool else None,
        wandb_project=str(cfg.wandb.project) if cfg.wandb.enabled else None,
    )


def run_text_robustness(cfg: DictConfig) -> None:
    """`text_robustness=true` with run=DIR (one model) or pool=[DIR,...] (side by side)."""
    text_robustness(text_robustness_request(cfg))
