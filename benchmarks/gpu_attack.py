"""AutoAttack on a GPU, measured at card size (issue 47): robust-regime fixtures, attack throughput as a share of
the device's peak, and ours against the authors' code end to end.

    python benchmarks/gpu_attack.py --out benchmarks/results/gpu_attack_h200.json   # one H200, at most 330 s
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
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
EPS = 4 / 255

GPU_PLAN = {
    "image_size": 224, "num_classes": 196, "device": "cuda",
    "models": {"resnet50": 1, "convnext_tiny": 1, "vit_base_patch16_224": 20},  # model: input contraction
    # Worst case, every part at its limit: 3 x 30 + 3 x 60 + 60 = 330 s (gpu_check.sh's share of its 9 minutes).
    "fixture": {"n": 32, "steps": 10, "limit": 30},
    "throughput": {"batches": [64, 256, 1024], "steps": 2, "precisions": ["fp32", "tf32", "bf16"], "limit": 60},
    "versus_authors": {"model": "resnet50", "n": 64, "batch": 64, "steps": 100, "limit": 60},
}
CPU_PLAN = {
    "image_size": 32, "num_classes": 10, "device": "cpu",
    "models": {"test_resnet": 1, "test_vit": 20},
    "fixture": {"n": 2, "steps": 2, "limit": 120},
    "throughput": {"batches": [2], "steps": 1, "precisions": ["fp32", "bf16"], "limit": 120},
    "versus_authors": {"model": "test_resnet", "n": 2, "batch": 2, "steps": 2, "limit": 120},
}


def build_fixture(name: str, contraction: float, plan: dict):
    """The model of part `fixture_<name>`, on the plan's device, in eval mode, parameters frozen."""
    import timm
    import torch
    from torch import nn

    class Contracted(nn.Module):
        def __init__(self, net: nn.Module, factor: float):
            super().__init__()
            self.net, self.factor = net, factor

        def forward(self, x):
            return self.net(x if self.factor == 1 else 0.5 + (x - 0.5) / self.factor)

    torch.manual_seed(0)
    kwargs = {"img_size": plan["image_size"]} if "vit" in name else {}
    net = timm.create_model(name, pretrained=False, num_classes=plan["num_classes"], **kwargs)
    model = Contracted(net, contraction).to(plan["device"]).eval()
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


def parts(plan: dict) -> list[tuple[str, int]]:
    """(part, time limit in seconds), in the order run."""
    models = list(plan["models"])
    return ([(f"fixture_{m}", plan["fixture"]["limit"]) for m in models]
            + [(f"throughput_{m}", plan["throughput"]["limit"]) for m in models]
            + [("versus_authors", plan["versus_authors"]["limit"])])


def run_part(part: str, plan: dict) -> dict:
    kind, _, model = part.partition("_")
    if part == "versus_authors":
        return part_versus_authors(plan)
    return part_fixture(model, plan) if kind == "fixture" else part_throughput(model, plan)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="the JSON, rewritten after every part")
    parser.add_argument("--cpu", action="store_true", help="tiny sizes on the CPU (what the test suite runs)")
    parser.add_argument("--part", help=argparse.SUPPRESS)  # one part, in its own process: its JSON to --out
    parser.add_argument("--parts", nargs="+", help="run only these parts (default: all, in order)")
    args = parser.parse_args(argv)
    plan = CPU_PLAN if args.cpu else GPU_PLAN
    if args.part:
        args.out.write_text(json.dumps(run_part(args.part, plan), indent=2) + "\n")
        return 0
    import torch

    if not args.cpu and not torch.cuda.is_available():
        print("gpu_attack: no CUDA device visible; use --cpu for the tiny CPU run", file=sys.stderr)
        return 4
    report = {"mode": "cpu" if args.cpu else "gpu", "started": time.strftime("%Y-%m-%dT%H:%M:%S"),
              "torch": torch.__version__, "plan": plan, "parts": {}}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    scratch = args.out.with_name(args.out.name + ".part")
    for part, limit in parts(plan):
        if args.parts and part not in args.parts:
            continue
        began = time.perf_counter()
        command = [sys.executable, __file__, "--out", str(scratch), "--part", part, *(["--cpu"] if args.cpu else [])]
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
        outcome["seconds"] = round(time.perf_counter() - began, 1)
        report["parts"][part] = outcome
        tmp = args.out.with_name(args.out.name + ".tmp")
        tmp.write_text(json.dumps(report, indent=2) + "\n")
        os.replace(tmp, args.out)
        print(f"gpu_attack: {part}: {'ok' if outcome['returncode'] == 0 else 'FAILED'} ({outcome['seconds']}s)",
              flush=True)
    return 0 if all(p["returncode"] == 0 for p in report["parts"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
