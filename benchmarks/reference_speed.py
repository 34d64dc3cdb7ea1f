"""Wall time per attack, ours vs the reference (fra31/auto-attack, `pyautoattack` on PyPI), side by side on the
same model, images, budget and seed, where evaluations are cheap and per-step overhead shows (issue 14).

    python benchmarks/reference_speed.py --models cnn-pgd_at cnn-ce --norms linf l2 l1 --n 64 \
        --out benchmarks/results/reference_speed_small_cnn_cpu.json

The models are small CNNs on the mini benchmark's 32x32 digits (rgb.data.mini, no files needed), trained here
(PGD-AT with rgb.training.losses, or plain CE) and cached in --cache, never in the repository. For each model and
norm the two implementations run at the same time in two processes with --threads torch threads each, so both
see the same machine load; each records wall time and its own CPU time (the steadier measure where other jobs
share the cores; per attack, the two implementations' stages do not run at the same moments). Each process counts the rows through the model with the same wrapper (forward rows;
backward rows via a hook on the logits), times every attack of the cascade, and returns the final robust flags
(fp32 re-evaluation of the returned images), which are compared image by image; ours calls the model as it is
(capture="eager": a trace would bypass the counting wrapper). Each process then replays the
model calls of its run in isolation (every batch size it used, timed forward-only or forward+backward, times its
count: `evaluation_floor`), so a record says how far each implementation's wall time is above what its model
evaluations alone cost. --busy K runs K CPU-bound busy loops beside the two (issue 24: a shared machine).
--kept-memory says which processes keep freed memory for the next tensor (`rgb.core.machine.keep_freed_memory`,
what attack.py does): ours by default, as each runs for its users; `both` gives the reference the same allocator.
--whole-machine instead runs each implementation as its users do on every core, one after the other beside the
same --busy loops: ours through `rgb.benchmark` on a mini benchmark built here (one forked single-threaded worker
per core, the model traced as on any CPU run: capture="auto"), the reference with torch's default threads, both
with --batch-size (default: n / cores, a batch per worker), ours with --schedule (batch, or pooled: each attack over
the survivors of all batches, as the reference does); flags and rows (ours: its own count) are compared as above.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import torch
from torch import nn

from machine_load import busy_loops
from rgb.attacks.autoattack import AutoAttack
from rgb.core.files import atomic_write_json
from rgb.core.machine import available_cpus, keep_freed_memory
from rgb.core.threat import Norm, parse_norm
from rgb.data.catalog import WHITE_BOX_BUDGETS, scale_budget
from rgb.data.mini import digit_images, stratified_splits
from rgb.runs.reference import RowCounter
from rgb.training.losses import build_loss

TRAIN_EPS = 8 / 255  # Linf budget of the inner attack of the PGD-AT model
TARGET_ROBUST_SPEEDUP = 1.5  # issue 24 (issue 14 asked 1.3)
TARGET_PLAIN_SPEEDUP = 5.0
_AFTER = re.compile(r"robust accuracy after (\S+):")


def small_cnn(n_classes: int = 10) -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.ReLU(),
        nn.Conv2d(32, 64, 3, stride=2, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(64 * 8 * 8, n_classes))


def tiny_vit(n_classes: int = 10) -> nn.Module:
    """A timm ViT at 32x32: 4x4 patches (64 tokens), width 64, 3 blocks; attention and MLPs instead of convs."""
    from timm.models.vision_transformer import VisionTransformer

    return VisionTransformer(img_size=32, patch_size=4, num_classes=n_classes, embed_dim=64, depth=3, num_heads=2,
                             mlp_ratio=2.0)


# name -> (architecture, training loss, epochs over the mini train split)
MODELS = {"cnn-pgd_at": (small_cnn, "pgd_at", 15), "cnn-ce": (small_cnn, "ce", 15),
          "vit-pgd_at": (tiny_vit, "pgd_at", 15)}


def digits(split: str) -> tuple[torch.Tensor, torch.Tensor]:
    images, labels = digit_images()
    index = stratified_splits(labels)[split]
    x = torch.from_numpy(images[index]).permute(0, 3, 1, 2).contiguous().float() / 255
    return x, torch.from_numpy(labels[index])


def train(name: str, seed: int = 0) -> nn.Module:
    architecture, loss_name, epochs = MODELS[name]
    torch.manual_seed(seed)
    model = architecture()
    loss = build_loss(loss_name, None if loss_name == "ce" else {"norm": "Linf", "eps": TRAIN_EPS, "n_iter": 10})
    x, y = digits("train")
    optimizer = torch.optim.Adam(model.parameters(), lr=2e-3)
    for epoch in range(epochs):
        order = torch.randperm(len(x), generator=torch.Generator().manual_seed(epoch))
        for start in range(0, len(x), 128):
            xb, yb = x[order[start:start + 128]], y[order[start:start + 128]]
            model.eval()  # the inner attack sees a fixed model
            adv = loss.attack(model, xb, yb) if loss.attack is not None else None
            model.train()
            optimizer.zero_grad()
            loss(yb, model(xb) if loss.uses_clean else None, model(adv) if adv is not None else None).backward()
            optimizer.step()
    return model.eval().requires_grad_(False)


def cached_model(name: str, cache: Path) -> Path:
    path = cache / f"reference_speed_{name}.pt"
    if not path.exists():
        cache.mkdir(parents=True, exist_ok=True)
        started = time.perf_counter()
        state = train(name).state_dict()
        with tempfile.NamedTemporaryFile(dir=cache, delete=False) as tmp:
            torch.save(state, tmp.name)
        os.replace(tmp.name, path)
        print(f"trained {name} in {time.perf_counter() - started:.0f} s -> {path}", flush=True)
    return path


class CallLog(RowCounter):
    """RowCounter that also counts the calls of each batch size and memory format (forward; backward), from which
    the cost of the attack's model evaluations alone is replayed (`evaluation_floor`)."""

    def __init__(self, model: nn.Module):
        super().__init__(model)
        self.forward_calls, self.backward_calls = Counter(), Counter()
        self._last_call = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        nhwc = x.dim() == 4 and x.shape[1] > 1 and x.is_contiguous(memory_format=torch.channels_last)
        self._last_call = (x.shape[0], nhwc)
        self.forward_calls[self._last_call] += 1
        return super().forward(x)

    def _count_backward(self, grad: torch.Tensor) -> None:
        self.backward_calls[(grad.shape[0], self._last_call[1])] += 1
        super()._count_backward(grad)


def _seconds_per_call(call, min_seconds: float = 0.05, repeats: int = 3) -> float:
    """Best of `repeats` process-CPU timings of `call`, each over enough calls to take `min_seconds` (after one
    warm-up): the best per-call speed for that size on this CPU, steady where other jobs share the cores."""
    call()
    best = float("inf")
    for _ in range(repeats):
        calls, began = 0, time.process_time()
        while (elapsed := time.process_time() - began) < min_seconds or calls == 0:
            call()
            calls += 1
        best = min(best, elapsed / calls)
    return best


def evaluation_floor(net: nn.Module, log: CallLog, shape: tuple[int, ...]) -> dict:
    """What the model evaluations of a run cost alone (process CPU seconds): every logged call size timed in
    isolation (random images,
    in the memory format the run gave them, forward without a graph; forward with one plus the backward to the input
    for a backward call), times its count.
    A run's wall time over this is what its own steps add: the limit an implementation can reach is 1."""
    seconds, sizes = 0.0, sorted(set(log.forward_calls) | set(log.backward_calls))
    for size, nhwc in sizes:
        x = torch.rand(size, *shape)
        x = x.contiguous(memory_format=torch.channels_last) if nhwc else x
        with torch.no_grad():
            forward = _seconds_per_call(lambda: net(x))
        seconds += log.forward_calls[(size, nhwc)] * forward
        if log.backward_calls[(size, nhwc)]:
            def forward_backward():
                xg = x.detach().clone().requires_grad_(True)
                net(xg).sum().backward()
            seconds += log.backward_calls[(size, nhwc)] * max(_seconds_per_call(forward_backward) - forward, 0.0)
    return {"seconds": seconds, "call_sizes": len(sizes), "forward_calls": sum(log.forward_calls.values()),
            "backward_calls": sum(log.backward_calls.values())}


def _clocks() -> tuple[float, float]:
    """(wall, CPU time of this process): on a shared machine the CPU time is the steadier measure of work."""
    return time.perf_counter(), time.process_time()


class _Stages:
    """Wall and CPU seconds and rows counted per attack: {attack: {"seconds", "cpu_seconds", "forward_rows",
    "backward_rows"}}."""

    def __init__(self, model: RowCounter):
        self.model, self.stages, self.began, self.rows_before = model, {}, None, (0, 0)

    def start(self) -> None:
        self.began, self.rows_before = _clocks(), self.model.rows()

    def end(self, name: str) -> None:
        now, rows = _clocks(), self.model.rows()
        self.stages[name] = {"seconds": now[0] - self.began[0], "cpu_seconds": now[1] - self.began[1],
                             "forward_rows": rows[0] - self.rows_before[0],
                             "backward_rows": rows[1] - self.rows_before[1]}
        self.began, self.rows_before = now, rows


def run_ours(model: RowCounter, x, y, norm: str, eps: float, seed: int, version: str, tail_rows: int = 0) -> dict:
    stages = _Stages(model)
    current = []

    def progress(name: str, *position) -> None:
        if not position and name not in current:  # an attack starts: the previous one ended
            if current:
                stages.end(current[-1])
            current.append(name)

    stages.start()  # the clean pass and checks count towards the first attack, as in the reference's stages
    started = _clocks()
    # Eager: a trace (capture="auto") would run the model's ATen calls without the counting wrapper's Python, so
    # rows, stages and the floor could not be observed. --whole-machine runs ours as users do, traced.
    result = AutoAttack(model, norm, eps, version=version, seed=seed, progress=progress, tail_rows=tail_rows,
                        capture="eager").run(x, y, batch_size=len(x))
    ended = _clocks()
    if current:
        stages.end(current[-1])
    return {"seconds": ended[0] - started[0], "cpu_seconds": ended[1] - started[1], "stages": stages.stages,
            "x_adv": result.x_adv,
            "own_count": {"forward_rows": float(result.forward_rows.sum()),
                          "backward_rows": float(result.backward_rows.sum())}}


def reference_attack(model: nn.Module, norm: str, eps: float, version: str, seed: int):
    from pyautoattack import AutoAttack as ReferenceAutoAttack

    return ReferenceAutoAttack(model, norm=parse_norm(norm).value, eps=eps, version=version, seed=seed, device="cpu")


def run_reference(model: RowCounter, x, y, norm: str, eps: float, seed: int, version: str, tail_rows: int = 0
                  ) -> dict:
    if tail_rows:
        raise ValueError("the reference runs targets one after another")
    stages = _Stages(model)

    class Handler(logging.Handler):
        def emit(self, record):
            match = _AFTER.search(record.getMessage())
            if match:  # logged after each attack's verification
                stages.end(match.group(1).lower())

    handler, logger = Handler(logging.DEBUG), logging.getLogger("auto-attack")
    logger.setLevel(logging.DEBUG)
    logger.addHandler(handler)
    try:
        attack = reference_attack(model, norm, eps, version, seed)
        started = _clocks()
        stages.start()
        x_adv, _ = attack.run_standard_evaluation(x, y, batch_size=len(x))
        ended = _clocks()
    finally:
        logger.removeHandler(handler)
    return {"seconds": ended[0] - started[0], "cpu_seconds": ended[1] - started[1], "stages": stages.stages,
            "x_adv": x_adv}


IMPLEMENTATIONS = {"ours": run_ours, "reference": run_reference}


def child(args) -> None:
    """One implementation on one (model, norm), in its own process; JSON to args.child_out."""
    torch.set_num_threads(args.threads)
    kept = keep_freed_memory() if args.kept_memory in (args.impl, "both") else False
    net = MODELS[args.model][0]()
    net.load_state_dict(torch.load(args.weights, weights_only=True))
    model = CallLog(net.eval().requires_grad_(False))
    x, y = digits("test")
    x, y = x[:args.n], y[:args.n]
    eps = args.eps if args.eps is not None else scale_budget(args.norm, WHITE_BOX_BUDGETS[args.norm], x[0].numel())
    tail_rows = args.tail_rows if args.impl == "ours" else 0
    outcome = IMPLEMENTATIONS[args.impl](model, x, y, args.norm, eps, args.seed, args.version, tail_rows)
    with torch.inference_mode():
        robust = net(outcome.pop("x_adv")).argmax(1) == y
    forward_rows, backward_rows = model.rows()
    floor = evaluation_floor(net, model, tuple(x.shape[1:]))
    outcome["evaluation_floor"] = {**floor, "wall_over_floor": outcome["seconds"] / floor["seconds"],
                                   "share_of_floor": floor["seconds"] / outcome["cpu_seconds"]}
    atomic_write_json(Path(args.child_out), {
        **outcome, "eps": eps, "threads": torch.get_num_threads(), "kept_freed_memory": kept,
        "robust": robust.tolist(),
        "n_robust": int(robust.sum()), "forward_rows": forward_rows, "backward_rows": backward_rows})


def ours_as_users_run_it(net: nn.Module, x, y, norm: str, eps: float, seed: int, batch_size: int, mini: Path,
                         workdir: Path, schedule: str = "batch") -> dict:
    """Our attack as `rgb.benchmark` runs it on the CPU (one forked single-threaded worker per core, like attack.py)
    on the first len(x) images of the mini test split, which must be `x`; the robust flags and rows from its run.
    The allocator is the caller's (`--kept-memory`: kept by default, as attack.py keeps it; rgb.benchmark
    leaves it to its forked workers)."""
    import pyarrow.parquet as pq

    import rgb
    from rgb.data import BenchmarkData

    split = BenchmarkData.for_dataset("digits", str(mini)).split("test")
    if not (torch.equal(torch.stack([split[i][0] for i in range(len(x))]), x)
            and [int(split[i][1]) for i in range(len(y))] == y.tolist()):
        sys.exit("reference_speed: the mini test split's first images are not the benchmark's")
    started = _clocks()
    rgb.benchmark(net, "mini", source=str(mini), settings=(norm,), name="model", output_dir=workdir, seed=seed,
                  batch_size=batch_size, n_examples=len(x), budgets={norm: eps}, progress=False, schedule=schedule)
    ended = _clocks()
    results = pq.read_table(next(workdir.glob(f"attack/*/model/first-{len(x)}/{norm}/results.parquet"))).to_pydict()
    order = torch.tensor(results["image_id"]).argsort()
    robust = torch.tensor(results["robust"])[order]
    return {"seconds": ended[0] - started[0], "cpu_seconds_parent": ended[1] - started[1], "robust": robust,
            "forward_rows": int(sum(results["forward_rows"])), "backward_rows": int(sum(results["backward_rows"]))}


def whole_machine_child(args) -> None:
    """--whole-machine: one implementation with its defaults on every core (ours: forked single-threaded workers;
    the reference: torch's threads), alone in its process; JSON to args.child_out."""
    kept = keep_freed_memory() if args.kept_memory in (args.impl, "both") else False
    net = MODELS[args.model][0]()
    net.load_state_dict(torch.load(args.weights, weights_only=True))
    net = net.eval().requires_grad_(False)
    x, y = digits("test")
    x, y = x[:args.n], y[:args.n]
    eps = args.eps if args.eps is not None else scale_budget(args.norm, WHITE_BOX_BUDGETS[args.norm], x[0].numel())
    if args.impl == "ours":
        outcome = ours_as_users_run_it(net, x, y, args.norm, eps, args.seed, args.batch_size, Path(args.mini),
                                       Path(args.child_out).parent / "ours", args.schedule)
        robust = outcome.pop("robust")
    else:
        counted = CallLog(net)
        started = _clocks()
        x_adv, _ = reference_attack(counted, args.norm, eps, args.version, args.seed).run_standard_evaluation(
            x, y, batch_size=args.batch_size)
        ended = _clocks()
        outcome = {"seconds": ended[0] - started[0], "cpu_seconds_parent": ended[1] - started[1]}
        outcome["forward_rows"], outcome["backward_rows"] = counted.rows()
        with torch.inference_mode():
            robust = net(x_adv).argmax(1) == y
    atomic_write_json(Path(args.child_out), {**outcome, "eps": eps, "threads": torch.get_num_threads(),
                                             "kept_freed_memory": kept, "robust": robust.tolist(),
                                             "n_robust": int(robust.sum())})


def whole_machine(args, name: str, weights: Path, norm: str, workdir: Path) -> dict:
    """Ours, then the reference, each with its defaults on every core (as their users run them), in a fresh
    process each and beside the same --busy loops; compared on wall time, rows and flags."""
    outcome = {}
    for impl in IMPLEMENTATIONS:
        command = [sys.executable, __file__, "--child", impl, "--whole-machine", "--model", name, "--weights",
                   str(weights), "--norm", norm, "--kept-memory", args.kept_memory, "--n", str(args.n), "--seed",
                   str(args.seed), "--version", args.version, "--batch-size", str(args.batch_size), "--schedule",
                   args.schedule, "--mini", str(args.mini), "--child-out", str(workdir / f"{impl}.json"), "--out", "-"]
        if norm in args.budgets:
            command += ["--eps", str(args.budgets[norm])]
        if subprocess.run(command).returncode != 0:
            sys.exit(f"reference_speed: the {impl} process failed on {name} {norm}")
        outcome[impl] = json.loads((workdir / f"{impl}.json").read_text())
    ours, reference = (torch.tensor(outcome[impl].pop("robust")) for impl in IMPLEMENTATIONS)
    return compared(args, name, norm, outcome, ours, reference, cpu=False)


def side_by_side(args, name: str, weights: Path, norm: str, workdir: Path) -> dict:
    processes = {}
    for impl in IMPLEMENTATIONS:
        command = [sys.executable, __file__, "--child", impl, "--model", name, "--weights", str(weights),
                   "--norm", norm, "--tail-rows", str(args.tail_rows), "--kept-memory", args.kept_memory,
                   "--n", str(args.n), "--seed", str(args.seed), "--threads", str(args.threads),
                   "--version", args.version, "--child-out", str(workdir / f"{impl}.json"), "--out", "-"]
        if norm in args.budgets:
            command += ["--eps", str(args.budgets[norm])]
        env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
        processes[impl] = subprocess.Popen(command, env=env)
    for impl, process in processes.items():
        if process.wait() != 0:
            sys.exit(f"reference_speed: the {impl} process failed on {name} {norm}")
    outcome = {impl: json.loads((workdir / f"{impl}.json").read_text()) for impl in IMPLEMENTATIONS}
    ours, reference = (torch.tensor(outcome[impl].pop("robust")) for impl in IMPLEMENTATIONS)
    return compared(args, name, norm, outcome, ours, reference, cpu=True)


def compared(args, name: str, norm: str, outcome: dict, ours: torch.Tensor, reference: torch.Tensor, cpu: bool
             ) -> dict:
    """One record: the two outcomes, the speed-up (and of CPU time, where each process did all its work itself),
    the flags' agreement image by image and the targets met."""
    speedup = outcome["reference"]["seconds"] / outcome["ours"]["seconds"]
    robust_model = outcome["reference"]["n_robust"] > 0
    target = TARGET_ROBUST_SPEEDUP if robust_model else TARGET_PLAIN_SPEEDUP
    only_ours = int((ours & ~reference).sum())
    meets = {"speed_wall": speedup >= target}
    speedups = {"speedup_wall": speedup}
    if cpu:
        speedups["speedup_cpu"] = outcome["reference"]["cpu_seconds"] / outcome["ours"]["cpu_seconds"]
        meets["speed_cpu"] = speedups["speedup_cpu"] >= target
    return {
        "model": name, "norm": norm, "eps": outcome["ours"]["eps"], "n": args.n, "seed": args.seed,
        "agreement": {"both_robust": int((ours & reference).sum()), "only_ours_robust": only_ours,
                      "only_reference_robust": int((~ours & reference).sum())},
        **speedups,
        "meets_targets": {**meets,
                          "evaluations": (outcome["ours"]["forward_rows"] <= outcome["reference"]["forward_rows"]
                                          and outcome["ours"]["backward_rows"] <= outcome["reference"]["backward_rows"]),
                          "never_weaker": only_ours <= max(1, args.n // 450)},
        "target_speedup": target, **outcome,
    }


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--norms", nargs="+", default=[n.key for n in Norm], choices=[n.key for n in Norm])
    parser.add_argument("--n", type=int, default=64, help="test images (the first n of the mini test split)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="torch threads of each of the two processes")
    parser.add_argument("--version", default="standard", choices=["standard", "plus"])
    parser.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) / "rgb-benchmark-models")
    parser.add_argument("--budget", nargs="+", default=[], metavar="NORM=EPS",
                        help="instead of the mini benchmark's budget, e.g. linf=0.1 (a plain model needs more to fall)")
    parser.add_argument("--tail-rows", type=int, default=0,
                        help="ours: run the targets left side by side below this many rows (AutoAttack tail_rows)")
    parser.add_argument("--busy", type=int, default=0, help="CPU-bound processes running beside the two (a shared "
                                                           "machine)")
    parser.add_argument("--kept-memory", default="ours", choices=["ours", "both", "none"],
                        help="processes that keep freed memory for the next tensor (attack.py does)")
    parser.add_argument("--whole-machine", action="store_true",
                        help="instead of two one-thread processes side by side: ours, then the reference, each with "
                             "its defaults on every core (rgb.benchmark's forked workers; torch's threads)")
    parser.add_argument("--batch-size", type=int, help="--whole-machine: both sides' batch (default: n / cores, "
                                                       "so that every worker of ours has a batch)")
    parser.add_argument("--schedule", default="batch", choices=["batch", "pooled"],
                        help="--whole-machine: ours batch by batch, or each attack over all survivors (AttackOptions)")
    parser.add_argument("--out", required=True)
    parser.add_argument("--mini", help=argparse.SUPPRESS)
    parser.add_argument("--eps", type=float, help=argparse.SUPPRESS)
    parser.add_argument("--model", choices=list(MODELS), help=argparse.SUPPRESS)
    parser.add_argument("--child", choices=list(IMPLEMENTATIONS), help=argparse.SUPPRESS)
    parser.add_argument("--weights", help=argparse.SUPPRESS)
    parser.add_argument("--norm", help=argparse.SUPPRESS)
    parser.add_argument("--child-out", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.budgets = {parse_norm(key).key: float(value) for key, _, value in (b.partition("=") for b in args.budget)}
    if args.child:
        args.impl = args.child
        return whole_machine_child(args) if args.whole_machine else child(args)
    if args.whole_machine and args.threads != 1:
        parser.error("--threads is for the side-by-side runs; --whole-machine uses each side's defaults")
    args.batch_size = args.batch_size or -(-args.n // available_cpus())

    from importlib import metadata

    records, compare = [], whole_machine if args.whole_machine else side_by_side
    if args.whole_machine:  # one mini benchmark for all records, removed with the process
        from rgb.data.mini import build_mini

        mini_build = tempfile.TemporaryDirectory()
        args.mini = build_mini(Path(mini_build.name) / "mini")
    for name in args.models:
        weights = cached_model(name, args.cache)
        for norm in args.norms:
            with tempfile.TemporaryDirectory() as workdir, busy_loops(args.busy):
                record = compare(args, name, weights, norm, Path(workdir))
            records.append(record)
            ours, reference = record["ours"], record["reference"]
            print(f"{name} {norm}: ours {ours['n_robust']}/{args.n} in {ours['seconds']:.1f} s "
                  f"({ours['forward_rows']} fwd, {ours['backward_rows']} bwd), reference {reference['n_robust']} in "
                  f"{reference['seconds']:.1f} s ({reference['forward_rows']} fwd, {reference['backward_rows']} bwd): "
                  f"{record['speedup_wall']:.2f}x wall"
                  + (f", {record['speedup_cpu']:.2f}x CPU time" if "speedup_cpu" in record else "")
                  + f", {record['agreement']}", flush=True)
            atomic_write_json(Path(args.out), {
                "what": ("our AutoAttack vs the reference (pyautoattack), each with its defaults on every core, one "
                         "after the other: wall time, rows through the model" if args.whole_machine else
                         "our AutoAttack vs the reference (pyautoattack), two processes side by side, wall time and "
                         "rows through the model per attack"),
                "machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                            "threads_each": "defaults" if args.whole_machine else args.threads,
                            "busy_loops_beside": args.busy,
                            "load_average_at_end": os.getloadavg()},
                "versions": {"torch": torch.__version__, "pyautoattack": metadata.version("pyautoattack")},
                "targets": {"robust_speedup": TARGET_ROBUST_SPEEDUP, "plain_speedup": TARGET_PLAIN_SPEEDUP},
                "version": args.version, "tail_rows": args.tail_rows, "kept_memory": args.kept_memory,
                "schedule": args.schedule,
                "whole_machine": args.whole_machine, "batch_size": args.batch_size if args.whole_machine else args.n,
                "records": records,
            })


if __name__ == "__main__":
    main()
