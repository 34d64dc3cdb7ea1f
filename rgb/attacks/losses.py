"""Per-sample attack losses (spec §2.4). Every loss is maximised by the attacker and computed in fp32."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def ce_loss(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Per-sample cross-entropy of the true class."""
    return F.cross_entropy(logits.float(), y, reduction="none")


def dlr_loss(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Untargeted DLR: -(z_y - max_{j != y} z_j) / (z_pi1 - z_pi3 + 1e-12), invariant to shift and scale."""
    if logits.shape[1] < 3:
        raise ValueError(f"DLR loss needs at least 3 classes, got {logits.shape[1]}")
    logits = logits.float()
    ranked, order = logits.sort(dim=1, descending=True)
    true_logit = logits.gather(1, y[:, None]).squeeze(1)
    top_is_true = order[:, 0] == y
    runner_up = torch.where(top_is_true, ranked[:, 1], ranked[:, 0])
    return -(true_logit - runner_up) / (ranked[:, 0] - ranked[:, 2] + 1e-12)


def targeted_dlr_loss(logits: torch.Tensor, y: torch.Tensor, y_target: torch.Tensor) -> torch.Tensor:
    """Targeted DLR: -(z_y - z_t) / (z_pi1 - (z_pi3 + z_pi4) / 2 + 1e-12)."""
    if logits.shape[1] < 4:
        raise ValueError(f"targeted DLR loss needs at least 4 classes, got {logits.shape[1]}")
    logits = logits.float()
    ranked = logits.sort(dim=1, descending=True).values
    true_logit = logits.gather(1, y[:, None]).squeeze(1)
    target_logit = logits.gather(1, y_target[:, None]).squeeze(1)
    return -(true_logit - target_logit) / (ranked[:, 0] - (ranked[:, 2] + ranked[:, 3]) / 2 + 1e-12)
