"""Everything a few minutes on a GPU should measure, in one JSON (+ a log): environment, the GPU-gated tests,
training throughput, AutoAttack speed and the full-size rehearsal (benchmarks/full_size.py). Run through
`benchmarks/gpu_check.sh OUT_DIR [--cpu]`.

Each part runs in its own process with a time limit, so one failure or hang costs only its own entry; the JSON
is rewritten after every part, so what finished survives a kill. `--cpu` runs the same parts at tiny sizes
(the test suite does, so the script cannot rot).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# What the parts import. The H200 image has torch, timm, lightning, torchmetrics, safetensors and pytest; the rest
# (pure Python) travels as wheels made by benchmarks/gpu_wheels.sh (docs/performance.md says how).
REQUIRED = ("torch", "timm", "lightning", "torchmetrics", "safetensors", "hydra", "omegaconf", "pytest", "numpy",
            "datasets", "imagecorruptions", "sklearn")

GPU_PLAN = {
    "train": {"model": "vit_base_patch16_224", "image_size": 224, "batch_size": 64, "steps": 10, "warmup": 3,
              "variants": [("bf16", ["--precision", "bf16"])],
              "conv": {"model": "convnext_tiny", "variants": [("bf16", ["--precision", "bf16"]),
                                                              ("bf16+channels_last", ["--precision", "bf16",
                                                                                      "--channels-last"])]}},
    # Worst case, every part at its limit: 80 + 3 x 30 + 370 = 540 s, gpu_check.sh's 9 minutes (gpu_attack.py's
    # parts at theirs: 355 s, + 15 s for its own start). AutoAttack's speed is benchmarks/gpu_attack.py's (fixtures,
    # throughput, ours vs the authors', schedule=pooled vs batch at card size, the dry run's forecast against the
    # measured time); the full-size rehearsal (benchmarks/full_size.py, about 5 minutes) and the tiny models'
    # pooled-schedule benchmark (benchmarks/pooled_schedule.py) do not fit: run them in a session of their own.
    "attack": {"variants": []},
    "limits": {"tests": 80, "train": 30},
    "env": {},
    "gpu_attack": {"args": [], "limit": 370},
    "full_size": "left out so that gpu_check.sh fits 9 minutes: run benchmarks/full_size.py in a session of its own",
    "pooled_schedule": "left out so that gpu_check.sh fits 9 minutes: run benchmarks/pooled_schedule.py on its own",
}
CPU_PLAN = {
    "train": {"model": "test_vit", "image_size": 32, "batch_size": 8, "steps": 2, "warmup": 1,
              "extra": ["--timm-kwargs", json.dumps({"img_size": 32})],
              "variants": [("fp32", ["--precision", "32"])],
              "conv": {"model": "test_resnet", "variants": [("fp32+channels_last", ["--precision", "32",
                                                                                   "--channels-last"])]}},
    # A random-init net labelled by its own predictions survives every step: keep the CPU run to 5 steps of APGD-CE
    # (the same code path) on 4 images of 16x16, seconds per part even on 2 loaded cores (the limits leave ~20x).
    "attack": {"model": "test_resnet", "image_size": 16, "n": 4, "num_classes": 10,
               "extra": ["--attacks", "apgd-ce", "--steps", "5"],
               "variants": [("bs2", 2, [], 240), ("bs4", 4, ["--channels-last"], 240)]},
    "limits": {"tests": 240, "train": 240},
    # One torch thread per part: on 2 cores shared with other jobs, torch's spinning threads made the tiny attack part
    # ~100x slower (300 s limits hit at load 6-8); one thread runs it in about a second.
    "env": {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"},
    # tests/test_gpu_check.py runs gpu_attack.py --cpu on its own (about a minute and a half on a busy CPU)
    "gpu_attack": "the --cpu plan leaves benchmarks/gpu_attack.py --cpu to its own test",
    # The rehearsal takes minutes even in its quick mode: tests/test_full_size.py runs that (slow mark).
    "full_size": "the --cpu plan leaves the rehearsal to tests/test_full_size.py",
    # tests/test_runs_pooled.py covers the schedule; its benchmark takes minutes on a CPU
    "pooled_schedule": "the --cpu plan leaves the schedule to its tests",
}


def worst_case_seconds(plan: dict) -> int:
    """The run's length if every part hits its time limit (a lent GPU's command may run 10 minutes at most)."""
    train = plan["train"]
    trainings = len(train["variants"]) + len(train["conv"]["variants"])
    scripts = [plan[part]["limit"] for part in ("gpu_attack", "full_size", "pooled_schedule")
               if isinstance(plan[part], dict)]
    return (plan["limits"]["tests"] + trainings * plan["limits"]["train"]
            + sum(limit for *_, limit in plan["attack"]["variants"]) + sum(scripts))


def missing_packages() -> list[str]:
    return [name for name in REQUIRED if importlib.util.find_spec(name) is None]


def environment() -> dict:
    import torch

    info = {
        "python": platform.python_version(), "machine": platform.machine(), "processor": platform.processor(),
        "cpu_count": os.cpu_count(), "torch": torch.__version__, "cuda_available": torch.cuda.is_available(),
        "torch_cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version(),
        "tf32_matmul": torch.backends.cuda.matmul.allow_tf32, "tf32_cudnn": torch.backends.cudnn.allow_tf32,
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
    }
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        info.update(gpu=torch.cuda.get_device_name(0), gpu_memory_gib=round(props.total_memory / 2**30, 1),
                    multiprocessors=props.multi_processor_count, bf16_supported=torch.cuda.is_bf16_supported())
    return info


class Checker:
    def __init__(self, out_dir: Path, cpu: bool):
        self.out_dir, self.cpu = out_dir, cpu
        self.plan = CPU_PLAN if cpu else GPU_PLAN
        self.report: dict = {"mode": "cpu" if cpu else "gpu", "started": time.strftime("%Y-%m-%dT%H:%M:%S")}
        self.log = open(out_dir / "gpu_check.log", "a")

    def save(self) -> None:
        tmp = self.out_dir / "gpu_check.json.tmp"
        tmp.write_text(json.dumps(self.report, indent=2) + "\n")
        os.replace(tmp, self.out_dir / "gpu_check.json")

    def run(self, name: str, command: list[str], limit: int) -> dict:
        """Run one part in a fresh process; its output goes to the log, its outcome into the report."""
        began = time.perf_counter()
        self.log.write(f"\n===== {name}: {' '.join(command)}\n")
        self.log.flush()
        env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
               "PYTHONUNBUFFERED": "1", **self.plan["env"]}
        try:
            done = subprocess.run(command, cwd=REPO, stdout=self.log, stderr=subprocess.STDOUT, timeout=limit,
                                  env=env)
            outcome = {"returncode": done.returncode}
        except subprocess.TimeoutExpired:
            outcome = {"returncode": None, "error": f"timed out after {limit}s"}
        outcome["seconds"] = round(time.perf_counter() - began, 1)
        print(f"gpu_check: {name}: {'ok' if outcome['returncode'] == 0 else 'FAILED'} ({outcome['seconds']}s)",
              flush=True)
        return outcome

    def tests(self) -> None:
        junit = self.out_dir / "gpu_tests.xml"
        outcome = self.run("gpu tests", [sys.executable, "-m", "pytest", "-q", "-m", "gpu", "tests/test_gpu.py",
                                         "tests/test_runs_runner.py", "tests/test_attacks_syncs.py",
                                         f"--junitxml={junit}", "-p", "no:cacheprovider"], self.plan["limits"]["tests"])
        if junit.is_file():
            import xml.etree.ElementTree as ET

            suite = ET.parse(junit).getroot()
            suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
            outcome.update({k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")})
        self.report["gpu_tests"] = outcome

    def train(self) -> None:
        plan, results = self.plan["train"], []
        runs = [(plan["model"], v) for v in plan["variants"]] + [(plan["conv"]["model"], v) for v in plan["conv"]["variants"]]
        for model, (label, flags) in runs:
            out = self.out_dir / f"train_{model}_{label.replace('+', '_')}.json"
            command = [sys.executable, "benchmarks/train_throughput.py", "--model", model, "--image-size",
                       str(plan["image_size"]), "--batch-size", str(plan["batch_size"]), "--steps", str(plan["steps"]),
                       "--warmup", str(plan["warmup"]), "--losses", "ce", "pgd_at", "trades", "--out", str(out),
                       *flags, *(plan.get("extra", []) if model == plan["model"] else [])]
            outcome = self.run(f"train {model} {label}", command, self.plan["limits"]["train"])
            if out.is_file():
                outcome["result"] = json.loads(out.read_text())
                out.unlink()
            results.append({"model": model, "variant": label, **outcome})
            self.report["train_throughput"] = results
            self.save()

    def attack(self) -> None:
        plan, results = self.plan["attack"], []
        self.report["autoattack"] = results
        for variant, batch_size, flags, limit in plan["variants"]:
            out = self.out_dir / f"attack_{variant}.json"
            command = [sys.executable, "benchmarks/attack_speed.py", "--model", plan["model"], "--synthetic",
                       str(plan["n"]), "--image-size", str(plan["image_size"]), "--num-classes",
                       str(plan["num_classes"]), "--batch-size", str(batch_size), "--out", str(out),
                       *plan.get("extra", []), *flags]
            outcome = self.run(f"autoattack {variant}", command, limit)
            if out.is_file():
                outcome["result"] = json.loads(out.read_text())
                out.unlink()
            results.append({"variant": variant, "batch_size": batch_size, **outcome})
            self.report["autoattack"] = results
            self.save()

    def script(self, part: str, title: str, script: str, args: list[str], work: Path | None = None) -> None:
        """A benchmark script that writes its own JSON (`part` of the plan; a string there skips it, saying why),
        folded into the report; `work` (its scratch) is removed afterwards."""
        plan = self.plan[part]
        if isinstance(plan, str):
            self.report[part] = {"skipped": plan}
            return
        out = self.out_dir / f"{part}.json"
        outcome = self.run(title, [sys.executable, script, "--out", str(out), *args, *plan["args"]], plan["limit"])
        if out.is_file():
            outcome["result"] = json.loads(out.read_text())
        if work is not None:
            shutil.rmtree(work, ignore_errors=True)
        self.report[part] = outcome

    def full_size(self) -> None:
        work = self.out_dir / "full_size_work"  # gigabytes of PNG, removed after the rehearsal
        reference = ["--reference"] if importlib.util.find_spec("pyautoattack") else []
        self.script("full_size", "full-size rehearsal", "benchmarks/full_size.py", ["--work", str(work), *reference],
                    work)

    def pooled_schedule(self) -> None:
        self.script("pooled_schedule", "pooled schedule", "benchmarks/pooled_schedule.py", ["--device", "cuda"])

    def gpu_attack(self) -> None:
        self.script("gpu_attack", "gpu attack", "benchmarks/gpu_attack.py", [])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--cpu", action="store_true", help="tiny sizes on the CPU (what the test suite runs)")
    parser.add_argument("--worst-case", action="store_true",
                        help="print the seconds the run takes if every part hits its time limit, and exit")
    args = parser.parse_args(argv)
    if args.worst_case:
        print(worst_case_seconds(CPU_PLAN if args.cpu else GPU_PLAN))
        return 0
    missing = missing_packages()
    if missing:
        print(f"gpu_check: missing Python packages: {', '.join(missing)}; install them or carry them as wheels "
              f"(benchmarks/gpu_wheels.sh; docs/performance.md, 'Reproduce')", file=sys.stderr)
        return 3
    import torch

    if not args.cpu and not torch.cuda.is_available():
        print("gpu_check: no CUDA device visible; use --cpu for the tiny CPU run", file=sys.stderr)
        return 4
    args.out_dir.mkdir(parents=True, exist_ok=True)
    checker = Checker(args.out_dir, args.cpu)
    checker.report["environment"] = environment()
    checker.save()
    began = time.perf_counter()
    for part in (checker.tests, checker.train, checker.attack, checker.gpu_attack, checker.full_size,
                 checker.pooled_schedule):
        part()
        checker.save()
    checker.report["total_seconds"] = round(time.perf_counter() - began, 1)
    checker.save()
    failed = [r for r in [checker.report["gpu_tests"], *checker.report["train_throughput"],
                          *checker.report["autoattack"]] if r["returncode"] != 0]
    for part in ("gpu_attack", "full_size", "pooled_schedule"):
        if checker.report[part].get("returncode", 0) != 0:
            failed.append(checker.report[part])
    print(f"gpu_check: wrote {args.out_dir / 'gpu_check.json'} ({len(failed)} part(s) failed, "
          f"{checker.report['total_seconds']}s)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
