"""Do FARE and TeCoA fine-tuning raise the white-box robustness of a zero-shot CLIP? Issue 21's measurement on the
mini benchmark with the embedded CLIP: for each train run dir (the zero-shot start and the fine-tuned ones), the
clean accuracy on the whole test split and the standard AutoAttack's Linf robust accuracy on its first --n images.

    python train.py model=openclip_mini strategy=zeroshot prompts=mean run_name=zs
    python train.py model=openclip_mini strategy=full_finetune head_init=zeroshot loss=fare run_name=fare
    python train.py model=openclip_mini strategy=full_finetune head_init=zeroshot loss=tecoa run_name=tecoa
    python benchmarks/robust_clip_finetune.py outputs/train/digits/{zs,fare,tecoa} --n 100 \
        --out benchmarks/results/robust_clip_finetune_mini_cpu.json

--n < 450 scores part of the split (recorded in the JSON): attack.py / evaluate.py give the whole-split numbers.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from rgb.attacks import AutoAttack  # noqa: E402
from rgb.core.files import atomic_write_json  # noqa: E402
from rgb.data import ImageSplit, load_split  # noqa: E402
from rgb.models import library_versions, load_with_meta  # noqa: E402


def test_images(meta: dict) -> tuple[torch.Tensor, torch.Tensor]:
    split = ImageSplit(load_split(meta["data_source"], meta["dataset"], "test"), meta["image_size"])
    return torch.stack([split[i][0] for i in range(len(split))]), split.labels


def measure(run: Path, n: int, eps: float, seed: int) -> dict:
    model, meta = load_with_meta(run)
    x, y = test_images(meta)
    with torch.no_grad():
        clean = torch.cat([model(x[i : i + 256]).argmax(1) for i in range(0, len(x), 256)]) == y
    started = time.perf_counter()
    result = AutoAttack(model, "Linf", eps, seed=seed).run(x[:n], y[:n])
    return {"run": str(run), "loss": (meta.get("loss") or {}).get("name"), "strategy": meta["strategy"],
            "epochs": meta.get("epochs"), "clean_acc": float(clean.float().mean()), "n_test": len(y),
            "clean_acc_first_n": float(clean[:n].float().mean()), "robust_acc_linf": result.robust_accuracy(),
            "n_attacked": n, "attack_seconds": round(time.perf_counter() - started, 1)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--n", type=int, default=100, help="test images attacked (the first n)")
    parser.add_argument("--eps", type=float, default=4 / 255)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    rows = []
    for run in args.runs:
        rows.append(measure(run, args.n, args.eps, args.seed))
        print(rows[-1], flush=True)
    atomic_write_json(args.out, {"eps": args.eps, "norm": "Linf", "version": "standard", "rows": rows,
                                 "machine": {"platform": platform.platform(), "threads": torch.get_num_threads(),
                                             "load_average": os.getloadavg()}, "versions": library_versions()})
    return 0


if __name__ == "__main__":
    sys.exit(main())
