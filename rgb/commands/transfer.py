"""rgb-transfer's config half: the surrogate's attack request at the requested transfer budgets (built as
attack.py's are), written into the snapshot. Plain Python at import, as attack.py's, so that its SCHEMA is read before
torch loads."""

from __future__ import annotations

from typing import TYPE_CHECKING

from omegaconf import DictConfig

from rgb.commands.attack import ATTACK_RUN, attack_request, data_factory
from rgb.core.values import TEXT, list_of, optional

if TYPE_CHECKING:
    from rgb.runs.store import RunSummary

# conf/transfer.yaml's schema (rgb.commands.schema).
SCHEMA = {**ATTACK_RUN, "splits": optional(list_of(TEXT)), "surrogate": TEXT}


def transfer_from_config(cfg: DictConfig, threads: int = 1) -> dict[str, RunSummary]:
    """rgb-transfer: the surrogate `cfg.run` attacked at the requested transfer budgets, written into the snapshot."""
    from rgb.runs.request import transfer_budgets
    from rgb.runs.transfer import make_transfer_splits

    data = data_factory(cfg.data)
    datamodule = data()
    splits = None if cfg.splits is None else [str(s) for s in cfg.splits]
    budgets = transfer_budgets(splits, datamodule.transfer_budgets)
    request = attack_request(cfg, data, budgets, surrogate=str(cfg.surrogate), threads=threads)
    return make_transfer_splits(request, datamodule.source)
