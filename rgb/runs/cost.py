"""What an attack run will cost before it runs (attack.py dry_run=true): model evaluations from the cost model of
docs/performance.md (each attack's worst case, `AutoAttack.worst_case_rows`), and time from this model's forward
and backward throughput measured on this machine at the run's batch size.

Only correctly classified images are attacked, so the dry run takes the model's clean predictions on a sample of the
split (all of it up to CLEAN_SAMPLE images): a misclassified image costs its clean forward and nothing more (counting
every image as attacked over-predicted a model with 45% clean accuracy ~2.2x at low robust shares). How many of the
attacked images stay robust is what the run finds out, so the estimate is a table over robust shares of the correctly
classified images: a robust image costs the cascade's worst case; one that falls is counted as falling to APGD-CE,
after the steps the implementation spends on it (`fooled_steps`: ours drops it within a few steps, the reference runs
APGD-CE to its end). A prediction, not a measurement: the attacks' batches shrink as images fall, and the speed is
measured at the run's full batch size.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from rgb.attacks.autoattack import AutoAttack
from rgb.core.files import atomic_write_json
from rgb.core.machine import configure_threads
from rgb.runs.implementations import attack_implementation
from rgb.runs.forecast import MEASURED_UTILISATION, evaluation_flops, measured_utilisation
from rgb.runs.pool import worker_threads
from rgb.runs.records import load_images
from rgb.runs.runner import Target, resolve_batch_size
from rgb.runs.request import AttackRequest
from rgb.runs.store import COST_ESTIMATE_FILE

log = logging.getLogger(__name__)

ROBUST_SHARES = (0.0, 0.1, 0.25, 0.5, 1.0)  # of the correctly classified images
CLEAN_SAMPLE = 1000  # images, evenly spaced over the split, whose clean predictions give the attacked share


@dataclass(frozen=True)
class Throughput:
    """Seconds per image row through the model, as the attacks call it: a forward alone, and a backward (the
    input gradient) on top of its forward."""

    batch_size: int
    forward_s: float
    backward_s: float


def measure_throughput(model: torch.nn.Module, x: torch.Tensor, device: str, repeats: int = 3) -> Throughput:
    """The model's speed on the batch `x` (one warm-up call each, then the mean of `repeats`)."""
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    x = x.to(device)

    def forward() -> None:
        with torch.no_grad():
            model(x)

    def forward_backward() -> None:
        inputs = x.detach().requires_grad_(True)
        torch.autograd.grad(model(inputs).float().logsumexp(1).sum(), inputs)

    seconds = []
    for call in (forward, forward_backward):
        call()
        sync()
        began = time.perf_counter()
        for _ in range(repeats):
            call()
        sync()
        seconds.append((time.perf_counter() - began) / (repeats * len(x)))
    return Throughput(len(x), seconds[0], max(seconds[1] - seconds[0], 0.0))


def measure_as_worker(model: torch.nn.Module, x: torch.Tensor, request: AttackRequest, workers: int) -> Throughput:
    """The model's speed as one of the run's `workers` calls it: on the CPU with the torch threads a worker sets
    (rgb.runs.pool.worker_threads), this process's own threads restored after."""
    threads = torch.get_num_threads()
    configure_threads(worker_threads(request, request.device, workers))
    try:
        return measure_throughput(model, x, request.device)
    finally:
        torch.set_num_threads(threads)


@dataclass(frozen=True)
class BudgetCost:
    """One budget's rows per image by kind, and the run's rows and seconds at each robust share."""

    budget: str
    n_images: int
    clean_accuracy: float
    robust_rows: tuple[int, int]
    fooled_rows: tuple[int, int]
    rows: dict[str, tuple[float, float]]  # robust share (as text) -> (forward rows, backward rows) of the run
    seconds: dict[str, float]


def budget_cost(n_images: int, clean_accuracy: float, robust_rows: tuple[int, int], fooled_rows: tuple[int, int],
                speed: Throughput, workers: int, name: str) -> BudgetCost:
    """Rows and seconds of `n_images` at each robust share of the `clean_accuracy` share that is attacked (a
    misclassified image costs its clean forward), `workers` attacking side by side."""
    rows, seconds = {}, {}
    attacked, missed = n_images * clean_accuracy, n_images * (1 - clean_accuracy)
    for share in ROBUST_SHARES:
        forward = attacked * (share * robust_rows[0] + (1 - share) * fooled_rows[0]) + missed
        backward = attacked * (share * robust_rows[1] + (1 - share) * fooled_rows[1])
        rows[f"{share:g}"] = (forward, backward)
        seconds[f"{share:g}"] = (forward * speed.forward_s + backward * speed.backward_s) / workers
    return BudgetCost(name, n_images, clean_accuracy, robust_rows, fooled_rows, rows, seconds)


def clean_accuracy(model: torch.nn.Module, split, n_images: int, batch_size: int, device: str) -> tuple[float, int]:
    """(share of correctly classified images, images looked at) over up to CLEAN_SAMPLE images evenly spaced over
    the first `n_images` of `split` (every one of a smaller run)."""
    ids = torch.linspace(0, n_images - 1, min(n_images, CLEAN_SAMPLE)).round().long().unique().tolist()
    correct = 0
    with torch.no_grad():
        for first in range(0, len(ids), batch_size):
            x, y, _ = load_images(split, ids[first : first + batch_size])
            correct += int((model(x.to(device)).argmax(1).cpu() == y).sum())
    return correct / len(ids), len(ids)


def device_name(device: str) -> str:
    """The device as benchmarks/gpu_attack.py names it: torch's name of a CUDA device, else "cpu"."""
    return torch.cuda.get_device_name(device) if device.startswith("cuda") else "cpu"


def forecast_throughput(model: torch.nn.Module, x: torch.Tensor, request: AttackRequest, model_name: str | None,
                        measured: Path | None) -> tuple[Throughput, dict] | None:
    """Seconds per row from the attack throughput measured on this device (rgb.runs.forecast) and the model's
    FLOPs, with what it rests on; None where nothing was measured on this device at the run's precision."""
    utilisation = measured_utilisation(device_name(request.device), request.batch_size, request.options.precision,
                                       model_name, measured)
    if utilisation is None:
        return None
    forward, backward = evaluation_flops(model, x[:1].to(request.device))
    per_s = utilisation["flop_per_s"]
    return Throughput(request.batch_size, forward / per_s, backward / per_s), utilisation


def estimate(request: AttackRequest, measured: Path | None = None) -> dict:
    """The cost of the requested run on this machine, logged as a table and written to <output_dir>/cost_estimate.json
    (nothing is attacked, no run directory is claimed). Time is a forecast from the attack utilisation measured on
    this device (`measured`: a gpu_check/gpu_attack JSON; None: MEASURED_UTILISATION) where there is one, else the bound: the model's plain
    passes measured here (an attack step costs at least that)."""
    target = Target.open(request, request.device)
    request = resolve_batch_size(request, target, record=False)
    n_images = target.n_images(request)
    x, _, _ = load_images(target.split, range(min(request.batch_size, n_images)))
    # the run's workers attack side by side (GPUs, or CPU processes): each is measured as it runs, on the CPU with
    # its share of the threads (one each by default), never with all of them
    workers = min(request.processes, math.ceil(n_images / request.batch_size) * len(request.budgets))
    speed = measure_as_worker(target.model, x, request, workers)
    forecast = forecast_throughput(target.model, x, request, target.meta.get("timm_name"),
                                   MEASURED_UTILISATION if measured is None else measured)
    if forecast is not None:
        speed, utilisation = forecast
        basis = {"kind": "forecast", "label": utilisation["label"], "utilisation": utilisation}
    else:
        basis = {"kind": "bound", "label": f"bound: the model's plain passes measured here at batch "
                                           f"{request.batch_size} (no attack utilisation measured on this device)"}
    with torch.no_grad():
        n_classes = int(target.model(x[:1].to(request.device)).shape[1])
    implementation = attack_implementation(request.impl)
    accuracy, sample = clean_accuracy(target.model, target.split, n_images, request.batch_size, request.device)
    costs = []
    for budget in request.budgets:
        cascade = AutoAttack(target.model, budget.threat.norm.value, budget.threat.eps, request.options)
        robust = cascade.worst_case_rows(n_classes)
        steps = implementation.fooled_steps(request.options)
        fooled = (steps + 3, steps + 1)  # the clean pass, APGD-CE's start and steps, its verification forward
        costs.append(budget_cost(n_images, accuracy, robust, fooled, speed, workers, budget.name))
    record = {"run": str(request.run), "impl": request.impl, "version": request.options.version,
              "device": request.device, "workers": workers, "threads": request.threads, "n_classes": n_classes,
              "clean_accuracy": accuracy, "clean_sample": sample,
              "throughput": asdict(speed), "time_basis": basis, "fooled_steps": implementation.fooled_steps(request.options),
              "budgets": [asdict(c) for c in costs]}
    path = Path(request.output_dir) / COST_ESTIMATE_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(path, record, indent=1)
    log.info("%s", cost_table(record))
    log.info("estimate written to %s (a prediction: attack.py without dry_run measures it)", path)
    return record


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min" if seconds < 7200 else \
        f"{seconds / 3600:.1f} h"


def cost_table(record: dict) -> str:
    """The estimate as a table: one row per budget, one column per robust share, and the total."""
    shares = [f"{s:g}" for s in ROBUST_SHARES]
    speed = record["throughput"]
    lines = [f"dry run of {record['run']} ({record['impl']}, {record['version']}, {record['n_classes']} classes) "
             f"on {record['device']}: {1 / speed['forward_s']:.1f} forward, "
             f"{1 / max(speed['forward_s'] + speed['backward_s'], 1e-12):.1f} forward+backward images/s at batch "
             f"{speed['batch_size']}, {record['workers']} worker(s); clean accuracy {record['clean_accuracy']:.1%} "
             f"on {record['clean_sample']} images: only those are attacked",
             f"time: {record['time_basis']['label']}",
             "| budget | images | worst case fwd + bwd rows per image | " + " | ".join(
                 f"{float(s):.0%} of correct robust" for s in shares) + " |",
             "|---|---:|---:|" + "---:|" * len(shares)]
    totals = dict.fromkeys(shares, 0.0)
    for cost in record["budgets"]:
        lines.append(f"| {cost['budget']} | {cost['n_images']} | {cost['robust_rows'][0]} + {cost['robust_rows'][1]} | "
                     + " | ".join(_duration(cost["seconds"][s]) for s in shares) + " |")
        for s in shares:
            totals[s] += cost["seconds"][s]
    lines.append("| all | | | " + " | ".join(_duration(totals[s]) for s in shares) + " |")
    return "\n".join(lines)
