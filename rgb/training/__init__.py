"""Fine-tuning under the paper's protocol: losses (CE, PGD-AT, TRADES), the LightningModule, the run driver (one
TrainRequest of typed sections per run: rgb.commands.train builds it from train.py's config)."""

from rgb.training.config import TrainingConfigError, TrainingError
from rgb.training.losses import LOSSES, PGDAT, TRADES, CrossEntropy, InnerAttack, TrainingLoss, build_loss
from rgb.training.module import STRATEGIES, RobustFinetuneModule
from rgb.training.optim import SCHEDULERS, build_optimizer, parameter_groups, warmup_cosine
from rgb.training.rundir import AtomicCheckpointIO, RunManifest, locked
from rgb.training.request import (
    DataSection,
    LoggingSection,
    LossSection,
    ModelSection,
    OptimSection,
    StrategySection,
    TrainerSection,
    TrainRequest,
)
from rgb.training.run import accumulation_steps, resume_path, train

__all__ = [
    "LOSSES",
    "PGDAT",
    "SCHEDULERS",
    "STRATEGIES",
    "TRADES",
    "AtomicCheckpointIO",
    "CrossEntropy",
    "DataSection",
    "InnerAttack",
    "LoggingSection",
    "LossSection",
    "ModelSection",
    "OptimSection",
    "RobustFinetuneModule",
    "RunManifest",
    "StrategySection",
    "TrainRequest",
    "TrainerSection",
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
    "warmup_cosine",
]
