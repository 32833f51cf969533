"""The run's state the trainer carries from step to step, in two small groups by job.

`Trainables` are the objects an optimizer step changes. A checkpoint saves them, a guard
snapshot copies them and a rollback restores them, always together, so they travel as one
argument. `RunState` is how far the run got: the counters the loop advances and each
checkpoint saves beside the weights (a resume starts from the checkpoint's values).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


def _no_eval_yet() -> dict[str, Any]:
    return {"metric": None, "checkpoint": None, "bad_evals": 0}


@dataclass
class Trainables:
    """What an optimizer step changes. ``model`` is the unwrapped model (accelerate's wrapper
    only runs the forward); ``scaler`` is the fp16 GradScaler, else None."""

    model: Any
    optimizer: Any
    scheduler: Any
    scaler: Any = None


@dataclass
class RunState:
    """The loop's counters. ``best`` (eval metric, its checkpoint, evals since it) is a dict
    because checkpoints store it as one; ``saved`` says a checkpoint of this run exists
    (written, or resumed from), so the result can name the newest."""

    step: int = 0
    skipped: int = 0
    history: list[dict[str, Any]] = field(default_factory=list)
    best: dict[str, Any] = field(default_factory=_no_eval_yet)
    saved: bool = False
    last_eval: dict[str, float] | None = None
    stopped_early: bool = False
    data: str = ""  # the shards' fingerprint (RunShards.fingerprint): checkpoints record it
