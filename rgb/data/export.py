"""Adversarial images as a RobustGenBench split: 8-bit quantisation within the budget, and the snapshot write.

This is how the transfer splits of the card were made (images a surrogate misclassifies are copied unchanged,
is_modified = false), so the mini benchmark's transfer splits go through the same code.
"""

from __future__ import annotations

import io
import math
from pathlib import Path

import torch
from PIL import Image

from rgb.core.threat import Norm, ThreatModel, lp_norm
from rgb.data.catalog import TRANSFER_SPLITS, split_budget
from rgb.data.errors import BenchmarkError
from rgb.data.layout import readme_title, split_file
from rgb.data.snapshot import png_bytes, write_readme, write_split

# Exported 8-bit images must satisfy the budget up to the float32 precision of the stored eps (relative).
QUANTISED_TOLERANCE = 1e-6


class ExportError(BenchmarkError):
    """Adversarial images that cannot be stored as a benchmark split without leaving their budget."""


def quantise_within_budget(x: torch.Tensor, x_adv: torch.Tensor, norm: str, eps: float) -> torch.Tensor:
    """8-bit (uint8, same shape) version of x_adv that still satisfies ||q/255 - x||_p <= eps.

    Plain rounding can push an L1/L2 perturbation over the budget (and Linf by half a grey level). Each pixel
    is rounded to the nearest level; if that breaks the budget, the coordinates that rounding moved away from
    x are rounded towards x instead, largest norm gain first, until it fits. Needs 8-bit clean images.
    """
    threat = ThreatModel(norm, eps)
    clean = torch.round(x.double() * 255)
    if (clean - x.double() * 255).abs().max() > 1e-3:
        raise ExportError("clean images are not on the 8-bit grid; adversarial images cannot be exported as PNG")
    delta = (x_adv.double() * 255 - clean).flatten(1)
    nearest, towards_clean = torch.round(delta), torch.trunc(delta)
    limit = threat.eps * 255 * (1 + QUANTISED_TOLERANCE)
    if threat.norm is Norm.LINF:
        level = math.floor(limit)
        q = nearest.clamp(-level, level)
        size = q.abs().amax(dim=1)
    else:
        p = threat.norm.p
        excess = nearest.abs().pow(p).sum(dim=1) - limit**p
        gain, order = (nearest.abs().pow(p) - towards_clean.abs().pow(p)).sort(dim=1, descending=True)
        count = torch.where(excess > 0, (gain.cumsum(dim=1) < excess[:, None]).sum(dim=1) + 1, 0)
        chosen = torch.arange(delta.shape[1])[None, :] < count[:, None]
        flip = torch.zeros_like(chosen).scatter(1, order, chosen)
        q = torch.where(flip, towards_clean, nearest)
        size = q.abs().pow(p).sum(dim=1).pow(1 / p)
    if bool((size > limit).any()):
        raise ExportError(f"cannot store an adversarial image within {threat} at 8 bits")
    return (clean.flatten(1) + q).clamp(0, 255).view_as(x).to(torch.uint8)


def export_adversarial_split(split, *, dataset: str, image_size: int, root: Path, surrogate: str,
                             threat: ThreatModel, split_name: str, adversarial: torch.Tensor,
                             modified: list[bool]) -> Path:
    """Write 8-bit adversarial images (N,C,H,W uint8) of an ImageSplit as split `split_name` of config
    `<dataset>-<surrogate>` under the snapshot `root`; unmodified rows keep the clean PNG bytes. The snapshot
    gets a `test` split too if it has none, so `load_split` can check the new split against it."""
    rows = split.rows
    clean = [image["bytes"] for image in rows["image"]]
    size = Image.open(io.BytesIO(clean[0])).size
    if size != (image_size,) * 2:
        raise ExportError(f"test images are {size}, not the attacked {image_size}px: no export")
    n = len(rows)
    columns = {
        "image": [png_bytes(adversarial[i].permute(1, 2, 0).numpy()) if modified[i] else clean[i] for i in range(n)],
        "label": rows["label"], "image_id": rows["image_id"], "perturbation": ["transfer_autoattack"] * n,
        "surrogate": [surrogate] * n, "norm": [threat.norm.key] * n, "epsilon": [threat.eps] * n,
        "is_modified": modified,
    }
    names = split.class_names
    test_path = split_file(root, dataset, "test")
    if not test_path.is_file():
        write_split(test_path, names, {k: rows[k] for k in rows.column_names if k != "image"} | {"image": clean})
    path = split_file(root, dataset, split_name, surrogate)
    write_split(path, names, columns)
    write_readme(root, readme_title(root) or f"{dataset} adversarial images from {surrogate}")
    return path


def noise_transfer_splits(root: Path, clean_split, modified: list[bool], surrogate: str, seed: int = 0) -> None:
    """The 7 transfer splits of config `<dataset>-<surrogate>` in the snapshot `root`, made cheaply: a random
    perturbation within each budget (8-bit, quantise_within_budget) where `modified`, the clean test PNG elsewhere (as
    the card copies the images its surrogate gets wrong). For request counting and throughput, where what
    matters is which images are distinct, not how adversarial they are."""
    x = torch.stack([clean_split[i][0] for i in range(len(clean_split))])
    generator = torch.Generator().manual_seed(seed)
    dataset = clean_split.rows.info.config_name
    for split in TRANSFER_SPLITS:
        norm, eps = split_budget(split, x[0].numel())
        noise = torch.randn(x.shape, generator=generator)
        size = lp_norm(noise, norm)
        adversarial = quantise_within_budget(x, (x + 0.9 * eps * noise / size.view(-1, 1, 1, 1)).clamp(0, 1), norm, eps)
        export_adversarial_split(clean_split, dataset=dataset, image_size=x.shape[-1], root=root, surrogate=surrogate,
                                 threat=ThreatModel(norm, eps), split_name=split, adversarial=adversarial,
                                 modified=modified)
