"""Fine-tuning under the paper's protocol: losses (CE, PGD-AT, TRADES), the LightningModule, the run driver (one
TrainRequest per run: rgb.commands.train builds it from train.py's config)."""

from rgb.training.config import RESUMABLE_KEYS, TrainingConfigError, TrainingError, training_identity, validate_config
from rgb.training.losses import LOSSES, PGDAT, TRADES, CrossEntropy, InnerAttack, TrainingLoss, build_loss
from rgb.training.module import STRATEGIES, RobustFinetuneModule
from rgb.training.optim import SCHEDULERS, build_optimizer, parameter_groups, warmup_cosine
from rgb.training.rundir import AtomicCheckpointIO, RunManifest, locked
from rgb.training.run import TrainRequest, accumulation_steps, resume_path, train

__all__ = [
    "LOSSES",
    "PGDAT",
    "RESUMABLE_KEYS",
    "SCHEDULERS",
    "STRATEGIES",
    "TRADES",
    "AtomicCheckpointIO",
    "CrossEntropy",
    "InnerAttack",
    "RobustFinetuneModule",
    "RunManifest",
    "TrainRequest",
    "TrainingConfigError",
    "TrainingError",
    "TrainingLoss",
    "accumulation_steps",
    "build_loss",
    "build_optimizer",
    "locked",
    "parameter_groups",
    "resume_path",
    "train",
    "training_identity",
    "validate_config",
    "warmup_cosine",
]
