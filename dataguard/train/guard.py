"""The stability guard: detect a diverging step, skip it, roll back, and at last stop.

Detection (per optimizer step, before the update is applied):

- a non-finite loss or gradient (what ``error_if_nonfinite`` means, without crashing);
- a loss spike or a gradient-norm spike: robust z-score ``(x - median) / (1.4826 MAD)``
  over a trailing window of *accepted* steps (NaN and skipped steps are never in it), once
  the window holds ``max(10, zscore_window // 5)`` values; the scale has a floor of 5% of
  the median so a flat window does not turn noise into spikes;
- weights above ``weight_bound`` (checked after the update, on monitor steps).

Response ladder: every anomaly skips its step (no optimizer update, no scheduler step).
When ``max_anomalies`` anomalies fall within ``anomaly_window`` steps, the guard rolls back
to the last good in-memory snapshot (taken every ``snapshot_every`` steps and at every
checkpoint, only from a clean state): weights, optimizer, scheduler and scaler come back,
the lr is multiplied by ``lr_backoff`` (cumulative), global clipping is tightened to
``recovery_clip`` for ``recovery_steps`` steps and the Adam moments are reset (zeroed, with
their step counters, so Adam's bias correction restarts them cleanly; a freeze of the moments
over a number of steps is not offered). The data does not rewind: the batches since the snapshot, the
offending ones among them, are not seen again. After ``max_rollbacks`` rollbacks the next
trigger stops the run with a diagnosis (`diagnosis.json`) and `TrainDiverged`.

Every event goes to ``events.jsonl``. The guard's state (windows, anomaly steps, rollbacks,
lr scale, recovery deadline, fired faults) is saved with each checkpoint so a resumed run
takes the same decisions; the snapshot after a resume is the checkpoint it resumed from,
which is what the uninterrupted run held too (a snapshot is taken at every checkpoint).
"""

from __future__ import annotations

import copy
import json
import math
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from dataguard.io.safe_files import write_atomic
from dataguard.train.jsonl_log import JsonlLog

EVENT_KINDS = ("anomaly", "skip", "rollback", "stop", "fault", "checkpoint", "recovered")


def robust_z(value: float, window: list[float]) -> float:
    """``(value - median) / max(1.4826 MAD, 0.05 |median|, 1e-12)``."""
    s = sorted(window)
    n = len(s)
    med = s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])
    dev = sorted(abs(x - med) for x in s)
    mad = dev[n // 2] if n % 2 else 0.5 * (dev[n // 2 - 1] + dev[n // 2])
    scale = max(1.4826 * mad, 0.05 * abs(med), 1e-12)
    return (value - med) / scale


@dataclass
class Snapshot:
    step: int
    model: dict[str, torch.Tensor]
    optimizer: dict[str, Any]
    scheduler: dict[str, Any] | None
    scaler: dict[str, Any] | None


@dataclass
class Verdict:
    """What the guard decided for one step."""

    anomalies: list[dict[str, Any]] = field(default_factory=list)
    skip: bool = False
    rollback: bool = False
    stop: bool = False


class EventLog(JsonlLog):
    """events.jsonl: one object per event (a resumed run first drops events after its checkpoint)."""

    def __init__(self, run_dir: Path | None, resume_step: int | None = None) -> None:
        super().__init__(run_dir / "events.jsonl" if run_dir is not None else None, resume_step)
        self.events: list[dict[str, Any]] = [json.loads(line) for line in self.lines]

    def add(self, step: int, kind: str, cause: str, detail: str = "", *, layer: str | None = None,
            rows: list[str] | None = None, lr: float | None = None) -> dict[str, Any]:
        assert kind in EVENT_KINDS, kind
        event = {"step": int(step), "kind": kind, "cause": cause, "detail": detail, "layer": layer,
                 "rows": list(rows) if rows is not None else None,
                 "lr": float(lr) if lr is not None and math.isfinite(lr) else None}
        self.events.append(event)
        self.write(event)
        return event


class Guard:
    """The response ladder's state and decisions (the loop applies them)."""

    def __init__(self, knobs: Mapping[str, Any], max_grad_norm: float) -> None:
        self.k = dict(knobs)
        self.max_grad_norm = float(max_grad_norm)
        self.loss_window: deque[float] = deque(maxlen=int(self.k["zscore_window"]))
        self.gnorm_window: deque[float] = deque(maxlen=int(self.k["zscore_window"]))
        self.anomaly_steps: list[int] = []
        self.rollbacks = 0
        self.lr_scale = 1.0
        self.recover_until = 0
        self.snapshot: Snapshot | None = None
        self.bad_rows: list[str] = []
        self.first_layer: str | None = None

    # ------------------------------------------------------------------ detection
    def _min_history(self) -> int:
        return max(10, int(self.k["zscore_window"]) // 5)

    def check(self, step: int, loss: float, grad_norm: float, finite: bool,
              bad_layers: list[str]) -> Verdict:
        """Anomalies of one step, before its update."""
        v = Verdict()
        if not math.isfinite(loss):
            v.anomalies.append({"cause": "nonfinite_loss", "detail": f"loss {loss}",
                                "layer": bad_layers[0] if bad_layers and len(bad_layers) == 1 else None})
        elif not finite or not math.isfinite(grad_norm):
            v.anomalies.append({"cause": "nonfinite_grad",
                                "detail": f"non-finite gradient in {', '.join(bad_layers) or 'every layer'}",
                                "layer": bad_layers[0] if bad_layers else None})
        else:
            z_thr = float(self.k["zscore"])
            for cause, value, window in (("loss_spike", loss, self.loss_window),
                                         ("grad_spike", grad_norm, self.gnorm_window)):
                if len(window) >= self._min_history():
                    z = robust_z(value, list(window))
                    if z > z_thr:
                        v.anomalies.append({"cause": cause, "detail": f"{cause.split('_')[0]} {value:.4g} "
                                                                      f"robust z {z:.1f} > {z_thr:g}",
                                            "layer": None})
        return self._respond(step, v)

    def check_weights(self, step: int, max_abs: float) -> Verdict:
        """Weights above the bound after an update: the state is poisoned, roll back now."""
        v = Verdict()
        if not math.isfinite(max_abs) or max_abs > float(self.k["weight_bound"]):
            v.anomalies.append({"cause": "weight_bound", "layer": None,
                                "detail": f"max |w| {max_abs:.4g} > {float(self.k['weight_bound']):g}"})
            self.anomaly_steps.append(step)
            self._escalate(v)
        return v

    def _escalate(self, v: Verdict) -> None:
        """Roll back, or stop once ``max_rollbacks`` rollbacks have been spent."""
        if self.rollbacks >= int(self.k["max_rollbacks"]):
            v.stop = True
        else:
            v.rollback = True

    def _respond(self, step: int, v: Verdict) -> Verdict:
        if not v.anomalies:
            return v
        v.skip = True
        self.anomaly_steps.append(step)
        window = int(self.k["anomaly_window"])
        recent = [s for s in self.anomaly_steps if s > step - window]
        if len(recent) >= int(self.k["max_anomalies"]):
            self._escalate(v)
        return v

    def accept(self, loss: float, grad_norm: float) -> None:
        """An applied step: its loss and gradient norm join the trailing windows."""
        if math.isfinite(loss) and math.isfinite(grad_norm):
            self.loss_window.append(float(loss))
            self.gnorm_window.append(float(grad_norm))

    # ------------------------------------------------------------------ recovery
    def clip_norm(self, step: int) -> float:
        if step <= self.recover_until:
            return min(self.max_grad_norm, float(self.k["recovery_clip"]))
        return self.max_grad_norm

    def recovering(self, step: int) -> bool:
        return step <= self.recover_until

    def take_snapshot(self, step: int, model: Any, optimizer: Any, scheduler: Any, scaler: Any) -> None:
        self.snapshot = Snapshot(
            step=step, model={k: v.detach().clone() for k, v in model.state_dict().items()},
            optimizer=copy.deepcopy(optimizer.state_dict()),
            scheduler=copy.deepcopy(scheduler.state_dict()) if scheduler is not None else None,
            scaler=copy.deepcopy(scaler.state_dict()) if scaler is not None else None)

    def roll_back(self, step: int, model: Any, optimizer: Any, scheduler: Any, scaler: Any) -> int:
        """Restore the snapshot, back off the lr, tighten clipping, reset the moments.
        Returns the step the state was taken at."""
        snap = self.snapshot
        assert snap is not None, "no snapshot to roll back to"
        with torch.no_grad():
            model.load_state_dict(snap.model)
        optimizer.load_state_dict(copy.deepcopy(snap.optimizer))
        inner = getattr(optimizer, "optimizer", optimizer)
        inner.state.clear()  # reset the Adam moments (and their bias-correction counters)
        if scheduler is not None and snap.scheduler is not None:
            scheduler.load_state_dict(copy.deepcopy(snap.scheduler))
            for g, lr in zip(optimizer.param_groups, scheduler.get_last_lr(), strict=True):
                g["lr"] = lr
        if scaler is not None and snap.scaler is not None:
            scaler.load_state_dict(copy.deepcopy(snap.scaler))
        optimizer.zero_grad(set_to_none=True)
        self.rollbacks += 1
        self.lr_scale *= float(self.k["lr_backoff"])
        self.recover_until = step + int(self.k["recovery_steps"])
        self.anomaly_steps = []
        return snap.step

    # ------------------------------------------------------------------ resume
    def state_dict(self) -> dict[str, Any]:
        return {"loss_window": list(self.loss_window), "gnorm_window": list(self.gnorm_window),
                "anomaly_steps": list(self.anomaly_steps), "rollbacks": self.rollbacks, "lr_scale": self.lr_scale,
                "recover_until": self.recover_until, "bad_rows": list(self.bad_rows),
                "first_layer": self.first_layer}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.loss_window.extend(float(x) for x in state.get("loss_window", []))
        self.gnorm_window.extend(float(x) for x in state.get("gnorm_window", []))
        self.anomaly_steps = [int(s) for s in state.get("anomaly_steps", [])]
        self.rollbacks = int(state.get("rollbacks", 0))
        self.lr_scale = float(state.get("lr_scale", 1.0))
        self.recover_until = int(state.get("recover_until", 0))
        self.bad_rows = list(state.get("bad_rows", []))
        self.first_layer = state.get("first_layer")


def write_diagnosis(run_dir: Path, step: int, cause: str, first_layer: str | None, rows: list[str],
                    events: list[dict[str, Any]]) -> Path:
    path = run_dir / "diagnosis.json"
    write_atomic(path, json.dumps({"step": int(step), "cause": cause, "first_layer": first_layer,
                                   "rows": list(rows), "events": list(events)}, indent=1) + "\n")
    return path
