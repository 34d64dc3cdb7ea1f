"""Training throughput (images/s) per loss on synthetic data: what an epoch of CE, PGD-AT or TRADES costs.

    python benchmarks/train_throughput.py --model test_resnet --image-size 32 --batch-size 64
    python benchmarks/train_throughput.py --model vit_base_patch16_224 --precision bf16 --channels-last --compile

Uses the training module's own step (inner APGD included), so the numbers match `train.py` minus data loading.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from contextlib import nullcontext
from pathlib import Path

import torch

from rgb.models import create_model, library_versions
from rgb.training import RobustFinetuneModule

AUTOCAST = {"32": None, "bf16": torch.bfloat16, "16": torch.float16}
INNER_ATTACK = {"norm": "Linf", "eps": 4 / 255, "n_iter": 10}


def machine_info(device: torch.device) -> dict:
    info = {
        "platform": platform.platform(),
        "processor": platform.processor(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "device": str(device),
        **library_versions(),
    }
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
        info["cuda"] = torch.version.cuda
    return info


def images_per_second(module: RobustFinetuneModule, args, device: torch.device) -> dict:
    """Optimiser steps on one fixed random batch; warmup steps (compilation, allocator) are not timed."""
    optimizer = module.configure_optimizers()
    dtype = AUTOCAST[args.precision]
    scaler = torch.amp.GradScaler(device.type, enabled=dtype is torch.float16)
    x = torch.rand(args.batch_size, 3, args.image_size, args.image_size, device=device)
    y = torch.randint(0, args.num_classes, (args.batch_size,), device=device)
    module.train()

    def step():
        with torch.autocast(device.type, dtype=dtype) if dtype is not None else nullcontext():
            loss, _, _ = module.loss_and_logits(x, y)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)

    for _ in range(args.warmup):
        step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    for _ in range(args.steps):
        step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    seconds = time.perf_counter() - start
    return {"images_per_s": args.steps * args.batch_size / seconds, "seconds_per_step": seconds / args.steps}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="test_resnet", help="any timm name (random init)")
    parser.add_argument("--timm-kwargs", default="{}", help='JSON, e.g. \'{"img_size": 32}\' for a ViT')
    parser.add_argument("--image-size", type=int, default=32)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--num-classes", type=int, default=10)
    parser.add_argument("--precision", choices=sorted(AUTOCAST), default="32")
    parser.add_argument("--channels-last", action="store_true")
    parser.add_argument("--compile", action="store_true")
    parser.add_argument("--strategy", choices=["full_finetune", "linear_probe"], default="full_finetune")
    parser.add_argument("--losses", nargs="+", choices=["ce", "pgd_at", "trades"], default=["ce", "pgd_at", "trades"])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/out/train_throughput.json"))
    args = parser.parse_args(argv)

    device = torch.device(args.device)
    optim = dict(backbone_lr=1.2165e-4, head_lr=3.996e-3, backbone_weight_decay=1.001e-6, head_weight_decay=1.619e-5)
    results = []
    for loss in args.losses:
        torch.manual_seed(0)
        model = create_model(args.model, args.num_classes, pretrained=False, **json.loads(args.timm_kwargs))
        loss_cfg = {"name": loss} if loss == "ce" else {"name": loss, "attack": INNER_ATTACK}
        module = RobustFinetuneModule(
            model, loss=loss_cfg, strategy=args.strategy, optim=optim,
            channels_last=args.channels_last, compile=args.compile,
        ).to(device)
        results.append({"loss": loss, **images_per_second(module, args, device)})
        print(f"{loss:7s} {results[-1]['images_per_s']:9.1f} images/s")
    record = {
        "benchmark": "train_throughput",
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "machine": machine_info(device),
        "results": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {args.out}")
    return record


if __name__ == "__main__":
    main()
