"""`batch_size=auto`: the largest attack batch that fits the device's free memory for a model, measured by a probe;
and `saturation_rows`: the rows per call from which a bigger call no longer makes a row cheaper (schedule=pooled_by_need).

An attack iteration's peak memory is one forward with its graph and one input-gradient backward over the batch.
The probe runs that step at doubling batch sizes until the device runs out of memory (or a ceiling), and keeps
the largest size that ran, times a safety share for the attacks' own tensors. The answer is cached per model
identity and device in a small JSON file, so the probe runs once per model and machine. On the CPU there is no
memory wall worth probing: `auto` is a fixed size there.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import torch
from torch import nn

from rgb.core.files import atomic_write_json

log = logging.getLogger(__name__)

CPU_BATCH = 64  # what `auto` means on the CPU: larger batches buy nothing there (docs/performance.md)
CEILING = 4096  # no probe goes beyond this: a larger batch only lengthens the tail of survivors
SAFETY = 0.75  # the share of the largest probed batch kept: room for the attacks' per-row state


def probe_step(model: nn.Module, batch: torch.Tensor) -> None:
    """One attack iteration's memory: a forward with its graph and the input gradient of the summed logits."""
    x = batch.detach().requires_grad_(True)
    with torch.enable_grad():
        torch.autograd.grad(model(x).float().sum(), x)


def largest_batch(model: nn.Module, image_shape: tuple[int, ...], device: torch.device,
                  ceiling: int = CEILING) -> int:
    """The largest power-of-two batch (at most `ceiling`) whose `probe_step` runs on `device`, times SAFETY where
    memory ran out (the ceiling itself where it did not)."""
    fits, size = 0, 1
    while size <= ceiling:
        try:
            probe_step(model, torch.rand((size, *image_shape), device=device))
        except torch.OutOfMemoryError:
            if fits == 0:
                raise torch.OutOfMemoryError(
                    f"not even one image of shape {image_shape} fits an attack step on {device}") from None
            return max(1, int(fits * SAFETY))
        finally:
            if device.type == "cuda":
                torch.cuda.empty_cache()
        fits, size = size, size * 2
    return fits


SATURATED_WITHIN = 1.15  # a call is saturated once its time per row is within this factor of the best size's
SATURATION_REPEATS = 3  # timed steps per size (the best kept), after one warm-up step


def saturation_rows(model: nn.Module, x: torch.Tensor, largest: int) -> dict:
    """{"rows", "seconds_per_row", "within"}: the fewest rows (a power of two up to `largest`, and `largest`) whose
    `probe_step` costs at most SATURATED_WITHIN times the cheapest size's process CPU seconds per row, timed on `x`
    (the run's first images in the attacks' input format, repeated to each size). Below it a call pays for rows it
    does not hold: survivors fewer than that are worth pooling across batches."""
    sizes = sorted({1 << k for k in range(max(largest, 1).bit_length()) if 1 << k <= largest} | {max(largest, 1)})
    per_row = {}
    for size in sizes:
        rows = x[torch.arange(size) % len(x)]
        best = float("inf")
        for timed in range(-1, SATURATION_REPEATS):
            began = _clock(rows.device)
            probe_step(model, rows)
            if timed >= 0:
                best = min(best, _clock(rows.device) - began)
        per_row[size] = best / size
    cheapest = min(per_row.values())
    rows = next(size for size in sizes if per_row[size] <= SATURATED_WITHIN * cheapest)
    return {"rows": rows, "seconds_per_row": {str(size): per_row[size] for size in sizes}, "within": SATURATED_WITHIN}


def _clock(device: torch.device) -> float:
    """Process CPU seconds on the CPU (other processes' load does not count); wall seconds after the queued work on
    CUDA (its calls return before they run)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        return time.perf_counter()
    return time.process_time()


def device_key(device: torch.device) -> str:
    """What the answer depends on besides the model: the device's kind and, on CUDA, its name and memory."""
    if device.type != "cuda":
        return device.type
    props = torch.cuda.get_device_properties(device)
    return f"cuda:{props.name}:{props.total_memory}"


def auto_batch_size(model: nn.Module, model_id: str, image_shape: tuple[int, ...], device: torch.device,
                    cache: Path) -> dict:
    """{"batch_size", "source": "cpu default" | "probe" | "cache", "device"}: `auto` resolved for `model`
    (`model_id` names it, e.g. its weights' sha256) on `device`, probing and caching in `cache` when needed."""
    if device.type == "cpu":
        return {"batch_size": CPU_BATCH, "source": "cpu default", "device": "cpu"}
    key = f"{model_id}|{tuple(image_shape)}|{device_key(device)}"
    known = json.loads(cache.read_text()) if cache.is_file() else {}
    if key in known:
        return {"batch_size": int(known[key]), "source": "cache", "device": device_key(device)}
    log.info("batch_size=auto: finding the largest batch an attack step fits on %s ...", device)  # a long wait
    size = largest_batch(model, image_shape, device)
    atomic_write_json(cache, {**known, key: size})
    return {"batch_size": size, "source": "probe", "device": device_key(device)}
