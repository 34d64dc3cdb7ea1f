"""End-to-end time of `evaluate.py run=DIR text_robustness=true` on a zero-shot run, as JSON: the whole command
(start-up, model and text tower loading, features, tables, plots) with empty feature caches, then again with the
caches filled, and the stage times each run records in its text_robustness.json.

    python benchmarks/text_robustness_e2e.py outputs/train/digits/zeroshot_mini              # threads=1
    python benchmarks/text_robustness_e2e.py outputs/train/digits/zeroshot_mini --threads 2

The run is made by `python train.py model=openclip_mini strategy=zeroshot run_name=zeroshot_mini` (the embedded
CLIP, built on first use). Caches and outputs go to a temporary directory; the run itself is only read. One
thread by default, as benchmarks/text_robustness_speed.py: on a loaded 2-core machine two threads made the tables
6x slower (4.4 s instead of 0.7 s), so thread counts are recorded with every number.
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

import torch

from rgb.core import atomic_write_json

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results" / "text_robustness_e2e_cpu.json"


def timed_evaluation(run: Path, work: Path, extra: list[str]) -> tuple[dict, dict]:
    """One evaluate.py text_robustness=true, its wall time and the stage times of its record."""
    out = work / "eval"
    command = [sys.executable, str(REPO / "evaluate.py"), f"run={run.resolve()}", "text_robustness=true",
               f"output_dir={out}", f"text_robustness_options.cache_dir={work / 'cache'}", *extra]
    started = time.perf_counter()
    shown = subprocess.run(command, cwd=REPO, capture_output=True, text=True,
                           env={**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"})
    wall = time.perf_counter() - started
    if shown.returncode != 0:
        raise SystemExit(f"evaluate.py failed: {shown.stderr.strip().splitlines()[-1:]}")
    record = json.loads((out / "text_robustness" / "text_robustness.json").read_text())
    return {"wall_s": round(wall, 2), "stages_s": record["timings_s"], "texts_encoded": record["texts_encoded"],
            "image_features": record["image_features"]}, record


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path, help="a zero-shot run dir (model.json family openclip with a zeroshot head)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--threads", type=int, default=1, help="evaluate.py threads=")
    parser.add_argument("overrides", nargs="*", help="more evaluate.py overrides (text_robustness_options.split=...)")
    args = parser.parse_args(argv)
    overrides = [f"threads={args.threads}", *args.overrides]
    with tempfile.TemporaryDirectory() as tmp:
        cold, record = timed_evaluation(args.run, Path(tmp), overrides)
        warm, _ = timed_evaluation(args.run, Path(tmp), overrides)
    report = {
        "what": "evaluate.py run=DIR text_robustness=true end to end: cold (empty feature caches), then warm",
        "model": record["model"], "dataset": record["dataset"], "split": record["split"],
        "n_images": record["n_images"], "queries": record["queries"], "n_queries": record["n_queries"],
        "types": record["types"], "seeds": record["seeds"], "n_perturbations": record["n_perturbations"],
        "distinct_texts": record["distinct_texts"], "cold": cold, "warm": warm,
        "threads": args.threads, "machine": platform.machine(), "cpus": os.cpu_count(),
        "python": platform.python_version(), "torch": torch.__version__,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(args.out, report)
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
