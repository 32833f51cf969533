"""The audit's "Rows named by training" section (``dataguard report OUTPUT --training RUN``).

A training run's guard names the rows of every anomalous step (``RUN/events.jsonl``); most of
them are rows this pipeline *kept*, which the audit otherwise never shows. Given the run
folders, this section looks those rows up in the kept shards and shows each one (its
conversation, label and stage scores) at the anchor the training page links to
(`dataguard.report.fmt.row_anchor`), beside the step and cause that named it. A row the
next run rejected with ``--exclude`` shows among that run's rejected samples at the same anchor.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from dataguard.report.fmt import esc, num, row_anchor
from dataguard.report.records import render_record, snippet
from dataguard.train.dynamics.rows import NOT_SCORES, quarantined

MAX_ROWS = 500
MAX_TEXT = 4000


def _record(row: dict[str, Any]) -> dict[str, Any]:
    messages = [{"role": str(m.get("role")), "content": str(m.get("content") or "")[:MAX_TEXT]}
                for m in row.get("messages") or []]
    scores = {k: v for k, v in row.items() if k not in NOT_SCORES and not isinstance(v, list | dict | bytes)
              and v is not None and not k.endswith("_embedding")}
    return {"kind": "row", "messages": messages, "label": row.get("label"), "scores": scores}


def collect_named(output_dir: Path, runs: list[str]) -> list[dict[str, Any]]:
    """The kept rows the runs' guards named, in the order the events name them."""
    named: dict[str, dict[str, Any]] = {}
    for run in runs:
        for rid, why in quarantined(run).items():
            named.setdefault(rid, {"id": rid, "run": str(run), **why})
    if not named:
        return []
    from dataguard.io.writer import read_table

    manifest = json.loads((output_dir / "manifest.json").read_text(encoding="utf-8"))
    wanted = pa.array(list(named), pa.string())
    found: dict[str, dict[str, Any]] = {}
    for entry in manifest["outputs"]["data"]:
        table = read_table(output_dir / entry["path"])
        for row in table.filter(pc.is_in(table.column("id"), value_set=wanted)).to_pylist():
            found[str(row["id"])] = row
    out = []
    for rid, info in list(named.items())[:MAX_ROWS]:
        row = found.get(rid)
        out.append({**info, "kept": row is not None, "record": _record(row) if row is not None else None})
    return out


def section(rows: list[dict[str, Any]], ids: set[str]) -> str:
    """The section's HTML: one expandable sample per named row, anchored for the training page."""
    items = []
    for r in rows:
        anchor = row_anchor(r["id"])
        aid = f' id="{esc(anchor)}"' if anchor not in ids else ""
        ids.add(anchor)
        why = f"named by {r['run']} at step {num(r.get('step'))} ({r.get('cause')})"
        if r["record"] is None:
            items.append(f'<div class="sample"{aid}><span class="sid">{esc(r["id"])}</span> '
                         f'<span class="muted small">{esc(why)}; not among this output\'s kept rows</span></div>')
            continue
        items.append(f'<details class="sample"{aid}><summary><span class="sid">{esc(r["id"])}</span>'
                     f'<span class="sdet">{esc(why)}</span><span class="snip">{esc(snippet(r["record"]))}</span>'
                     f'</summary><div class="rec">{render_record(r["record"])}</div></details>')
    return (f'<p class="lead small">{len(rows)} rows named by the training guard (anomalous steps), with their '
            "stage scores; <code>dataguard run CONFIG --exclude RUN</code> drops them.</p>" + "".join(items))
