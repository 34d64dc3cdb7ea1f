"""What RobustGenBench contains: datasets, split names, surrogates and the card's coverage table.

The coverage table is the single source of truth for which transfer splits exist; a split outside it is
reported as missing rather than silently skipped.
"""

from __future__ import annotations

from dataclasses import dataclass

from rgb.core.errors import UserError
from rgb.core.threat import Norm, parse_norm

DEFAULT_REPO_ID = "legolasflagstaff/RobustGenBench"

CLEAN_SPLITS = ("train", "validation", "test")
# The card's control: uniform noise at Linf 30/255 on the test images (every evaluation shows it, no score adds it).
CONTROL_LINF = 30  # its budget, in 1/255 units (whole grey levels)
CONTROL_SPLIT = f"random_linf_{CONTROL_LINF}"
MODEL_INDEPENDENT_SPLITS = ("common", CONTROL_SPLIT)
DATASET_SPLITS = CLEAN_SPLITS + MODEL_INDEPENDENT_SPLITS

# The 11 ImageNet-C corruptions of the `common` split, in the card's block order.
CORRUPTIONS = (
    "shot_noise",
    "impulse_noise",
    "defocus_blur",
    "motion_blur",
    "zoom_blur",
    "snow",
    "brightness",
    "contrast",
    "elastic_transform",
    "pixelate",
    "jpeg_compression",
)
CORRUPTION_SEVERITY = 3

# The image side the card's six datasets are stored at; the mini benchmark scales its budgets from their size.
CARD_IMAGE_SIZE = 224
REFERENCE_DIM = 3 * CARD_IMAGE_SIZE * CARD_IMAGE_SIZE

# Budgets of the transfer splits on the real benchmark, pixel units in [0, 1].
# Keys are `Norm.key` ("l1", "l2", "linf"), the one spelling of configs and run directories.
TRANSFER_BUDGETS = {
    "l1_75": (Norm.L1.key, 75.0),
    "l1_300": (Norm.L1.key, 300.0),
    "l2_2": (Norm.L2.key, 2.0),
    "l2_8": (Norm.L2.key, 8.0),
    "linf_4": (Norm.LINF.key, 4 / 255),
    "linf_8": (Norm.LINF.key, 8 / 255),
    "linf_30": (Norm.LINF.key, 30 / 255),
}
TRANSFER_SPLITS = tuple(TRANSFER_BUDGETS)
# The card's two protocols, as records, boards, `protocol=` and the budget tables name them (JSON keys too).
WHITE_BOX = "white_box"
BLACK_BOX = "black_box"
# White-box budgets of the five-setting protocol.
WHITE_BOX_BUDGETS = {Norm.L1.key: 75.0, Norm.L2.key: 2.0, Norm.LINF.key: 4 / 255}
# How a budget grows with the number of values d of an image at a fixed per-pixel budget: eps * (d/d_ref)**k.
BUDGET_DIM_EXPONENT = {Norm.L1: 1.0, Norm.L2: 0.5, Norm.LINF: 0.0}


class UnknownDatasetError(UserError, ValueError):
    """A dataset or transfer split the catalog does not hold."""


@dataclass(frozen=True)
class DatasetInfo:
    name: str
    title: str
    granularity: str
    num_classes: int
    train_size: int
    validation_size: int
    test_size: int

    def split_rows(self, split: str, surrogate: str | None = None) -> int:
        """Rows the card gives split `split`: every perturbed split (common, random noise, any surrogate's
        transfer split) holds one perturbed copy of each test image."""
        if surrogate is None and split == "train":
            return self.train_size
        if surrogate is None and split == "validation":
            return self.validation_size
        return self.test_size


DATASETS = {
    d.name: d
    for d in (
        DatasetInfo("caltech101", "Caltech-101", "coarse", 101, 5899, 1042, 1000),
        DatasetInfo("fgvc-aircraft-2013b", "FGVC-Aircraft (2013b)", "fine", 100, 3334, 3333, 1000),
        DatasetInfo("flowers-102", "Oxford Flowers-102", "fine", 102, 1020, 1020, 1000),
        DatasetInfo("oxford-iiit-pet", "Oxford-IIIT Pet", "fine", 37, 3128, 552, 1000),
        DatasetInfo("stanford_cars", "Stanford Cars", "fine", 196, 6922, 1222, 1000),
        DatasetInfo("uc-merced-land-use-dataset", "UC Merced Land Use", "coarse", 21, 1428, 252, 420),
    )
}

# The suite's embedded mini benchmark (rgb.data.mini): scikit-learn's 1797 digits, 32x32. Not a card dataset; its
# split sizes are those of its builder, checked only on a snapshot that builder wrote.
MINI = DatasetInfo("digits", "RobustGenBench mini (scikit-learn digits, 32x32)", "coarse", 10, 1077, 270, 200)
# Every dataset id rgb accepts by name (rgb.benchmark, BenchmarkData.for_dataset, prompt templates).
DATASET_IDS = (*DATASETS, MINI.name)

SURROGATES = {
    "clip_vitb16": "CLIP ViT-B/16 (open_clip ViT-B-16 / laion2b_s34b_b88k)",
    "clip_vith14": "CLIP ViT-H/14 (open_clip ViT-H-14 / laion2b_s32b_b79k)",
    "metaclip_vith14": "MetaCLIP ViT-H/14 (open_clip ViT-H-14-quickgelu / metaclip_fullcc)",
    "siglip2_so400m": "SigLIP2 SO400M (google/siglip2-so400m-patch14-384)",
    "siglip2_base": "SigLIP2 base (google/siglip2-base-patch16-224)",
}

# The card provides SigLIP2 SO400M on these three only (it classifies the others too poorly to attack them).
SIGLIP2_SO400M_DATASETS = ("caltech101", "flowers-102", "uc-merced-land-use-dataset")


def transfer_coverage(dataset: str) -> dict[str, tuple[str, ...]]:
    """Surrogate -> transfer splits the card lists for a real dataset (its coverage table)."""
    check_dataset(dataset)
    coverage = {s: TRANSFER_SPLITS for s in ("clip_vitb16", "clip_vith14", "metaclip_vith14")}
    if dataset in SIGLIP2_SO400M_DATASETS:
        coverage["siglip2_so400m"] = TRANSFER_SPLITS
    coverage["siglip2_base"] = ("linf_30",)
    return coverage


def check_dataset(dataset: str) -> DatasetInfo:
    if dataset not in DATASETS:
        raise UnknownDatasetError(f"unknown RobustGenBench dataset {dataset!r}; available: {', '.join(DATASETS)}")
    return DATASETS[dataset]


def split_budget(split: str, scale_dim: int = REFERENCE_DIM) -> tuple[str, float]:
    """(norm, eps) of a transfer split, with L1/L2 budgets rescaled to images of `scale_dim` values.

    The per-pixel budget is kept: L2 scales with sqrt(d), L1 with d, Linf not at all.
    """
    if split not in TRANSFER_BUDGETS:
        raise UnknownDatasetError(f"unknown transfer split {split!r}; available: {', '.join(TRANSFER_BUDGETS)}")
    norm, eps = TRANSFER_BUDGETS[split]
    return norm, scale_budget(norm, eps, scale_dim)


def scale_budget(norm: str | Norm, eps: float, dim: int) -> float:
    """`eps` of the 224x224 benchmark for images of `dim` values, at the same per-pixel budget."""
    return eps * (dim / REFERENCE_DIM) ** BUDGET_DIM_EXPONENT[parse_norm(norm)]
