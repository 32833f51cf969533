"""The training runner's errors (re-exported by `dataguard.train.loop`)."""

from __future__ import annotations


class TrainError(RuntimeError):
    """A run that cannot start or continue (message says what to change)."""


class TrainDiverged(TrainError):
    """The guard stopped a diverging run (one line naming the step, cause and diagnosis file)."""
