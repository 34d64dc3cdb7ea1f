"""Speed of our AutoAttack per norm: wall time, images/s and model evaluations per image (forward / backward
rows), as JSON, next to the reference implementation's worst case for the same images (spec §6.1).

    python benchmarks/attack_speed.py --model test_resnet --mini data/mini --n 64            # CPU, tiny
    python benchmarks/attack_speed.py --run outputs/train/digits/<run_name> --mini data/mini
    python benchmarks/attack_speed.py --model vit_base_patch16_224 --synthetic 256 --image-size 224 --device cuda

Budgets are the protocol's (L1 75, L2 2, Linf 4/255) scaled to the image size like the mini benchmark's. With
synthetic images the labels are the model's own clean predictions, so every image is attacked.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time

import torch

from rgb.attacks import VERSIONS, AutoAttack
from rgb.core.threat import Norm, parse_norm
from rgb.data import ImageSplit, load_split
from rgb.data.catalog import WHITE_BOX_BUDGETS, scale_budget
from rgb.models import apply_speed_options, create_model, library_versions, load_with_meta

# Spec §6.1: passes per image that survives every attack in the reference (fra31/auto-attack, standard version).
# "forward" counts forward-only passes, "forward_backward" passes with a backward; a backward costs ~2 forwards.
REFERENCE_WORST_CASE = {
    "linf": {"forward": 5950, "forward_backward": 1910},
    "l2": {"forward": 5950, "forward_backward": 1910},
    "l1": {"forward": 5945, "forward_backward": 1930},
}


def reference_worst_case(norm: str, n_images: int) -> dict:
    """The reference's worst case in our units: forward rows include the forwards of forward+backward passes."""
    passes = REFERENCE_WORST_CASE[norm]
    forward = passes["forward"] + passes["forward_backward"]
    backward = passes["forward_backward"]
    return {
        "forward_rows_per_image": forward, "backward_rows_per_image": backward,
        "forward_equivalents_per_image": forward + 2 * backward,
        "forward_equivalents_total": n_images * (forward + 2 * backward),
    }


def load_images(args, model: torch.nn.Module, device: str) -> tuple[torch.Tensor, torch.Tensor, str]:
    if args.mini:
        split = ImageSplit(load_split(args.mini, "digits", "test"), image_size=args.image_size)
        n = min(args.n, len(split))
        x = torch.stack([split[i][0] for i in range(n)])
        return x, split.labels[:n], f"mini test split, first {n} images"
    g = torch.Generator().manual_seed(args.seed)
    x = torch.rand(args.synthetic, 3, args.image_size, args.image_size, generator=g)
    with torch.inference_mode():
        y = torch.cat([model(x[i: i + args.batch_size].to(device)).argmax(1).cpu()
                       for i in range(0, len(x), args.batch_size)])
    return x, y, f"{len(x)} uniform random images labelled with the model's predictions"


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def measure(model, x, y, norm: str, args, device: str) -> dict:
    eps = scale_budget(norm, WHITE_BOX_BUDGETS[norm], x[0].numel())
    started: dict[str, float] = {}  # when each attack began (AutoAttack's progress hook), for per-attack times

    def mark(name: str, *_) -> None:
        if name not in started:
            sync(device)
            started[name] = time.perf_counter()
            print(f"{norm}: {name} ...", file=sys.stderr, flush=True)

    attack = AutoAttack(model, parse_norm(norm), eps, seed=args.seed, device=device, attacks=args.attacks,
                        steps=args.steps, progress=mark)
    sync(device)
    began = time.perf_counter()
    result = attack.run(x, y, batch_size=args.batch_size)
    sync(device)
    ended = time.perf_counter()
    seconds = ended - began
    times = sorted(started.items(), key=lambda item: item[1]) + [("end", ended)]
    seconds_by_attack = {name: round(times[i + 1][1] - t, 3) for i, (name, t) in enumerate(times[:-1])}
    print(f"{norm}: {seconds:.1f}s {seconds_by_attack}", file=sys.stderr, flush=True)
    n = len(y)
    forward, backward = float(result.forward_rows.sum()) / n, float(result.backward_rows.sum()) / n
    reference = reference_worst_case(norm, n)
    share = (forward + 2 * backward) / reference["forward_equivalents_per_image"]
    return {
        "norm": norm, "eps": eps, "n_images": n, "attacks": result.attacks,
        "wall_seconds": round(seconds, 3), "images_per_second": round(n / seconds, 3),
        "clean_accuracy": result.accuracy_after["clean"], "robust_accuracy": result.robust_accuracy,
        "accuracy_after": result.accuracy_after,
        "forward_rows_per_image": round(forward, 1), "backward_rows_per_image": round(backward, 1),
        "forward_equivalents_per_image": round(forward + 2 * backward, 1),
        "seconds_by_attack": seconds_by_attack,  # attacks that found no point left to attack are absent
        "rows_per_image_by_attack": {
            name: {k: round(v / n, 1) for k, v in rows.items()} for name, rows in result.evaluations.items()
        },
        "reference_worst_case": reference,
        "share_of_reference_worst_case": round(share, 4),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--model", help="timm name, random init (rgb.models.create_model)")
    which.add_argument("--run", help="train output dir or exported .safetensors (rgb.models.load_with_meta)")
    images = parser.add_mutually_exclusive_group(required=True)
    images.add_argument("--mini", help="mini benchmark directory: attack its test split")
    images.add_argument("--synthetic", type=int, help="this many uniform random images")
    parser.add_argument("--n", type=int, default=64, help="images of the mini test split (from the start)")
    parser.add_argument("--image-size", type=int, default=32)
    parser.add_argument("--num-classes", type=int, default=10, help="head size for --model")
    parser.add_argument("--norms", nargs="+", default=[n.key for n in Norm], choices=[n.key for n in Norm])
    parser.add_argument("--attacks", nargs="+", choices=VERSIONS["standard"].attacks,
                        help="a subset (default: the standard cascade)")
    parser.add_argument("--steps", type=int, default=100,
                        help="iterations of each gradient attack (not the protocol's unless 100: tiny CPU checks)")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--compile", action="store_true", help="torch.compile the model (dynamic batch sizes)")
    parser.add_argument("--channels-last", action="store_true", help="channels_last weights (convnets)")
    parser.add_argument("--out", help="write the JSON here as well as to stdout")
    args = parser.parse_args(argv)

    if args.run:
        model, meta = load_with_meta(args.run)
        name = meta["timm_name"]
    else:
        model, name = create_model(args.model, args.num_classes, pretrained=False).eval(), args.model
    # As attack.py compile=true / channels_last=true; compile time lands in the first norm's wall time.
    model = apply_speed_options(model.to(args.device), channels_last=args.channels_last, compile=args.compile,
                                dynamic=True)
    x, y, described = load_images(args, model, args.device)
    report = {
        "model": name, "run": args.run, "images": described, "image_size": args.image_size,
        "batch_size": args.batch_size, "steps": args.steps, "device": args.device, "compile": args.compile,
        "channels_last": args.channels_last,
        "device_name": torch.cuda.get_device_name(args.device) if args.device.startswith("cuda")
        else platform.processor() or platform.machine(),
        "torch_threads": torch.get_num_threads(), "versions": library_versions(),
        "norms": [measure(model, x, y, norm, args, args.device) for norm in args.norms],
    }
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        with open(args.out, "w") as handle:
            handle.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
