"""The 11 common corruptions of the benchmark (ImageNet-C, via the maintained `imagecorruptions-imaug`)."""

from __future__ import annotations

import numpy as np

from rgb.data.catalog import CORRUPTIONS


def apply_corruption(image: np.ndarray, name: str, severity: int, seed: int) -> np.ndarray:
    """Corrupt one uint8 HxWx3 image reproducibly: the library draws from NumPy's global RNG, so seed it here."""
    if name not in CORRUPTIONS:
        raise ValueError(f"unknown corruption {name!r}; available: {', '.join(CORRUPTIONS)}")
    # Imported here: it pulls OpenCV, which needs libGL; attack.py and evaluate.py must start without it.
    from imagecorruptions import corrupt

    np.random.seed(seed % 2**32)
    extra = {"seed": seed % 2**32} if name == "impulse_noise" else {}
    return corrupt(image, severity=severity, corruption_name=name, **extra)


def corruption_of_row(index: int, n_rows: int) -> str:
    """The card's block rule: 11 contiguous blocks of floor(n/11) rows; the remainder wraps to the first."""
    block = n_rows // len(CORRUPTIONS)
    if block == 0:
        raise ValueError(f"a common split needs at least {len(CORRUPTIONS)} test images, got {n_rows}")
    return CORRUPTIONS[(index // block) % len(CORRUPTIONS)]
