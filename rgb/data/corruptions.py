"""The 11 common corruptions of the benchmark (ImageNet-C, via the maintained `imagecorruptions-imaug`)."""

from __future__ import annotations

import numpy as np

from rgb.data.catalog import CORRUPTIONS
from rgb.data.errors import BenchmarkError, DataConfigError


def apply_corruption(image: np.ndarray, name: str, severity: int, seed: int) -> np.ndarray:
    """Corrupt one uint8 HxWx3 image reproducibly: the library draws from NumPy's global RNG, so seed it here."""
    if name not in CORRUPTIONS:
        raise DataConfigError(f"unknown corruption {name!r}; available: {', '.join(CORRUPTIONS)}")
    # Imported here: an optional extra (OpenCV, scikit-image, numba) that only common splits and the severity
    # sweep use; every other command runs without it installed.
    try:
        from imagecorruptions import corrupt
    except ImportError as err:
        raise BenchmarkError(f"corruption {name!r} needs the corruption library: pip install "
                             f"'robustgenbench[corruptions]' (imagecorruptions-imaug; {err})") from None

    np.random.seed(seed % 2**32)
    extra = {"seed": seed % 2**32} if name == "impulse_noise" else {}
    return corrupt(image, severity=severity, corruption_name=name, **extra)


def corruption_of_row(index: int, n_rows: int) -> str:
    """The card's block rule: 11 contiguous blocks of floor(n/11) rows; the remainder wraps to the first."""
    block = n_rows // len(CORRUPTIONS)
    if block == 0:
        raise DataConfigError(f"a common split needs at least {len(CORRUPTIONS)} test images (one block per "
                              f"corruption), got {n_rows}: add test images")
    return CORRUPTIONS[(index // block) % len(CORRUPTIONS)]
