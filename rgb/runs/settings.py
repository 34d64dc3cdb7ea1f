"""What an attack run is asked to do, validated before anything is written: threat models, shards, devices."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf

from rgb.core.machine import DeviceError, resolve_device
from rgb.core.threat import Norm, ThreatModel, parse_norm
from rgb.data.catalog import TRANSFER_BUDGETS

IMPLEMENTATIONS = ("ours", "reference")


class AttackRunError(RuntimeError):
    """A one-line problem with an attack run: bad settings, a directory made for another run, missing shards."""


@dataclass(frozen=True)
class Budget:
    """One threat model of a run: its run-directory name and, when exported, the benchmark split it becomes."""

    name: str
    threat: ThreatModel
    export_split: str


@dataclass(frozen=True)
class AttackSettings:
    """Everything a run needs, validated, picklable (it travels to spawned per-GPU processes)."""

    run: Path
    run_name: str
    data: dict
    budgets: tuple[Budget, ...]
    version: str
    seed: int
    attacks: tuple[str, ...] | None
    precision: str
    batch_size: int
    device: str
    compile: bool
    channels_last: bool
    shard_index: int
    shard_count: int
    processes: int
    merge_only: bool
    export: bool
    export_dir: Path
    surrogate: str
    output_dir: Path
    progress: bool = True
    impl: str = "ours"
    threads: int = 1
    tail_rows: int = 0
    input_format: str = "auto"
    max_images: int | None = None  # attack the first N test images only (rgb.benchmark(n_examples=N)): PARTIAL

    @classmethod
    def from_config(cls, cfg: DictConfig, budgets: tuple[Budget, ...], surrogate: str, threads: int = 1
                    ) -> AttackSettings:
        if cfg.get("run") is None or OmegaConf.is_missing(cfg, "run"):
            raise AttackRunError("no model given: pass run=<train output dir or exported .safetensors file>")
        run = Path(str(cfg.run))
        if not run.exists():
            raise AttackRunError(f"run={run} does not exist (a train output dir or an exported .safetensors file)")
        batch_size = int(cfg.batch_size)
        if batch_size < 1:
            raise AttackRunError(f"batch_size must be >= 1, got {batch_size}")
        impl = str(cfg.get("impl", "ours"))
        if impl not in IMPLEMENTATIONS:
            raise AttackRunError(f"impl must be one of {list(IMPLEMENTATIONS)}, got {impl!r}")
        index, count = shard_position(cfg.shard.index, cfg.shard.count)
        attacks = None if cfg.attacks is None else tuple(str(a) for a in cfg.attacks)
        try:
            device = resolve_device(str(cfg.device))
        except DeviceError as err:
            raise AttackRunError(str(err)) from err
        from rgb.runs.store import run_name_for  # the store imports this module's error

        return cls(
            run=run, run_name=str(cfg.run_name) if cfg.get("run_name") else run_name_for(run), data=OmegaConf.to_container(cfg.data, resolve=True),
            budgets=budgets, version=str(cfg.version), seed=int(cfg.seed), attacks=attacks,
            precision=str(cfg.precision), batch_size=batch_size, device=device,
            compile=bool(cfg.compile), channels_last=bool(cfg.channels_last),
            shard_index=index, shard_count=count, processes=process_count(cfg.shard.devices, device, threads),
            merge_only=bool(cfg.merge_only), export=bool(cfg.export_adversarial),
            export_dir=Path(str(cfg.export_dir)), surrogate=surrogate, output_dir=Path(str(cfg.output_dir)),
            progress=bool(cfg.progress), impl=impl, threads=threads, tail_rows=int(cfg.get("tail_rows", 0)),
            input_format=str(cfg.get("input_format", "auto")),
        )


def shard_position(index, count) -> tuple[int, int]:
    """(index, count) of this shard; null values come from a SLURM array (task id - min id, task count)."""
    env = os.environ
    in_array = "SLURM_ARRAY_TASK_ID" in env
    if index is None:
        index = int(env["SLURM_ARRAY_TASK_ID"]) - int(env.get("SLURM_ARRAY_TASK_MIN", 0)) if in_array else 0
    if count is None:
        count = int(env.get("SLURM_ARRAY_TASK_COUNT", 1)) if in_array else 1
    index, count = int(index), int(count)
    if count < 1 or not 0 <= index < count:
        raise AttackRunError(f"shard.index must be in [0, shard.count) and shard.count >= 1, got {index} of {count}")
    return index, count


def process_count(devices, device: str, threads: int = 1) -> int:
    """Worker processes on this node: `auto` = one per visible GPU, or on the CPU one single-threaded worker per
    thread this run may use (`threads`: the CPUs of its affinity mask, cgroup and SLURM allocation unless set);
    or an explicit count."""
    gpus = torch.cuda.device_count() if device.startswith("cuda") else 0
    if devices == "auto":
        return max(gpus, 1) if device.startswith("cuda") else max(int(threads), 1)
    count = int(devices)
    if count < 1 or (gpus and count > gpus):
        raise AttackRunError(f"shard.devices={devices}: need 1 <= devices <= {gpus or 'any'} (visible GPUs: {gpus})")
    return count


def white_box_budgets(norms, data: DictConfig) -> tuple[Budget, ...]:
    """The data config's white-box budgets for the requested norms; exported as the matching transfer split."""
    try:
        parsed = [parse_norm(str(n)) for n in norms]
    except ValueError:
        parsed = []
    if not parsed or len(set(parsed)) != len(parsed):
        raise AttackRunError(f"norms must be distinct names from {[n.key for n in Norm]}, got {list(norms)}")
    budgets = []
    for norm in parsed:
        threat = ThreatModel(norm, float(data.budgets[norm.key]))
        matching = [s for s, e in (data.get("transfer_budgets") or {}).items()
                    if s.startswith(norm.key + "_") and math.isclose(float(e), threat.eps, rel_tol=1e-9)]
        budgets.append(Budget(norm.key, threat, matching[0] if matching else f"{norm.key}_{threat.eps:.6g}"))
    return tuple(budgets)


def transfer_budgets(splits, data: DictConfig) -> tuple[Budget, ...]:
    """The requested transfer splits (all of the data config's `transfer_budgets` when None) as budgets."""
    available = dict(data.get("transfer_budgets") or {})
    names = list(available) if splits is None else [str(s) for s in splits]
    unknown = [n for n in names if n not in available or n not in TRANSFER_BUDGETS]
    if not names or unknown:
        raise AttackRunError(f"unknown transfer splits {unknown or names}; the data config has {list(available)}")
    return tuple(Budget(name, ThreatModel(TRANSFER_BUDGETS[name][0], float(available[name])), name) for name in names)
