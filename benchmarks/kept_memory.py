"""What glibc's default malloc costs an attack step, and what `rgb.core.machine.keep_freed_memory` saves (issue 24).

    python benchmarks/kept_memory.py --out benchmarks/results/kept_memory_cpu.json

One attack step is a forward and a backward to the input of the small CNN of benchmarks/reference_speed.py (random
weights: the cost does not depend on them), one torch thread, for a few batch sizes and both memory formats. Each
configuration runs in a fresh process, once with glibc's defaults and once after keep_freed_memory(), and reports
the milliseconds per step and the minor page faults per step (getrusage): the defaults hand freed activations back
to the kernel, and the next step faults them in afresh.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

STEP = """
import json, resource, sys, time, torch
sys.path[:0] = [{benchmarks!r}, {repo!r}]
from rgb.core.machine import keep_freed_memory
from reference_speed import small_cnn
kept = keep_freed_memory() if {keep} else False
torch.set_num_threads(1)
torch.manual_seed(0)
net = small_cnn().eval().requires_grad_(False)
x = torch.rand({batch}, 3, 32, 32).contiguous(memory_format=torch.{layout}).requires_grad_(True)
def step():
    torch.autograd.grad(net(x)[:, 0].sum(), x)
for _ in range(10):
    step()
faults, began = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, time.perf_counter()
for _ in range({steps}):
    step()
seconds = time.perf_counter() - began
print(json.dumps({{"kept": kept, "ms_per_step": 1000 * seconds / {steps},
                  "faults_per_step": (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults) / {steps}}}))
"""


def measure(batch: int, layout: str, keep: bool, steps: int) -> dict:
    code = STEP.format(benchmarks=str(REPO / "benchmarks"), repo=str(REPO), keep=keep, batch=batch, layout=layout,
                       steps=steps)
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k not in ("LD_PRELOAD",)}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.splitlines()[-1])


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int, nargs="+", default=[16, 62, 128])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=2, help="fresh processes per configuration")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    rows = []
    for batch in args.batches:
        for layout in ("contiguous_format", "channels_last"):
            for keep in (False, True):
                for run in range(args.repeat):
                    row = {"batch": batch, "layout": layout, "keep_freed_memory": keep, "run": run,
                           **measure(batch, layout, keep, args.steps)}
                    rows.append(row)
                    print(f"batch {batch:4d} {layout:17s} {'kept' if row['kept'] else 'glibc defaults':14s} "
                          f"{row['ms_per_step']:7.2f} ms/step {row['faults_per_step']:8.0f} faults/step", flush=True)
    record = {"what": "one attack step (forward + backward to the input, small CNN, one thread): glibc's default "
                      "malloc vs keep_freed_memory()",
              "machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                          "load_average_at_end": os.getloadavg()},
              "steps": args.steps, "rows": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()
