"""Acting on the guard for one step: events, skipped steps, rollback, stop and verified states.

`check_weights` adds weights above the bound to the step's verdict; `respond` logs the step's
anomalies and applies the verdict (skip, rollback, stop with ``diagnosis.json``); `after_step`
and `after_eval` count the step or the evaluation towards verifying the pending snapshots (an
event and the checkpoint's ``VERIFIED`` marker), close a recovery window and take the periodic
snapshot. Each takes the trainer (`GuardedRun`: what they read of it) and the step's
`StepOutcome`, and changes the guard only through its methods.

Events that name rows (anomaly, skip, rollback, stop) also carry ``row_scores``: each row's
stage scores from the pipeline's shards (`dataguard.train.dynamics.rows.RowScores`), so the
training page can say what the data side thought of the rows that upset the run.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Protocol

from dataguard.io.safe_files import write_atomic
from dataguard.train import checkpoint as ckpt_mod
from dataguard.train.dynamics.rows import RowScores
from dataguard.train.stability.guard import EventLog, Guard, Verdict
from dataguard.train.stability.monitor import Monitor
from dataguard.train.stability.snapshots import Snapshot
from dataguard.train.state import Trainables
from dataguard.train.step import StepOutcome


class GuardedRun(Protocol):
    """What the responses read of the trainer."""

    run_dir: Path
    main: bool
    guard: Guard | None
    events: EventLog
    trainables: Trainables
    monitor: Monitor
    scores: RowScores | None


def add_event(events: EventLog, step: int, kind: str, cause: str, detail: str, *, layer: str | None,
              rows: list[str] | None, lr: float | None, scores: RowScores | None) -> dict[str, Any]:
    """`EventLog.add`, plus the named rows' stage scores (``row_scores``) when known."""
    if scores is None or not rows:
        return events.add(step, kind, cause, detail, layer=layer, rows=rows, lr=lr)
    return events.add(step, kind, cause, detail, layer=layer, rows=rows, lr=lr, row_scores=scores.lookup(list(rows)))


def check_weights(run: GuardedRun, out: StepOutcome, due: bool) -> None:
    """After an applied update, on the steps ``due`` (monitor and checkpoint steps): weights
    above the bound join the step's verdict (a rollback now)."""
    if run.guard is None or not out.applied or not due:
        return
    weights = run.guard.check_weights(out.step, run.monitor.max_abs_weight())
    if weights.anomalies:
        out.verdict = Verdict(anomalies=out.verdict.anomalies + weights.anomalies, skip=False,
                              rollback=weights.rollback, stop=weights.stop)


def respond(run: GuardedRun, out: StepOutcome) -> str | None:
    """Log the step's anomalies and apply the guard's verdict; returns the stop message, if any."""
    events, guard, verdict, step, rows, lr = run.events, run.guard, out.verdict, out.step, out.rows, out.lr
    for a in verdict.anomalies:
        add_event(events, step, "anomaly", a["cause"], a["detail"], layer=a["layer"], rows=rows, lr=lr,
                  scores=run.scores)
        if guard is not None:
            guard.note_anomaly(a["layer"], rows)
    if not out.applied:
        cause = verdict.anomalies[0]["cause"] if verdict.anomalies else (
            "nonfinite_grad" if math.isfinite(out.loss) else "nonfinite_loss")
        detail = "optimizer step skipped (no update, no scheduler step)"
        if not verdict.anomalies and out.bad_layers:
            detail += f"; non-finite gradient in {', '.join(out.bad_layers)}"
        add_event(events, step, "skip", cause, detail, layer=out.bad_layers[0] if out.bad_layers else None,
                  rows=rows, lr=lr, scores=run.scores)
    if guard is None:
        return None
    cause = verdict.anomalies[-1]["cause"] if verdict.anomalies else ""
    if verdict.stop:
        return _stop(run, guard, step, cause, lr)
    if verdict.rollback:
        target = guard.roll_back(step, run.trainables)
        add_event(events, step, "rollback", cause,
                  f"restored the state of step {target}; lr x{guard.lr_scale:g}, clip max_norm "
                  f"{guard.clip_norm(step + 1):g} until step {guard.recover_until}, Adam moments reset; "
                  f"the batches since step {target} are not replayed",
                  layer=guard.first_layer, rows=rows, lr=lr * guard.lr_scale, scores=run.scores)
    return None


def _stop(run: GuardedRun, guard: Guard, step: int, cause: str, lr: float) -> str:
    """The stop event and ``diagnosis.json``; the message `TrainDiverged` carries."""
    events = run.events
    add_event(events, step, "stop", cause, f"{guard.rollbacks} rollbacks (max_rollbacks {guard.k['max_rollbacks']}) "
              f"did not stop the anomalies", layer=guard.first_layer, rows=guard.bad_rows, lr=lr, scores=run.scores)
    first = next((e for e in events.events if e["kind"] == "anomaly"), None)
    path = run.run_dir / "diagnosis.json"
    if events.path is not None:
        write_atomic(path, json.dumps({"step": int(first["step"] if first else step),
                                       "cause": first["cause"] if first else cause, "first_layer": guard.first_layer,
                                       "rows": list(guard.bad_rows), "events": list(events.events)}, indent=1) + "\n")
    return (f"training diverged at step {step}: {cause} after {guard.rollbacks} rollback(s); first bad "
            f"layer {guard.first_layer or 'unknown'}; diagnosis in {path}")


def after_step(run: GuardedRun, out: StepOutcome) -> None:
    """Count the step towards verifying the pending snapshots, close a recovery window (an
    event) and take the guard's periodic in-memory snapshot."""
    guard = run.guard
    if guard is None:
        return
    verdict, step = out.verdict, out.step
    note_verified(run, guard.snapshots.after_step(out.applied, verdict.clean), step, out.lr)
    if guard.rollbacks and step == guard.recover_until:
        run.events.add(step, "recovered", "recovery_end", f"clip back to {guard.max_grad_norm:g} after "
                       f"{guard.k['recovery_steps']} steps; lr scale stays x{guard.lr_scale:g}", lr=out.lr)
    if out.applied and not verdict.anomalies and not verdict.rollback and step % int(guard.k["snapshot_every"]) == 0:
        guard.snapshots.take(step, run.trainables)


def after_eval(run: GuardedRun, out: StepOutcome, eval_loss: float, best: float | None) -> None:
    """An evaluation in band verifies the pending snapshots sooner, and the state it measured
    itself when the step was clean."""
    guard = run.guard
    if guard is None:
        return
    note_verified(run, guard.snapshots.after_eval(eval_loss, best), out.step, out.lr)
    if out.applied and not out.verdict.anomalies and guard.snapshots.eval_in_band(eval_loss, best):
        note_verified(run, guard.snapshots.verify_current(out.step, run.trainables), out.step, out.lr)


def note_verified(run: GuardedRun, snap: Snapshot | None, step: int, lr: float) -> None:
    """A snapshot the guard just verified: an event, and its checkpoint's VERIFIED marker."""
    if snap is None:
        return
    marked = ckpt_mod.mark_verified(run.run_dir, snap.step, f"verified by the guard after step {snap.step}: "
                                    f"{snap.clean_steps} clean steps") if run.main else None
    run.events.add(step, "verified", "clean_steps" if snap.clean_steps else "eval",
                   f"the state of step {snap.step} is a rollback target"
                   + (f"; {marked.name} marked verified" if marked is not None else ""), lr=lr)
