"""evaluate.py text_robustness=true, its config half: the `text_robustness_options` block and the models (run=, or
each pool member named and placed as run=DIR would be) become one TextRobustnessRequest. Plain Python at import
(its SCHEMA is read before torch loads): the report's modules are imported by the functions that run it."""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from rgb.brittleness.perturb import PerturbationError
from rgb.commands.evaluate import member, run_outputs
from rgb.evaluation.text_robustness_options import TextRobustnessOptions

if TYPE_CHECKING:
    from rgb.evaluation.text_robustness import TextRobustnessRequest

# The `text_robustness_options` block of conf/evaluate.yaml (rgb.commands.schema): TextRobustnessOptions' rules.
SCHEMA = TextRobustnessOptions.rules("text_robustness_options.")


def text_robustness_options(cfg: DictConfig) -> TextRobustnessOptions:
    """The block's keys onto TextRobustnessOptions' fields by name; the device and batch are evaluate.py's."""
    from rgb.core.machine import resolve_device

    return TextRobustnessOptions.from_config(OmegaConf.to_container(cfg.text_robustness_options, resolve=True),
                                             device=resolve_device(str(cfg.device)), batch_size=int(cfg.batch_size))


def text_robustness_request(cfg: DictConfig) -> TextRobustnessRequest:
    from rgb.evaluation.model_eval import EvaluationError
    from rgb.evaluation.text_robustness import TextRobustnessRequest

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
    from rgb.evaluation.text_robustness import text_robustness

    text_robustness(text_robustness_request(cfg))
