"""Render the report model (see load.py) as one self-contained HTML page.

No external resource of any kind: one inline <style> and one inline <script>, both
allowed by hash in a Content-Security-Policy that forbids everything else (network,
frames, forms, inline event handlers). Every piece of dataset text passes through
``esc``; the script never turns data into code.
"""

from __future__ import annotations

from typing import Any

from dataguard.report import svg, training_rows
from dataguard.report.assets import CSS, JS, content_security_policy
from dataguard.report.blocks import render_block, summary_grid, table_html
from dataguard.report.fmt import (
    esc,
    human_bytes,
    human_seconds,
    is_number,
    num,
    pct,
    row_anchor,
    slug,
    yamlish,
)
from dataguard.report.records import render_record, snippet

STAGE_NOTES = {
    "normalize": "Maps each source format to canonical conversations; rows that fit no format or break the "
                 "role order are rejected with their raw text.",
    "dedup": "Exact duplicate conversations.",
    "near_dedup": "Near duplicates: MinHash LSH over word or character shingles, candidates checked with the "
                  "exact Jaccard, one row kept per cluster.",
    "semantic_dedup": "Semantic duplicates: the same prompt in another template or source, by sentence-embedding "
                      "cosine.",
    "language": "Language identification: rows in a language the run does not want.",
    "consistency": "Semantic agreement between prompt and response (sentence-embedding similarity); rows far "
                   "below the dataset's own distribution are flagged.",
    "length": "Token-length cap from a global percentile of the whole input; over-long conversations are "
              "truncated (oldest turns first) or dropped.",
    "quality": "Repetition and URL scores on the prompt and response sides, each with its own threshold.",
    "overlap": "Token n-gram overlap with reference sets (benchmarks, validation split): contamination and leakage.",
    "noise": "Confident learning on out-of-sample class probabilities: likely label errors.",
    "longtail": "Class priors, logit offsets and sample weights for long-tailed labels, and the curriculum.",
    "drift": "Distribution shift against a reference: PSI and KL per column, an MMD test and a domain "
             "classifier, each with a verdict.",
}


class _Page:
    """Accumulates sections and the table of contents."""

    def __init__(self) -> None:
        self.ids: set[str] = set()
        self.toc: list[str] = []
        self.sections: list[str] = []

    def section(self, title: str, body: str, key: str, tag: str = "", toc_extra: str = "",
                group: str | None = None) -> str:
        sid = slug(key, self.ids)
        if group:
            self.toc.append(f'<li class="sec">{esc(group)}</li>')
        extra = f'<span class="n">{toc_extra}</span>' if toc_extra else ""
        self.toc.append(f'<li><a href="#{sid}">{esc(title)}{extra}</a></li>')
        tag_html = f'<span class="tag">{esc(tag)}</span>' if tag else ""
        self.sections.append(f'<section class="card" id="{sid}"><h2>{esc(title)}{tag_html}</h2>{body}</section>')
        return sid


def _overview(m: dict[str, Any]) -> str:
    c = m["counts"]
    ok = m.get("nothing_lost")
    klass, icon, big = {True: ("ok", "✓", "NOTHING LOST"), False: ("bad", "✗", "ROWS UNACCOUNTED FOR"),
                        None: ("unknown", "?", "NOT VERIFIABLE")}[ok]
    eq = (f"{num(c.get('rows_in'))} rows in = {num(c.get('rows_kept'))} kept + {num(c.get('rows_rejected'))} rejected"
          if ok else next((ch["detail"] for ch in m["checks"] if ch["ok"] is False), "counts missing"))
    verdict = (f'<div class="verdict {klass}" id="verdict" data-verdict="{klass}"><div class="icon">{icon}</div>'
               f'<div><div class="big">{big}</div><div class="eq">{esc(eq)}</div></div></div>')
    run = m.get("run") or {}
    kpis = [("Rows in", num(c.get("rows_in")), ""), ("Kept", num(c.get("rows_kept")), "kept"),
            ("Rejected", num(c.get("rows_rejected")), "rej"),
            ("Reject rate", pct(c.get("rows_rejected"), c.get("rows_in")), ""),
            ("Run time", human_seconds(run.get("seconds")), ""),
            ("Inputs", num(len(m.get("inputs") or [])), ""), ("Stages", num(len(m.get("stages") or [])), "")]
    kpi_html = "".join(f'<div class="kpi {k}"><div class="v">{esc(v)}</div><div class="k">{esc(t)}</div></div>'
                       for t, v, k in kpis)
    share = ""
    stages = m.get("stages") or []
    if stages and all(is_number(s.get("rows_rejected")) for s in stages) and is_number(c.get("rows_kept")):
        segs = [("kept", c["rows_kept"], "#2563eb")] + [(f"rejected by {s['name']}", s["rows_rejected"], None)
                                                        for s in stages if s["rows_rejected"]]
        share = f'<h3>Where the rows went</h3>{svg.share_bar(segs)}'
    checks = []
    for ch in m["checks"]:
        mark, cls = {True: ("✓", "ok"), False: ("✗", "bad"), None: ("?", "na")}[ch["ok"]]
        checks.append(f'<li><span class="ck {cls}">{mark}</span>{esc(ch["name"])} '
                      f'<span class="muted small">— {esc(ch["detail"])}</span></li>')
    when = ""
    if run.get("started"):
        when = (f'<p class="lead">Run started {esc(run.get("started"))}'
                f'{", finished " + esc(run.get("finished")) if run.get("finished") else ""}.</p>')
    return (f'{verdict}<div class="kpis">{kpi_html}</div>{when}{share}<h3>Nothing-lost checks</h3>'
            f'<ul class="checks">{"".join(checks)}</ul>')


def _inputs(m: dict[str, Any]) -> str:
    inputs = m.get("inputs") or []
    if not inputs:
        return '<p class="muted">No inputs recorded.</p>'
    show_fmts = any(i.get("formats_detected") for i in inputs)
    rows = []
    for i in inputs:
        fmts = i.get("formats_detected") or {}
        fmt_text = ", ".join(f"{k}: {num(v)}" for k, v in fmts.items()) if isinstance(fmts, dict) else str(fmts)
        cells = [f"<td><b>{esc(i.get('name'))}</b><div class=\"mono muted\">{esc(i.get('path'))}</div></td>",
                 f"<td>{esc(i.get('format'))}{' (' + esc(i['reader']) + ')' if i.get('reader') else ''}</td>"]
        if show_fmts:
            cells.append(f"<td>{esc(fmt_text) or '—'}</td>")
        cells += [f'<td class="num">{esc(num(i.get("rows")))}</td>', f'<td class="num">{esc(human_bytes(i.get("bytes")))}</td>',
                  f'<td class="mono">{esc(i.get("sha256"))}</td>']
        rows.append("<tr>" + "".join(cells) + "</tr>")
    head = ("<tr><th>input</th><th>format</th>" + ("<th>formats detected</th>" if show_fmts else "")
            + "<th class=\"num\">rows</th><th class=\"num\">size</th><th>sha256</th></tr>")
    return f'<div class="xscroll"><table><thead>{head}</thead><tbody>{"".join(rows)}</tbody></table></div>'


def _outputs(m: dict[str, Any]) -> str:
    out = []
    for kind, label in (("data", "Kept shards"), ("rejected", "Rejected shards")):
        files = (m.get("outputs") or {}).get(kind) or []
        if not files:
            continue
        rows = [[f.get("path"), f.get("rows"), human_bytes(f.get("bytes")), f.get("sha256")] for f in files]
        total_rows = sum(int(f.get("rows") or 0) for f in files)
        total_bytes = sum(int(f.get("bytes") or 0) for f in files)
        out.append(f"<details><summary>{esc(label)}: {len(files)} file(s), {esc(num(total_rows))} rows, "
                   f"{esc(human_bytes(total_bytes))}</summary>{table_html(['path', 'rows', 'size', 'sha256'], rows)}</details>")
    return "".join(out)


def _funnel(m: dict[str, Any]) -> str:
    stages = m.get("stages") or []
    if not stages:
        return '<p class="muted">No stages ran.</p>'
    steps = [{"name": s["name"], "rows_in": s.get("rows_in"), "rows_kept": s.get("rows_kept"),
              "rows_rejected": s.get("rows_rejected")} for s in stages]
    total = m["counts"].get("rows_in") or stages[0].get("rows_in") or 0
    chart = svg.funnel(steps, total)
    rows = [[s["name"], s.get("rows_in"), s.get("rows_kept"), s.get("rows_rejected"),
             pct(s.get("rows_rejected"), s.get("rows_in")), human_seconds(s.get("seconds"))] for s in stages]
    return chart + table_html(["stage", "rows in", "kept", "rejected", "rejected %", "time (all workers)"], rows)


def _reasons(m: dict[str, Any], ids: set[str]) -> str:
    reasons = m.get("reasons") or []
    if not reasons:
        return '<p class="muted">No row was rejected.</p>'
    rows_in = m["counts"].get("rows_in")
    cmax = max((r["count"] or 0) for r in reasons) or 1
    table_rows = []
    groups = []
    for r in reasons:
        rid = slug(f"reason-{r['stage']}-{r['reason']}", ids)
        r["_anchor"] = rid
        cnt = r["count"]
        table_rows.append(
            f'<tr><td><a href="#{rid}"><code>{esc(r["reason"])}</code></a></td><td>{esc(r["stage"])}</td>'
            f'<td class="num">{esc(num(cnt))}</td><td class="num">{esc(pct(cnt, rows_in))}</td>'
            f'<td>{svg.meter(cnt or 0, cmax)}</td></tr>')
        samples = r.get("samples") or []
        first_detail = next((s["detail"] for s in samples if s.get("detail")), "")
        items = []
        for s in samples:
            rec = s.get("record") or {}
            det = f'<div class="det">{esc(s.get("detail"))}</div>' if s.get("detail") else ""
            anchor = row_anchor(s.get("id"))  # the training page links rows here (--exclude, #27)
            aid = f' id="{esc(anchor)}"' if s.get("id") is not None and anchor not in ids else ""
            ids.add(anchor)
            items.append(
                f'<details class="sample"{aid}><summary><span class="sid">{esc(s.get("id"))}</span>'
                f'<span class="sdet">{esc(_short(s.get("detail") or "", 70))}</span><span class="snip">{esc(snippet(rec))}'
                f'</span></summary><div class="rec">{det}<div class="small muted">source: {esc(s.get("source"))}</div>'
                f'{render_record(rec, s.get("detail") or "")}</div></details>')
        shown = (f'<p class="example-detail">Showing {len(samples)} of {esc(num(cnt))} rows.'
                 f'{" e.g. “" + esc(first_detail) + "”" if first_detail else ""}</p>') if samples else \
            '<p class="example-detail">No sample rows found in the rejected shards.</p>'
        groups.append(
            f'<details class="reason" id="{rid}"><summary><span class="rc">{esc(r["reason"])}</span>'
            f'<span class="muted small">{esc(r["stage"])}</span><span class="cnt">{esc(num(cnt))}</span>'
            f'<span class="share">{esc(pct(cnt, rows_in))}</span></summary><div class="body">{shown}'
            f'{"".join(items)}</div></details>')
    table = ('<div class="xscroll"><table><thead><tr><th>reason</th><th>stage</th><th class="num">rows</th>'
             '<th class="num">of input</th><th></th></tr></thead><tbody>' + "".join(table_rows) + "</tbody></table></div>")
    scan = m.get("rejected_scan") or {}
    toolbar = ('<div class="toolbar" id="sample-toolbar" hidden><input id="sample-search" type="search" '
               'placeholder="Search sample rows: id, text, reason, detail…" aria-label="Search sample rows">'
               '<button type="button" id="expand-all">Expand all</button>'
               '<button type="button" id="collapse-all">Collapse all</button><span class="count" id="sample-count">'
               '</span></div>')
    note = (f'<p class="lead small">Up to {esc(num(scan.get("per_reason")))} sample rows per reason, read from '
            f'{esc(num(scan.get("rows_read")))} rejected rows{"" if scan.get("complete") else " (reading stopped once every reason had its samples)"}. '
            "All rows are in the <code>rejected/</code> shards.</p>")
    return f"{table}<h3>Sample rejected rows</h3>{note}{toolbar}{''.join(groups)}"


def _stage(s: dict[str, Any], reason_anchor: dict[tuple[str, str], str]) -> str:
    head = [f"rows in <b>{esc(num(s.get('rows_in')))}</b>", f"kept <b>{esc(num(s.get('rows_kept')))}</b>",
            f"rejected <b>{esc(num(s.get('rows_rejected')))}</b> ({esc(pct(s.get('rows_rejected'), s.get('rows_in')))})"]
    if s.get("seconds") is not None:
        head.append(f"time <b>{esc(human_seconds(s.get('seconds')))}</b>")
    chips = []
    for reason, count in (s.get("reasons") or {}).items():
        anchor = reason_anchor.get((str(s["name"]), str(reason)))
        code = f"<code>{esc(reason)}</code>"
        chips.append((f'<a href="#{anchor}">{code}</a>' if anchor else code) + f" {esc(num(count))}")
    lead = STAGE_NOTES.get(str(s.get("name")))
    parts = [f'<div class="stagehead">{"<span>" + "</span><span>".join(head) + "</span>"}</div>']
    if lead:
        parts.append(f'<p class="lead">{esc(lead)}</p>')
    if chips:
        parts.append(f'<div class="reasons-inline">Reasons: {" · ".join(chips)}</div>')
    parts.append(summary_grid(s.get("summary") or {}))
    parts.extend(_blocks(s.get("blocks") or []))
    return "".join(parts)


def _blocks(blocks: list[dict]) -> list[str]:
    """Render blocks in order; a run of 2+ histograms becomes a two-column grid of compact
    charts (small multiples), so a stage with many score distributions stays scannable."""
    out: list[str] = []
    i = 0
    while i < len(blocks):
        j = i
        while j < len(blocks) and blocks[j].get("type") == "histogram":
            j += 1
        if j - i >= 2:
            out.append('<div class="grid2 multiples">' + "".join(render_block(b, compact=True) for b in blocks[i:j])
                       + "</div>")
            i = j
        else:
            out.append(render_block(blocks[i]))
            i += 1
    return out


def _pairs(m: dict[str, Any]) -> str:
    """Preference runs: the balance of chosen vs rejected responses that stages measured
    (length by the normalizer, quality rules by the quality stage), in one section."""
    parts = []
    for s in m.get("stages") or []:
        pairs = s.get("pairs")
        if isinstance(pairs, dict):
            parts.append(f"<h3>{esc(str(pairs.get('title') or s.get('name')))}</h3>"
                         + summary_grid(pairs.get("summary") or {})
                         + "".join(_blocks([b for b in pairs.get("blocks") or [] if isinstance(b, dict)])))
    if not parts:
        return ""
    return ('<p class="lead">Length is the known confound of preference data: a policy trained on pairs whose '
            "chosen response is mostly the longer one learns length as much as the preference.</p>" + "".join(parts))


def _short(text: str, n: int = 140) -> str:
    text = " ".join(str(text or "").split())
    return text if len(text) <= n else text[: n - 1] + "…"


def _kept(m: dict[str, Any]) -> str:
    prev = m.get("kept_preview")
    if not prev:
        return ""
    cols = ["id", "source", "label"]
    extra = [c for c in prev["columns"] if c not in cols]
    rows = []
    for r in prev["rows"]:
        v = r["values"]
        rows.append([v.get("id"), v.get("source"), v.get("label"), r["turns"], _short(r["prompt"]), _short(r["response"])]
                    + [v.get(c) for c in extra])
    return (f'<p class="lead small">First {len(rows)} rows of <code>{esc(prev["shard"])}</code>, with the score '
            f"columns the stages added.</p>" + table_html(cols + ["turns", "prompt", "response"] + extra, rows,
                                                           wide=(4, 5)))


def _config(m: dict[str, Any]) -> str:
    parts = []
    if m.get("config") is not None:
        parts.append("<h3>Config (resolved)</h3><pre>" + esc(yamlish(m["config"])) + "</pre>")
    pk = m.get("packages") or {}
    if pk:
        rows = [[k, v] for k, v in sorted(pk.items())]
        parts.append("<h3>Package versions</h3>" + table_html(["package", "version"], rows))
    outs = _outputs(m)
    if outs:
        parts.append("<h3>Output files</h3>" + outs)
    return "".join(parts)


def _training(m: dict[str, Any]) -> str:
    """What the stages hand to the training runner (priors, weights, offsets, curriculum)."""
    t = m.get("training")
    if not isinstance(t, dict):
        return f"<pre>{esc(yamlish(t))}</pre>"
    out = []
    for key, val in t.items():
        if isinstance(val, dict):
            scalars = {k: v for k, v in val.items() if not isinstance(v, list | dict)}
            rest = {k: v for k, v in val.items() if isinstance(v, list | dict)}
            out.append(f"<h3>{esc(key)}</h3>{summary_grid(scalars)}")
            # parallel lists of scalars (classes, weights, priors, ...) read best as one table
            lengths: dict[int, list[str]] = {}
            for k, v in rest.items():
                if isinstance(v, list) and len(v) > 1 and all(not isinstance(x, list | dict) for x in v):
                    lengths.setdefault(len(v), []).append(k)
            cols = max(lengths.values(), key=len, default=[])
            if len(cols) >= 2:
                n = len(rest[cols[0]])
                out.append(table_html(cols, [[rest[c][i] for c in cols] for i in range(n)]))
                rest = {k: v for k, v in rest.items() if k not in cols}
            if rest:
                out.append(f"<pre>{esc(yamlish(rest))}</pre>")
        else:
            out.append(f"<h3>{esc(key)}</h3><pre>{esc(yamlish(val))}</pre>")
    return "".join(out)


def page_head(csp: str, tab_title: str, css: str, title: str, sub_html: str) -> str:
    """The shared top of a self-contained dataguard page: CSP, no referrer, styles, header.

    ``sub_html`` is already escaped; every other argument is escaped here.
    """
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        f'<meta http-equiv="Content-Security-Policy" content="{esc(csp)}">'
        '<meta name="referrer" content="no-referrer">'
        '<meta name="viewport" content="width=device-width,initial-scale=1">'
        '<meta name="generator" content="dataguard">'
        f"<title>{esc(tab_title)}</title>"
        f"<style>{css}</style></head><body>"
        f'<header class="top"><h1>{esc(title)}</h1><div class="sub">{sub_html}</div></header>'
    )


def render_html(m: dict[str, Any]) -> str:
    """The complete page for a report model."""
    page = _Page()
    c = m["counts"]
    page.section("Overview", _overview(m), "overview", group="Run")
    page.section("Inputs", _inputs(m), "inputs", tag=f"{len(m.get('inputs') or [])} file(s)")
    page.section("Rows through the stages", _funnel(m), "funnel")
    n_reasons = len(m.get("reasons") or [])
    page.section("Reject reasons", _reasons(m, page.ids), "rejects", tag=f"{n_reasons} reason(s)",
                 toc_extra=esc(num(c.get("rows_rejected"))) if c.get("rows_rejected") is not None else "")
    if m.get("training_rows"):  # rows a training run's guard named, at the training page's anchors
        page.section("Rows named by training", training_rows.section(m["training_rows"], page.ids),
                     "training-rows", tag=f"{len(m['training_rows'])} row(s)")
    pairs = _pairs(m)
    if pairs:
        page.section("Preference pairs: chosen vs rejected", pairs, "pairs")
    anchors = {(r["stage"], r["reason"]): r.get("_anchor") for r in m.get("reasons") or []}
    for k, s in enumerate(m.get("stages") or []):
        rej = s.get("rows_rejected")
        page.section(str(s.get("title") or s.get("name")), _stage(s, anchors), f"stage-{s.get('name')}",
                     tag=f"stage: {s.get('name')}", toc_extra=esc(num(rej)) if rej else "",
                     group="Stages" if k == 0 else None)
    kept = _kept(m)
    if kept:
        page.section("Kept rows preview", kept, "kept", group="Data")
    if m.get("training"):
        page.section("Training", _training(m), "training")
    page.section("Config & environment", _config(m), "config")

    title = "dataguard audit"
    sub = (f"{esc(m.get('output_dir', ''))} · dataguard {esc(m.get('dataguard_version') or '?')}"
           f"{' · ' + esc((m.get('run') or {}).get('started')) if (m.get('run') or {}).get('started') else ''}")
    verdict = {True: "nothing lost", False: "rows unaccounted for", None: "not verifiable"}[m.get("nothing_lost")]
    return (
        page_head(content_security_policy(), f"{title} · {num(c.get('rows_in'))} rows · {verdict}", CSS, title, sub)
        + f'<div class="layout"><nav class="toc" aria-label="Contents"><ol>{"".join(page.toc)}</ol></nav>'
        f'<main>{"".join(page.sections)}<footer>Generated by dataguard from manifest.json, run.json and the '
        "rejected shards. Self-contained: no network access. A JSON with the same statistics sits beside this file."
        "</footer></main></div>"
        f"<script>{JS}</script></body></html>\n"
    )
