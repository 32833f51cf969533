"""Acting on the guard's verdict for one step: events, skipped steps, rollback and stop.

Events that name rows (anomaly, skip, rollback, stop) also carry ``row_scores``: each row's
stage scores from the pipeline's shards (`dataguard.train.dynamics.rows.RowScores`), so the
training page can say what the data side thought of the rows that upset the run.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from dataguard.train.dynamics.rows import RowScores
from dataguard.train.stability.guard import EventLog, Guard, Verdict, write_diagnosis


def add_event(events: EventLog, step: int, kind: str, cause: str, detail: str, *, layer: str | None,
              rows: list[str] | None, lr: float | None, scores: RowScores | None) -> dict[str, Any]:
    """`EventLog.add`, plus the named rows' stage scores (``row_scores``) when known."""
    if scores is None or not rows:
        return events.add(step, kind, cause, detail, layer=layer, rows=rows, lr=lr)
    return events.add(step, kind, cause, detail, layer=layer, rows=rows, lr=lr, row_scores=scores.lookup(list(rows)))


def respond(run_dir: Path, step: int, verdict: Verdict, applied: bool, record: dict[str, Any], rows: list[str],
            bad_layers: list[str], guard: Guard | None, events: EventLog, model: Any, optimizer: Any,
            scheduler: Any, scaler: Any, scores: RowScores | None = None) -> str | None:
    """Log the step's anomalies and apply the guard's verdict; returns the stop message, if any."""
    lr = record["lr"]
    for a in verdict.anomalies:
        add_event(events, step, "anomaly", a["cause"], a["detail"], layer=a["layer"], rows=rows, lr=lr,
                  scores=scores)
        if guard is not None:
            guard.note_anomaly(a["layer"], rows)
    if not applied:
        cause = verdict.anomalies[0]["cause"] if verdict.anomalies else (
            "nonfinite_grad" if math.isfinite(record["loss"]) else "nonfinite_loss")
        detail = "optimizer step skipped (no update, no scheduler step)"
        if not verdict.anomalies and bad_layers:
            detail += f"; non-finite gradient in {', '.join(bad_layers)}"
        add_event(events, step, "skip", cause, detail, layer=bad_layers[0] if bad_layers else None, rows=rows,
                  lr=lr, scores=scores)
    if guard is None:
        return None
    cause = verdict.anomalies[-1]["cause"] if verdict.anomalies else ""
    if verdict.stop:
        k = guard.k
        add_event(events, step, "stop", cause, f"{guard.rollbacks} rollbacks (max_rollbacks {k['max_rollbacks']}) "
                  f"did not stop the anomalies", layer=guard.first_layer, rows=guard.bad_rows, lr=lr, scores=scores)
        first = next((e for e in events.events if e["kind"] == "anomaly"), None)
        path = run_dir / "diagnosis.json"
        if events.path is not None:
            path = write_diagnosis(run_dir, first["step"] if first else step,
                                   first["cause"] if first else cause, guard.first_layer, guard.bad_rows,
                                   events.events)
        return (f"training diverged at step {step}: {cause} after {guard.rollbacks} rollback(s); first bad "
                f"layer {guard.first_layer or 'unknown'}; diagnosis in {path}")
    if verdict.rollback:
        target = guard.roll_back(step, model, optimizer, scheduler, scaler)
        k = guard.k
        add_event(events, step, "rollback", cause,
                  f"restored the state of step {target}; lr x{guard.lr_scale:g}, clip max_norm "
                  f"{guard.clip_norm(step + 1):g} until step {guard.recover_until}, Adam moments reset; "
                  f"the batches since step {target} are not replayed",
                  layer=guard.first_layer, rows=rows, lr=lr * guard.lr_scale, scores=scores)
    return None
