"""Clean-room AutoAttack components in pure PyTorch (models map [0,1] images to logits).

Every attack follows the `Attack` protocol and returns an `AttackResult`; `ATTACKS` is the name -> attack
table and `VERSIONS` the AutoAttack versions built from it (`is_standard` says which one is the benchmark's).
"""

from rgb.attacks.apgd import APGDResult, apgd, apgd_over_targets, apgd_targeted, checkpoint_schedule, l1_eps_stages
from rgb.attacks.autoattack import AutoAttack, AutoAttackResult, check_threat_model, within_budget
from rgb.attacks.common import Attack, AttackError, AttackResult, EvalCounter, LiveRows, lp_norm
from rgb.attacks.fab import FABResult, fab_targeted, fab_untargeted
from rgb.attacks.options import AttackOptions
from rgb.attacks.losses import ce_loss, dlr_loss, targeted_dlr_loss
from rgb.attacks.projections import project_l1_ball_box, project_l2, project_linf
from rgb.attacks.registry import ATTACKS, VERSIONS, AttackEntry, Step, Version, is_standard
from rgb.attacks.square import SquareResult, square
from rgb.core.threat import Norm, parse_norm

__all__ = [
    "ATTACKS",
    "APGDResult",
    "Attack",
    "AttackEntry",
    "AttackError",
    "AttackOptions",
    "AttackResult",
    "AutoAttack",
    "AutoAttackResult",
    "EvalCounter",
    "FABResult",
    "LiveRows",
    "Norm",
    "SquareResult",
    "Step",
    "VERSIONS",
    "Version",
    "apgd",
    "apgd_over_targets",
    "apgd_targeted",
    "ce_loss",
    "check_threat_model",
    "checkpoint_schedule",
    "dlr_loss",
    "fab_targeted",
    "fab_untargeted",
    "is_standard",
    "l1_eps_stages",
    "lp_norm",
    "parse_norm",
    "project_l1_ball_box",
    "project_l2",
    "project_linf",
    "square",
    "targeted_dlr_loss",
    "within_budget",
]
