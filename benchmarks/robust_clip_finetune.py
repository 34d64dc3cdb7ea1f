"""Do FARE and TeCoA fine-tuning raise the white-box robustness of a zero-shot CLIP? Issue 21's measurement on the
mini benchmark with the embedded CLIP: each train run dir (the zero-shot start and the fine-tuned ones) is attacked
by attack.py (the standard AutoAttack at Linf, the data config's 4/255, the whole test split, the default CPU
workers) and its summary.json read back: clean accuracy, robust accuracy, robust points, attack wall time.

    python train.py model=openclip_mini strategy=zeroshot prompts=mean run_name=zs
    python train.py model=openclip_mini strategy=full_finetune head_init=zeroshot loss=fare run_name=fare trainer.max_epochs=5
    python train.py model=openclip_mini strategy=full_finetune head_init=zeroshot loss=tecoa run_name=tecoa trainer.max_epochs=5
    python benchmarks/robust_clip_finetune.py outputs/train/digits/{zs,fare,tecoa} \
        --out benchmarks/results/robust_clip_finetune_mini_cpu.json

Re-running resumes (attack.py's run store): finished attacks are read, not recomputed.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from rgb.core.files import atomic_write_json  # noqa: E402
from rgb.core.exportfiles import model_record  # noqa: E402
from rgb.runs.store import output_dir_for, run_name_for  # noqa: E402


def measure(run: Path, output_root: Path) -> dict:
    record = model_record(run) or {}
    started = time.perf_counter()
    command = [sys.executable, str(REPO / "attack.py"), f"run={run}", "norms=[linf]", f"paths.output_dir={output_root}"]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"attack.py failed ({' '.join(command)}):\n{done.stderr[-3000:]}")
    folder = output_dir_for(output_root, "attack", record.get("dataset"), run_name_for(run)) / "linf"
    summary = json.loads((folder / "summary.json").read_text())
    return {"run": str(run), "loss": (record.get("loss") or {}).get("name"), "strategy": record.get("strategy"),
            "epochs": record.get("epochs"), "prompts": (record.get("zeroshot") or {}).get("label"),
            "eps": summary["eps"], "standard": summary["standard"], "n": summary["n"],
            "clean_acc": summary["clean_accuracy"], "robust_acc_linf": summary["robust_accuracy"],
            "n_robust": summary["n_robust"], "attack_seconds": summary["attack_seconds"],
            "wall_seconds": round(time.perf_counter() - started, 1), "summary": str(folder / "summary.json")}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--output-root", type=Path, default=Path("outputs"), help="attack.py's paths.output_dir")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    load_before = os.getloadavg()
    rows = []
    for run in args.runs:
        rows.append(measure(run.resolve(), args.output_root.resolve()))
        print(rows[-1], flush=True)
    start = rows[0]
    for row in rows[1:]:
        row["robust_gain_over_first"] = round(row["robust_acc_linf"] - start["robust_acc_linf"], 4)
        row["clean_drop_from_first"] = round(start["clean_acc"] - row["clean_acc"], 4)
    atomic_write_json(args.out, {"what": "white-box Linf AutoAttack of a zero-shot CLIP and its FARE/TeCoA "
                                         "fine-tunes (issue 21)", "rows": rows,
                                 "machine": {"platform": platform.platform(), "cpu_count": os.cpu_count(),
                                             "load_before": load_before, "load_after": os.getloadavg()}})
    return 0


if __name__ == "__main__":
    sys.exit(main())
