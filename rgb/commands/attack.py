"""attack.py's config half (and what rgb-transfer's shares with it): the composed config becomes the typed values
the library takes (`AttackRequest.create`, a data-module factory, budgets), so no module below rgb/commands/ sees a
DictConfig. Plain Python at import, so that its SCHEMA is read before torch loads (the run's modules are imported by
the functions that run it); imported inside the commands, never by `--help`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from rgb.attacks.options import AttackOptions
from rgb.commands.schema import DATA, MACHINE, RUN, WANDB
from rgb.core.values import AUTO_OR_COUNT, BOOL, NON_NEGATIVE_INT, NORM, POSITIVE_INT, list_of, one_of, optional
from rgb.runs.errors import AttackRunError
from rgb.runs.implementations import IMPLEMENTATIONS

if TYPE_CHECKING:
    from rgb.data.benchmark_data import BenchmarkData
    from rgb.runs.request import AttackRequest, Budget
    from rgb.runs.store import RunSummary

# What an attack run reads of conf/attack.yaml and conf/transfer.yaml (AttackOptions declares its options' rules).
ATTACK_RUN = {
    **DATA, **MACHINE, **RUN, **AttackOptions.rules(), "impl": one_of(IMPLEMENTATIONS), "batch_size": AUTO_OR_COUNT,
    "shard.index": optional(NON_NEGATIVE_INT), "shard.count": optional(POSITIVE_INT), "shard.devices": AUTO_OR_COUNT,
    "compile": BOOL, "channels_last": BOOL, "merge_only": BOOL, "export_adversarial": BOOL, "progress": BOOL,
}
# conf/attack.yaml's schema (rgb.commands.schema).
SCHEMA = {**ATTACK_RUN, **WANDB, "norms": list_of(NORM), "max_images": optional(POSITIVE_INT), "dry_run": BOOL}


def data_factory(data: DictConfig) -> Callable[[], BenchmarkData]:
    """The data config as a picklable factory (a functools.partial of its `_target_` with plain values): spawned
    attack workers each build their own data module from it."""
    return instantiate(data, _partial_=True, _convert_="all")


def attack_request(cfg: DictConfig, data: Callable[[], BenchmarkData], budgets: tuple[Budget, ...], surrogate: str,
                   threads: int = 1) -> AttackRequest:
    """conf/attack.yaml (or conf/transfer.yaml) mapped onto the attack run's request."""
    from rgb.runs.request import AttackRequest
    from rgb.runs.store import first_images_dir

    if cfg.get("run") is None or OmegaConf.is_missing(cfg, "run"):
        raise AttackRunError("no model given: pass run=<train output dir or exported .safetensors file>")
    # every option by its name; a config without one keeps its default
    options = AttackOptions(**{name: cfg[name] for name in AttackOptions.names() if name in cfg})
    max_images = cfg.get("max_images")
    output_dir = str(cfg.output_dir) if max_images is None else first_images_dir(str(cfg.output_dir), max_images)
    return AttackRequest.create(
        str(cfg.run), data, budgets, batch_size=cfg.batch_size, max_images=max_images,
        output_dir=output_dir, surrogate=surrogate, run_name=cfg.get("run_name") or None,
        options=options, device=str(cfg.device), compile=bool(cfg.compile), channels_last=bool(cfg.channels_last),
        shard_index=cfg.shard.index, shard_count=cfg.shard.count, devices=cfg.shard.devices,
        merge_only=bool(cfg.merge_only), export=bool(cfg.export_adversarial), export_dir=str(cfg.export_dir),
        progress=bool(cfg.progress), impl=str(cfg.get("impl", "ours")), threads=threads,
    )


def attack_from_config(cfg: DictConfig, threads: int = 1) -> dict[str, RunSummary]:
    """attack.py: white-box AutoAttack of `cfg.run` at the data config's budgets for `cfg.norms`."""
    from rgb.runs.request import white_box_budgets
    from rgb.runs.runner import execute
    from rgb.runs.store import run_name_for

    data = data_factory(cfg.data)
    datamodule = data()  # cheap: reads nothing until a split is asked for
    budgets = white_box_budgets(list(cfg.norms), datamodule.budgets, datamodule.transfer_budgets)
    request = attack_request(cfg, data, budgets, surrogate=run_name_for(cfg.run), threads=threads)
    if cfg.get("dry_run"):
        from rgb.runs.cost import estimate

        estimate(request)
        return {}
    summaries = execute(request)
    tracking = cfg.get("wandb") or {}
    if tracking.get("enabled") and summaries:  # the shard that merges logs the run
        from rgb.runs.wandb_report import log_attack

        log_attack(summaries, request.output_dir, str(tracking.get("project", "robustgenbench")))
    return summaries
