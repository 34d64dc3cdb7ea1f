"""Wall time of `make demo` step by step on a fresh copy of this checkout (issue 24: <= 5 minutes on a quiet 2-core
machine once the venv is installed, <= 10 minutes beside two other CPU-bound processes).

    python benchmarks/demo_time.py --venv .venv --out benchmarks/results/demo_time_cpu.json
    python benchmarks/demo_time.py --venv .venv --busy 2 --out benchmarks/results/demo_time_busy2_cpu.json
    python benchmarks/demo_time.py --install --out benchmarks/results/install_time_cpu.json   # a new venv too

The checkout's files (tracked and untracked, not ignored: what a clone plus your edits holds) are copied into a
temporary folder with no data/ and no outputs/, so the mini benchmark and the embedded CLIP are built as on a
fresh clone. The steps are the commands `make -n demo` prints with the venv taken as installed (--install first
runs and times `make install` into a new venv of the copy and records its size), each run and timed in turn; --busy K starts K pure-Python busy loops beside them. --steps N stops after N steps
(to check the script itself quickly; the JSON lists the steps it would run as `planned`).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from machine_load import busy_loops

REPO = Path(__file__).resolve().parents[1]


def fresh_copy(destination: Path) -> Path:
    """Tracked and untracked-but-not-ignored files of the checkout, as a clone with local edits would hold."""
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO, check=True,
                            capture_output=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        source = REPO / name
        if source.is_file():
            target = destination / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
    return destination


def demo_steps(copy: Path, venv: Path) -> list[str]:
    """The shell commands of `make demo` with the venv taken as installed, continuation lines joined."""
    command = ["make", "--no-print-directory", "-n", "demo", f"VENV={venv}", "-o", f"{venv}/.installed"]
    printed = subprocess.run(command, cwd=copy, check=True, capture_output=True, text=True).stdout
    steps, pending = [], ""
    for line in printed.splitlines():
        pending += line[:-1] + " " if line.endswith("\\") else line
        if not line.endswith("\\"):
            if pending.strip():
                steps.append(pending.strip())
            pending = ""
    return steps


def du(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--venv", type=Path, default=REPO / ".venv", help="an installed venv (absolute or repo-relative)")
    parser.add_argument("--install", action="store_true", help="install a new venv in the copy first (timed)")
    parser.add_argument("--torch-index", default=None, help="with --install: pip index for torch, e.g. "
                        "https://download.pytorch.org/whl/cpu")
    parser.add_argument("--busy", type=int, default=0, help="CPU-bound processes running beside the demo")
    parser.add_argument("--steps", type=int, default=None, help="stop after this many steps")
    parser.add_argument("--keep", type=Path, default=None, help="copy the demo's folder here afterwards")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "demo_time_cpu.json")
    args = parser.parse_args(argv)

    from rgb.core.machine import available_cpus

    scratch = Path(tempfile.mkdtemp(prefix="demo_time-"))
    copy = fresh_copy(scratch / "rgb")
    venv = (copy / ".venv") if args.install else args.venv.resolve()
    env = {**os.environ, "PYTHONPATH": str(copy)}
    env.pop("RGB_THREADS", None)
    if args.torch_index:
        env["TORCH_INDEX"] = args.torch_index
    planned = demo_steps(copy, venv)
    steps = planned[: args.steps]
    record = {"what": "make demo, step by step, on a fresh copy (issue 24)", "command": " ".join(sys.argv),
              "machine": {"platform": platform.platform(), "cpu_count": os.cpu_count(),
                          "available_cpus": available_cpus(), "python": platform.python_version()},
              "busy": args.busy, "load_before": os.getloadavg(), "planned": planned, "steps": []}
    began = time.perf_counter()
    with busy_loops(args.busy):
        if args.install:  # `make install` into a new venv of the copy: pip's downloads or its local wheel cache
            start = time.perf_counter()
            done = subprocess.run(["make", "install", f"VENV={venv}"], cwd=copy, env=env, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True)
            record["install_seconds"] = round(time.perf_counter() - start, 1)
            record["install_returncode"] = done.returncode
            print(f"{record['install_seconds']:7.1f} s  make install (rc {done.returncode})", flush=True)
            if done.returncode:
                print(done.stdout[-3000:], file=sys.stderr)
                steps = []
        for step in steps:
            start = time.perf_counter()
            done = subprocess.run(["bash", "-c", step], cwd=copy, env=env, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True)
            seconds = time.perf_counter() - start
            record["steps"].append({"command": step, "seconds": round(seconds, 1), "returncode": done.returncode,
                                    "tail": done.stdout[-1500:] if done.returncode else done.stdout[-400:]})
            print(f"{seconds:7.1f} s  {step[:110]}", flush=True)
            if done.returncode:
                print(done.stdout[-3000:], file=sys.stderr)
                break
    record["total_seconds"] = round(time.perf_counter() - began, 1)
    record["load_after"] = os.getloadavg()
    record["complete"] = (len(record["steps"]) == len(steps) and all(s["returncode"] == 0 for s in record["steps"])
                          and record.get("install_returncode", 0) == 0)
    if args.install and venv.is_dir():
        record["venv_bytes"] = du(venv)
    if args.keep:
        shutil.copytree(copy, args.keep, symlinks=True, dirs_exist_ok=True)
    shutil.rmtree(scratch, ignore_errors=True)
    print(f"total {record['total_seconds']:.1f} s ({'complete' if record['complete'] else 'INCOMPLETE'})")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=2) + "\n")
    return 0 if record["complete"] else 1


if __name__ == "__main__":
    sys.exit(main())
