"""What the whole white-box benchmark of one model costs on one H200, before any GPU run: the cost model
(`AutoAttack.worst_case_rows` for a robust image, the implementation's `fooled_steps` for one that falls) times the
FLOPs of each model evaluation (counted by torch's FlopCounterMode on a meta-device timm model: no weights, no
memory), over the card's 6 datasets x 1,000 test images x 3 norms at 224x224, against the device's peaks.

    python benchmarks/benchmark_cost.py --out benchmarks/results/benchmark_cost_h200.json

The times are the physical limit (every FLOP at the peak); a real run reaches some fraction of it, which a GPU run
of `attack.py dry_run=true` (measured throughput) or of the attack itself replaces. TF32 is off in the attacks
(spec §6.3 item 10), so the FP32 peak is the protocol's; the TF32 column says what it would allow.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import timm
import torch
from torch.utils.flop_counter import FlopCounterMode

from rgb.attacks import AutoAttack
from rgb.attacks.options import AttackOptions
from rgb.core.threat import Norm
from rgb.runs.implementations import IMPLEMENTATIONS

# The card's backbones (ViT-B/16 and ViT-H/14 CLIP image towers) and two common convnets, at the card's size.
BACKBONES = ("vit_base_patch16_224", "vit_huge_patch14_224", "convnext_base", "resnet50")
IMAGE_SIZE, N_DATASETS, N_IMAGES, N_CLASSES = 224, 6, 1000, 196
# NVIDIA H200 SXM (same compute as H100 SXM): dense TFLOPS.
PEAKS = {"fp32": 67e12, "tf32": 494.7e12}
ROBUST_SHARES = (0.0, 0.25, 0.5)


def evaluation_flops(name: str) -> tuple[float, float]:
    """(forward, input-gradient backward) FLOPs of one image through timm model `name`."""
    with torch.device("meta"):
        model = timm.create_model(name, pretrained=False, num_classes=N_CLASSES).eval()
        x = torch.empty(1, 3, IMAGE_SIZE, IMAGE_SIZE, requires_grad=True)
    counted = []
    for step in ("forward", "backward"):
        counter = FlopCounterMode(display=False)
        with counter:
            if step == "forward":
                logits = model(x)
            else:
                torch.autograd.grad(logits.sum(), x)
        counted.append(float(counter.get_total_flops()))
    return counted[0], counted[1]


def benchmark_rows(implementation, share: float) -> tuple[float, float]:
    """(forward, backward) rows of one model's whole white-box benchmark at robust share `share` (every image
    correctly classified: an upper bound)."""
    options = AttackOptions()
    steps = implementation.fooled_steps(options)
    fooled = (steps + 3, steps + 1)
    forward = backward = 0.0
    for norm in Norm:
        robust = AutoAttack(torch.nn.Identity(), norm.value, 1.0, options).worst_case_rows(N_CLASSES)
        forward += N_DATASETS * N_IMAGES * (share * robust[0] + (1 - share) * fooled[0])
        backward += N_DATASETS * N_IMAGES * (share * robust[1] + (1 - share) * fooled[1])
    return forward, backward


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    rows = []
    for name in BACKBONES:
        forward_flops, backward_flops = evaluation_flops(name)
        for impl, implementation in IMPLEMENTATIONS.items():
            for share in ROBUST_SHARES:
                forward, backward = benchmark_rows(implementation, share)
                flops = forward * forward_flops + backward * backward_flops
                rows.append({"model": name, "gflops_forward": forward_flops / 1e9,
                             "gflops_backward": backward_flops / 1e9, "impl": impl, "robust_share": share,
                             "forward_rows": forward, "backward_rows": backward, "pflops": flops / 1e15,
                             **{f"hours_at_{p}_peak": flops / peak / 3600 for p, peak in PEAKS.items()}})
    args.out.write_text(json.dumps({"image_size": IMAGE_SIZE, "datasets": N_DATASETS, "images": N_IMAGES,
                                    "peaks_flops": PEAKS, "rows": rows}, indent=1) + "\n")
    print("| model | GFLOPs fwd / bwd | impl | robust | FP32 peak | TF32 peak |")
    print("|---|---:|---|---:|---:|---:|")
    for row in rows:
        print(f"| {row['model']} | {row['gflops_forward']:.1f} / {row['gflops_backward']:.1f} | {row['impl']} | "
              f"{row['robust_share']:.0%} | {row['hours_at_fp32_peak']:.1f} h | {row['hours_at_tf32_peak']:.2f} h |")


if __name__ == "__main__":
    main()
