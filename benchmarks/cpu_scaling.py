"""CPU scaling of attack.py (issue 24): one single-threaded worker vs the default (one worker per usable core) vs
one process with N threads (the old default), each alone and beside --busy other CPU-bound processes.

    python benchmarks/cpu_scaling.py --case outputs/train/digits/demo:l1 --case outputs/train/digits/demo_zeroshot:linf \
        --n 200 --busy 0 2 --out benchmarks/results/cpu_scaling_cpu.json

Each case is a train run dir and a norm (the mini data config's budget); its first --n test images are written
as a small snapshot (same rows, another README title) and attacked by `attack.py` in a fresh output dir per
configuration, so wall times include the start-up a user sees. Targets: the default reaches >= 0.8 x N times the
single-worker throughput on N cores, and beside two CPU-bound processes it is at most 2.5x slower than alone.
Results equal across configurations (batch for batch) are checked: a speed-up that changed a number is a bug.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from machine_load import busy_loops

REPO = Path(__file__).resolve().parents[1]


def head_snapshot(mini_dir: Path, out: Path, n: int) -> Path:
    """The first n test images of the mini benchmark as their own snapshot (attack.py reads only `test`)."""
    import datasets

    from rgb.data import load_split
    from rgb.data.mini import CLASS_NAMES, DATASET, ensure_mini
    from rgb.data.snapshot import write_readme, write_split

    ensure_mini(mini_dir)
    test = load_split(str(mini_dir), DATASET, "test")
    test = test.select(range(min(n, len(test))))
    columns = test.cast_column("image", datasets.Image(decode=False))[:]
    columns["image"] = [image["bytes"] for image in columns["image"]]
    write_split(out / "data" / DATASET / "test.parquet", CLASS_NAMES, columns)
    write_readme(out, f"first {len(test)} test images of the mini benchmark (cpu_scaling)")
    return out


def configurations(cores: int) -> list[dict]:
    """(name, attack.py overrides): the three ways of using the cores."""
    configs = [{"name": "1 worker, 1 thread", "overrides": ["shard.devices=1", "threads=1"], "cores": 1}]
    if cores > 1:
        configs += [
            {"name": f"default: {cores} workers x 1 thread", "overrides": [f"threads={cores}"], "cores": cores},
            {"name": f"1 process x {cores} threads", "overrides": ["shard.devices=1", f"threads={cores}"],
             "cores": cores},
        ]
    return configs


def attack(run: str, norm: str, bench: Path, out: Path, batch_size: int | None, overrides: list[str]) -> dict:
    command = [sys.executable, str(REPO / "attack.py"), f"run={run}", f"norms=[{norm}]", f"paths.mini_dir={bench}",
               f"output_dir={out}", "progress=false", *overrides]
    if batch_size:
        command.append(f"batch_size={batch_size}")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "PYTHONPATH": str(REPO)}
    env.pop("RGB_THREADS", None)
    began = time.perf_counter()
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - began
    if done.returncode != 0:
        raise SystemExit(f"attack.py failed ({' '.join(command)}):\n{done.stderr[-3000:]}")
    summary = json.loads((out / norm / "summary.json").read_text())
    return {"wall_s": wall, "attack_seconds": summary["attack_seconds"], "n": summary["n"],
            "n_robust": summary["n_robust"], "results_sha256": summary["results_sha256"],
            "images_per_s": summary["n"] / wall}


def write(path: Path, record: dict) -> None:
    """The JSON so far (rewritten after every configuration: a long run interrupted keeps what it measured)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=2) + "\n")


def main(argv: list[str] | None = None) -> int:
    from rgb.core.machine import available_cpus

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", action="append", required=True, help="RUN_DIR:NORM (repeatable)")
    parser.add_argument("--mini", type=Path, default=REPO / "data" / "mini")
    parser.add_argument("--n", type=int, default=200, help="first test images attacked")
    parser.add_argument("--batch-size", type=int, default=None, help="default: the data config's (50 on mini)")
    parser.add_argument("--busy", type=int, nargs="+", default=[0, 2], help="CPU-bound processes beside it")
    parser.add_argument("--cores", type=int, default=available_cpus())
    parser.add_argument("--skip-threads", action="store_true",
                        help="leave out one process with N threads (the old default; minutes when shared)")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "cpu_scaling_cpu.json")
    args = parser.parse_args(argv)

    record = {"what": "attack.py wall time by way of using the CPU cores (issue 24)",
              "machine": {"platform": platform.platform(), "cpu_count": os.cpu_count(), "available_cpus": args.cores,
                          "python": platform.python_version()},
              "command": " ".join(sys.argv), "cases": []}
    with tempfile.TemporaryDirectory(prefix="cpu_scaling-") as scratch:
        bench = head_snapshot(args.mini, Path(scratch) / "bench", args.n)
        for case in args.case:
            run, norm = case.rsplit(":", 1)
            rows = []
            for busy in args.busy:
                for config in configurations(args.cores)[: 2 if args.skip_threads else None]:
                    out = Path(scratch) / f"out-{len(record['cases'])}-{len(rows)}"
                    load_before = os.getloadavg()
                    with busy_loops(busy):
                        row = attack(run, norm, bench, out, args.batch_size, config["overrides"])
                    rows.append({**config, "busy": busy, "load_before": load_before, "load_after": os.getloadavg(),
                                 **row})
                    print(f"{case} busy={busy} {config['name']}: {row['wall_s']:.1f} s "
                          f"({row['images_per_s']:.2f} img/s, {row['n_robust']}/{row['n']} robust)", flush=True)
                    write(args.out, {**record, "cases": [*record["cases"], {"case": case, "rows": rows}]})
            single = {r["busy"]: r for r in rows if r["cores"] == 1}
            default = {r["busy"]: r for r in rows if r["name"].startswith("default")}
            summary = {"identical_results": len({r["results_sha256"] for r in rows}) == 1}
            if 0 in single and 0 in default:
                speedup = default[0]["images_per_s"] / single[0]["images_per_s"]
                summary.update(default_speedup_alone=speedup, scaling_target=0.8 * args.cores,
                               scaling_met=speedup >= 0.8 * args.cores)
            shared = [b for b in default if b > 0]
            if 0 in default and shared:
                slowdown = default[shared[0]]["wall_s"] / default[0]["wall_s"]
                summary.update(default_slowdown_shared=slowdown, shared_busy=shared[0], slowdown_target=2.5,
                               slowdown_met=slowdown <= 2.5)
            record["cases"].append({"case": case, "n": args.n, "rows": rows, "summary": summary})
            print(case, json.dumps(summary), flush=True)
            write(args.out, record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
