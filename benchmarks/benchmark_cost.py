"""What the whole white-box benchmark of one model costs on one H200, before any GPU run: the cost model
(`AutoAttack.worst_case_rows` for a robust image, the implementation's `fooled_steps` for one that falls) times the
FLOPs of each model evaluation (counted by torch's FlopCounterMode on a meta-device timm model: no weights, no
memory), over the card's 6 datasets x 1,000 test images x 3 norms at 224x224, against the device's peaks.

    python benchmarks/benchmark_cost.py --out benchmarks/results/benchmark_cost_h200.json

The times at the peaks are the physical limit (every FLOP at the peak), the bound; where gpu_check.sh's JSON
(`--measured`, default benchmarks/results/gpu_check_h200.json) holds the attack throughput measured on an H200, each
row also gets the forecast from it (the model's own measurement where there is one, else the mean of the measured
models at the measured batch nearest 1024), labelled with the device and date. TF32 is off in the attacks
(spec §6.3 item 10), so the FP32 peak is the protocol's; the TF32 column says what it would allow.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import timm
import torch

from rgb.attacks import AutoAttack
from rgb.attacks.options import AttackOptions
from rgb.core.threat import Norm
from rgb.runs.forecast import DEVICE_PEAKS, MEASURED_UTILISATION, evaluation_flops, measured_utilisation
from rgb.runs.implementations import IMPLEMENTATIONS

# The card's backbones (ViT-B/16 and ViT-H/14 CLIP image towers) and two common convnets, at the card's size.
BACKBONES = ("vit_base_patch16_224", "vit_huge_patch14_224", "convnext_base", "resnet50")
IMAGE_SIZE, N_DATASETS, N_IMAGES, N_CLASSES = 224, 6, 1000, 196
DEVICE, BATCH = "NVIDIA H200", 1024  # the forecast's: the measured batch nearest this (batch_size=auto's size)
PEAKS = {p: DEVICE_PEAKS[DEVICE][p] for p in ("fp32", "tf32")}  # the bound's precisions
ROBUST_SHARES = (0.0, 0.25, 0.5)


def model_flops(name: str) -> tuple[float, float]:
    """(forward, input-gradient backward) FLOPs of one image through timm model `name` (on the meta device)."""
    with torch.device("meta"):
        model = timm.create_model(name, pretrained=False, num_classes=N_CLASSES).eval()
        return evaluation_flops(model, torch.empty(1, 3, IMAGE_SIZE, IMAGE_SIZE))


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
    parser.add_argument("--measured", type=Path, default=MEASURED_UTILISATION,
                        help="gpu_check.sh's (or gpu_attack.py's) JSON of the attack throughput measured on an H200")
    parser.add_argument("--device", default=DEVICE, help="whose measured throughput forecasts (as torch names it)")
    args = parser.parse_args()
    rows = []
    for name in BACKBONES:
        forward_flops, backward_flops = model_flops(name)
        utilisation = measured_utilisation(args.device, BATCH, "fp32", name, args.measured)
        for impl, implementation in IMPLEMENTATIONS.items():
            for share in ROBUST_SHARES:
                forward, backward = benchmark_rows(implementation, share)
                flops = forward * forward_flops + backward * backward_flops
                rows.append({"model": name, "gflops_forward": forward_flops / 1e9,
                             "gflops_backward": backward_flops / 1e9, "impl": impl, "robust_share": share,
                             "forward_rows": forward, "backward_rows": backward, "pflops": flops / 1e15,
                             **{f"hours_at_{p}_peak": flops / peak / 3600 for p, peak in PEAKS.items()},
                             "hours_forecast": None if utilisation is None else flops / utilisation["flop_per_s"] / 3600,
                             "time_basis": "bound (the device's peak)" if utilisation is None else utilisation["label"],
                             "utilisation": utilisation})
    args.out.write_text(json.dumps({"image_size": IMAGE_SIZE, "datasets": N_DATASETS, "images": N_IMAGES,
                                    "peaks_flops": PEAKS, "rows": rows}, indent=1) + "\n")
    print("| model | GFLOPs fwd / bwd | impl | robust | FP32 peak (bound) | TF32 peak (bound) | forecast, FP32 |")
    print("|---|---:|---|---:|---:|---:|---|")
    for row in rows:
        forecast = "none measured" if row["hours_forecast"] is None else \
            f"{row['hours_forecast']:.1f} h ({row['time_basis']})"
        print(f"| {row['model']} | {row['gflops_forward']:.1f} / {row['gflops_backward']:.1f} | {row['impl']} | "
              f"{row['robust_share']:.0%} | {row['hours_at_fp32_peak']:.1f} h | {row['hours_at_tf32_peak']:.2f} h | "
              f"{forecast} |")


if __name__ == "__main__":
    main()
