"""AutoAttack on a GPU, measured at card size (issue 47): robust-regime fixtures, attack throughput as a share of
the device's peak, ours against the authors' code end to end, `schedule=pooled` against `schedule=batch` on a
robust-model-like mix, and `attack.py dry_run=true`'s forecast against the measured time.

    python benchmarks/gpu_attack.py --out benchmarks/results/gpu_attack_h200.json   # one H200, at most 355 s
    python benchmarks/gpu_attack.py --out /tmp/gpu_attack_cpu.json --cpu            # tiny sizes, about a minute

benchmarks/gpu_check.sh runs it as its part `gpu_attack`.

Each part runs in its own process under its own time limit, and the JSON is rewritten after every part, so a
part cut by its limit costs only its own entry. Parts:
  - fixture_<model>: a random-init timm model at card size (224 px, 196 classes), labelled by its own predictions,
    and the share of images that survive APGD-CE. A random-init ViT-B/16 falls within 10 steps (issue 47), so
    every fixture sees its input through a contraction towards grey, x -> 0.5 + (x - 0.5) / contraction, in front
    of the unchanged network: the attack's effective budget shrinks by that factor (1 = none: resnet50 survives
    as it is), while every evaluation still costs the whole network. Logit temperature or a scaled head would not
    help: they leave the argmax, and so the attack's success, unchanged.
  - throughput_<model>: a fixed number of APGD-CE iterations (no early exit) at each batch size (the largest that
    fits, by rgb.runs.batch_probe, caps them) and precision: rows/s (one row = one image through forward and
    input-gradient backward), FLOP/s counted by torch.utils.flop_counter.FlopCounterMode, and its share of the
    device's dense peak at that precision (fp32 = CUDA cores, tf32 and bf16 = tensor cores; none on the CPU).
  - versus_authors: ours and the authors' (pyautoattack, skipped with a note when it is not importable) on the same
    robust images, model, budget (Linf 4/255) and batch: APGD-CE alone, so that it fits; the whole cascade's time
    follows from the throughput rows (a computed figure, labelled so).
  - pooled_vs_batch: one attack run per schedule through the library's own entry points (rgb.runs.AttackRequest and
    rgb.runs.runner.execute, as attack.py runs them; the fixture model exported with the factory that rebuilds it
    and loaded by path) on the same images, model (resnet50), budget (Linf 4/255) and batch: the standard version's
    whole cascade with fewer steps and Square queries, so that both fit (labelled: not the protocol's). Each run's
    wall time (CUDA synchronised), rows, robust flags of both and whether they agree image by image. The images are
    a robust-model-like mix (`boundary_mix`), written as a one-split snapshot by the suite's writer: a share (~20%)
    of uniform-noise images, which a random-init net classifies with a margin APGD does not overcome (the fixture
    part: resnet50 survives), and the rest points near the decision boundary: on the line from a noise image to a
    flat-colour image the net classifies otherwise, bisected to the class change, stepped back 1/255 (Linf) to the
    noise image's side and stored as 8-bit PNG, which APGD-CE flips within a few steps. Every image is labelled by
    the model's prediction on its stored pixels, in an order that spreads the robust ones evenly over the batches
    (each batch keeps ~20%, the case where the batch schedule's tails run nearly empty).
  - dry_run_forecast: `attack.py dry_run=true`'s estimate (rgb.runs.cost.estimate) of the same case: its time from
    the throughput rows this run measured (this report, rewritten so far; the model's own rows, at the measured
    batch nearest the run's), else the bound, labelled by `time_basis`; the forecast at the robust share that
    pooled_vs_batch measured (the plan's where that part did not finish), beside both measured wall times and
    measured / forecast.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
EPS = 4 / 255

GPU_PLAN = {
    "image_size": 224, "num_classes": 196, "device": "cuda",
    "models": {"resnet50": 1, "convnext_tiny": 1, "vit_base_patch16_224": 20},  # model: input contraction
    # Worst case, every part at its limit: 3 x 20 + 3 x 50 + 40 + 80 + 25 = 355 s (gpu_check.sh's share of its 9
    # minutes). The first H200 run spent 70.8 s on 8 robust resnet50 images over the whole standard cascade at batch 8
    # (~9 s each); 26 robust images at 10 steps and 500 queries (~8% of its rows) fit pooled_vs_batch's 80 s twice.
    "fixture": {"n": 32, "steps": 10, "limit": 20},
    "throughput": {"batches": [64, 256, 1024], "steps": 2, "precisions": ["fp32", "tf32", "bf16"], "limit": 50},
    "versus_authors": {"model": "resnet50", "n": 64, "batch": 64, "steps": 100, "limit": 40},
    "pooled_vs_batch": {"model": "resnet50", "n": 128, "robust_share": 0.2, "batch": 32, "steps": 10, "queries": 500,
                        "limit": 80},
    "dry_run_forecast": {"limit": 25},
}
CPU_PLAN = {
    "image_size": 32, "num_classes": 10, "device": "cpu",
    "models": {"test_resnet": 1, "test_vit": 20},
    "fixture": {"n": 2, "steps": 2, "limit": 120},
    "throughput": {"batches": [2], "steps": 1, "precisions": ["fp32", "bf16"], "limit": 120},
    "versus_authors": {"model": "test_resnet", "n": 2, "batch": 2, "steps": 2, "limit": 120},
    # test_resnet at random init gives every image one class: no boundary to put images near; resnet18 is quick at 32 px
    "pooled_vs_batch": {"model": "resnet18", "n": 8, "robust_share": 0.25, "batch": 4, "steps": 2, "queries": 5,
                        "limit": 120},
    "dry_run_forecast": {"limit": 120},
}


def fixture_net(name: str, num_classes: int, image_size: int, contraction: float = 1):
    """A random-init timm `name` behind the input contraction (module docstring); also the factory that rebuilds
    pooled_vs_batch's export (`gpu_attack:fixture_net`: this script's folder is on the path where it runs)."""
    import timm
    from torch import nn

    class Contracted(nn.Module):
        def __init__(self, net: nn.Module, factor: float):
            super().__init__()
            self.net, self.factor = net, factor

        def forward(self, x):
            return self.net(x if self.factor == 1 else 0.5 + (x - 0.5) / self.factor)

    kwargs = {"img_size": image_size} if "vit" in name else {}
    return Contracted(timm.create_model(name, pretrained=False, num_classes=num_classes, **kwargs), contraction)


def build_fixture(name: str, contraction: float, plan: dict):
    """The model of part `fixture_<name>`, on the plan's device, in eval mode, parameters frozen."""
    import torch

    torch.manual_seed(0)
    model = fixture_net(name, plan["num_classes"], plan["image_size"], contraction).to(plan["device"]).eval()
    for parameter in model.parameters():
        parameter.requires_grad_(False)
    return model


def images(model, n: int, plan: dict, seed: int = 1):
    """n random images labelled by the model's own predictions (every image is attacked)."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    x = torch.rand(n, 3, plan["image_size"], plan["image_size"], generator=generator)
    with torch.inference_mode():
        y = model(x.to(plan["device"])).argmax(1).cpu()
    return x, y


def synchronize(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def part_fixture(name: str, plan: dict) -> dict:
    from rgb.attacks import apgd

    contraction = plan["models"][name]
    model = build_fixture(name, contraction, plan)
    x, y = images(model, plan["fixture"]["n"], plan)
    device = plan["device"]
    result = apgd(model, x.to(device), y.to(device), norm="Linf", eps=EPS, n_iter=plan["fixture"]["steps"],
                  generator=0)
    return {"model": name, "input_contraction": contraction, "images": len(x), "apgd_ce_steps": plan["fixture"]["steps"],
            "survived": float((~result.fooled).float().mean()), "classes_predicted": int(y.unique().numel())}


def flops_per_row(model, plan: dict) -> float:
    """FLOPs of one image through forward and input-gradient backward (what one APGD step costs a row)."""
    import torch

    from rgb.runs.forecast import evaluation_flops

    return sum(evaluation_flops(model, torch.rand(1, 3, plan["image_size"], plan["image_size"], device=plan["device"])))


def precision_context(precision: str, device: str):
    """The numerics of one throughput row: fp32 (TF32 off, the protocol's), tf32, or bf16 autocast."""
    import contextlib

    import torch

    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = precision == "tf32"
    if precision == "bf16":
        return torch.autocast(device_type=device, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def part_throughput(name: str, plan: dict) -> dict:
    import torch

    from rgb.attacks import apgd
    from rgb.runs.batch_probe import largest_batch
    from rgb.runs.forecast import DEVICE_PEAKS

    device, settings = plan["device"], plan["throughput"]
    model = build_fixture(name, plan["models"][name], plan)
    per_row = flops_per_row(model, plan)
    shape = (3, plan["image_size"], plan["image_size"])
    fits = largest_batch(model, shape, torch.device(device), ceiling=max(settings["batches"]))
    device_name = torch.cuda.get_device_name(0) if device == "cuda" else "cpu"
    rows = []
    for batch in sorted({min(b, fits) for b in settings["batches"]}):
        x, y = images(model, batch, plan)
        x, y = x.to(device), y.to(device)
        for precision in settings["precisions"]:
            with precision_context(precision, device):
                apgd(model, x, y, norm="Linf", eps=EPS, n_iter=1, early_stop=False, generator=0)  # warm-up
                synchronize(device)
                began = time.perf_counter()
                result = apgd(model, x, y, norm="Linf", eps=EPS, n_iter=settings["steps"], early_stop=False,
                              random_start=False, generator=0)
                synchronize(device)
                seconds = time.perf_counter() - began
            rows_per_s = result.backward_rows / seconds
            peak = DEVICE_PEAKS.get(device_name, {}).get(precision)
            rows.append({"batch": batch, "precision": precision, "steps": settings["steps"], "seconds": seconds,
                         "rows_per_s": rows_per_s, "flop_per_s": rows_per_s * per_row,
                         "share_of_peak": rows_per_s * per_row / peak if peak else None})
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    return {"model": name, "device": device_name, "flop_per_row": per_row, "largest_batch_that_fits": fits,
            "peak_source": "DEVICE_PEAKS (dense, data sheet)" if device_name in DEVICE_PEAKS else "unknown device: no share",
            "rows": rows}


def part_versus_authors(plan: dict) -> dict:
    import torch

    from rgb.attacks import AutoAttack

    settings, device = plan["versus_authors"], plan["device"]
    model = build_fixture(settings["model"], plan["models"][settings["model"]], plan)
    x, y = images(model, settings["n"], plan, seed=2)
    entry = {"model": settings["model"], "images": len(x), "batch": settings["batch"], "norm": "Linf", "eps": EPS,
             "attacks": ["apgd-ce"], "steps": settings["steps"], "whole_cascade": "computed from the throughput rows, not measured"}
    synchronize(device)
    began = time.perf_counter()
    ours = AutoAttack(model, "Linf", EPS, attacks=("apgd-ce",), steps=settings["steps"], device=device).run(
        x, y, batch_size=settings["batch"])
    synchronize(device)
    entry["ours"] = {"seconds": time.perf_counter() - began, "robust_accuracy": ours.robust_accuracy}
    if importlib.util.find_spec("pyautoattack") is None:
        entry["authors"] = {"skipped": "pyautoattack is not importable here"}
        return entry
    from pyautoattack import AutoAttack as AuthorsAutoAttack

    authors = AuthorsAutoAttack(model, norm="Linf", eps=EPS, version="custom", attacks=["apgd-ce"], device=device,
                                seed=0)
    authors.apgd.n_iter, authors.apgd.n_restarts = settings["steps"], 1  # the standard version's APGD-CE
    synchronize(device)
    began = time.perf_counter()
    x_adv, _ = authors.run_standard_evaluation(x.to(device), y.to(device), batch_size=settings["batch"])
    synchronize(device)
    seconds = time.perf_counter() - began
    with torch.inference_mode():
        robust = (model(x_adv.to(device)).argmax(1).cpu() == y).float().mean()
    entry["authors"] = {"seconds": seconds, "robust_accuracy": float(robust)}
    entry["ours_speedup"] = seconds / entry["ours"]["seconds"]
    return entry


def boundary_mix(model, plan: dict, seed: int = 3):
    """(uint8 N x H x W x 3 images, labels, robust_by_design): pooled_vs_batch's mix (module docstring): round(share
    x n) uniform-noise images and the rest near the decision boundary, each labelled by the model's prediction on
    its stored (8-bit) pixels, in a fixed order that spreads the noise images evenly over the batches."""
    import torch

    settings, device, size = plan["pooled_vs_batch"], plan["device"], plan["image_size"]
    n, generator = settings["n"], torch.Generator().manual_seed(seed)
    n_far = round(n * settings["robust_share"])
    n_near = n - n_far

    def predict(x):
        with torch.inference_mode():
            return torch.cat([model(part.to(device)).argmax(1).cpu() for part in x.split(64)])

    far = torch.rand(n_far, 3, size, size, generator=generator)
    start = torch.rand(n_near, 3, size, size, generator=generator)
    colours = (torch.rand(4 * n_near, 3, 1, 1, generator=generator)
               + 0.1 * (torch.rand(4 * n_near, 3, size, size, generator=generator) - 0.5)).clamp(0, 1)
    start_class, colour_class = predict(start), predict(colours)
    other = colour_class[None, :] != start_class[:, None]  # (start, colour): classified otherwise
    if not bool(other.any(1).all()):
        raise RuntimeError("boundary_mix: no flat-colour image is classified otherwise than a noise image")
    end = colours[other.float().argmax(1)]  # the first such colour for each start
    low, high = torch.zeros(n_near), torch.ones(n_near)  # start's class at low, another at high
    for _ in range(16):
        middle = (low + high) / 2
        same = predict(start + middle.view(-1, 1, 1, 1) * (end - start)) == start_class
        low, high = torch.where(same, middle, low), torch.where(same, high, middle)
    reach = (end - start).abs().flatten(1).amax(1)
    back = (low - (1 / 255) / reach).clamp(min=0)  # 1/255 (Linf) back towards start, off the boundary's rounding
    near = start + back.view(-1, 1, 1, 1) * (end - start)
    robust_by_design = torch.zeros(n, dtype=torch.bool)
    robust_by_design[(torch.arange(n_far) * n) // n_far] = True  # evenly spaced slots: ~the share in every batch
    x = torch.empty(n, 3, size, size)
    x[robust_by_design], x[~robust_by_design] = far, near
    stored = (x * 255).round().to(torch.uint8)
    labels = predict(stored.float() / 255)
    return stored.permute(0, 2, 3, 1).numpy(), labels.numpy(), robust_by_design


class ScheduleCase:
    """pooled_vs_batch's case as a user's run is: the fixture model (random init, no input normalisation: the
    fixture part's resnet50, whose noise images survive), exported with the factory that rebuilds it, the mix written
    as a one-split snapshot by the suite's writer, and the request attack.py makes of it per schedule (attacks and
    dry runs load the export by path, as attack.py run=DIR does)."""

    def __init__(self, plan: dict, work: Path):
        from rgb.data.benchmark_data import BenchmarkData
        from rgb.data.snapshot import clean_columns, write_readme, write_split
        from rgb.models import export_factory_model, export_meta

        self.plan, self.work, self.settings = plan, work, plan["pooled_vs_batch"]
        name = self.settings["model"]
        model = build_fixture(name, 1, plan)
        images_u8, labels, self.robust_by_design = boundary_mix(model, plan)
        class_names = [f"class_{c:03d}" for c in range(plan["num_classes"])]
        write_split(work / "snapshot" / "data" / "fixture_mix" / "test.parquet", class_names,
                    clean_columns(images_u8, labels))
        write_readme(work / "snapshot", "gpu_attack.py pooled_vs_batch fixture (synthetic)")
        self.datamodule = BenchmarkData(str(work / "snapshot"), "fixture_mix", plan["image_size"],
                                        plan["num_classes"], {"linf": EPS}, eval_batch_size=self.settings["batch"])
        self.run_dir = work / "models" / name
        export_factory_model(model.cpu(), self.run_dir, f"{Path(__file__).stem}:fixture_net",
                             {"name": name, "num_classes": plan["num_classes"], "image_size": plan["image_size"]},
                             export_meta(self.datamodule, {"run_name": name}, timm_name=name))

    def request(self, schedule: str):
        import torch

        from rgb.attacks.options import AttackOptions
        from rgb.runs.request import AttackRequest, white_box_budgets

        return AttackRequest.create(
            self.run_dir, lambda: self.datamodule, white_box_budgets(["linf"], self.datamodule.budgets, {}),
            batch_size=self.settings["batch"], output_dir=self.work / "attack" / schedule,
            surrogate=self.settings["model"], options=AttackOptions(steps=self.settings["steps"],
                                                                    queries=self.settings["queries"],
                                                                    schedule=schedule),
            device=self.plan["device"], progress=False, threads=torch.get_num_threads(), devices=1)


def part_pooled_vs_batch(plan: dict, work: Path) -> dict:
    import pyarrow.parquet as pq
    import torch

    from rgb.attacks import apgd
    from rgb.models import load
    from rgb.runs.records import load_images
    from rgb.runs.runner import execute
    from rgb.runs.store import budget_dir

    device, settings = plan["device"], plan["pooled_vs_batch"]
    case = ScheduleCase(plan, work)
    x, y, _ = load_images(case.datamodule.split("test"), range(settings["batch"]))
    warm = load(case.run_dir).to(device).eval()
    apgd(warm, x.to(device), y.to(device), norm="Linf", eps=EPS, n_iter=1, early_stop=False,
         generator=0)  # warm-up: CUDA context and kernels, outside both timings
    entry = {"model": settings["model"], "images": settings["n"], "batch": settings["batch"], "norm": "Linf",
             "eps": EPS, "version": "standard", "steps": settings["steps"], "queries": settings["queries"],
             "not_protocol": "the standard cascade at fewer steps and Square queries, so that both schedules fit",
             "robust_share_by_design": settings["robust_share"],
             "robust_by_design": case.robust_by_design.tolist(), "schedules": {}}
    flags = {}
    for schedule in ("batch", "pooled"):
        request = case.request(schedule)
        synchronize(device)
        began = time.perf_counter()
        summary = execute(request)["linf"]
        synchronize(device)
        seconds = time.perf_counter() - began
        table = pq.read_table(budget_dir(request.output_dir, "linf") / "results.parquet").to_pydict()
        flags[schedule] = [bool(r) for _, r in sorted(zip(table["image_id"], table["robust"]))]
        entry["schedules"][schedule] = {
            "wall_seconds": seconds, "attack_seconds": summary.attack_seconds, "n_robust": sum(flags[schedule]),
            "clean_correct": int(sum(table["clean_correct"])), "forward_rows": float(sum(table["forward_rows"])),
            "backward_rows": float(sum(table["backward_rows"])), "robust": flags[schedule]}
    batch, pooled = (torch.tensor(flags[s]) for s in ("batch", "pooled"))
    entry["flags_agree"] = bool(torch.equal(batch, pooled))
    entry["agreement"] = {"both_robust": int((batch & pooled).sum()), "only_batch_robust": int((batch & ~pooled).sum()),
                          "only_pooled_robust": int((~batch & pooled).sum())}
    entry["pooled_speedup"] = (entry["schedules"]["batch"]["wall_seconds"]
                               / entry["schedules"]["pooled"]["wall_seconds"])
    return entry


def part_dry_run_forecast(plan: dict, work: Path, report: Path) -> dict:
    """attack.py dry_run=true's estimate of pooled_vs_batch's case beside that part's measured wall times (both from
    `report`, this run's JSON so far)."""
    from rgb.runs.cost import estimate

    case = ScheduleCase(plan, work)
    so_far = json.loads(report.read_text()) if report.is_file() else {}
    measured = ((so_far.get("parts") or {}).get("pooled_vs_batch") or {}).get("result")
    # the bound unless this run's report holds throughput rows of this device (never the committed JSON)
    record = estimate(case.request("batch"), measured=report)
    seconds = record["budgets"][0]["seconds"]  # linear in the robust share: interpolate between 0% and 100%
    if measured:
        batch = measured["schedules"]["batch"]
        share = batch["n_robust"] / max(batch["clean_correct"], 1)
        share_source = "measured by pooled_vs_batch (batch schedule): robust / correctly classified"
    else:
        share, share_source = plan["pooled_vs_batch"]["robust_share"], "the fixture's design (pooled_vs_batch absent)"
    forecast = seconds["0"] + share * (seconds["1"] - seconds["0"])
    entry = {"time_basis": record["time_basis"], "throughput": record["throughput"],
             "clean_accuracy": record["clean_accuracy"], "forecast_seconds_by_robust_share": seconds,
             "robust_share": share, "robust_share_source": share_source, "forecast_seconds": forecast}
    if measured:
        walls = {s: measured["schedules"][s]["wall_seconds"] for s in ("batch", "pooled")}
        entry["measured_wall_seconds"] = walls
        entry["measured_over_forecast"] = {s: wall / forecast for s, wall in walls.items()}
    else:
        entry["measured_wall_seconds"] = "pooled_vs_batch did not finish in this run"
    return entry


def parts(plan: dict) -> list[tuple[str, int]]:
    """(part, time limit in seconds), in the order run."""
    models = list(plan["models"])
    return ([(f"fixture_{m}", plan["fixture"]["limit"]) for m in models]
            + [(f"throughput_{m}", plan["throughput"]["limit"]) for m in models]
            + [(part, plan[part]["limit"]) for part in ("versus_authors", "pooled_vs_batch", "dry_run_forecast")])


def run_part(part: str, plan: dict, work: Path, report: Path) -> dict:
    """One part's result (`work`: its scratch folder; `report`: this run's JSON so far)."""
    whole_parts = {"versus_authors": lambda: part_versus_authors(plan),
                   "pooled_vs_batch": lambda: part_pooled_vs_batch(plan, work),
                   "dry_run_forecast": lambda: part_dry_run_forecast(plan, work, report)}
    if part in whole_parts:
        return whole_parts[part]()
    kind, _, model = part.partition("_")
    return part_fixture(model, plan) if kind == "fixture" else part_throughput(model, plan)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="the JSON, rewritten after every part")
    parser.add_argument("--cpu", action="store_true", help="tiny sizes on the CPU (what the test suite runs)")
    parser.add_argument("--part", help=argparse.SUPPRESS)  # one part, in its own process: its JSON to --out
    parser.add_argument("--work", type=Path, help=argparse.SUPPRESS)  # that part's scratch folder
    parser.add_argument("--report", type=Path, help=argparse.SUPPRESS)  # the run's JSON so far
    parser.add_argument("--parts", nargs="+", help="run only these parts (default: all, in order)")
    args = parser.parse_args(argv)
    plan = CPU_PLAN if args.cpu else GPU_PLAN
    if args.part:
        args.out.write_text(json.dumps(run_part(args.part, plan, args.work, args.report), indent=2) + "\n")
        return 0
    import torch

    if not args.cpu and not torch.cuda.is_available():
        print("gpu_attack: no CUDA device visible; use --cpu for the tiny CPU run", file=sys.stderr)
        return 4
    report = {"mode": "cpu" if args.cpu else "gpu", "started": time.strftime("%Y-%m-%dT%H:%M:%S"),
              "torch": torch.__version__, "plan": plan, "parts": {}}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    scratch = args.out.with_name(args.out.name + ".part")
    work = args.out.with_name(args.out.name + ".work")  # a part's snapshot, export and run dirs, removed after it

    def save() -> None:  # also before the first part: a part reads this run's report, never an older one
        tmp = args.out.with_name(args.out.name + ".tmp")
        tmp.write_text(json.dumps(report, indent=2) + "\n")
        os.replace(tmp, args.out)

    save()
    for part, limit in parts(plan):
        if args.parts and part not in args.parts:
            continue
        began = time.perf_counter()
        command = [sys.executable, __file__, "--out", str(scratch), "--part", part, "--work", str(work), "--report",
                   str(args.out), *(["--cpu"] if args.cpu else [])]
        env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
        try:
            done = subprocess.run(command, cwd=REPO, env=env, timeout=limit, capture_output=True, text=True)
            outcome = {"returncode": done.returncode}
            if done.returncode != 0:
                outcome["error"] = done.stderr.strip().splitlines()[-1:] or ["(no output)"]
        except subprocess.TimeoutExpired:
            outcome = {"returncode": None, "error": f"timed out after {limit}s"}
        if outcome["returncode"] == 0:
            outcome["result"] = json.loads(scratch.read_text())
        scratch.unlink(missing_ok=True)
        shutil.rmtree(work, ignore_errors=True)
        outcome["seconds"] = round(time.perf_counter() - began, 1)
        report["parts"][part] = outcome
        save()
        print(f"gpu_attack: {part}: {'ok' if outcome['returncode'] == 0 else 'FAILED'} ({outcome['seconds']}s)",
              flush=True)
    return 0 if all(p["returncode"] == 0 for p in report["parts"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
