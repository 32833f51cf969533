"""The stability guard: detect a diverging step, skip it, roll back, and at last stop.

Detection (per optimizer step, before the update is applied):

- a non-finite loss or gradient (what ``error_if_nonfinite`` means, without crashing);
- a loss spike or a gradient-norm spike: robust z-score ``(x - median) / (1.4826 MAD)``
  over a trailing window of *accepted* steps (NaN and skipped steps are never in it), once
  the window holds ``max(5, zscore_window // 2)`` values; the scale has a floor of 5% of
  the median so a flat window does not turn noise into spikes;
- weights above ``weight_bound`` (checked after the update, on monitor steps).

Rollbacks go back only to *verified* states: a snapshot is pending until clean steps or an
evaluation prove it good, and an anomaly discards it (`snapshots`, which holds them).

Response ladder: every anomaly skips its step (no optimizer update, no scheduler step).
When ``max_anomalies`` anomalies fall within ``anomaly_window`` steps, the guard rolls back
to the newest verified snapshot: weights, optimizer and scaler come back, the scheduler
stays where the loop is (so the schedule still anneals to ``min_lr`` at the last step), the
lr is multiplied by ``lr_backoff`` (cumulative), global clipping is tightened to
``recovery_clip`` for ``recovery_steps`` steps and the Adam moments are reset (zeroed, with
their step counters, so Adam's bias correction restarts them cleanly). The data does not
rewind: the batches since the snapshot, the offending ones among them, are not seen again.
After ``max_rollbacks`` rollbacks the next trigger stops the run with a diagnosis
(`diagnosis.json`) and `TrainDiverged`.

fp16: a step the GradScaler skips (an overflow) is normal while the scale settles; it
becomes an anomaly once ``fp16_skips_in_a_row`` steps in a row were skipped or the scale
fell below ``fp16_min_scale``, so a real fp16 divergence rolls back and stops like bf16/fp32.

Every event goes to ``events.jsonl``. The guard's state (windows, anomaly steps, rollbacks,
lr scale, recovery deadline, the pending snapshot's clean-step count) is saved with each
checkpoint so a resumed run takes the same decisions.
"""

from __future__ import annotations

import json
import math
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dataguard.train.report.jsonl_log import JsonlLog
from dataguard.train.stability.snapshot_store import SpillFolder
from dataguard.train.stability.snapshots import Snapshots
from dataguard.train.state import Trainables

EVENT_KINDS = ("anomaly", "skip", "rollback", "stop", "fault", "checkpoint", "recovered", "verified")
# Knobs added after the first release; a guard mapping saved by an older run lacks them.
GUARD_KNOB_DEFAULTS: dict[str, Any] = {"verify_steps": 10, "worse_than_best": 0.1, "fp16_skips_in_a_row": 8,
                                       "fp16_min_scale": 1.0}


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
class Verdict:
    """What the guard decided for one step."""

    anomalies: list[dict[str, Any]] = field(default_factory=list)
    skip: bool = False
    rollback: bool = False
    stop: bool = False

    @property
    def clean(self) -> bool:
        """No anomaly, rollback or stop: the state after this step may become a rollback target."""
        return not (self.anomalies or self.rollback or self.stop)


MAX_BAD_ROWS = 1000


class EventLog(JsonlLog):
    """events.jsonl: one object per event (a resumed run first drops events after its checkpoint)."""

    def __init__(self, run_dir: Path | None, resume_step: int | None = None) -> None:
        super().__init__(run_dir / "events.jsonl" if run_dir is not None else None, resume_step)
        self.events: list[dict[str, Any]] = [json.loads(line) for line in self.lines]

    def add(self, step: int, kind: str, cause: str, detail: str = "", *, layer: str | None = None,
            rows: list[str] | None = None, lr: float | None = None, **extra: Any) -> dict[str, Any]:
        """Record one event; ``extra`` fields (the rows' ``row_scores``) follow the fixed ones."""
        assert kind in EVENT_KINDS, kind
        event = {"step": int(step), "kind": kind, "cause": cause, "detail": detail, "layer": layer,
                 "rows": list(rows) if rows is not None else None,
                 "lr": float(lr) if lr is not None and math.isfinite(lr) else None, **extra}
        self.events.append(event)
        self.write(event)
        return event


class Guard:
    """The response ladder's state and decisions (the loop applies them); the states it rolls
    back to are its `Snapshots`."""

    def __init__(self, knobs: Mapping[str, Any], max_grad_norm: float, warmup_steps: int = 0,
                 spill: SpillFolder | None = None) -> None:
        self.k = {**GUARD_KNOB_DEFAULTS, **dict(knobs)}
        self.snapshots = Snapshots(self.k, spill)
        self.max_grad_norm = float(max_grad_norm)
        self.warmup_steps = int(warmup_steps)  # their fast-falling losses never enter the windows
        self.current_step = 0  # the step `check` judged last (`accept` follows it)
        self.phase: int | None = None  # the curriculum phase of the last step
        self.skips_in_a_row = 0
        self.loss_window: deque[float] = deque(maxlen=int(self.k["zscore_window"]))
        self.gnorm_window: deque[float] = deque(maxlen=int(self.k["zscore_window"]))
        self.anomaly_steps: list[int] = []
        self.rollbacks = 0
        self.lr_scale = 1.0
        self.recover_until = 0
        self.bad_rows: list[str] = []  # the rows of anomalous steps (first 1,000), for the diagnosis
        self.first_layer: str | None = None

    # ------------------------------------------------------------------ detection
    def _min_history(self) -> int:
        return max(5, int(self.k["zscore_window"]) // 2)

    def check(self, step: int, loss: float, grad_norm: float, finite: bool,
              bad_layers: list[str]) -> Verdict:
        """Anomalies of one step, before its update."""
        self.current_step = step
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
        if self.rollbacks >= int(self.k["max_rollbacks"]) or self.snapshots.target is None:
            v.stop = True  # no rollbacks left, or no verified state to go back to
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

    def scaler_skipped(self, step: int, scale: float) -> Verdict:
        """An fp16 step the GradScaler skipped: normal while the scale settles, an anomaly
        after ``fp16_skips_in_a_row`` in a row or below ``fp16_min_scale``."""
        self.skips_in_a_row += 1
        v = Verdict()
        if self.skips_in_a_row >= int(self.k["fp16_skips_in_a_row"]) or scale < float(self.k["fp16_min_scale"]):
            v.anomalies.append({"cause": "fp16_overflow", "layer": None,
                                "detail": f"{self.skips_in_a_row} fp16 steps skipped in a row, loss scale {scale:g}"})
        return self._respond(step, v)

    def accept(self, loss: float, grad_norm: float, step: int | None = None) -> None:
        """An applied step: its loss and gradient norm join the trailing windows (warmup
        steps excluded: their fast-falling losses would widen the band for the rest)."""
        self.skips_in_a_row = 0
        step = self.current_step if step is None else step
        if self.warmup_steps and step <= self.warmup_steps:
            return
        if math.isfinite(loss) and math.isfinite(grad_norm):
            self.loss_window.append(float(loss))
            self.gnorm_window.append(float(grad_norm))

    def enter_phase(self, phase: int, step: int) -> None:
        """A new curriculum phase admits new classes: the loss moves for a good reason, so the
        spike windows start again (no z-score until they refill)."""
        if phase != self.phase:
            if self.phase is not None:
                self.loss_window.clear()
                self.gnorm_window.clear()
            self.phase = phase

    # ------------------------------------------------------------------ recovery
    def clip_norm(self, step: int) -> float:
        if step <= self.recover_until:
            return min(self.max_grad_norm, float(self.k["recovery_clip"]))
        return self.max_grad_norm

    def roll_back(self, step: int, parts: Trainables) -> int:
        """Restore the verified snapshot, back off the lr, tighten clipping (the moments are
        reset by the restore). Returns the step the state was taken at."""
        target = self.snapshots.restore(parts)
        self.rollbacks += 1
        self.lr_scale *= float(self.k["lr_backoff"])
        self.recover_until = step + int(self.k["recovery_steps"])
        self.anomaly_steps = []
        return target

    # ------------------------------------------------------------------ diagnosis and resume
    def note_anomaly(self, layer: str | None, rows: list[str]) -> None:
        """Remember an anomalous step's first bad layer and its rows (capped), for the diagnosis."""
        if self.first_layer is None and layer:
            self.first_layer = layer
        self.bad_rows.extend(r for r in rows if r not in self.bad_rows)
        del self.bad_rows[MAX_BAD_ROWS:]

    def state_dict(self) -> dict[str, Any]:
        return {"loss_window": list(self.loss_window), "gnorm_window": list(self.gnorm_window),
                "anomaly_steps": list(self.anomaly_steps), "rollbacks": self.rollbacks, "lr_scale": self.lr_scale,
                "recover_until": self.recover_until, "bad_rows": list(self.bad_rows),
                "first_layer": self.first_layer, "skips_in_a_row": self.skips_in_a_row, "phase": self.phase,
                **self.snapshots.state_dict()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.loss_window.extend(float(x) for x in state.get("loss_window", []))
        self.gnorm_window.extend(float(x) for x in state.get("gnorm_window", []))
        self.anomaly_steps = [int(s) for s in state.get("anomaly_steps", [])]
        self.rollbacks = int(state.get("rollbacks", 0))
        self.lr_scale = float(state.get("lr_scale", 1.0))
        self.recover_until = int(state.get("recover_until", 0))
        self.bad_rows = list(state.get("bad_rows", []))
        self.first_layer = state.get("first_layer")
        self.skips_in_a_row = int(state.get("skips_in_a_row", 0))
        self.phase = state.get("phase")
