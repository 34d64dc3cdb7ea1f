"""The request of one model's scoring (evaluate.py run=DIR, rgb.benchmark): what rgb.commands.evaluate builds and
every step of rgb.evaluation reads, fields and defaults declared once here. `rgb.evaluation.run.evaluate` resolves
it once (the attack runs' dir, the device, the protocol's transfer, a capped run's consent to partial) and hands the
resolved request down."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from rgb.core.classwise import DEFAULT_WORST_K
from rgb.endpoints.client import RequestCaps


@dataclass(frozen=True)
class RunOutputs:
    """One model to evaluate and where its outputs go: its name (rgb.runs.store.run_name_for, as attack.py's) and
    its output dir, as evaluate.py run=DIR resolves them."""

    run: Path
    run_name: str
    output_dir: Path


@dataclass(frozen=True)
class EvalRequest:
    """evaluate.py run=DIR (or rgb.benchmark): one model scored from its attack runs and clean predictions. The
    defaults are what rgb.benchmark asks for; evaluate.py sets every field from its config."""

    model: RunOutputs
    attack_dir: Path
    data: Callable[[], object]  # the data config's module (rgb.data.BenchmarkData), built when the scoring needs it
    device: str  # as configured: auto is resolved here
    batch_size: int
    protocol: str = "white_box"  # black_box also scores the black-box protocol (as transfer)
    transfer: bool = False
    severity_sweep: bool = False
    allow_partial: bool = False
    max_images: int | None = None
    worst_k: tuple = DEFAULT_WORST_K
    api_cache_dir: Path | None = None  # None: no answer cache (a tensor model sends no requests)
    caps: RequestCaps = RequestCaps()  # API models: what the evaluation may send and spend (then partial)
    prices: dict = field(default_factory=dict)  # api_model: price, for API models whose model.price is null
    dry_run: bool = False
    wandb_project: str | None = None  # None: nothing logged to W&B
    output_root: Path | None = None  # paths.output_dir: records name the train run relative to it
