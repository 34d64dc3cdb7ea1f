"""The benchmark data's error: a leaf that the loader, the snapshot writer and the corruptions all import (it
imports nothing of rgb.data), so none of them imports another for it."""

from __future__ import annotations

from rgb.core.errors import UserError, one_line

# The first line of the message a DataLoader worker re-raises an exception with (its traceback follows).
WORKER_PREFIX = "Caught "


class BenchmarkError(UserError, RuntimeError):
    """A one-line, actionable problem with the benchmark data (missing, corrupt, misaligned).

    The message is always one line: a DataLoader worker re-raises it as `Caught BenchmarkError in DataLoader
    worker ...` + the worker's traceback, of which only the original message (the last line) is kept.
    """

    def __init__(self, message: str = ""):
        super().__init__(one_line(_original_message(str(message))))


class DataConfigError(BenchmarkError, ValueError):
    """Data settings and the data they name that do not fit together (a class count the snapshot contradicts, an
    unknown corruption, a test split too small for the common split, non-square images, a dataset of one's own
    without its snapshot folder): one line naming the value and what is allowed."""


def _original_message(message: str) -> str:
    """The message a DataLoader worker re-raised (the last line of its report), else `message` itself."""
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    if len(lines) > 1 and lines[0].startswith(WORKER_PREFIX):
        return lines[-1].split(f"{BenchmarkError.__name__}: ", 1)[-1]
    return message


__all__ = ["WORKER_PREFIX", "BenchmarkError", "DataConfigError"]
