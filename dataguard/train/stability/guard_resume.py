"""The guard's snapshots across a checkpoint: saved beside it when needed, restored on resume.

A resumed run must take the decisions the uninterrupted run took, rollbacks included, so it
needs the same *verified* state to roll back to and the same *pending* snapshots waiting for
verification. With the defaults (a snapshot at every checkpoint) these are checkpoints on
disk or the checkpoint itself, and nothing extra is written. Otherwise (periodic in-memory
snapshots between checkpoints) their trainable tensors go into the checkpoint as
``guard_snapshot.safetensors``, keyed ``step-N/<tensor name>``. Without either, the resumed
state is the run's new verified start (the note says so).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from dataguard.train import checkpoint as ckpt_mod
from dataguard.train.stability.snapshot_store import host_copy, live_trainable
from dataguard.train.stability.snapshots import Snapshot, Snapshots
from dataguard.train.state import Trainables

GUARD_SNAPSHOT = ckpt_mod.GUARD_SNAPSHOT


def snapshot_to_save(snapshots: Snapshots | None, run_dir: Path, step: int) -> dict[str, torch.Tensor] | None:
    """The snapshots a checkpoint of ``step`` would not otherwise lead back to, as one flat dict."""
    if snapshots is None:
        return None
    out: dict[str, torch.Tensor] = {}
    held = ([snapshots.target] if snapshots.target is not None else []) + list(snapshots.pending)
    for snap in held:
        if snap.step == step or (snap.verified and _complete(run_dir, snap.step)):
            continue  # (its sums are checked when a resume reads it, not re-hashed at every save)
        # cloned: tied weights share storage, which safetensors refuses to write
        out.update({f"step-{snap.step}/{k}": v.detach().cpu().clone() for k, v in snap.model.items()})
    return out or None


def restore_guard(snapshots: Snapshots, saved: dict[str, Any], latest: Path, run_dir: Path, step: int, parts: Trainables,
                  note: Callable[[str], None]) -> None:
    """Put back the verified target and the pending snapshots of the checkpoint resumed from."""
    stored = _stored(latest)
    verified_step = saved.get("verified_step")
    target = None
    if verified_step is not None and verified_step != step:
        target = stored.get(int(verified_step)) or _from_checkpoint(run_dir, latest, int(verified_step), parts.model)
    if target is None:
        snapshots.take(step, parts, verified=True)
        if verified_step is not None and verified_step != step:
            note(f"the guard's rollback target is the resumed state of step {step} (the verified state of step "
                 f"{verified_step} is not on disk)")
    else:
        snapshots.adopt(_snapshot(int(verified_step), target, parts, verified=True))
    for pending in saved.get("pending") or []:
        at, clean = int(pending.get("step", -1)), int(pending.get("clean_steps", 0))
        if at == step:
            snapshots.take(step, parts)
        elif at in stored:
            snapshots.adopt(_snapshot(at, stored[at], parts, verified=False))
        else:
            continue
        snapshots.resume_pending(clean)


def _complete(run_dir: Path, step: int) -> bool:
    return (ckpt_mod.checkpoint_dir(run_dir) / f"step-{step:06d}" / ckpt_mod.COMPLETE).is_file()


def _intact(run_dir: Path, step: int) -> bool:
    path = ckpt_mod.checkpoint_dir(run_dir) / f"step-{step:06d}"
    return (path / ckpt_mod.COMPLETE).is_file() and ckpt_mod.checkpoint_damage(path) is None


def _stored(latest: Path) -> dict[int, dict[str, torch.Tensor]]:
    """The snapshots saved in a checkpoint, by step."""
    if not (latest / GUARD_SNAPSHOT).is_file():
        return {}
    from safetensors.torch import load_file

    out: dict[int, dict[str, torch.Tensor]] = {}
    for key, value in load_file(str(latest / GUARD_SNAPSHOT)).items():
        head, _, name = key.partition("/")
        out.setdefault(int(head.removeprefix("step-")), {})[name] = value
    return out


def _from_checkpoint(run_dir: Path, latest: Path, step: int, model: Any) -> dict[str, torch.Tensor] | None:
    """A verified checkpoint's trainable tensors (loaded into the model, then the resumed ones back)."""
    if not _intact(run_dir, step):
        return None
    ckpt_mod.load_weights(model, ckpt_mod.checkpoint_dir(run_dir) / f"step-{step:06d}")
    tensors = host_copy(live_trainable(model))
    ckpt_mod.load_weights(model, latest)
    return tensors


def _snapshot(step: int, tensors: dict[str, torch.Tensor], parts: Trainables, *, verified: bool) -> Snapshot:
    device_of = {k: v.device for k, v in host_copy(live_trainable(parts.model)).items()}
    return Snapshot(step=step, model={k: v.to(device_of.get(k, v.device)) for k, v in tensors.items()},
                    optimizer={"param_groups": [{k: v for k, v in g.items() if k != "params"}
                                                for g in parts.optimizer.param_groups]},
                    scheduler=None, scaler=parts.scaler.state_dict() if parts.scaler is not None else None,
                    verified=verified)
