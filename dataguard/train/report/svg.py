"""Static SVG for the training report: step curves with event markers, and a layer x step
heat map. Same rules as dataguard/report/svg.py (which it builds on): presentation
attributes only (no ``style=``, so the page's CSP needs no 'unsafe-inline'), every text
through ``esc``, a ``<title>`` on each mark so hovering shows the exact value.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from dataguard.report.fmt import esc, num
from dataguard.report.svg import FONT, PALETTE, nice_ticks

EVENT_COLORS = {"anomaly": "#d97706", "skip": "#94a3b8", "rollback": "#dc2626", "stop": "#111827",
                "fault": "#7c3aed", "recovered": "#059669", "checkpoint": "#0891b2"}
# sequential ramp (light -> dark) for the heat map; non-finite cells are drawn black
SEVERITY = ("stop", "rollback", "fault", "anomaly", "skip", "recovered", "checkpoint")
RAMP = ("#f7fbff", "#deebf7", "#c6dbef", "#9ecae1", "#6baed6", "#4292c6", "#2171b5", "#08519c", "#08306b")
NONFINITE = "#000000"
MAX_COLUMNS = 240
MAX_POINTS = 2000  # per line; longer series are thinned (see thin)


def _f(x: float) -> str:
    return f"{x:.1f}".rstrip("0").rstrip(".")


def _open(width: int, height: int, title: str, klass: str = "chart") -> str:
    return (f'<svg class="{klass}" viewBox="0 0 {width} {height}" width="{width}" height="{height}" role="img" '
            f'font-size="{FONT}" font-family="system-ui,sans-serif"><title>{esc(title)}</title>')


def _log_ticks(lo: float, hi: float) -> list[float]:
    """Powers of ten in [lo, hi]; with 1-2-5 steps added when fewer than three fit."""
    powers = [10.0 ** e for e in range(math.floor(math.log10(lo)), math.ceil(math.log10(hi)) + 1)]
    ticks = [t for t in powers if lo * (1 - 1e-9) <= t <= hi * (1 + 1e-9)]
    if len(ticks) < 3:
        ticks = sorted(t * m for t in powers for m in (1, 2, 5) if lo * (1 - 1e-9) <= t * m <= hi * (1 + 1e-9))
    return ticks


def event_label(ev: dict) -> str:
    parts = [f"step {ev.get('step')}", str(ev.get("kind"))]
    for key in ("cause", "layer", "detail"):
        if ev.get(key) not in (None, ""):
            parts.append(f"{key}: {ev[key]}")
    return " · ".join(parts)


def _event_marks(events: Sequence[dict], sx, x_lo: float, x_hi: float, top: float, bottom: float) -> list[str]:
    """One marker per step: drawn in the colour of its most severe event, the hover title
    lists every event of that step, and the class names every kind (``ev ev-rollback ...``)."""
    by_step: dict[int, list[dict]] = {}
    for ev in events:
        step = ev.get("step")
        if isinstance(step, int) and x_lo <= step <= x_hi:
            by_step.setdefault(step, []).append(ev)
    out = []
    for step, evs in sorted(by_step.items()):
        kinds = []
        for ev in evs:
            kind = str(ev.get("kind"))
            kind = kind if kind in EVENT_COLORS else "other"
            if kind not in kinds:
                kinds.append(kind)
        kinds.sort(key=lambda k: SEVERITY.index(k) if k in SEVERITY else len(SEVERITY))
        top_kind = kinds[0]
        col = EVENT_COLORS.get(top_kind, "#6b7280")
        x = sx(step)
        strong = top_kind in ("rollback", "stop")
        dash = "" if strong else ' stroke-dasharray="3 3"'
        title = "\n".join(event_label(ev) for ev in evs)
        out.append(f'<g class="ev {" ".join("ev-" + k for k in kinds)}"><title>{esc(title)}</title>'
                   f'<line x1="{_f(x)}" x2="{_f(x)}" y1="{_f(top)}" y2="{_f(bottom)}" stroke="{col}" '
                   f'stroke-width="{"2" if strong else "1.2"}"{dash}/>'
                   f'<path d="M{_f(x - 4)} {_f(top - 7)}h8l-4 6z" fill="{col}"/></g>')
    return out


def thin(points: Sequence[tuple[int, float]], buckets: int = MAX_POINTS // 2) -> list[tuple[int, float]]:
    """At most ~2 * ``buckets`` points: each bucket keeps its lowest and highest point (so
    a one-step spike survives) and every non-finite point."""
    if len(points) <= 2 * buckets:
        return list(points)
    size = math.ceil(len(points) / buckets)
    out: list[tuple[int, float]] = []
    for k in range(0, len(points), size):
        chunk = points[k:k + size]
        finite = [p for p in chunk if math.isfinite(p[1])]
        keep = {p for p in chunk if not math.isfinite(p[1])}
        if finite:
            keep |= {min(finite, key=lambda p: p[1]), max(finite, key=lambda p: p[1])}
        out.extend(sorted(keep, key=lambda p: p[0]))
    return out


def line_chart(series: dict[str, Sequence[tuple[int, float]]], events: Sequence[dict] = (), *,
               title: str = "", y_label: str = "", log_y: bool = False, width: int = 860,
               height: int = 240, x_range: tuple[int, int] | None = None) -> str:
    """Lines over steps, one per series; non-finite points break the line and get a red x at
    the top; events are vertical markers (with a hover title) in their kind's colour."""
    names = [n for n in series if series[n]]
    if not names:
        return ""
    series = {n: thin(series[n]) for n in names}
    ml, mr, mt, mb = 64, 16, 34 if len(names) > 1 else 22, 34
    pw, ph = width - ml - mr, height - mt - mb
    xs = [s for n in names for s, _ in series[n]]
    x_lo, x_hi = x_range if x_range else (min(xs), max(xs))
    if x_hi <= x_lo:
        x_hi = x_lo + 1
    ok = [v for n in names for _, v in series[n] if math.isfinite(v) and (v > 0 or not log_y)]
    if log_y and not ok:
        log_y = False
        ok = [v for n in names for _, v in series[n] if math.isfinite(v)]
    lo, hi = (min(ok), max(ok)) if ok else (0.0, 1.0)
    if log_y:
        t_lo, t_hi = math.log10(lo), math.log10(hi)
        if t_hi - t_lo < 0.3:  # a flat or narrow curve: widen to a readable span
            mid = (t_hi + t_lo) / 2
            t_lo, t_hi = mid - 0.5, mid + 0.5
        yticks = _log_ticks(10 ** t_lo, 10 ** t_hi)

        def ty(v: float) -> float:
            return (math.log10(v) - t_lo) / (t_hi - t_lo)
    else:
        if hi - lo < 1e-12:
            lo, hi = lo - (abs(lo) * 0.1 or 1), hi + (abs(hi) * 0.1 or 1)
        yticks = [t for t in nice_ticks(lo, hi, 4) if lo <= t <= hi] or [lo, hi]
        t_lo, t_hi = lo, hi

        def ty(v: float) -> float:
            return (v - t_lo) / (t_hi - t_lo)

    def sx(s: float) -> float:
        return ml + pw * (s - x_lo) / (x_hi - x_lo)

    def sy(v: float) -> float:
        return mt + ph - ph * ty(v)

    out = [_open(width, height, title or "Curve")]
    for t in yticks:
        y = sy(t)
        out.append(f'<line x1="{ml}" x2="{ml + pw}" y1="{_f(y)}" y2="{_f(y)}" stroke="#e5e7eb"/>')
        out.append(f'<text x="{ml - 6}" y="{_f(y + 4)}" text-anchor="end" fill="#6b7280">{esc(num(t))}</text>')
    for t in nice_ticks(x_lo, x_hi, 8):
        if x_lo <= t <= x_hi:
            x = sx(t)
            out.append(f'<line x1="{_f(x)}" x2="{_f(x)}" y1="{mt + ph}" y2="{mt + ph + 4}" stroke="#374151"/>')
            out.append(f'<text x="{_f(x)}" y="{mt + ph + 16}" text-anchor="middle" fill="#374151">{esc(num(t))}</text>')
    out.append(f'<line x1="{ml}" x2="{ml + pw}" y1="{mt + ph}" y2="{mt + ph}" stroke="#374151"/>')
    out.append(f'<text x="{ml + pw / 2}" y="{height - 4}" text-anchor="middle" fill="#374151">step</text>')
    if y_label:
        out.append(f'<text x="12" y="{mt + ph / 2}" text-anchor="middle" fill="#6b7280" '
                   f'transform="rotate(-90 12 {mt + ph / 2})">{esc(y_label)}{" (log)" if log_y else ""}</text>')
    out.extend(_event_marks(events, sx, x_lo, x_hi, mt, mt + ph))
    colors = [PALETTE[(i + 1) % len(PALETTE)] for i in range(len(names))]
    for i, name in enumerate(names):
        pts = series[name]
        d, pen, bad = [], False, []
        for s, v in pts:
            if not math.isfinite(v) or (log_y and v <= 0):
                pen = False
                bad.append((s, v))
                continue
            d.append(f"{'L' if pen else 'M'}{_f(sx(s))} {_f(sy(v))}")
            pen = True
        out.append(f'<path d="{"".join(d)}" fill="none" stroke="{colors[i]}" stroke-width="1.6" '
                   f'stroke-linejoin="round"><title>{esc(name)}</title></path>')
        if len(pts) <= 60:
            for s, v in pts:
                if math.isfinite(v) and not (log_y and v <= 0):
                    out.append(f'<circle cx="{_f(sx(s))}" cy="{_f(sy(v))}" r="2.2" fill="{colors[i]}">'
                               f'<title>{esc(f"{name} at step {s}: {num(v)}")}</title></circle>')
        for s, v in bad:
            x = sx(s)
            out.append(f'<g class="nonfinite"><title>{esc(f"{name} at step {s}: {num(v)}")}</title>'
                       f'<path d="M{_f(x - 4)} {mt - 4}l8 8m0 -8l-8 8" stroke="#dc2626" stroke-width="2"/></g>')
    if len(names) > 1:
        x = float(ml)
        for i, name in enumerate(names):
            out.append(f'<rect x="{_f(x)}" y="6" width="10" height="10" rx="2" fill="{colors[i]}"/>'
                       f'<text x="{_f(x + 14)}" y="15">{esc(name)}</text>')
            x += 26 + 6.6 * len(name)
    out.append("</svg>")
    return "".join(out)


def heatmap(steps: Sequence[int], layers: Sequence[str], values: Sequence[Sequence[float | None]],
            events: Sequence[dict] = (), *, title: str = "", value_label: str = "value",
            width: int = 860, max_label_chars: int = 30) -> tuple[str, dict]:
    """Layers (rows) x steps (columns), colour = log10 of the value on a shared scale.
    More than MAX_COLUMNS steps are grouped (each cell shows its group's maximum). Returns
    the SVG and the scale used ({"lo", "hi", "groups"}) for the legend text."""
    n = len(steps)
    if not n or not layers:
        return "", {}
    group = max(1, math.ceil(n / MAX_COLUMNS))
    cols = [(k, min(k + group, n)) for k in range(0, n, group)]

    def cell(row: Sequence[float | None], a: int, b: int) -> float | None:
        vals = [v for v in row[a:b] if v is not None]
        if not vals:
            return None
        if any(not math.isfinite(v) for v in vals):
            return math.inf
        return max(vals)

    grid = [[cell(row, a, b) for a, b in cols] for row in values]
    pos = [v for row in grid for v in row if v is not None and math.isfinite(v) and v > 0]
    lo, hi = (math.log10(min(pos)), math.log10(max(pos))) if pos else (0.0, 1.0)
    if hi - lo < 1e-9:
        lo, hi = lo - 0.5, hi + 0.5
    label_w = min(max(len(str(x)) for x in layers), max_label_chars) * 6.4 + 10
    ml, mr, mt, mb = label_w, 10, 14, 28
    row_h = 14 if len(layers) <= 40 else 8
    pw = width - ml - mr
    cw = pw / len(cols)
    height = int(mt + row_h * len(layers) + mb)
    out = [_open(width, height, title or "Heat map", "chart heatmap")]
    for i, name in enumerate(layers):
        y = mt + i * row_h
        short = name if len(name) <= max_label_chars else "…" + name[-(max_label_chars - 1):]
        out.append(f'<text x="{_f(ml - 6)}" y="{_f(y + row_h - 3)}" text-anchor="end" fill="#374151" '
                   f'font-size="{10 if row_h > 8 else 7}"><title>{esc(name)}</title>{esc(short)}</text>')
        for j, (a, b) in enumerate(cols):
            v = grid[i][j]
            if v is None:
                continue
            if not math.isfinite(v):
                fill = NONFINITE
            elif v <= 0:
                fill = RAMP[0]
            else:
                k = int((math.log10(v) - lo) / (hi - lo) * (len(RAMP) - 1) + 0.5)
                fill = RAMP[max(0, min(len(RAMP) - 1, k))]
            span = f"step {steps[a]}" if b - a == 1 else f"steps {steps[a]}–{steps[b - 1]} (max)"
            out.append(f'<rect x="{_f(ml + j * cw)}" y="{y}" width="{_f(cw + 0.3)}" height="{row_h - 1}" '
                       f'fill="{fill}"><title>{esc(f"{name} · {span} · {value_label} {num(v)}")}</title></rect>')
    bottom = mt + row_h * len(layers)

    def sx(s: float) -> float:  # the centre of the column holding step s
        idx = next((j for j, (a, b) in enumerate(cols) if steps[a] <= s <= steps[b - 1]), None)
        if idx is None:
            idx = min(range(len(cols)), key=lambda j: abs(steps[cols[j][0]] - s))
        return ml + (idx + 0.5) * cw

    for t in nice_ticks(steps[0], steps[-1], 8):
        if steps[0] <= t <= steps[-1]:
            x = sx(t)
            out.append(f'<line x1="{_f(x)}" x2="{_f(x)}" y1="{bottom}" y2="{bottom + 4}" stroke="#374151"/>'
                       f'<text x="{_f(x)}" y="{bottom + 15}" text-anchor="middle" fill="#374151">{esc(num(t))}</text>')
    out.append(f'<text x="{_f(ml + pw)}" y="{height - 2}" text-anchor="end" fill="#6b7280">step</text>')
    out.extend(_event_marks([e for e in events if e.get("kind") in ("rollback", "anomaly", "stop", "fault")],
                            sx, steps[0], steps[-1], mt, bottom))
    out.append("</svg>")
    return "".join(out), {"lo": 10 ** lo, "hi": 10 ** hi, "groups": group}


def ramp_legend(lo: float, hi: float, label: str) -> str:
    """A small colour key for the heat map."""
    w = 22
    x = w * len(RAMP)
    text = f"{num(lo)} → {num(hi)} ({label}, log scale)"
    kx = x + 14 + 6.4 * len(text)
    width = int(kx) + 70
    parts = [f'<svg class="legend" viewBox="0 0 {width} 22" width="{width}" height="22" font-size="{FONT}" '
             f'font-family="system-ui,sans-serif" role="img"><title>{esc("Colour key: " + label)}</title>']
    for i, col in enumerate(RAMP):
        parts.append(f'<rect x="{i * w}" y="4" width="{w}" height="12" fill="{col}"/>')
    parts.append(f'<text x="{x + 6}" y="14" fill="#374151">{esc(text)}</text>'
                 f'<rect x="{_f(kx)}" y="4" width="12" height="12" fill="{NONFINITE}"/>'
                 f'<text x="{_f(kx + 16)}" y="14" fill="#374151">NaN/inf</text></svg>')
    return "".join(parts)
