"""Fine-tuning under the paper's protocol: losses (CE, PGD-AT, TRADES), the LightningModule, the run driver."""

from rgb.training.losses import PGDAT, TRADES, CrossEntropy, InnerAttack, TrainingLoss, build_loss
from rgb.training.module import STRATEGIES, RobustFinetuneModule
from rgb.training.optim import build_optimizer, parameter_groups, warmup_cosine
from rgb.training.run import accumulation_steps, resume_path, stable_run_id, train

__all__ = [
    "PGDAT",
    "STRATEGIES",
    "TRADES",
    "CrossEntropy",
    "InnerAttack",
    "RobustFinetuneModule",
    "TrainingLoss",
    "accumulation_steps",
    "build_loss",
    "build_optimizer",
    "parameter_groups",
    "resume_path",
    "stable_run_id",
    "train",
    "warmup_cosine",
]
