"""The request of one model's scoring (evaluate.py run=DIR, rgb.benchmark): what rgb.commands.evaluate builds and
every step of rgb.evaluation reads, fields, defaults and rules declared once here (rgb.core.options: evaluate.py
builds it from conf/evaluate.yaml by field name, and its schema checks the same rules first).
`rgb.evaluation.run.evaluate` resolves it once (the attack runs' dir, the device, the protocol's transfer, a capped
run's consent to partial) and hands the resolved request down."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from rgb.core.classwise import DEFAULT_WORST_K, WORST_K
from rgb.core.options import Ruled, ruled, section
from rgb.core.values import BOOL, POSITIVE_INT, TEXT, one_of, optional
from rgb.data.catalog import WHITE_BOX
from rgb.endpoints.client import RequestCaps
from rgb.evaluation.records import PROTOCOLS


@dataclass(frozen=True)
class RunOutputs:
    """One model to evaluate and where its outputs go: its name (rgb.runs.store.run_name_for, as attack.py's) and
    its output dir, as evaluate.py run=DIR resolves them."""

    run: Path
    run_name: str
    output_dir: Path


@dataclass(frozen=True)
class EvalRequest(Ruled):
    """evaluate.py run=DIR (or rgb.benchmark): one model scored from its attack runs and clean predictions.

    The defaults are what rgb.benchmark asks for; evaluate.py sets every field from its key of the same name (
    `output_root` from paths.output_dir). `evaluate` runs it.

    Args:
        model: The model to score and where its outputs go.
        attack_dir: The attack run directory its white-box results are read from.
        data: Builds the data module (rgb.data.BenchmarkData) when the scoring needs it.
        device: As configured ("auto" is resolved when scoring).
        batch_size: The evaluation batch.
        protocol: "white_box", or "black_box" (also scores the black-box protocol, as transfer).
        transfer: Also score the transfer splits.
        severity_sweep: Also the accuracy under each corruption at severities 1-5, made on the fly.
        allow_partial: Accept part of a split (then the record is PARTIAL).
        max_images: Score the first N images of each split only (needs `allow_partial`).
        worst_k: The k of the worst-k class accuracies.
        api_cache_dir: The answer cache of an endpoint model; None: no cache.
        caps: What an endpoint model's evaluation may send and spend (requests, tokens, cost); past a cap the
            record is partial.
        prices: {api_model: price} for endpoint models whose `model.price` is null.
        dry_run: Plan an endpoint model's requests and cost without sending any.
        wandb_project: Log the record to this W&B project; None: nothing logged.
        output_root: paths.output_dir: records name the train run relative to it.

    Raises:
        ConfigValueError: A value outside its rule (one line naming the key, its rule and the value). `evaluate`
            raises EvaluationError for results that must not be scored (another model, dataset, split size or
            budget; partial without `allow_partial`; caps or a dry run for a model that sends no requests).
    """

    model: RunOutputs
    attack_dir: Path = ruled(convert=Path)
    data: Callable[[], object]  # the data config's module (rgb.data.BenchmarkData), built when the scoring needs it
    device: str = ruled(rule=TEXT)  # as configured: auto is resolved here
    batch_size: int = ruled(rule=POSITIVE_INT)
    protocol: str = ruled(WHITE_BOX, one_of(PROTOCOLS))  # black_box also scores the black-box protocol (as transfer)
    transfer: bool = ruled(False, BOOL)
    severity_sweep: bool = ruled(False, BOOL)
    allow_partial: bool = ruled(False, BOOL)
    max_images: int | None = ruled(None, optional(POSITIVE_INT))
    worst_k: tuple = ruled(DEFAULT_WORST_K, WORST_K, convert=tuple)
    api_cache_dir: Path | None = ruled(None, convert=Path)  # None: no answer cache
    caps: RequestCaps = section(RequestCaps, key="")  # API models: what it may send and spend (then partial)
    prices: dict = field(default_factory=dict)  # api_model: price, for API models whose model.price is null
    dry_run: bool = ruled(False, BOOL)
    wandb_project: str | None = None  # None: nothing logged to W&B
    output_root: Path | None = ruled(None, key="paths.output_dir", convert=Path)  # train runs are named relative to it

    def __post_init__(self):
        self.check()
