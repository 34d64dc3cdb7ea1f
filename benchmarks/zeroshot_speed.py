"""Zero-shot CLIP speed: building a head (text features of templates x classes) and the classifier's forward.

    python benchmarks/zeroshot_speed.py                      # the embedded mini CLIP (offline, seconds)
    python benchmarks/zeroshot_speed.py --model ViT-B-16 --image-size 224 --batch-size 32 --device cuda

Head building: 80 templates (open_clip's ImageNet pool) x 196 classes (the benchmark's largest class count),
once with no cache (every prompt encoded) and once from the on-disk cache. Throughput: the zero-shot classifier
(resize/normalise + image tower + L2 norm + one matmul) against the bare image tower on the same preprocessed
batch, alternating, median of the repeats; the goal is a ratio >= 0.95. Random-init weights unless --weights:
speed does not depend on them.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

import torch

from rgb.core import atomic_write_json
from rgb.models import library_versions, load_clip
from rgb.models.embedded_clip import EMBEDDED_ARCH, register_embedded_architecture
from rgb.zeroshot.head import PromptSettings, build_zeroshot_head, zeroshot_classifier

RESULTS = Path(__file__).resolve().parent / "results"


def timed(fn, device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start


def head_building(clip, classes: int, device: torch.device) -> dict:
    names = [f"class number {i}" for i in range(classes)]
    with tempfile.TemporaryDirectory() as cache:
        settings = PromptSettings(ensemble="mean", pool="imagenet80", cache_dir=cache)
        cold = timed(lambda: build_zeroshot_head(clip, names, settings, "bench", device=device), device)
        warm = timed(lambda: build_zeroshot_head(clip, names, settings, "bench", device=device), device)
    templates = len(settings.template_list("bench")[0])
    return {"templates": templates, "classes": classes, "prompts": templates * classes,
            "seconds_uncached": cold, "seconds_cached": warm, "prompts_per_second": templates * classes / cold}


@torch.inference_mode()
def throughput(model, batch_size: int, image_size: int, repeats: int, device: torch.device) -> dict:
    model = model.to(device).eval()
    x = torch.rand(batch_size, 3, image_size, image_size, device=device)
    pre = model.preprocess(x)
    tower = model.backbone.visual
    for _ in range(2):  # warm-up
        model(x), tower(pre)
    zeroshot, bare = [], []
    for _ in range(repeats):
        zeroshot.append(batch_size / timed(lambda: model(x), device))
        bare.append(batch_size / timed(lambda: tower(pre), device))
    zs, tw = statistics.median(zeroshot), statistics.median(bare)
    return {"batch_size": batch_size, "image_size": image_size, "repeats": repeats,
            "zeroshot_images_per_second": zs, "tower_images_per_second": tw, "ratio": zs / tw, "goal": 0.95}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=EMBEDDED_ARCH, help="open_clip architecture")
    parser.add_argument("--weights", default=None, help="local CLIP checkpoint (default: random init)")
    parser.add_argument("--classes", type=int, default=196)
    parser.add_argument("--image-size", type=int, default=None, help="input size (default: the tower's own)")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--skip-head", action="store_true", help="throughput only (a big text tower on a CPU)")
    parser.add_argument("--out", default=None, help="JSON path (default benchmarks/results/zeroshot_speed_<model>_<device>.json)")
    args = parser.parse_args()
    device = torch.device(args.device)
    register_embedded_architecture()
    clip = load_clip(args.model, weights=args.weights)
    image_size = args.image_size or clip.preprocess["size"][0]
    result = {"model": args.model, "weights": args.weights or "random init", "device": str(device),
              "machine": {"platform": platform.platform(), "cpu_count": os.cpu_count(),
                          "torch_threads": torch.get_num_threads(), **library_versions()}}
    if not args.skip_head:
        result["head_building"] = head_building(clip, args.classes, device)
    head = build_zeroshot_head(clip, [f"c{i}" for i in range(args.classes)],
                               PromptSettings(ensemble="single", pool="none"), "bench", device=device)
    result["forward"] = throughput(zeroshot_classifier(clip, head), args.batch_size, image_size, args.repeats, device)
    out = Path(args.out) if args.out else RESULTS / f"zeroshot_speed_{args.model}_{device.type}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out, result)
    print(json.dumps(result, indent=2))
    print(f"written to {out}")


if __name__ == "__main__":
    main()
