"""The training names and settings a config gives, plain Python so that train.py's schema reads them before torch
loads: the losses' names (rgb.training.losses builds them), the fine-tuning strategies (rgb.training.module), the
record-only strategy of a model behind an API (rgb.training.endpoint_run), the learning-rate schedules
(rgb.training.optim) and robust validation's numbers (rgb.training.robust_val runs it)."""

from __future__ import annotations

from dataclasses import dataclass

from rgb.core.options import Ruled, ruled
from rgb.core.values import POSITIVE_INT, number

# The losses of `loss.name`, each built by its class in rgb.training.losses.LOSSES.
LOSS_NAMES = ("ce", "pgd_at", "trades", "tecoa", "fare")
# The fine-tuning strategies (strategy.name): every parameter trains, or the head alone on a frozen backbone.
FULL_FINETUNE = "full_finetune"
LINEAR_PROBE = "linear_probe"
STRATEGIES = (FULL_FINETUNE, LINEAR_PROBE)
# The strategy of a model behind an API: a record only, no fit and no weights.
ENDPOINT_STRATEGY = "api"
# Learning-rate schedules of `optim.scheduler` (None: constant, as in the paper).
SCHEDULERS = (None, "cosine")

KEY = "callbacks.robust_val."  # robust validation's settings' keys in train.py's config


@dataclass(frozen=True)
class RobustValSettings(Ruled):
    """The numbers of `callbacks.robust_val` (conf/callbacks/robust_val.yaml), each with its rule: what the callback
    checks and what train.py's schema checks first. The batch only sets how many images are attacked at once."""

    every_n_epochs: int = ruled(1, POSITIVE_INT)
    n_images: int = ruled(200, POSITIVE_INT)
    batch_size: int = ruled(256, POSITIVE_INT, identity=False)
    n_iter: int = ruled(100, POSITIVE_INT)
    clean_weight: float = ruled(0.5, (lambda v: number(v) and 0 <= v <= 1, "a number in [0, 1]"))
