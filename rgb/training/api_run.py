"""`model=api_chat` (strategy `api`): a run dir for a model behind an API, made without training, the way a
zero-shot CLIP run is: model.json only (family `api`), with the data's class names the prompt will list."""

from __future__ import annotations

import logging
from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf

from rgb.models import export_meta, export_model
from rgb.models.api import ApiClassifier, split_config
from rgb.training.rundir import run_names

log = logging.getLogger(__name__)


def export_api_run(cfg: DictConfig) -> None:
    """Write `<run_dir>/model.json` for the endpoint of `cfg.model`; the API key stays in its environment variable."""
    datamodule = hydra.utils.instantiate(cfg.data)
    try:
        settings, client = split_config(OmegaConf.to_container(cfg.model, resolve=True))
    except (TypeError, ValueError) as err:
        raise ValueError(f"model=api_chat: {err}") from err
    model = ApiClassifier(settings, client, datamodule.class_names, datamodule.dataset)
    meta = export_meta(datamodule, run_names(cfg), loss=None, strategy="api", epochs=0, seed=cfg.seed, weights=None)
    exported = export_model(model, Path(cfg.run_dir), meta)
    log.info("exported %s: %s at %s (no weights; score it with evaluate.py run=%s protocol=black_box)", exported,
             settings.api_model, settings.base_url, cfg.run_dir)
