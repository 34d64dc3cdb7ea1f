"""What an attack run is asked to do, validated before anything is written: threat models, shards, devices."""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from rgb.attacks.options import AttackOptions
from rgb.core.machine import DeviceError, resolve_device
from rgb.core.threat import Norm, ThreatModel, parse_norm
from rgb.core.values import AUTO_OR_COUNT
from rgb.data.catalog import TRANSFER_BUDGETS
from rgb.runs.implementations import attack_implementation
from rgb.runs.store import AttackRunError, adversarial_dir, run_name_for

if TYPE_CHECKING:  # for the annotation only: building a data module is the factory's job
    from rgb.data.benchmark_data import BenchmarkData

# batch_size=auto: the largest batch that fits the device for the model (rgb.runs.batch_probe), made a number once
# per run by rgb.runs.runner.resolve_batch_size before any batch (a run's batches never change size)
AUTO_BATCH = "auto"


@dataclass(frozen=True)
class Budget:
    """One threat model of a run: its run-directory name and, when exported, the benchmark split it becomes."""

    name: str
    threat: ThreatModel
    export_split: str


@dataclass(frozen=True)
class AttackRequest:
    """One attack run (attack.py, rgb-transfer, rgb.benchmark): everything it needs, validated, picklable.

    Picklable because it travels to spawned per-GPU processes. Make it with `create`, which validates; the fields
    are its arguments after validation.

    Args:
        run: The model: a train output dir or an exported .safetensors file.
        run_name: The model's name in the run's outputs.
        data: Builds the data module (a picklable functools.partial: each worker builds its own).
        budgets: The threat models to attack, one run directory each.
        options: What AutoAttack runs.
        batch_size: Images per batch (part of a run's identity), or "auto" until the run resolves it.
        device: The resolved device ("cpu", "cuda", "cuda:N").
        compile: torch.compile the model before attacking it.
        channels_last: Give the model channels-last images.
        shard_index: This node's shard, in [0, shard_count).
        shard_count: How many shards the images are cut into.
        processes: Worker processes on this node.
        merge_only: Only merge the shards already there; attack nothing.
        export: Export the adversarial images as benchmark splits.
        export_dir: Where they are exported.
        surrogate: The surrogate's name in exported splits.
        output_dir: The run's directory.
        progress: Show progress bars.
        impl: "ours", or another implementation of `rgb.runs.implementations`.
        threads: CPU threads this run may use.
        max_images: Attack the first N test images only (rgb.benchmark(n_examples=N)): a PARTIAL run.
    """

    run: Path
    run_name: str
    data: Callable[[], BenchmarkData]  # picklable (a functools.partial): each worker builds its own
    budgets: tuple[Budget, ...]
    options: AttackOptions
    batch_size: int | str
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
    max_images: int | None = None  # attack the first N test images only (rgb.benchmark(n_examples=N)): PARTIAL

    @classmethod
    def create(cls, run: str | Path, data: Callable[[], BenchmarkData], budgets: tuple[Budget, ...], *,
               batch_size: int | str, output_dir: str | Path, surrogate: str, run_name: str | None = None,
               options: AttackOptions = AttackOptions(), device: str = "auto", compile: bool = False,
               channels_last: bool = False,
               shard_index: int | None = None, shard_count: int | None = None, devices: int | str = "auto",
               merge_only: bool = False, export: bool = False, export_dir: str | Path | None = None,
               progress: bool = True, impl: str = "ours", threads: int = 1, max_images: int | None = None
               ) -> AttackRequest:
        """The validated request from plain values and the (already validated) attack options.

        attack.py's config is mapped onto these by rgb.commands.attack; rgb.benchmark passes them directly.

        Args:
            run: The model: a train output dir or an exported .safetensors file.
            data: Builds the data module in whichever process attacks.
            budgets: The threat models to attack (`white_box_budgets`).
            batch_size: Images per batch, >= 1, or "auto": the largest that fits the device for the model (probed
                once per model and device, cached; on the CPU a fixed size), resolved once per run and recorded.
            output_dir: The run's directory.
            surrogate: The surrogate's name in exported splits.
            run_name: The model's name; None: `rgb.runs.store.run_name_for(run)`.
            options: What AutoAttack runs.
            device: "auto", "cpu", "cuda" or "cuda:N".
            compile: torch.compile the model before attacking it.
            channels_last: Give the model channels-last images.
            shard_index: This node's shard; None: from the SLURM array, else 0.
            shard_count: How many shards; None: from the SLURM array, else 1.
            devices: Worker processes: "auto" (one per visible GPU, or one per thread on the CPU) or a count.
            merge_only: Only merge the shards already there.
            export: Export the adversarial images as benchmark splits.
            export_dir: Where; None: `<output_dir>/adversarial`.
            progress: Show progress bars.
            impl: "ours", or another implementation of `rgb.runs.implementations`.
            threads: CPU threads this run may use.
            max_images: Attack the first N test images only: a PARTIAL run.

        Returns:
            The request, with the device resolved and the shard and process counts fixed.

        Raises:
            AttackRunError: No `run`, or it does not exist; `batch_size` neither "auto" nor >= 1; an unknown `impl`; a shard outside
                [0, shard_count); a device count < 1; or `device` asks for CUDA where none is visible.
        """
        if run is None:
            raise AttackRunError("no model given: pass run=<train output dir or exported .safetensors file>")
        run = Path(str(run))
        if not run.exists():
            raise AttackRunError(f"run={run} does not exist (a train output dir or an exported .safetensors file)")
        if not AUTO_OR_COUNT[0](batch_size):
            raise AttackRunError(f"batch_size must be {AUTO_OR_COUNT[1]}, got {batch_size!r}")
        batch_size = batch_size if batch_size == AUTO_BATCH else int(batch_size)
        attack_implementation(impl)
        index, count = shard_position(shard_index, shard_count)
        try:
            device = resolve_device(str(device))
        except DeviceError as err:
            raise AttackRunError(str(err)) from err
        output_dir = Path(str(output_dir))
        return cls(
            run=run, run_name=str(run_name) if run_name else run_name_for(run), data=data, budgets=budgets,
            options=options, batch_size=batch_size, device=device, compile=bool(compile),
            channels_last=bool(channels_last), shard_index=index, shard_count=count,
            processes=process_count(devices, device, threads), merge_only=bool(merge_only), export=bool(export),
            export_dir=Path(str(export_dir if export_dir is not None else adversarial_dir(output_dir))),
            surrogate=surrogate, output_dir=output_dir, progress=bool(progress), impl=str(impl), threads=int(threads),
            max_images=max_images,
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
    or an explicit count (more workers than GPUs share them round-robin: several attacks keep one GPU busy where
    one leaves it idle between small tail batches)."""
    gpus = torch.cuda.device_count() if device.startswith("cuda") else 0
    if devices == "auto":
        return max(gpus, 1) if device.startswith("cuda") else max(int(threads), 1)
    count = int(devices)
    if count < 1:
        raise AttackRunError(f"shard.devices={devices}: need a count >= 1 or auto")
    return count


def white_box_budgets(norms: Sequence[str], budgets: Mapping[str, float], transfer: Mapping[str, float]
                      ) -> tuple[Budget, ...]:
    """The dataset's white-box budgets (`budgets`: norm key -> eps) for the requested norms; each is exported as
    the transfer split of `transfer` (split -> eps) with the same norm and eps, when there is one."""
    try:
        parsed = [parse_norm(str(n)) for n in norms]
    except ValueError:
        parsed = []
    if not parsed or len(set(parsed)) != len(parsed):
        raise AttackRunError(f"norms must be distinct names from {[n.key for n in Norm]}, got {list(norms)}")
    chosen = []
    for norm in parsed:
        threat = ThreatModel(norm, float(budgets[norm.key]))
        matching = [s for s, e in transfer.items()
                    if s.startswith(norm.key + "_") and math.isclose(float(e), threat.eps, rel_tol=1e-9)]
        chosen.append(Budget(norm.key, threat, matching[0] if matching else f"{norm.key}_{threat.eps:.6g}"))
    return tuple(chosen)


def transfer_budgets(splits: Sequence[str] | None, available: Mapping[str, float]) -> tuple[Budget, ...]:
    """The requested transfer splits (all of `available`, split -> eps, when None) as budgets."""
    names = list(available) if splits is None else [str(s) for s in splits]
    unknown = [n for n in names if n not in available or n not in TRANSFER_BUDGETS]
    if not names or unknown:
        raise AttackRunError(f"unknown transfer splits {unknown or names}; the data config has {list(available)}")
    return tuple(Budget(name, ThreatModel(TRANSFER_BUDGETS[name][0], float(available[name])), name) for name in names)
