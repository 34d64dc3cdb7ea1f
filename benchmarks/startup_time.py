"""How long the commands take to answer `--help` (the issue's target: under 3 s), and what `import rgb` costs.

    python benchmarks/startup_time.py --repeat 5 --out benchmarks/results/startup_time_cpu.json
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
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

COMMANDS = {
    "train.py --help": ["train.py", "--help"],
    "attack.py --help": ["attack.py", "--help"],
    "evaluate.py --help": ["evaluate.py", "--help"],
    "import rgb": ["-c", "import rgb"],
}


def wall_seconds(repo: Path, arguments: list[str], repeat: int) -> list[float]:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        subprocess.run([sys.executable, *arguments], cwd=repo, check=True, capture_output=True)
        times.append(time.perf_counter() - start)
    return times


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repo", type=Path, default=Path(__file__).resolve().parents[1])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--command", action="append", default=[], metavar="NAME::ARGUMENTS",
                        help="also time `python ARGUMENTS` (split as a shell would), reported as NAME")
    parser.add_argument("--only", action="store_true", help="time the --command entries only")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    if args.only and not args.command:
        parser.error("--only times the --command entries: give at least one")
    commands = {} if args.only else dict(COMMANDS)
    for entry in args.command:
        name, separator, arguments = entry.partition("::")
        if not separator or not arguments.strip():
            parser.error(f"--command takes NAME::ARGUMENTS, got {entry!r}")
        commands[name] = shlex.split(arguments)
    results = {}
    for name, arguments in commands.items():
        times = wall_seconds(args.repo, arguments, args.repeat)
        results[name] = {"median_s": statistics.median(times), "runs_s": times}
        print(f"{name:22s} {statistics.median(times):6.2f} s (median of {args.repeat})")
    if args.out:
        record = {"repo": str(args.repo), "python": platform.python_version(), "machine": platform.machine(),
                  "cpus": os.cpu_count(), "load_average_1_5_15": os.getloadavg(), "results": results}
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()
