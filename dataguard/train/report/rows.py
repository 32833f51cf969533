"""The training page's "Rows named by the guard" section and its "Training dynamics" summary.

Rows come from the anomaly / skip / rollback / stop events of ``events.jsonl`` (their
``rows``), each with the stage scores the event recorded (``row_scores``, from the shards)
and a link to the same row's anchor on the data audit page (`dataguard.report.fmt.row_anchor`).
Kept rows show on the audit once it is rebuilt with ``dataguard report DATA --training RUN``
(or, rejected as ``training_anomaly``, on the audit of ``dataguard run CONFIG --exclude RUN``). The dynamics summary reads
``dynamics.arrow`` (entries, passes, rows; for classify the share of rows with a negative AUM).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any
from urllib.parse import quote

from dataguard.report.fmt import esc, num, row_anchor

NAMING_KINDS = ("anomaly", "skip", "rollback", "stop")
MAX_ROWS = 200
MAX_SCORES_SHOWN = 8


def named_rows(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One entry per row id the events named: first step, the kinds and causes, its scores."""
    out: dict[str, dict[str, Any]] = {}
    for ev in events:
        if ev.get("kind") not in NAMING_KINDS or not isinstance(ev.get("rows"), list):
            continue
        scores = ev.get("row_scores") if isinstance(ev.get("row_scores"), dict) else {}
        for rid in ev["rows"]:
            entry = out.setdefault(str(rid), {"id": str(rid), "step": ev.get("step"), "kinds": [], "causes": [],
                                              "scores": {}})
            for key, value in (("kinds", ev.get("kind")), ("causes", ev.get("cause"))):
                if value and value not in entry[key]:
                    entry[key].append(str(value))
            if not entry["scores"] and isinstance(scores.get(str(rid)), dict):
                entry["scores"] = scores[str(rid)]
    return list(out.values())


def dynamics_summary(run_dir: Path) -> dict[str, Any] | None:
    """A few figures of ``dynamics.arrow`` (None when the run has none or it is unreadable)."""
    from dataguard.train.dynamics.file import DynamicsFileError, read_dynamics

    try:
        table, meta = read_dynamics(run_dir)
    except DynamicsFileError:
        return None
    ids = table.column("id")
    out = {"entries": table.num_rows, "rows": len(ids.unique()), "source": meta["source"], "task": meta["task"],
           "passes": len(table.column("pass").unique())}
    if table.num_rows and table.column("margin").null_count < table.num_rows:  # a task with classes
        import pyarrow.compute as pc

        aum = table.group_by("id").aggregate([("margin", "mean")]).column("margin_mean")
        out["rows_with_negative_aum"] = int(pc.sum(pc.less(aum, 0)).as_py() or 0)
    return out


def _audit_href(m: dict[str, Any], html_dir: Path) -> str | None:
    audit = (m.get("audit") or {}).get("audit_html")
    if not audit:
        return None
    rel = os.path.relpath(audit, html_dir.resolve())
    return quote(Path(rel).as_posix(), safe="/._-~")


def section(m: dict[str, Any], html_dir: Path) -> str:
    """The HTML of the rows section ('' when no event named a row)."""
    rows = named_rows(m.get("events") or [])
    parts = []
    dyn = m.get("dynamics")
    if dyn:
        parts.append('<p class="lead small">Training dynamics: <code>dynamics.arrow</code> holds '
                     f'{esc(num(dyn["entries"]))} entries for {esc(num(dyn["rows"]))} rows over '
                     f'{esc(num(dyn["passes"]))} passes ({esc(dyn["source"])})'
                     + (f'; {esc(num(dyn["rows_with_negative_aum"]))} rows have a negative AUM'
                        if "rows_with_negative_aum" in dyn else "")
                     + '. Flag them with the <code>noise</code> stage: <code>inputs: dynamics</code>, '
                       f'<code>dynamics: {esc(m["run_dir"])}</code>.</p>')
    if not rows:
        return "".join(parts)
    href = _audit_href(m, html_dir)
    body = []
    for r in rows[:MAX_ROWS]:
        anchor = row_anchor(r["id"])
        rid = (f'<a class="mono" href="{esc(href)}#{esc(anchor)}">{esc(r["id"])}</a>' if href
               else f'<span class="mono">{esc(r["id"])}</span>')
        scores = "; ".join(f"{k} {num(v)}" for k, v in list(r["scores"].items())[:MAX_SCORES_SHOWN])
        body.append(f'<tr class="named-row"><td>{rid}</td><td class="num">{esc(num(r["step"]))}</td>'
                    f'<td>{esc(", ".join(r["kinds"]))}</td><td>{esc(", ".join(r["causes"]))}</td>'
                    f'<td class="txt">{esc(scores or "(no stage scores recorded)")}</td></tr>')
    more = (f'<p class="muted small">First {MAX_ROWS} of {len(rows)} rows; all are in events.jsonl.</p>'
            if len(rows) > MAX_ROWS else "")
    parts.append(f'<p class="lead small">{len(rows)} rows were in the micro-batches of steps the guard called '
                 "anomalous, with their stage scores from the shards. <code>dataguard report DATA --training "
                 f'{esc(m["run_dir"])}</code> adds them to the data audit, each at the anchor linked here; '
                 f'<code>dataguard run CONFIG --exclude {esc(m["run_dir"])}</code> drops them (reason '
                 "<code>training_anomaly</code>), and that run's audit lists them at the same anchors.</p>")
    parts.append('<div class="scroll"><table id="named-rows"><thead><tr><th>row (data audit)</th>'
                 '<th class="num">step</th><th>events</th><th>cause</th><th>stage scores</th></tr></thead>'
                 f'<tbody>{"".join(body)}</tbody></table></div>{more}')
    return "".join(parts)
