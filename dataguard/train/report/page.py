"""The training report: one self-contained HTML page for a training run folder.

Built the same way as the data audit (dataguard/report): static inline SVG, the audit's
stylesheet plus a few rules, no script at all, a Content-Security-Policy that allows only
that stylesheet (by hash) and ``data:`` images, and every piece of text through ``esc``.
It reads only the run folder (and the manifest of the data it trained on), so it can be
rebuilt at any time: ``build_training_report(run_dir)``.

Every input beyond the run folder itself is optional: a run from before the monitor and
the guard (no per-layer fields, no events.jsonl) gets the curves, checkpoints and metrics
it has, and a note for each part that is left out.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any
from urllib.parse import quote

from dataguard.report import svg
from dataguard.report.assets import CSS, csp_hash
from dataguard.report.blocks import render_block, summary_grid, table_html
from dataguard.report.build import _atomic_write
from dataguard.report.fmt import esc, human_bytes, is_number, num, pct, slug, yamlish
from dataguard.report.render import page_head
from dataguard.train.report import rows as report_rows
from dataguard.train.report import svg as report_svg
from dataguard.train.report.page_data import EVENT_KINDS, ReportInputError, collect

__all__ = ["DEFAULT_HTML", "ReportInputError", "build_training_report", "render_training_html"]

DEFAULT_HTML = "training.html"
MAX_HISTOGRAMS = 12
MAX_EVENT_ROWS = 500
MAX_ROW_IDS = 24  # row ids shown per event (all are in events.jsonl)
EXTRA_CSS = """
ul.notes{margin:0 0 12px;padding:8px 12px 8px 28px;background:var(--warnbg);border:1px solid #fde68a;border-radius:8px;font-size:13px}
.evkey{display:flex;flex-wrap:wrap;gap:4px 14px;font-size:12px;color:var(--muted);margin:2px 0 8px}
.evkey b{display:inline-block;width:10px;height:10px;border-radius:2px;margin-right:4px;vertical-align:-1px}
.evkey .k-anomaly{background:#d97706}.evkey .k-skip{background:#94a3b8}.evkey .k-rollback{background:#dc2626}
.evkey .k-stop{background:#111827}.evkey .k-fault{background:#7c3aed}.evkey .k-recovered{background:#059669}
.evkey .k-checkpoint{background:#0891b2}
.badge.ev-anomaly{background:#fef3c7;color:#92400e}.badge.ev-skip{background:#f1f5f9;color:#475569}
.badge.ev-rollback,.badge.ev-stop,.badge.ev-fault{background:var(--badbg);color:var(--bad)}
.badge.ev-recovered{background:var(--okbg);color:var(--ok)}.badge.ev-checkpoint{background:#ecfeff;color:#0e7490}
""".strip()
PAGE_CSS = CSS + "\n" + EXTRA_CSS


def content_security_policy() -> str:
    """No network and no script at all; the one inline stylesheet is allowed by its hash."""
    return (f"default-src 'none'; style-src {csp_hash(PAGE_CSS)}; img-src data:; "
            "base-uri 'none'; form-action 'none'")


class _Page:
    def __init__(self) -> None:
        self.ids: set[str] = set()
        self.toc: list[str] = []
        self.sections: list[str] = []

    def section(self, title: str, body: str, key: str, tag: str = "", group: str | None = None) -> None:
        sid = slug(key, self.ids)
        if group:
            self.toc.append(f'<li class="sec">{esc(group)}</li>')
        self.toc.append(f'<li><a href="#{sid}">{esc(title)}</a></li>')
        tag_html = f'<span class="tag">{esc(tag)}</span>' if tag else ""
        self.sections.append(f'<section class="card" id="{sid}"><h2>{esc(title)}{tag_html}</h2>{body}</section>')


def _muted(text: str) -> str:
    return f'<p class="muted small">{esc(text)}</p>'


def _last(series: list[tuple[int, float]]) -> float | None:
    return series[-1][1] if series else None


# ----------------------------------------------------------------------------- sections
def _overview(m: dict[str, Any]) -> str:
    status = m["status"]
    klass, icon, big = {"completed": ("ok", "✓", "COMPLETED"), "stopped": ("bad", "✗", "STOPPED BY THE GUARD"),
                        "worse_than_best": ("bad", "!", "COMPLETED, WORSE THAN ITS BEST"),
                        "incomplete": ("unknown", "…", "INCOMPLETE")}[status]
    ec = m["event_counts"]
    total = m.get("total_steps")
    line = f"step {num(m.get('last_step'))} of {num(total)}"
    if ec["rollback"]:
        line += f" · {ec['rollback']} rollback(s)"
    warning = m["run"].get("final_warning") if isinstance(m.get("run"), dict) else None
    if warning:
        line += f" · {warning}"
    verdict = (f'<div class="verdict {klass}" id="status" data-status="{esc(status)}"><div class="icon">{icon}</div>'
               f'<div><div class="big">{big}</div><div class="eq">{esc(line)}</div></div></div>')
    best = m.get("best") or {}
    eval_loss = m["eval_series"].get("eval_loss") or []
    kpis = [("Steps", num(m.get("last_step")), ""), ("Final loss", num(_last(m["series"]["loss"])), ""),
            ("Best eval loss", num(best.get("eval_loss") if best else (min(v for _, v in eval_loss)
                                                                       if eval_loss else None)), "kept"),
            ("Skipped steps", num(max(m["skipped_steps"], ec["skip"])), "rej" if m["skipped_steps"] else ""),
            ("Anomalies", num(ec["anomaly"]), "rej" if ec["anomaly"] else ""),
            ("Rollbacks", num(ec["rollback"]), "rej" if ec["rollback"] else ""),
            ("Checkpoints", num(sum(1 for c in m["checkpoints"] if c["complete"])), "")]
    kpi_html = "".join(f'<div class="kpi {k}"><div class="v">{esc(v)}</div><div class="k">{esc(t)}</div></div>'
                       for t, v, k in kpis)
    cfg = m.get("config") or {}
    facts = {k: cfg.get(k) for k in ("task", "model", "data", "device", "precision", "lr", "batch_size",
                                     "grad_accum", "max_steps", "seed") if cfg.get(k) is not None}
    run = m.get("run") or {}
    for k in ("train_examples", "val_examples", "warmup_steps", "max_length"):
        if run.get(k) is not None:
            facts[k] = run[k]
    notes = "".join(f"<li>{esc(n)}</li>" for n in m["notes"] + [str(n) for n in run.get("notes") or []])
    notes_html = f'<h3>Notes</h3><ul class="notes" id="notes">{notes}</ul>' if notes else ""
    return f"{verdict}<div class=\"kpis\">{kpi_html}</div>{summary_grid(facts)}{notes_html}"


def _diagnosis(d: Any) -> str:
    if not isinstance(d, dict):
        return f"<pre>{esc(yamlish(d))}</pre>"
    scalars = {k: v for k, v in d.items() if not isinstance(v, list | dict)}
    rows = d.get("rows") if isinstance(d.get("rows"), list) else None
    rest = {k: v for k, v in d.items() if isinstance(v, list | dict) and k not in ("rows", "events")}
    parts = [_muted("Written when the guard stopped the run: where it went wrong first, and the data rows in the "
                    "bad batches (by id)."), summary_grid(scalars)]
    if rows is not None:
        parts.append(f"<h3>Rows in the bad batches ({len(rows)})</h3>"
                     f'<pre class="rows" id="diagnosis-rows">{esc(chr(10).join(str(r) for r in rows))}</pre>')
    if isinstance(d.get("events"), list):
        parts.append(_muted(f"The diagnosis lists {len(d['events'])} event(s); they are in the Events section."))
    if rest:
        parts.append(f"<pre>{esc(yamlish(rest))}</pre>")
    return "".join(parts)


def _event_key(kinds: set[str]) -> str:
    items = [f'<span><b class="k-{k}"></b>{esc(k)}</span>' for k in EVENT_KINDS if k in kinds]
    return f'<div class="evkey">{"".join(items)}</div>' if items else ""


def _curves(m: dict[str, Any]) -> str:
    s, events = m["series"], [e for e in m["events"] if e.get("kind") != "checkpoint"]
    if not m["train"]:
        return _muted("No step records in metrics.jsonl.")
    steps = [st for st, _ in s["loss"] or s["grad_norm"] or s["lr"]]
    xr = (min(steps), max(steps)) if steps else None
    parts = [_event_key({str(e.get("kind")) for e in events})]
    loss = {"train loss": s["loss"]}
    if m["eval_series"].get("eval_loss"):
        loss["eval loss"] = m["eval_series"]["eval_loss"]
    parts.append('<div class="block" id="curve-loss"><h3>Loss</h3>'
                 + report_svg.line_chart(loss, events, title="Loss by step", y_label="loss", x_range=xr) + "</div>")
    lr = {f"lr {k}": v for k, v in m["lr_groups"].items()} or {"lr": s["lr"]}
    if any(lr.values()):
        parts.append('<div class="block" id="curve-lr"><h3>Learning rate</h3>'
                     + report_svg.line_chart(lr, events, title="Learning rate by step", y_label="lr", x_range=xr)
                     + "</div>")
    if s["grad_norm"]:
        parts.append('<div class="block" id="curve-grad-norm"><h3>Gradient norm (before clipping)</h3>'
                     + report_svg.line_chart({"grad norm": s["grad_norm"]}, events, title="Global gradient norm",
                                             y_label="grad norm", log_y=True, x_range=xr) + "</div>")
    if s["amp_scale"]:
        parts.append('<div class="block" id="curve-amp"><h3>AMP loss scale</h3>'
                     + report_svg.line_chart({"scale": s["amp_scale"]}, events, title="AMP loss scale",
                                             y_label="scale", log_y=True, x_range=xr) + "</div>")
    big = {k: s[k] for k in ("n_big_grads", "n_big_weights") if s[k]}
    if big and not any(v for series in big.values() for _, v in series):
        parts.append(_muted("No parameter had |grad| > 1e5 or |weight| > 1e6 at any monitored step."))
    elif big:
        parts.append('<div class="block" id="curve-big"><h3>Parameters with |grad| &gt; 1e5 / weights &gt; 1e6</h3>'
                     + report_svg.line_chart(big, events, title="Large gradients and weights", y_label="count",
                                             x_range=xr) + "</div>")
    if m["nonfinite_steps"]:
        parts.append(f'<p class="small">Non-finite loss at step(s) {esc(", ".join(map(str, m["nonfinite_steps"][:50])))}'
                     " (red ✕ above the chart).</p>")
    return "".join(parts)


def _events(m: dict[str, Any]) -> str:
    events = m["events"]
    if not events:
        return _muted("No events: no anomaly, skip, rollback or stop was recorded.") if m["have_events"] else \
            _muted("No events.jsonl in this run folder, and no skipped step in metrics.jsonl.")
    counts = {k: v for k, v in m["event_counts"].items() if v}
    rows = []
    for ev in events[:MAX_EVENT_ROWS]:
        kind = str(ev.get("kind"))
        ids = ev.get("rows")
        if isinstance(ids, list):
            rows_text = ", ".join(str(r) for r in ids[:MAX_ROW_IDS])
            rows_text += f" … (+{len(ids) - MAX_ROW_IDS} more)" if len(ids) > MAX_ROW_IDS else ""
        else:
            rows_text = "" if ids is None else str(ids)
        detail = ev.get("detail")
        detail_text = yamlish(detail) if isinstance(detail, dict | list) else ("" if detail is None else str(detail))
        cls = f"ev-{kind}" if kind in EVENT_KINDS else ""
        rows.append(f'<tr class="event"><td class="num">{esc(num(ev.get("step")))}</td>'
                    f'<td><span class="badge {cls}">{esc(kind)}</span></td><td>{esc(ev.get("cause") or "")}</td>'
                    f'<td class="mono">{esc(ev.get("layer") or "")}</td><td class="txt">{esc(detail_text)}</td>'
                    f'<td class="mono">{esc(rows_text)}</td><td class="num">{esc(num(ev.get("lr")) if is_number(ev.get("lr")) else "")}</td></tr>')
    more = _muted(f"First {MAX_EVENT_ROWS} of {len(events)} events shown; all are in events.jsonl.") \
        if len(events) > MAX_EVENT_ROWS else ""
    table = ('<div class="scroll"><table id="events-table"><thead><tr><th class="num">step</th><th>kind</th>'
             '<th>cause</th><th>layer</th><th>detail</th><th>rows (ids)</th><th class="num">lr</th></tr></thead>'
             f'<tbody>{"".join(rows)}</tbody></table></div>')
    return summary_grid(counts) + table + more


def _heat(m: dict[str, Any], key: str, label: str, note: str) -> str:
    mat = m[key]
    chart, scale = report_svg.heatmap(mat["steps"], mat["layers"], mat["values"], m["events"],
                                      title=f"{label} per layer over steps", value_label=label)
    grouped = (f" Each column groups {scale['groups']} logged steps and shows their maximum."
               if scale.get("groups", 1) > 1 else "")
    return (f"{chart}{report_svg.ramp_legend(scale['lo'], scale['hi'], label)}"
            f'<p class="axis-note">{esc(note + grouped)} Hover a cell for its value; rollbacks and anomalies are '
            "marked above the columns.</p>")


def _layer_norms(m: dict[str, Any]) -> str:
    mat = m["layer_norms"]
    latest = {name: row[-1] for name, row in zip(mat["layers"], mat["values"], strict=True)}
    top = sorted(((v, k) for k, v in latest.items() if v is not None),
                 key=lambda t: (math.isfinite(t[0]), -t[0] if math.isfinite(t[0]) else 0.0))[:10]
    return (_heat(m, "layer_norms", "grad norm", f"{len(mat['layers'])} layers × {len(mat['steps'])} logged steps.")
            + "<h3>Largest layer gradient norms at the last logged step</h3>"
            + table_html(["layer", "grad norm"], [[k, v] for v, k in top]))


def _update_ratios(m: dict[str, Any]) -> str:
    parts = []
    ur = m["update_ratios"]
    if ur:
        latest = [row[-1] if row[-1] is not None and math.isfinite(row[-1]) else 0.0 for row in ur["values"]]
        med = []
        for row in ur["values"]:
            vals = sorted(v for v in row if v is not None and math.isfinite(v))
            med.append(vals[len(vals) // 2] if vals else 0.0)
        parts.append(_muted(f"‖ΔW‖ / ‖W‖ after the step, per layer (a healthy run is often near 1e-3). "
                            f"Latest logged step {ur['steps'][-1]}, and the median over the run."))
        parts.append(svg.bars(ur["layers"], {"latest": latest, "median": med}))  # non-finite drawn as 0
        parts.append(_heat(m, "update_ratios", "update ratio", "Update ratio over steps."))
    gs = m["grad_std_ratio"]
    if gs:
        rows = [[name, row[-1]] for name, row in zip(gs["layers"], gs["values"], strict=True)]
        parts.append(f"<h3>grad.std / param.std (step {esc(gs['steps'][-1])})</h3>" + table_html(["layer", "ratio"], rows))
    return "".join(parts)


def _histograms(m: dict[str, Any]) -> str:
    h = m["histograms"]
    layers = list(h["layers"].items())
    if not layers:
        return _muted("histograms.jsonl has no usable histogram (edges and counts) at its last step.")
    blocks = [render_block({"type": "histogram", "title": name, "edges": v["edges"],
                            "series": {"parameters": v["counts"]}, "x_label": h["x_label"],
                            "y_label": "parameters"}, compact=True)
              for name, v in layers[:MAX_HISTOGRAMS]]
    more = _muted(f"First {MAX_HISTOGRAMS} of {len(layers)} layers shown; all are in histograms.jsonl.") \
        if len(layers) > MAX_HISTOGRAMS else ""
    return (_muted(f"Gradient histograms at step {h['step']} (the latest of {h['snapshots']} snapshot(s)).")
            + f'<div class="grid2 multiples">{"".join(blocks)}</div>{more}')


def _checkpoints(m: dict[str, Any]) -> str:
    cks = m["checkpoints"]
    if not cks:
        return _muted("No checkpoint folder.")
    rows = []
    for c in cks:
        marks = []
        if c["best"]:
            marks.append('<span class="badge ok">best</span>')
        if c["complete"]:
            marks.append('<span class="badge pass">complete</span>')
        else:
            marks.append('<span class="badge warn">incomplete</span>')
        rows.append(f'<tr class="ckpt" data-complete="{"1" if c["complete"] else "0"}"><td class="mono">{esc(c["name"])}</td>'
                    f'<td class="num">{esc(num(c["step"]))}</td><td class="num">{esc(human_bytes(c["bytes"]))}</td>'
                    f'<td>{" ".join(marks)}</td><td>{esc(num(bool(c["has_weights"])))}</td></tr>')
    return (_muted("Only complete checkpoints (with a COMPLETE marker) are ever read back; rotation keeps the "
                   "newest and the best.")
            + '<div class="xscroll"><table id="checkpoints-table"><thead><tr><th>checkpoint</th><th class="num">step</th>'
              '<th class="num">size</th><th>status</th><th>weights</th></tr></thead><tbody>'
            + "".join(rows) + "</tbody></table></div>")


def _final(m: dict[str, Any]) -> str:
    parts = []
    best = m.get("best")
    if best:
        parts.append("<h3>Best checkpoint (best.json)</h3>" + summary_grid(best))
    final = {}
    if m["train"]:
        last = m["train"][-1]
        final = {k: v for k, v in last.items() if not isinstance(v, list | dict)}
    if final:
        parts.append("<h3>Last training step</h3>" + summary_grid(final))
    if m["eval"]:
        parts.append("<h3>Last evaluation</h3>" + summary_grid(m["eval"][-1]))
    run = m.get("run") or {}
    rest = {k: run[k] for k in ("total_steps", "split", "dropped", "lora", "classes") if run.get(k) is not None}
    if rest:
        parts.append("<h3>Run (run.json)</h3>" + summary_grid(rest))
    groups = run.get("param_groups")
    if isinstance(groups, list) and groups and all(isinstance(g, dict) for g in groups):
        cols = [c for c in ("kind", "rule", "lr", "lr_mult", "weight_decay", "tensors", "params") if c in groups[0]]
        parts.append("<h3>Parameter groups</h3>" + table_html(cols, [[g.get(c) for c in cols] for g in groups]))
    return "".join(parts) or _muted("No best.json, run.json or metrics to show.")


def _audit(m: dict[str, Any], html_dir: Path) -> str:
    a = m.get("audit")
    if not a:
        return _muted("The run config names no data folder.")
    if not a.get("found"):
        return _muted(f"Data folder {a['data']}: manifest.json not found from here.")
    c = a.get("counts") or {}
    parts = [f'<p class="lead">Trained on <code>{esc(a["data"])}</code>: '
             f'{esc(num(c.get("rows_in")))} rows in, {esc(num(c.get("rows_kept")))} kept, '
             f'{esc(num(c.get("rows_rejected")))} rejected ({esc(pct(c.get("rows_rejected"), c.get("rows_in")))}).</p>']
    if a.get("audit_html"):
        rel = os.path.relpath(a["audit_html"], html_dir.resolve())
        href = quote(Path(rel).as_posix(), safe="/._-~")  # percent-encoded: never a scheme such as javascript:
        parts.append(f'<p><a id="audit-link" href="{esc(href)}">Open the data audit ({esc(Path(rel).name)})</a> '
                     f'<span class="muted small">— every rejected row with its reason</span></p>')
    else:
        parts.append(_muted("No audit.html found beside the data (rebuild it with `dataguard report DATA`)."))
    if is_number(c.get("rows_kept")) and is_number(c.get("rows_rejected")):
        segs = [("kept", c["rows_kept"], "#2563eb")] + [(f"{r['reason']} ({r['stage']})", r["count"], None)
                                                        for r in a["reasons"] if r["count"]]
        parts.append(svg.share_bar(segs))
    if a["reasons"]:
        parts.append("<h3>Rejected rows by reason</h3>" + table_html(
            ["reason", "stage", "rows", "of input"],
            [[r["reason"], r["stage"], r["count"], pct(r["count"], c.get("rows_in"))] for r in a["reasons"]]))
    if a.get("stages"):
        parts.append("<h3>Stages</h3>" + table_html(["stage", "rows in", "kept", "rejected"],
                                                   [[s["name"], s["rows_in"], s["rows_kept"], s["rows_rejected"]]
                                                    for s in a["stages"]]))
    return "".join(parts)


def render_training_html(m: dict[str, Any], html_dir: Path | None = None) -> str:
    """The complete page for a report model (see report_model.collect)."""
    html_dir = html_dir or Path(m["run_dir"])
    page = _Page()
    page.section("Overview", _overview(m), "overview", group="Run")
    if m.get("diagnosis"):
        page.section("Diagnosis", _diagnosis(m["diagnosis"]), "diagnosis", tag="diagnosis.json")
    page.section("Curves", _curves(m), "curves", tag="metrics.jsonl", group="Training")
    page.section("Events", _events(m), "events",
                 tag="events.jsonl" if m["have_events"] else "derived from metrics.jsonl")
    if rows_html := report_rows.section(m, html_dir):  # the rows anomalies named; the dynamics file
        page.section("Rows and dynamics", rows_html, "named-rows", tag="events.jsonl, dynamics.arrow")
    if m["layer_norms"]:
        page.section("Per-layer gradient norms", _layer_norms(m), "layer-norms")
    if m["update_ratios"] or m["grad_std_ratio"]:
        page.section("Update ratios", _update_ratios(m), "update-ratios")
    if m["histograms"]:
        page.section("Gradient histograms", _histograms(m), "histograms", tag="histograms.jsonl")
    page.section("Checkpoints", _checkpoints(m), "checkpoints", group="Results")
    page.section("Final metrics", _final(m), "final")
    page.section("Data audit", _audit(m, html_dir), "data-audit", group="Data")
    if m.get("config"):
        page.section("Config", f"<pre>{esc(yamlish(m['config']))}</pre>", "config")
    title = "dataguard training"
    cfg = m.get("config") or {}
    sub = " · ".join(esc(x) for x in (m["run_dir"], cfg.get("model"), cfg.get("task")) if x)
    return (
        page_head(content_security_policy(), f"{title} · {m['status']} · step {num(m.get('last_step'))}",
                  PAGE_CSS, title, sub)
        + f'<div class="layout"><nav class="toc" aria-label="Contents"><ol>{"".join(page.toc)}</ol></nav>'
        f'<main>{"".join(page.sections)}<footer>Generated by dataguard from the run folder (metrics.jsonl, '
        "events.jsonl, histograms.jsonl, run.json, best.json, checkpoints/) and the data manifest. "
        "Self-contained: no script, no network access.</footer></main></div></body></html>\n"
    )


def build_training_report(run_dir: str | os.PathLike, html_path: str | os.PathLike | None = None) -> Path:
    """Write the self-contained HTML training report of ``run_dir`` (default
    ``run_dir/training.html``, written atomically) and return its path. Raises
    ``ReportInputError`` when ``run_dir`` is not a training run folder."""
    run_dir = Path(run_dir)
    html_file = Path(html_path) if html_path is not None else run_dir / DEFAULT_HTML
    model = collect(run_dir)
    from dataguard.io.output import register_extra_output

    register_extra_output(run_dir, html_file)
    _atomic_write(html_file, render_training_html(model, html_file.parent))
    return html_file
