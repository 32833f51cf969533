"""The guard's snapshots: the states a rollback can go back to, and how they earn that.

Rollback targets are *verified* states. A snapshot (taken every ``snapshot_every`` steps and
at every checkpoint, only after a clean step and only with every weight finite and within
``weight_bound``) is first *pending*; it becomes the rollback target once ``verify_steps``
applied steps after it passed without an anomaly, or sooner when an evaluation after it
stays within ``worse_than_best`` of the best evaluation. An anomaly while a snapshot is
pending discards it: the state may already hold the update that caused the anomaly (an lr
spike shows in the loss only on the next step). The state the run starts from (the model as
loaded, or the verified checkpoint a resume took) is verified by definition. A checkpoint
whose snapshot is verified gets a ``VERIFIED`` marker (`dataguard.train.checkpoint`);
``--resume`` and rollbacks use only verified states.

Snapshots hold only what training changes: the trainable parameters (a LoRA adapter, not
the frozen base) and buffers, on the device; the optimizer state is copied once. Where their
tensors live (host memory or a spill file) is `snapshot_store`'s job; what the guard decides
with them is `guard`'s.
"""

from __future__ import annotations

import copy
import math
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from dataguard.train.stability.snapshot_store import SpillFolder, choose_place, host_copy, live_trainable
from dataguard.train.state import Trainables


@dataclass
class Snapshot:
    """A state the run can go back to; ``verified`` once it proved good (see the module doc)."""

    step: int
    model: dict[str, torch.Tensor]
    optimizer: dict[str, Any]
    scheduler: dict[str, Any] | None
    scaler: dict[str, Any] | None
    verified: bool = False
    clean_steps: int = 0
    spilled: bool = False  # its tensors are a memory-mapped file in RUN/_guard (snapshot_store)


class Snapshots:
    """The verified rollback target and the pending snapshots waiting to become it."""

    def __init__(self, knobs: Mapping[str, Any], spill: SpillFolder | None = None) -> None:
        self.k = knobs  # weight_bound, snapshot_in, verify_steps, worse_than_best
        self.spill = spill  # where large snapshots go on a CPU run (None: always host memory)
        if spill is not None:
            spill.clear()  # a killed run's files: a resume restores from its checkpoint, not these
            weakref.finalize(self, spill.clear)  # and this run's, once the guard is let go
        self.target: Snapshot | None = None  # the verified state a rollback restores
        self.pending: list[Snapshot] = []  # oldest first; each waits for its clean steps
        self._spare: list[dict[str, torch.Tensor]] = []  # tensors of dropped snapshots, reused

    # ------------------------------------------------------------------ verification
    def after_step(self, applied: bool, clean: bool) -> Snapshot | None:
        """Count a step against the pending snapshots: a step that was not ``clean`` (an
        anomaly, a rollback or a stop) discards them all, the ``verify_steps``-th clean applied
        step verifies one (returned, so the loop can mark its checkpoint)."""
        if not clean:
            self._drop(self.pending)
            self.pending = []
            return None
        if not applied:
            return None
        ready = None
        for snap in self.pending:
            snap.clean_steps += 1
            if snap.clean_steps >= int(self.k["verify_steps"]):
                ready = snap
        return self._verify(ready) if ready is not None else None

    def after_eval(self, eval_loss: float, best: float | None) -> Snapshot | None:
        """An evaluation within ``worse_than_best`` of the best verifies the pending snapshots
        sooner (the newest becomes the target)."""
        if not self.pending or not self.eval_in_band(eval_loss, best):
            return None
        return self._verify(self.pending[-1])

    def eval_in_band(self, eval_loss: float, best: float | None) -> bool:
        return math.isfinite(eval_loss) and (best is None or eval_loss <= best * (1.0 + float(self.k["worse_than_best"])))

    def verify_current(self, step: int, parts: Trainables) -> Snapshot | None:
        """The state an evaluation just measured in band, after a clean step: verified now
        (None when it already is the target: `after_eval` verified it a moment ago, and one
        state is reported verified once)."""
        if self.target is not None and self.target.step == step:
            return None
        held = next((p for p in self.pending if p.step == step), None)
        if held is not None:
            return self._verify(held)
        if self.take(step, parts, verified=True) and self.target is not None and self.target.step == step:
            return self.target
        return None

    def _verify(self, snap: Snapshot) -> Snapshot:
        self._drop([p for p in self.pending if p.step < snap.step] + ([self.target] if self.target else []))
        self.pending = [p for p in self.pending if p.step > snap.step]
        snap.verified = True
        self.target = snap
        return snap

    # ------------------------------------------------------------------ taking and restoring
    def take(self, step: int, parts: Trainables, *, verified: bool = False) -> bool:
        """Snapshot the trainable state as pending (or as the verified target: the start of a
        run); refused (False) when a weight is non-finite or above ``weight_bound``. The
        optimizer's moments are not kept: a rollback resets them anyway."""
        if (any(p.step == step for p in self.pending) and not verified) or \
                (self.target is not None and self.target.step == step):
            return True  # this state is already held (verified, or waiting)
        live = live_trainable(parts.model)
        bound = float(self.k["weight_bound"])
        for value in live.values():
            if value.is_floating_point() and value.numel():
                low, high = torch.aminmax(value)  # no full-size temporary, unlike abs().max()
                if not bool(torch.maximum(-low, high) <= bound):
                    return False  # NaN compares False too
        spilled = self.spill is not None and choose_place(str(self.k.get("snapshot_in", "auto")), live) == "disk"
        tensors = self.spill.write(step, live) if spilled else host_copy(live, self._spare.pop() if self._spare
                                                                          else None)
        groups = [{k: copy.deepcopy(v) for k, v in g.items() if k != "params"} for g in parts.optimizer.param_groups]
        scaler_state = copy.deepcopy(parts.scaler.state_dict()) if parts.scaler is not None else None
        snap = Snapshot(step=step, model=tensors, optimizer={"param_groups": groups},
                        scheduler=None, scaler=scaler_state, verified=verified, spilled=spilled)
        if verified:
            self._drop(self.pending + ([self.target] if self.target else []))
            self.target, self.pending = snap, []
        else:
            self._drop(self.pending[:-1])
            self.pending = [*self.pending[-1:], snap]  # at most two wait: memory stays bounded
        return True

    def restore(self, parts: Trainables) -> int:
        """Put the target's weights, lr-free param groups and scaler back, reset the Adam
        moments and discard the pending snapshots. Returns the step the state was taken at."""
        snap = self.target
        assert snap is not None and snap.verified, "no verified snapshot to roll back to"
        optimizer, scaler = parts.optimizer, parts.scaler
        with torch.no_grad():
            state = parts.model.state_dict(keep_vars=True)
            for key, value in snap.model.items():
                state[key].data.copy_(value)
        inner = getattr(optimizer, "optimizer", optimizer)
        inner.state.clear()  # reset the Adam moments (and their bias-correction counters)
        for g, saved in zip(optimizer.param_groups, snap.optimizer["param_groups"], strict=True):
            lr = g["lr"]  # the schedule stays where the loop is
            g.update(copy.deepcopy(saved))
            g["lr"] = lr
        if scaler is not None and snap.scaler is not None:
            scaler.load_state_dict(copy.deepcopy(snap.scaler))
        optimizer.zero_grad(set_to_none=True)
        self._drop(self.pending)
        self.pending = []
        return snap.step

    def _drop(self, snaps: list[Snapshot]) -> None:
        """Keep the tensors of snapshots let go, for the next snapshot to copy into: a new full
        copy every ``snapshot_every`` steps cost as much in allocation as in copying."""
        for snap in snaps:
            if snap is not None and snap.spilled and self.spill is not None:
                self.spill.release(snap.step)
            elif snap is not None and len(self._spare) < 2:
                self._spare.append(snap.model)

    # ------------------------------------------------------------------ resume
    def adopt(self, snap: Snapshot) -> None:
        """A snapshot restored from a checkpoint: the verified target, or the newest pending."""
        if snap.verified:
            self.target = snap
        else:
            self.pending.append(snap)

    def resume_pending(self, clean_steps: int) -> None:
        """The newest pending snapshot had ``clean_steps`` clean steps when the checkpoint was saved."""
        self.pending[-1].clean_steps = clean_steps

    def state_dict(self) -> dict[str, Any]:
        """Which states were held, by step (`guard_resume` saves and restores their tensors)."""
        return {"verified_step": self.target.step if self.target is not None else None,
                "pending": [{"step": p.step, "clean_steps": p.clean_steps} for p in self.pending]}
