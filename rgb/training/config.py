"""The errors of a training run. What a training config must satisfy and which of its keys identify the weights are
the command's to know (rgb.commands.train_config): rgb.training reads the typed request only."""

from __future__ import annotations

from rgb.core.errors import UserError


class TrainingError(UserError, RuntimeError):
    """A one-line problem with a training run (its run dir, its checkpoints); the entry points print it as is."""


class TrainingConfigError(TrainingError, ValueError):
    """A training config that must not start: names the key, the rule and the value."""
