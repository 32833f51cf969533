"""The training runner's errors (re-exported by `dataguard.train.loop` and `dataguard.train.data.split`)."""

from __future__ import annotations


class TrainError(RuntimeError):
    """A run that cannot start or continue (message says what to change)."""


class TrainDiverged(TrainError):
    """The guard stopped a diverging run (one line naming the step, cause and diagnosis file)."""


class TrainDataError(ValueError):
    """The run folder cannot be trained on; the message says what to fix."""
