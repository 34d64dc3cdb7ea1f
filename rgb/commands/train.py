"""train.py's config half: the composed config becomes one TrainRequest (a model behind an API: one EndpointRunRequest)
and rgb.training runs it. What only Hydra knows is read here: the objects its `_target_`s name, the run's place in a
sweep, the `.hydra/` record of the start. Plain Python at import, so that its SCHEMA is read before torch loads (the
training modules are imported by the functions that run them).
"""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

import hydra
from hydra.errors import InstantiationException
from omegaconf import DictConfig, OmegaConf

from rgb.commands.train_config import RULES, training_identity, validate_config
from rgb.core.values import one_of
from rgb.core.files import stable_id as stable_run_id  # W&B id from the run dir: a requeue continues its run
from rgb.endpoints.settings import PREFIX as ENDPOINT, ClientSettings, EndpointSettings
from rgb.models.card import model_card
from rgb.training.config import TrainingConfigError, TrainingError
from rgb.training import request as sections
from rgb.training.settings import ENDPOINT_STRATEGY
from rgb.zeroshot.settings import PromptSettings

if TYPE_CHECKING:
    import lightning as L
    from lightning.pytorch.callbacks import Callback
    from lightning.pytorch.loggers import Logger

    from rgb.training.endpoint_run import EndpointRunRequest


def run_names(cfg: DictConfig) -> dict:
    """The run's own name and, for a job of a multirun, its sweep (the sweep dir's name, the dir, the job number),
    recorded in model.json: attack.py and evaluate.py name their outputs from this record
    (rgb.runs.store.run_name_for), since a sweep job's directory is named by its number only. A single run's name
    is its dir's: `run_name` unless the dir was set by hand (run_dir=, hydra.run.dir=)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not (HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN):
        return {"run_name": Path(str(cfg.run_dir)).name, "sweep": None}
    hydra_cfg = HydraConfig.get()
    sweep_dir = Path(str(hydra_cfg.sweep.dir))
    return {"run_name": str(cfg.run_name),
            "sweep": {"name": sweep_dir.name, "dir": str(sweep_dir.resolve()), "job": int(hydra_cfg.job.num)}}


def hydra_record(cfg: DictConfig) -> dict[str, bytes]:
    """The `.hydra/` files of this start (config.yaml, hydra.yaml, overrides.yaml); none when train() is called
    from Python (no Hydra run to record)."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return {}
    hydra_cfg = HydraConfig.get()
    return {name: OmegaConf.to_yaml(node).encode()
            for name, node in (("config.yaml", cfg), ("hydra.yaml", OmegaConf.create({"hydra": hydra_cfg})),
                               ("overrides.yaml", hydra_cfg.overrides.task))}


def build_loggers(logger_cfg: DictConfig | None, run_dir: Path) -> list[Logger]:
    loggers = []
    for cfg in (logger_cfg or {}).values():
        overrides = {}
        if cfg._target_.endswith("WandbLogger") and cfg.get("id") is None:
            overrides["id"] = stable_run_id(run_dir)
        loggers.append(hydra.utils.instantiate(cfg, **overrides))
    return loggers


def instantiate_callbacks(callbacks_cfg: DictConfig | None) -> list[Callback]:
    """The configured callbacks; a callback refusing its settings is reported as its own one-line error."""
    callbacks = []
    for node in (callbacks_cfg or {}).values():
        try:
            callbacks.append(hydra.utils.instantiate(node))
        except InstantiationException as err:
            if isinstance(err.__cause__, TrainingError):
                raise err.__cause__ from None
            raise
    return callbacks


def lightning_data(data: DictConfig) -> L.LightningDataModule:
    """The data config as Lightning fits on it: its `_target_` when that is a LightningDataModule (a user's own),
    else an RGBDataModule over the same keys (the configs' rgb.data.BenchmarkData reads no training batches)."""
    import lightning as L

    from rgb.training.datamodule import RGBDataModule

    if issubclass(hydra.utils.get_class(data._target_), L.LightningDataModule):
        return hydra.utils.instantiate(data)
    return hydra.utils.instantiate(data, _target_=f"{RGBDataModule.__module__}.{RGBDataModule.__qualname__}")


def check_optim_keys(optim: dict) -> None:
    """TrainingConfigError naming a key of the `optim` group that AdamW's settings do not know (it used to fail in
    the fit)."""
    known = sections.OptimSection.names()
    unknown = sorted(set(optim) - set(known))
    if unknown:
        raise TrainingConfigError(f"unknown optim key(s) {', '.join(unknown)}; known: {', '.join(known)}")


def card_of(cfg: DictConfig) -> dict:
    """The model card of `model_card=FILE` and `card.<key>=...` (read before anything starts: a bad file stops it)."""
    fields = cfg.get("card")
    return model_card(cfg.get("model_card"), OmegaConf.to_container(fields, resolve=True) if fields else None)


def training_request(cfg: DictConfig) -> sections.TrainRequest:
    """The run of `cfg` as typed sections, each field from its key (rgb.core.options): resolved once (an
    interpolation that fails is named here, before anything starts) and validated; its identity is the resolved
    config minus the resumable keys. What no key holds (builders, the card, the prompts) is built here."""
    config = OmegaConf.to_container(cfg, resolve=True)
    validate_config(config)
    run_dir = Path(config["run_dir"])
    loss = config["loss"]
    check_optim_keys(config["optim"])
    return sections.TrainRequest.from_config(
        config, run_names=run_names(cfg), identity=training_identity(config),
        data={"build": partial(hydra.utils.instantiate, cfg.data), "build_fit": partial(lightning_data, cfg.data)},
        model={"build": partial(hydra.utils.instantiate, cfg.model), "card": card_of(cfg),
               "prompts": PromptSettings.from_config(config["prompts"]) if config.get("prompts") else None},
        loss={"attack": loss.get("attack"), "options": {k: v for k, v in loss.items() if k not in ("name", "attack")}},
        trainer={"build": partial(hydra.utils.instantiate, cfg.get("trainer")),
                 "callbacks": partial(instantiate_callbacks, cfg.get("callbacks"))},
        logging={"loggers": partial(build_loggers, cfg.get("logger"), run_dir), "hyperparameters": config,
                 "hydra_record": hydra_record(cfg)},
    )


def api_run_request(cfg: DictConfig) -> EndpointRunRequest:
    from rgb.training.endpoint_run import EndpointRunRequest

    return EndpointRunRequest(model=OmegaConf.to_container(cfg.model, resolve=True),
                         data=partial(hydra.utils.instantiate, cfg.data), run_dir=str(cfg.run_dir),
                         names=run_names(cfg), seed=cfg.seed, card=card_of(cfg))


def export_api_config(cfg: DictConfig) -> None:
    from rgb.training.endpoint_run import export_api_run

    export_api_run(api_run_request(cfg))


# Strategies that only write a record, with no fit and no weights: a model behind an API (rgb.training.endpoint_run).
RECORD_ONLY = {ENDPOINT_STRATEGY: export_api_config}
# conf/train.yaml's schema (rgb.commands.schema): the data config's and the training sections' (train_config.RULES),
# whose strategies this command widens by its record-only ones, and the endpoint's settings (model=api_chat).
SCHEMA = {**RULES, **EndpointSettings.rules(ENDPOINT), **ClientSettings.rules(ENDPOINT),
          "strategy.name": one_of((*sections.STRATEGY_NAMES, *RECORD_ONLY))}


def train(cfg: DictConfig) -> float | None:
    """train.py: the run `cfg` describes (rgb.training.train), its monitored metric for sweepers."""
    if cfg.strategy.name in RECORD_ONLY:
        return RECORD_ONLY[cfg.strategy.name](cfg)
    from rgb.training.run import train as train_request

    return train_request(training_request(cfg))
