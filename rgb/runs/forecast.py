"""The cost model's time as a forecast: the attack throughput measured on a device (benchmarks/gpu_attack.py's
throughput rows, alone or inside gpu_check.sh's JSON) instead of the bound (the device's peak for
benchmarks/benchmark_cost.py, the model's plain passes for attack.py dry_run=true).

A throughput row is a fixed number of APGD-CE iterations without early exit at one batch and precision on one
device: FLOP/s counted by FlopCounterMode, so it carries over to another model of similar shape (a forecast, not a
measurement of that model). Rows of the run's model are preferred; otherwise the mean over the measured models.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
from torch.utils.flop_counter import FlopCounterMode

# Dense peak FLOP/s by device name and precision (vendor data sheets, SXM parts, without sparsity): the bound and
# the measured utilisation's denominator.
DEVICE_PEAKS = {
    "NVIDIA H200": {"fp32": 67e12, "tf32": 494.7e12, "bf16": 989.4e12},
    "NVIDIA H100 80GB HBM3": {"fp32": 67e12, "tf32": 494.7e12, "bf16": 989.4e12},
}

# Committed by the first GPU session that ran benchmarks/gpu_check.sh (docs/performance.md)
MEASURED_UTILISATION = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "gpu_check_h200.json"


def evaluation_flops(model: torch.nn.Module, x: torch.Tensor) -> tuple[float, float]:
    """(forward, input-gradient backward) FLOPs per image of `model` on the batch `x`."""
    x = x.detach().clone().requires_grad_(True)
    counted = []
    for step in ("forward", "backward"):
        with FlopCounterMode(display=False) as counter:
            if step == "forward":
                logits = model(x)
            else:
                torch.autograd.grad(logits.float().sum(), x)
        counted.append(float(counter.get_total_flops()) / len(x))
    return counted[0], counted[1]


def _throughput_rows(report: dict) -> tuple[list[dict], str]:
    """(throughput rows, each with its model and device, the measurement's date) of a gpu_attack.py report or
    of a gpu_check.json holding one."""
    if "parts" not in report:
        report = (report.get("gpu_attack") or {}).get("result") or {}
    rows = []
    for part in (report.get("parts") or {}).values():
        result = part.get("result") or {}
        for row in result.get("rows", []) if part.get("returncode") == 0 else []:
            rows.append({**row, "model": result["model"], "device": result["device"]})
    return rows, str(report.get("started", "undated"))


def measured_utilisation(device: str, batch: int, precision: str = "fp32", model: str | None = None,
                         path: Path | None = MEASURED_UTILISATION) -> dict | None:
    """{"flop_per_s", "share_of_peak", "device", "date", "batch", "models", "label"}: the attack throughput
    measured on `device` (as torch names it; "cpu") at `precision` and the measured batch nearest `batch`, of
    `model` where it was measured, else the mean over the measured models; None when `path` is absent or holds
    no such row."""
    if path is None or not Path(path).is_file():
        return None
    rows, date = _throughput_rows(json.loads(Path(path).read_text()))
    rows = [r for r in rows if r["device"] == device and r["precision"] == precision and r["flop_per_s"] > 0]
    if not rows:
        return None
    nearest = min({r["batch"] for r in rows}, key=lambda b: (abs(math.log(b / batch)), -b))
    rows = [r for r in rows if r["batch"] == nearest]
    rows = [r for r in rows if r["model"] == model] or rows
    shares = [r["share_of_peak"] for r in rows if r.get("share_of_peak") is not None]
    return {"flop_per_s": sum(r["flop_per_s"] for r in rows) / len(rows),
            "share_of_peak": sum(shares) / len(shares) if shares else None, "device": device, "date": date,
            "batch": nearest, "models": sorted({r["model"] for r in rows}),
            "label": f"forecast from measured utilisation ({device}, {date})"}
