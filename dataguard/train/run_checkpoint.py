"""The running loop's checkpoint: what a resume needs to compute the steps the run would have.

`checkpoint_step` is one checkpoint of the loop: the guard's snapshot of a clean step (taken
first, so the save records it), the save itself, the ``checkpoint`` event, the ``VERIFIED``
marker of a state the guard already verified, and ``best.json`` for the best evaluation.
`save_run_checkpoint` writes the trainables with the loop's own state (counters, sampler,
RNG, gradient-variance EMA, guard, fired faults); a refused save is a warning, not the end of
the run.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Protocol

import torch

from dataguard.io.safe_files import write_atomic
from dataguard.train import checkpoint as ckpt_mod
from dataguard.train.config import TrainConfig
from dataguard.train.data import LabelMap
from dataguard.train.data.sampler import CurriculumSampler
from dataguard.train.data.shards import FINGERPRINT_KEY
from dataguard.train.dynamics.hook import DynamicsHook
from dataguard.train.optim.optimizer import GradVarianceScaler
from dataguard.train.stability.faults import FaultPlan
from dataguard.train.stability.guard import EventLog, Guard
from dataguard.train.stability.guard_resume import GUARD_SNAPSHOT, snapshot_to_save
from dataguard.train.state import RunState, Trainables
from dataguard.train.step import StepOutcome


class CheckpointedRun(Protocol):
    """What a checkpoint reads of the trainer."""

    run_dir: Path
    cfg: TrainConfig
    main: bool
    accelerator: Any
    trainables: Trainables
    tokenizer: Any
    label_map: LabelMap | None
    sampler: CurriculumSampler
    gvs: GradVarianceScaler | None
    guard: Guard | None
    plan: FaultPlan
    state: RunState
    events: EventLog
    dyn: DynamicsHook | None

    def warn(self, text: str) -> None: ...


def checkpoint_step(run: CheckpointedRun, out: StepOutcome, is_best: bool) -> None:
    """Checkpoint the step just done (every process: the dynamics files and the barrier)."""
    step, best, guard = out.step, run.state.best, run.guard
    if is_best:
        best["checkpoint"] = f"step-{step:06d}"
    path = run.run_dir
    if guard is not None and out.applied and not out.verdict.anomalies:  # pending until verified; taken
        guard.snapshots.take(step, run.trainables)  # first: the save records it
    dyn_files = run.dyn.checkpoint_files(run.accelerator, run.main) if run.dyn is not None else {}
    if run.main:
        path = save_run_checkpoint(run, dyn_files)
        run.events.add(step, "checkpoint", "save", str(path), lr=out.lr)
    run.accelerator.wait_for_everyone()
    target = guard.snapshots.target if guard is not None else None
    if run.main and target is not None and target.step == step:
        ckpt_mod.mark_verified(run.run_dir, step, f"verified by the guard at step {step}: its eval")
    run.state.saved = True
    if is_best and run.main:
        write_atomic(run.run_dir / "best.json", json.dumps(
            {"checkpoint": str(path), "eval_loss": best["metric"], "step": step}) + "\n")


def save_run_checkpoint(run: CheckpointedRun, more_files: dict[str, dict[str, torch.Tensor]]) -> Path:
    """Save the checkpoint of ``run.state.step`` with the loop's own state; a refused save is a
    warning and the newest complete checkpoint (or the run folder) is returned instead."""
    cfg, state, parts, guard = run.cfg, run.state, run.trainables, run.guard
    extra = {"skipped_steps": state.skipped, "best": dict(state.best),
             "grad_variance": run.gvs.state_dict() if run.gvs is not None else None,
             "guard": guard.state_dict() if guard is not None else None, "faults": run.plan.state_dict(),
             FINGERPRINT_KEY: state.data, "stopped_early": state.stopped_early}
    snapshots = snapshot_to_save(guard.snapshots if guard is not None else None, run.run_dir, state.step)
    try:
        return ckpt_mod.save_checkpoint(
            run.run_dir, state.step, parts.model, parts.optimizer, parts.scheduler, parts.scaler,
            run.sampler.state_dict(), ckpt_mod.capture_rng(), state.history,
            run.label_map.to_json() if run.label_map else None, cfg.to_dict(),
            tokenizer=run.tokenizer, extra=extra, keep=cfg.keep_checkpoints,
            protect=[state.best["checkpoint"]] if state.best.get("checkpoint") else [],
            weight_bound=float(cfg.guard["weight_bound"]) if cfg.guard else None,
            tensor_files={**({GUARD_SNAPSHOT: snapshots} if snapshots else {}), **more_files} or None)
    except ckpt_mod.CheckpointError as exc:
        run.warn(str(exc))
        return ckpt_mod.latest_checkpoint(run.run_dir) or run.run_dir
