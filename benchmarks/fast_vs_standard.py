"""Is `version="fast"` (APGD-CE + APGD-T over MALT targets) almost never weaker than the standard AutoAttack, and
how much cheaper? Issue 12's validation: on the same images and seed, per (model, norm), both robust accuracies,
b = images broken only by standard (where fast overstates robustness), c = images broken only by fast, and model
evaluations per attack; first the noise floor: the standard version with two seeds.

    python benchmarks/fast_vs_standard.py --out benchmarks/results/fast_vs_standard_toy_cpu.json
    python benchmarks/fast_vs_standard.py --runs outputs/train/digits/<run> ... --n 64 \
        --out benchmarks/results/fast_vs_standard_mini_cpu.json

Toy models (default) are built here in seconds: small MLP / CNN classifiers of rgb.models.toy's separable 3x8x8
data, trained with plain CE, PGD-AT and TRADES (rgb.training.losses, inner APGD at Linf). `--runs` takes train run
dirs instead (train.py's output, rgb.models.load_with_meta) and attacks the first --n images of the test split of
the benchmark each was trained on (`--source` overrides the recorded one) at the data config's budgets for its
image size. Cost is counted in forward-equivalents, forward rows + 2 x backward rows.
"""

from __future__ import annotations

import argparse
import platform
import time
import warnings
from pathlib import Path

import torch
from torch import nn

from rgb.models.toy import separable_data, train_mlp

from rgb.attacks import AutoAttack
from rgb.core.files import atomic_write_json
from rgb.core.threat import Norm, parse_norm
from rgb.data import ImageSplit, load_split
from rgb.data.resolvers import white_box_budget
from rgb.models import library_versions, load_with_meta
from rgb.training.losses import LOSSES, InnerAttack

# Budgets on the 3x8x8 toy images where the adversarially trained toys are partly robust (--budget overrides).
BUDGETS = {Norm.LINF: 0.08, Norm.L2: 0.8, Norm.L1: 6.0}
TRAIN_EPS = 0.06  # Linf budget of the inner attack while training the robust toys
TARGET_SPEEDUP = 3.5
TARGET_POINTS = 0.2  # robust accuracy at most standard + max(0.2 points, noise floor)
TARGET_B = 0.005  # at most 0.5% of the images broken by standard only


def small_cnn(n_classes: int = 10) -> nn.Module:
    return nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 32, 3, stride=2, padding=1),
                         nn.ReLU(), nn.Flatten(), nn.Linear(32 * 4 * 4, n_classes))


def mlp(n_classes: int = 10) -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(192, 64), nn.ReLU(), nn.Linear(64, n_classes))


def train_robust(architecture, loss_name: str, steps: int, seed: int = 0) -> nn.Module:
    """Adversarial training on the toy data with the suite's own losses (inner APGD-CE, Linf, 10 steps)."""
    torch.manual_seed(seed)
    model = architecture()
    loss = LOSSES[loss_name](InnerAttack(norm="Linf", eps=TRAIN_EPS, n_iter=10))
    x, y = separable_data(512, seed=seed + 100)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    for step in range(steps):
        batch = torch.randint(0, len(x), (128,), generator=torch.Generator().manual_seed(step))
        xb, yb = x[batch], y[batch]
        model.eval()  # inner attack on a fixed model
        adv = loss.attack(model, xb, yb)
        model.train()
        optimizer.zero_grad()
        loss(yb, model(xb) if loss.uses_clean else None, model(adv)).backward()
        optimizer.step()
    return model.eval().requires_grad_(False)


MODELS = {
    "mlp-ce": lambda: train_mlp(),
    "mlp-pgd_at": lambda: train_robust(mlp, "pgd_at", steps=300),
    "mlp-trades": lambda: train_robust(mlp, "trades", steps=300),
    "cnn-pgd_at": lambda: train_robust(small_cnn, "pgd_at", steps=200),
}


def attack(model, x, y, norm: Norm, eps: float, version: str, seed: int) -> dict:
    start = time.perf_counter()
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        result = AutoAttack(model, norm, eps, version=version, seed=seed).run(x, y, batch_size=len(x))
    forward_equivalents = float(result.forward_rows.sum() + 2 * result.backward_rows.sum())
    return {
        "robust": result.robust, "seconds": time.perf_counter() - start,
        "robust_accuracy": result.robust_accuracy, "n_robust": int(result.robust.sum()),
        "accuracy_after": result.accuracy_after, "evaluations": result.evaluations,
        "forward_equivalents": forward_equivalents, "forward_equivalents_per_image": forward_equivalents / len(y),
        "warnings": result.warnings,
    }


def compare(model_name: str, model, x, y, norm: Norm, eps: float) -> dict:
    standard = attack(model, x, y, norm, eps, "standard", seed=0)
    second = attack(model, x, y, norm, eps, "standard", seed=1)
    fast = attack(model, x, y, norm, eps, "fast", seed=0)
    n = len(y)
    noise_flips = int((standard["robust"] != second["robust"]).sum())
    noise_floor = abs(standard["n_robust"] - second["n_robust"]) / n
    only_standard = fast["robust"] & ~standard["robust"]
    only_fast = ~fast["robust"] & standard["robust"]
    b, c = int(only_standard.sum()), int(only_fast.sum())
    speedup = standard["forward_equivalents"] / fast["forward_equivalents"]
    tolerance = max(TARGET_POINTS / 100, noise_floor)
    record = {
        "model": model_name, "norm": norm.value, "eps": eps, "n": n,
        "noise_floor": {"standard_seed1_robust_accuracy": second["robust_accuracy"], "flipped_images": noise_flips,
                        "robust_accuracy_difference": noise_floor},
        "b_broken_only_by_standard": b, "c_broken_only_by_fast": c,
        "b_images": only_standard.nonzero().flatten().tolist(), "c_images": only_fast.nonzero().flatten().tolist(),
        "speedup_forward_equivalents": speedup,
        "meets_targets": {"speedup": speedup >= TARGET_SPEEDUP,
                          "accuracy": fast["robust_accuracy"] <= standard["robust_accuracy"] + tolerance,
                          "b": b <= TARGET_B * n},
    }
    for name, run in (("standard", standard), ("standard_seed1", second), ("fast", fast)):
        run.pop("robust")
        record[name] = run
    return record


def toy_models(args, overrides: dict[Norm, float]):
    """(name, model, x, y, budgets, description) of each toy model, trained here; the same toy test images."""
    x, y = separable_data(args.n, seed=1)
    for model_name in args.models:
        start = time.perf_counter()
        model = MODELS[model_name]()
        yield model_name, model, x, y, {**BUDGETS, **overrides}, {"train_seconds": time.perf_counter() - start}


def run_models(args, overrides: dict[Norm, float]):
    """(name, model, x, y, budgets, description) of each train run dir: the first --n images of its benchmark's
    test split, at the data config's budgets (rgb.data.resolvers) for its image size."""
    for run in args.runs:
        model, meta = load_with_meta(run)
        source = args.source or meta["data_source"]
        split = ImageSplit(load_split(source, meta["dataset"], "test"), image_size=meta["image_size"])
        n = min(args.n, len(split))
        x, y = torch.stack([split[i][0] for i in range(n)]), split.labels[:n]
        budgets = {norm: overrides.get(norm, white_box_budget(norm.key, meta["image_size"])) for norm in Norm}
        description = {"run": str(run), "architecture": meta.get("timm_name", meta["family"]),
                       "loss": meta.get("loss", {}).get("name"), "epochs": meta.get("epochs"),
                       "images": f"{meta['dataset']} test split of {source}, first {n} images"}
        yield Path(run).name, model.requires_grad_(False), x, y, budgets, description


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS), help="toy models")
    parser.add_argument("--runs", nargs="+", metavar="DIR", help="train run dirs instead of the toy models")
    parser.add_argument("--source", help="benchmark of --runs (default: the one each run was trained on)")
    parser.add_argument("--norms", nargs="+", default=[n.key for n in Norm], choices=[n.key for n in Norm])
    parser.add_argument("--n", type=int, default=128, help="test images per model")
    parser.add_argument("--budget", nargs="+", default=[], metavar="NORM=EPS", help="override budgets, e.g. linf=0.07")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    overrides = {parse_norm(key): float(value) for key, _, value in (o.partition("=") for o in args.budget)}
    records, described = [], {}
    for model_name, model, x, y, budgets, description in (run_models if args.runs else toy_models)(args, overrides):
        with torch.no_grad():
            clean = float((model(x).argmax(1) == y).float().mean())
        described[model_name] = {**description, "clean_accuracy": clean,
                                 "budgets": {norm.value: eps for norm, eps in budgets.items()}}
        for key in args.norms:
            norm = parse_norm(key)
            record = compare(model_name, model, x, y, norm, budgets[norm])
            records.append(record)
            print(f"{model_name} {record['norm']}: standard {record['standard']['n_robust']}/{len(y)} "
                  f"(seed 1: {record['standard_seed1']['n_robust']}), fast {record['fast']['n_robust']}, "
                  f"b={record['b_broken_only_by_standard']} c={record['c_broken_only_by_fast']}, "
                  f"{record['speedup_forward_equivalents']:.2f}x fewer forward-equivalents, "
                  f"{record['standard']['seconds']:.0f}s vs {record['fast']['seconds']:.0f}s", flush=True)
            atomic_write_json(Path(args.out), {
                "what": "AutoAttack version 'fast' (APGD-CE + APGD-T over MALT targets) vs 'standard', same images "
                        "and seed; noise floor = standard with seeds 0 and 1",
                "machine": {"platform": platform.platform(), "threads": torch.get_num_threads()},
                "versions": library_versions(),
                "targets": {"speedup": TARGET_SPEEDUP, "accuracy_points": TARGET_POINTS, "b_fraction": TARGET_B},
                "models": described, "records": records,
            })


if __name__ == "__main__":
    main()
