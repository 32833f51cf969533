"""Generic renderers for the ``describe()`` block types of dataguard/stage.py.

Each renderer turns one block (plain JSON data) into an HTML fragment; every string from
the block is escaped. A block of an unknown type, or one that fails to render, falls back
to its pretty-printed JSON so that any stage's description is always shown.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from typing import Any

from dataguard.report import svg
from dataguard.report.fmt import esc, is_number, label_text, num

VERDICT_WORDS = {"stable", "moderate", "major", "ok", "pass", "fail", "warn", "flag", "drop", "reject",
                 "bad", "truncate", "mask", "relabel", "keep"}
EXAMPLE_TEXT_LIMIT = 2400
SPAN_CONTEXT = 220
MAX_BAR_LABELS = 120
DENSE_MATRIX = 24
EXAMPLES_SHOWN = 4
_SHARE_KEY = re.compile(r"(^|_)(share|fraction|pct_of|rate)(_|$)")


def cell(value: Any, wide: bool = False) -> str:
    """One table cell: numbers right-aligned, verdict words as badges, the rest as text."""
    if is_number(value):
        return f'<td class="num">{esc(num(value))}</td>'
    if value is None:
        return '<td class="muted">—</td>'
    if isinstance(value, bool):
        return f"<td>{esc(num(value))}</td>"
    if isinstance(value, list | dict):
        return f'<td class="mono">{esc(json.dumps(value, ensure_ascii=False))}</td>'
    text = str(value)
    if text.lower() in VERDICT_WORDS:
        return f'<td><span class="badge {esc(text.lower())}">{esc(text)}</span></td>'
    return f'<td class="txt">{esc(text)}</td>' if wide or len(text) > 60 else f"<td>{esc(text)}</td>"


def table_html(columns: Sequence[Any], rows: Sequence[Sequence[Any]], scroll_after: int = 14,
               wide: Sequence[int] = ()) -> str:
    """A table; numeric columns right-aligned; columns in ``wide`` get room for prose."""
    numeric = [bool(rows) and all(is_number(r[i]) or r[i] is None for r in rows if i < len(r))
               for i in range(len(columns))]
    head = "".join(f'<th class="{"num" if numeric[i] else ""}">{esc(c)}</th>' for i, c in enumerate(columns))
    body = "".join("<tr>" + "".join(cell(v, i in wide) for i, v in enumerate(r)) + "</tr>" for r in rows)
    cls = "scroll" if len(rows) > scroll_after else "xscroll"
    return f'<div class="{cls}"><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>'


def summary_grid(summary: dict[str, Any]) -> str:
    if not summary:
        return ""
    items = []
    for k, v in summary.items():
        if isinstance(v, list | dict):
            text = json.dumps(v, ensure_ascii=False)
            shown = text if len(text) <= 160 else text[:160] + "…"
            val = f'<span class="mono">{esc(shown)}</span>'
        elif isinstance(v, str) and v.lower() in VERDICT_WORDS:
            val = f'<span class="badge {esc(v.lower())}">{esc(v)}</span>'
        elif is_number(v) and 0 <= v <= 1 and _SHARE_KEY.search(str(k)):
            val = f"{esc(num(100 * v))}%"
        else:
            val = esc(num(v))
        items.append(f'<div class="stat"><div class="k">{esc(label_text(k))}</div><div class="v">{val}</div></div>')
    return f'<div class="stat-grid">{"".join(items)}</div>'


_FIRST = ("before", "original", "given", "train", "raw", "input")
_LAST = ("after", "cleaned", "weighted", "resampled", "corrected", "output")


def _ordered(series: dict) -> dict:
    """Series in a reading order: 'before'-like first, 'after'-like last (manifests are
    written with sorted keys, which would put 'after' before 'before')."""
    def rank(name: str) -> int:
        low = name.lower()
        return 0 if low.startswith(_FIRST) else 2 if low.startswith(_LAST) else 1
    return {k: series[k] for k in sorted(series, key=lambda k: rank(str(k)))}


def _histogram(b: dict, compact: bool = False) -> str:
    edges = [float(e) for e in b["edges"]]
    series = b.get("series")
    if series is None and "counts" in b:
        series = {"rows": b["counts"]}
    series = _ordered({str(k): [float(c or 0) for c in v] for k, v in (series or {}).items()})
    markers = [m for m in (b.get("markers") or []) if isinstance(m, dict)]
    chart = svg.histogram(edges, series, markers, x_label=str(b.get("x_label") or ""),
                          y_label=str(b.get("y_label") or ("share" if all(
                              abs(sum(float(c or 0) for c in v) - 1.0) < 1e-3 for v in series.values()) else "rows")),
                          log_x=b.get("log_x") if isinstance(b.get("log_x"), bool) else None,
                          **({"width": 470, "height": 230} if compact else {}))
    names = list(series)
    rows = [[f"[{num(edges[i])}, {num(edges[i + 1])})"] + [series[n][i] if i < len(series[n]) else None for n in names]
            for i in range(len(edges) - 1)]
    shares = all(abs(sum(v) - 1.0) < 1e-3 for v in series.values())  # already normalised: no row totals
    totals = "" if shares else " · ".join(f"{esc(n)}: {esc(num(sum(series[n])))} rows" for n in names)
    mk = " · ".join(f"{esc(m.get('label', 'marker'))} = {esc(num(m.get('value')))}" for m in markers)
    data = table_html(["bin"] + names, rows, scroll_after=10)
    note = " · ".join(x for x in (totals, mk) if x)
    return (f'{chart}<div class="axis-note">{note}</div>'
            f'<details class="data"><summary>Data ({len(rows)} bins)</summary>{data}</details>')


def _bar(b: dict) -> str:
    labels = [str(x) for x in b["labels"]]
    series = b.get("series")
    if series is None and "values" in b:
        series = {"value": b["values"]}
    series = _ordered({str(k): list(v) for k, v in (series or {}).items()})
    names = list(series)
    note = ""
    shown = labels
    if len(labels) > MAX_BAR_LABELS:
        shown = labels[:MAX_BAR_LABELS]
        note = f'<div class="axis-note">First {MAX_BAR_LABELS} of {len(labels)} categories drawn; all are in the data table.</div>'
    chart = svg.bars(shown, {n: series[n][: len(shown)] for n in names})
    rows = [[lab] + [series[n][i] if i < len(series[n]) else None for n in names] for i, lab in enumerate(labels)]
    data = table_html(["category"] + names, rows, scroll_after=10)
    return f'{chart}{note}<details class="data"><summary>Data ({len(labels)} categories)</summary>{data}</details>'


def _table(b: dict) -> str:
    cols = list(b.get("columns") or [])
    rows = [list(r) if isinstance(r, list | tuple) else [r] for r in (b.get("rows") or [])]
    if not cols and rows:
        cols = [f"col {i + 1}" for i in range(max(len(r) for r in rows))]
    if not rows:
        return '<p class="muted small">No rows.</p>'
    return table_html(cols, rows)


def _heat_class(prefix: str, v: float, vmax: float) -> str:
    if vmax <= 0 or v <= 0:
        return f"{prefix}0"
    return f"{prefix}{min(9, 1 + int(8.999 * v / vmax))}"


def _matrix(b: dict) -> str:
    values = [[float(x) if is_number(x) else 0.0 for x in row] for row in b["values"]]
    nr = len(values)
    nc = max((len(r) for r in values), default=0)
    rl = [str(x) for x in (b.get("row_labels") or [f"row {i}" for i in range(nr)])]
    cl = [str(x) for x in (b.get("col_labels") or [f"col {j}" for j in range(nc)])]
    square = nr == nc and rl == cl
    off = [values[i][j] for i in range(nr) for j in range(len(values[i])) if not (square and i == j)]
    diag = [values[i][i] for i in range(nr) if square and i < len(values[i])]
    omax, dmax = max(off, default=0.0), max(diag, default=0.0)
    dense = max(nr, nc) > DENSE_MATRIX
    head = "".join(f'<th class="ct" title="{esc(c)}">{esc(c[:28])}</th>' for c in cl)
    body = []
    for i, row in enumerate(values):
        tds = []
        for j in range(nc):
            v = row[j] if j < len(row) else 0.0
            klass = _heat_class("d", v, dmax) if square and i == j else _heat_class("h" if square else "b", v, omax)
            tip = f"{rl[i] if i < len(rl) else i} / {cl[j] if j < len(cl) else j}: {num(v)}"
            tds.append(f'<td class="{klass}" title="{esc(tip)}">{"" if dense else esc(num(v))}</td>')
        body.append(f'<tr><th title="{esc(rl[i] if i < len(rl) else i)}">{esc((rl[i] if i < len(rl) else str(i))[:28])}</th>'
                    f'{"".join(tds)}</tr>')
    rt, ct = esc(b.get("row_title") or "rows"), esc(b.get("col_title") or "columns")
    table = (f'<div class="xscroll"><table class="heat{" dense" if dense else ""}"><thead><tr>'
             f'<th class="muted">{rt} ↓ · {ct} →</th>{head}</tr></thead><tbody>{"".join(body)}</tbody></table></div>')
    legend = ('<div class="axis-note">Diagonal in green (agreement), off-diagonal in red, each scaled to its own '
              'maximum; hover a cell for its value.</div>' if square else
              '<div class="axis-note">Darker = larger; hover a cell for its value.</div>')
    top = ""
    cells = sorted(((values[i][j], i, j) for i in range(nr) for j in range(len(values[i]))
                    if not (square and i == j) and values[i][j] > 0), reverse=True)[:8]
    if cells and square:
        rows = [[rl[i], cl[j], v] for v, i, j in cells]
        top = "<h4 class=\"small muted\">Largest off-diagonal cells</h4>" + table_html(
            [b.get("row_title") or "row", b.get("col_title") or "column", "value"], rows)
    return table + legend + top


def _spans(raw: Any, length: int) -> list[tuple[int, int]]:
    spans = []
    for sp in raw or []:
        if isinstance(sp, list | tuple) and len(sp) >= 2 and is_number(sp[0]) and is_number(sp[1]):
            s, e = max(0, int(sp[0])), min(length, int(sp[1]))
            if e > s:
                spans.append((s, e))
    spans.sort()
    merged: list[tuple[int, int]] = []
    for s, e in spans:
        if merged and s <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], e))
        else:
            merged.append((s, e))
    return merged


def highlight(text: str, spans_raw: Any, limit: int = EXAMPLE_TEXT_LIMIT) -> str:
    """Escaped text with <mark> around the character-offset spans; long text is cut to
    windows around the spans (with '…' between) so the page stays small."""
    text = "" if text is None else str(text)
    spans = _spans(spans_raw, len(text))
    if len(text) <= limit:
        windows = [(0, len(text))]
    else:
        windows = []
        budget = limit
        for s, e in spans or [(0, min(limit, len(text)))]:
            ws, we = max(0, s - SPAN_CONTEXT), min(len(text), e + SPAN_CONTEXT)
            if windows and ws <= windows[-1][1]:
                windows[-1] = (windows[-1][0], we)
            else:
                windows.append((ws, we))
            budget -= we - ws
            if budget <= 0:
                break
        if not spans:
            windows = [(0, limit)]
    out = []
    for k, (ws, we) in enumerate(windows):
        if ws > 0 or k > 0:
            out.append('<span class="cut">… </span>')
        pos = ws
        for s, e in spans:
            if e <= ws or s >= we:
                continue
            s, e = max(s, ws), min(e, we)
            out.append(esc(text[pos:s]))
            out.append(f"<mark>{esc(text[s:e])}</mark>")
            pos = e
        out.append(esc(text[pos:we]))
    if windows and windows[-1][1] < len(text):
        out.append(f'<span class="cut"> … [{len(text) - windows[-1][1]:,} more characters]</span>')
    return "".join(out)


def _examples(b: dict) -> str:
    items = [it for it in (b.get("items") or []) if isinstance(it, dict)]
    if not items:
        return '<p class="muted small">No examples.</p>'
    known = {"id", "label", "text", "spans", "reference", "reference_spans", "note", "reference_id", "reference_title"}
    out = []
    for it in items:
        head = []
        if it.get("id") is not None:
            head.append(f'<span class="mono">{esc(it["id"])}</span>')
        if it.get("label") is not None:
            head.append(f'<span class="badge">{esc(it["label"])}</span>')
        extras = {k: v for k, v in it.items() if k not in known}
        for k, v in extras.items():
            val = json.dumps(v, ensure_ascii=False) if isinstance(v, list | dict) else num(v)
            head.append(f"<span>{esc(label_text(k))}: <b>{esc(val)}</b></span>")
        row = f'<div class="pane"><h4>Row</h4><div class="txt">{highlight(it.get("text"), it.get("spans"))}</div></div>'
        if it.get("reference") is not None:
            ref_title = "Reference" + (f" · {it['reference_id']}" if it.get("reference_id") is not None else "")
            ref = (f'<div class="pane"><h4>{esc(ref_title)}</h4><div class="txt">'
                   f'{highlight(it.get("reference"), it.get("reference_spans"))}</div></div>')
            body = f'<div class="grid2">{row}{ref}</div>'
        else:
            body = row
        note = f'<div class="note">{esc(it["note"])}</div>' if it.get("note") else ""
        out.append(f'<div class="ex"><div class="exhead">{"".join(head)}</div>{body}{note}</div>')
    if len(out) > EXAMPLES_SHOWN + 1:  # long lists: the first few open, the rest one click away
        return ("".join(out[:EXAMPLES_SHOWN]) + f'<details class="more"><summary>Show {len(out) - EXAMPLES_SHOWN} more '
                f'examples</summary>{"".join(out[EXAMPLES_SHOWN:])}</details>')
    return "".join(out)


def _text(b: dict) -> str:
    return f'<div class="textblock">{esc(b.get("text", ""))}</div>'


RENDERERS: dict[str, Callable[[dict], str]] = {
    "histogram": _histogram, "bar": _bar, "table": _table, "matrix": _matrix,
    "examples": _examples, "text": _text,
}


def render_block(block: dict, compact: bool = False) -> str:
    """One block with its title; unknown or malformed blocks show as JSON with a note.
    ``compact`` draws a histogram small, for a grid of small multiples."""
    kind = str(block.get("type", ""))
    title = block.get("title")
    h = f"<h3>{esc(title)}</h3>" if title else ""
    fn = RENDERERS.get(kind)
    try:
        if fn is None:
            raise KeyError(f"unknown block type {kind!r}")
        inner = _histogram(block, compact=True) if compact and kind == "histogram" else fn(block)
    except Exception as exc:  # noqa: BLE001 - a bad block must not break the whole audit
        pretty = json.dumps(block, ensure_ascii=False, indent=2, default=str)
        if len(pretty) > 6000:
            pretty = pretty[:6000] + "\n…"
        inner = (f'<p class="muted small">Shown as data ({esc(type(exc).__name__)}: {esc(exc)}).</p>'
                 f"<pre>{esc(pretty)}</pre>")
    return f'<div class="block block-{esc(kind or "unknown")}">{h}{inner}</div>'
