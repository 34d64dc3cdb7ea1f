"""How long the commands take to answer `--help` (the issue's target: under 3 s), what `import rgb` costs, and the
time to the error of a config mistake: an unknown key, a bad value, a missing run= (issue 53 item 5's target: under
2 s; the config is checked before torch loads, and each error case says whether torch was imported).

    python benchmarks/startup_time.py --repeat 5 --out benchmarks/results/startup_time_cpu.json
    python benchmarks/startup_time.py --errors --repeat 5 --out benchmarks/results/startup_time_errors_cpu.json
    python benchmarks/startup_time.py --repo /tmp/old-checkout ...    # the same scripts of another checkout
    python benchmarks/startup_time.py --only --command "attack.py, all batches done::attack.py run=... \
        norms=[linf] output_dir=DIR"    # what a command costs before and after its work (issue 24)

Each command runs in a fresh interpreter; the median of `--repeat` runs is reported (wall seconds).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import resource
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

COMMANDS = {
    "train.py --help": ["train.py", "--help"],
    "attack.py --help": ["attack.py", "--help"],
    "evaluate.py --help": ["evaluate.py", "--help"],
    "import rgb": ["-c", "import rgb"],
}
# Config mistakes (a nonzero exit status, one line): a mistyped key each (the run named need not exist: the key is
# refused first), a bad value (for a run that exists, RUN: its model.json is read by the config's resolvers) and a
# missing run=. {RUN} is replaced by a run dir made for the measurement.
ERRORS = {
    "train.py trainer.max_epochz=3": ["train.py", "trainer.max_epochz=3"],
    "attack.py max_imagez=3": ["attack.py", "run=outputs/train/digits/no-such-run", "max_imagez=3"],
    "evaluate.py max_imagez=3": ["evaluate.py", "run=outputs/train/digits/no-such-run", "max_imagez=3"],
    "rgb-serve limits.max_queuez=1": ["-m", "rgb.serve", "run=outputs/train/digits/no-such-run", "limits.max_queuez=1"],
    "train.py trainer.max_epochs=0": ["train.py", "trainer.max_epochs=0"],
    "train.py strategy.name=foo": ["train.py", "strategy.name=foo"],
    "attack.py norms=[L3]": ["attack.py", "run={RUN}", "norms=[L3]"],
    "evaluate.py max_images=-1": ["evaluate.py", "run={RUN}", "max_images=-1"],
    "rgb-serve limits.max_queue=-1": ["-m", "rgb.serve", "run={RUN}", "limits.max_queue=-1"],
    "rgb-transfer batch_size=-1": ["-c", "from rgb.commands.main import transfer_main; transfer_main()", "run={RUN}",
                                   "batch_size=-1"],
    "attack.py (no run=)": ["attack.py", "norms=[linf]"],
    "evaluate.py (no run=)": ["evaluate.py"],
    "rgb-serve (no run=)": ["-m", "rgb.serve"],
}
# The record of the run the bad values are given for (what train.py writes of a digits model; no weights are read).
RUN_RECORD = {"family": "timm", "num_classes": 10, "class_names": [str(d) for d in range(10)], "dataset": "digits",
              "run_name": "startup-time", "image_size": 32}


def loads_torch(repo: Path, arguments: list[str]) -> bool:
    """Whether `python ARGUMENTS` imports torch before it exits (read from `-X importtime`)."""
    done = subprocess.run([sys.executable, "-X", "importtime", *arguments], cwd=repo, capture_output=True, text=True)
    return any(re.search(r"\|\s+torch$", line.rstrip()) for line in done.stderr.splitlines())


def wall_seconds(repo: Path, arguments: list[str], repeat: int, status: int = 0,
                 cpu: list[float] | None = None) -> list[float]:
    """Wall seconds of each of `repeat` runs of `python ARGUMENTS`, which must exit with `status`; their CPU
    seconds (user + system) are appended to `cpu` (on a shared machine the wall time is mostly waiting)."""
    times = []
    for _ in range(repeat):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        done = subprocess.run([sys.executable, *arguments], cwd=repo, capture_output=True, text=True)
        times.append(time.perf_counter() - start)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if cpu is not None:
            cpu.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
        if done.returncode != status:
            raise SystemExit(f"{arguments}: exit status {done.returncode}, expected {status}: {done.stderr[-500:]}")
    return times


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repo", type=Path, default=Path(__file__).resolve().parents[1])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--command", action="append", default=[], metavar="NAME::ARGUMENTS",
                        help="also time `python ARGUMENTS` (split as a shell would), reported as NAME")
    parser.add_argument("--only", action="store_true", help="time the --command entries only")
    parser.add_argument("--errors", action="store_true", help="time the mistyped options (ERRORS) only")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    if args.only and not args.command:
        parser.error("--only times the --command entries: give at least one")
    commands = {} if args.only or args.errors else dict(COMMANDS)
    for entry in args.command:
        name, separator, arguments = entry.partition("::")
        if not separator or not arguments.strip():
            parser.error(f"--command takes NAME::ARGUMENTS, got {entry!r}")
        commands[name] = shlex.split(arguments)
    results = {}
    expected = {name: 0 for name in commands}
    run = Path(tempfile.mkdtemp(prefix="startup-time-run-"))
    (run / "model.json").write_text(json.dumps(RUN_RECORD))
    if args.errors:
        commands.update({name: [a.replace("{RUN}", str(run)) for a in argv] for name, argv in ERRORS.items()})
        expected.update({name: 1 for name in ERRORS})
    for name, arguments in commands.items():
        cpu: list[float] = []
        times = wall_seconds(args.repo, arguments, args.repeat, expected.get(name, 0), cpu)
        results[name] = {"median_s": statistics.median(times), "runs_s": times, "median_cpu_s": statistics.median(cpu)}
        if name in ERRORS:
            results[name]["torch_loaded"] = loads_torch(args.repo, arguments)
        print(f"{name:30s} {statistics.median(times):6.2f} s wall, {statistics.median(cpu):5.2f} s CPU (median of "
              f"{args.repeat})" + (f", torch loaded: {results[name]['torch_loaded']}" if name in ERRORS else ""))
    shutil.rmtree(run)
    if args.out:
        record = {"repo": str(args.repo), "python": platform.python_version(), "machine": platform.machine(),
                  "cpus": os.cpu_count(), "load_average_1_5_15": os.getloadavg(), "results": results}
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()
