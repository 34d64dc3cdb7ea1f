"""The pooled schedule against the batch schedule (issue 36): one attack worker that runs many batches, as one worker
per GPU does, on the same model, images, budget and seed.

    python benchmarks/pooled_schedule.py --models vit-pgd_at cnn-pgd_at --norms linf --n 64 --batch-sizes 8 16 \
        --out benchmarks/results/pooled_schedule_cpu.json [--device cuda] [--schedule pooled_by_need]

Ours runs as `rgb.benchmark` runs it (a mini benchmark built here, the first --n test images), in this process with
one thread on the CPU (one worker, like one GPU), the model called eager behind a counter of its calls
(reference_speed.CallLog: calls per batch size, forward and backward). The batch schedule attacks one batch after
another, so each attack's last calls hold a batch's few survivors; the pooled one re-cuts the survivors of all
batches into full chunks. For each pair the record holds both wall times (the attack's, summed over its units),
rows, calls and rows per call, the robust flags compared image by image, and what the calls predict for a device
where a call costs its launch whatever its rows (the calls' ratio) or its rows (the rows' ratio): a GPU at the few
rows of a tail lies between the two. The schedules alternate (--repeats) so both see the same machine load.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from pathlib import Path

import pyarrow.parquet as pq
import torch

import rgb
from reference_speed import MODELS, CallLog, cached_model
from rgb.core.files import atomic_write_json
from rgb.core.threat import Norm
from rgb.data.mini import build_mini


def run_once(net, norm: str, n: int, batch_size: int, schedule: str, device: str, mini: Path, workdir: Path) -> dict:
    """One attack of the first n images at `batch_size` under `schedule`: seconds, rows, calls and robust flags."""
    counted = CallLog(net)
    began, cpu = time.perf_counter(), time.process_time()
    rgb.benchmark(counted, "mini", source=str(mini), settings=(norm,), name=f"{schedule}-{batch_size}",
                  output_dir=workdir, batch_size=batch_size, n_examples=n, progress=False, threads=1, device=device,
                  capture="eager", schedule=schedule)
    wall, cpu = time.perf_counter() - began, time.process_time() - cpu
    run = next(workdir.glob(f"attack/*/{schedule}-{batch_size}/first-{n}/{norm}"))
    table = pq.read_table(run / "results.parquet").to_pydict()
    record = json.loads((run / "summary.json").read_text())
    saturation = run / "saturation.json"
    forward_calls, backward_calls = sum(counted.forward_calls.values()), sum(counted.backward_calls.values())
    return {
        "attack_seconds": record["attack_seconds"], "wall_seconds_with_evaluation": wall,
        "process_cpu_seconds_with_evaluation": cpu, "n_robust": record["n_robust"], "robust": table["robust"],
        "table": table,
        "saturation": json.loads(saturation.read_text()) if saturation.exists() else None,
        "forward_rows": counted.forward_rows, "backward_rows": counted.backward_rows,
        "forward_calls": forward_calls, "backward_calls": backward_calls,
        "rows_per_forward_call": counted.forward_rows / max(forward_calls, 1),
    }


def compared(runs: dict[str, list[dict]]) -> dict:
    schedules = list(runs)  # batch, then the other
    best = {s: min(runs[s], key=lambda r: r["attack_seconds"]) for s in schedules}
    batch, pooled = (torch.tensor(best[s]["robust"]) for s in schedules)
    calls = {s: best[s]["forward_calls"] + best[s]["backward_calls"] for s in schedules}
    rows = {s: best[s]["forward_rows"] + best[s]["backward_rows"] for s in schedules}
    tables = [best[s]["table"] for s in schedules]
    same_row = [all(tables[0][c][i] == tables[1][c][i] for c in tables[0] if c not in ("seconds",))
                for i in range(len(tables[0]["image_id"]))]
    cpu = {s: min(r["process_cpu_seconds_with_evaluation"] for r in runs[s]) for s in schedules}
    return {
        "schedule": schedules[1], "saturation": best[schedules[1]]["saturation"],
        "speedup_process_cpu": cpu["batch"] / cpu[schedules[1]],
        "images_with_the_batch_schedules_result_row": sum(same_row),
        "speedup_wall": best["batch"]["attack_seconds"] / best[schedules[1]]["attack_seconds"],
        "predicted_speedup_launch_bound": calls["batch"] / calls[schedules[1]],
        "predicted_speedup_compute_bound": rows["batch"] / rows[schedules[1]],
        "agreement": {"both_robust": int((batch & pooled).sum()), "only_batch_robust": int((batch & ~pooled).sum()),
                      "only_pooled_robust": int((~batch & pooled).sum())},
        "runs": {s: [{k: v for k, v in r.items() if k not in ("robust", "table")} for r in runs[s]]
                 for s in schedules},
    }


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=["vit-pgd_at", "cnn-pgd_at"], choices=list(MODELS))
    parser.add_argument("--norms", nargs="+", default=["linf"], choices=[n.key for n in Norm])
    parser.add_argument("--n", type=int, default=64, help="test images (the first n of the mini test split)")
    parser.add_argument("--batch-sizes", nargs="+", type=int, default=[8, 16])
    parser.add_argument("--repeats", type=int, default=1, help="alternating runs of each schedule (the best counts)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--schedule", default="pooled", choices=["pooled", "pooled_by_need"],
                        help="the schedule compared with the batch one")
    parser.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) / "rgb-benchmark-models")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    load_at_start = os.getloadavg()
    records = []
    with tempfile.TemporaryDirectory() as scratch:
        mini = build_mini(Path(scratch) / "mini")
        for name in args.models:
            net = MODELS[name][0]()
            net.load_state_dict(torch.load(cached_model(name, args.cache), weights_only=True))
            net = net.eval().requires_grad_(False)
            for norm in args.norms:
                for batch_size in args.batch_sizes:
                    runs: dict[str, list[dict]] = {s: [] for s in ("batch", args.schedule)}
                    for repeat in range(args.repeats):
                        for schedule in runs:
                            workdir = Path(scratch) / f"{name}-{norm}-{batch_size}-{schedule}-{repeat}"
                            runs[schedule].append(run_once(net, norm, args.n, batch_size, schedule, args.device,
                                                           mini, workdir))
                    record = {"model": name, "norm": norm, "n": args.n, "batch_size": batch_size, **compared(runs)}
                    records.append(record)
                    print(f"{name} {norm} batch {batch_size}: {args.schedule} {record['speedup_wall']:.2f}x wall, "
                          f"{record['speedup_process_cpu']:.2f}x CPU s; calls "
                          f"predict {record['predicted_speedup_launch_bound']:.2f}x launch-bound, rows "
                          f"{record['predicted_speedup_compute_bound']:.2f}x compute-bound; {record['agreement']}",
                          flush=True)
                    atomic_write_json(Path(args.out), {
                        "what": f"ours, one worker, batch schedule vs {args.schedule}: attack wall time, rows, calls",
                        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "device": args.device,
                                    "threads": 1, "load_average_at_start": load_at_start,
                                    "load_average_at_end": os.getloadavg()},
                        "versions": {"torch": torch.__version__, "rgb": rgb.__version__},
                        "records": records,
                    })


if __name__ == "__main__":
    main()
