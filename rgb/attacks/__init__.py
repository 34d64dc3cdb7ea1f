"""Clean-room AutoAttack components in pure PyTorch (models map [0,1] images to logits)."""

from rgb.attacks.apgd import APGDResult, apgd, apgd_targeted, checkpoint_schedule, l1_eps_stages
from rgb.attacks.common import EvalCounter, lp_norm, parse_norm
from rgb.attacks.losses import ce_loss, dlr_loss, targeted_dlr_loss
from rgb.attacks.projections import project_l1_ball_box, project_l2, project_linf

__all__ = [
    "APGDResult",
    "EvalCounter",
    "apgd",
    "apgd_targeted",
    "ce_loss",
    "checkpoint_schedule",
    "dlr_loss",
    "l1_eps_stages",
    "lp_norm",
    "parse_norm",
    "project_l1_ball_box",
    "project_l2",
    "project_linf",
    "targeted_dlr_loss",
]
