"""Static inline SVG charts, generated in Python.

Why static SVG rather than a charting library: the page must open offline with a strict
Content-Security-Policy and stay small for big runs. benchmarks/bench_report.py measured
the same report with inline Plotly and inline Vega-Lite: each adds the library's bundle
(megabytes) to every page and needs script to draw, while the SVG charts add a few KB,
draw with no script (print and no-JS readers included) and load fastest. Charts use only
presentation attributes (no ``style=``), so the CSP needs no 'unsafe-inline'.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from dataguard.report.fmt import esc, num

PALETTE = ("#94a3b8", "#2563eb", "#f59e0b", "#10b981", "#a855f7", "#ef4444", "#0ea5e9", "#84cc16")
MARKER_COLORS = ("#dc2626", "#d97706", "#7c3aed", "#0891b2")
FONT = 11


def _f(x: float) -> str:
    """Compact coordinate text."""
    return f"{x:.1f}".rstrip("0").rstrip(".")


def nice_ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    """Round tick values covering [lo, hi] (the classic 1-2-5 rule)."""
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return []
    if hi <= lo:
        return [lo]
    raw = (hi - lo) / max(n, 1)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    start = math.ceil(lo / step - 1e-9) * step
    ticks = []
    t = start
    while t <= hi + step * 1e-9:
        ticks.append(round(t, 12))
        t += step
    return ticks


def _is_geometric(edges: Sequence[float]) -> bool:
    """True when bin edges grow by a roughly constant ratio over a wide range, i.e. the
    histogram is log-binned (rounded edges included), so a log x axis shows it best."""
    if len(edges) < 6 or edges[0] <= 0 or edges[-1] / edges[0] < 50:
        return False
    ratios = [b / a for a, b in zip(edges, edges[1:], strict=False)]
    return min(ratios) > 1.02 and max(ratios) / min(ratios) < 1.6


def _legend(names: Sequence[str], colors: Sequence[str], x: float, y: float) -> list[str]:
    parts = []
    for i, name in enumerate(names):
        parts.append(f'<rect x="{_f(x)}" y="{_f(y - 8)}" width="10" height="10" rx="2" fill="{colors[i]}"/>')
        parts.append(f'<text x="{_f(x + 14)}" y="{_f(y + 1)}">{esc(name)}</text>')
        x += 22 + 7 * len(str(name))
    return parts


def histogram(edges: Sequence[float], series: dict[str, Sequence[float]], markers: Sequence[dict] = (),
              x_label: str = "", y_label: str = "rows", log_x: bool | None = None,
              width: int = 860, height: int = 260) -> str:
    """Overlaid step-area histogram, one filled path per series, with vertical markers."""
    edges = [float(e) for e in edges]
    names = list(series)
    if len(edges) < 2 or not names:
        return ""
    if log_x is None:
        log_x = _is_geometric(edges)
    ml, mr, mt, mb = 56, 16, 30, 40
    pw, ph = width - ml - mr, height - mt - mb
    lo, hi = edges[0], edges[-1]
    mvals = [float(m["value"]) for m in markers if isinstance(m.get("value"), int | float)]
    if mvals:
        lo, hi = min(lo, *mvals), max(hi, *mvals)
    if log_x and lo > 0:
        tx_lo, tx_hi = math.log10(lo), math.log10(hi)

        def sx(v: float) -> float:
            v = max(v, lo)
            return ml + pw * (math.log10(v) - tx_lo) / ((tx_hi - tx_lo) or 1)
    else:
        log_x = False

        def sx(v: float) -> float:
            return ml + pw * (v - lo) / ((hi - lo) or 1)

    ymax = max((max((float(c) for c in counts), default=0.0) for counts in series.values()), default=0.0)
    yticks = nice_ticks(0, ymax or 1, 4)
    ytop = max(yticks[-1] if yticks else 1, ymax) or 1

    def sy(v: float) -> float:
        return mt + ph - ph * v / ytop

    out = [f'<svg class="chart" viewBox="0 0 {width} {height}" width="{width}" height="{height}" role="img" '
           f'font-size="{FONT}" font-family="system-ui,sans-serif">']
    out.append(f"<title>{esc('Histogram of ' + (x_label or 'values'))}</title>")
    for t in yticks:
        y = sy(t)
        out.append(f'<line x1="{ml}" x2="{ml + pw}" y1="{_f(y)}" y2="{_f(y)}" stroke="#e5e7eb"/>')
        out.append(f'<text x="{ml - 6}" y="{_f(y + 4)}" text-anchor="end" fill="#6b7280">{esc(num(t))}</text>')
    colors = [PALETTE[i % len(PALETTE)] if len(names) > 1 else PALETTE[1] for i in range(len(names))]
    for i, name in enumerate(names):
        counts = [float(c) for c in series[name]][: len(edges) - 1]
        d = [f"M{_f(sx(edges[0]))} {_f(sy(0))}"]
        for j, c in enumerate(counts):
            d.append(f"V{_f(sy(c))}H{_f(sx(edges[j + 1]))}")
        d.append(f"V{_f(sy(0))}Z")
        opacity = "0.55" if len(names) > 1 else "0.8"
        out.append(f'<path d="{"".join(d)}" fill="{colors[i]}" fill-opacity="{opacity}" stroke="{colors[i]}" '
                   f'stroke-width="1"><title>{esc(name)}</title></path>')
    for j in range(len(edges) - 1):  # transparent per-bin targets: hover shows the exact counts
        x0, x1 = sx(edges[j]), sx(edges[j + 1])
        vals = " · ".join(f"{n}: {num(series[n][j]) if j < len(series[n]) else '—'}" for n in names)
        out.append(f'<rect x="{_f(x0)}" y="{mt}" width="{_f(max(x1 - x0, 0.5))}" height="{ph}" fill="#000" '
                   f'fill-opacity="0"><title>{esc(f"[{num(edges[j])}, {num(edges[j + 1])}) {vals}")}</title></rect>')
    out.append(f'<line x1="{ml}" x2="{ml + pw}" y1="{mt + ph}" y2="{mt + ph}" stroke="#374151"/>')
    xticks = _log_ticks(lo, hi) if log_x else nice_ticks(lo, hi, 6)
    for t in xticks:
        x = sx(t)
        if ml - 1 <= x <= ml + pw + 1:
            out.append(f'<line x1="{_f(x)}" x2="{_f(x)}" y1="{mt + ph}" y2="{mt + ph + 4}" stroke="#374151"/>')
            out.append(f'<text x="{_f(x)}" y="{mt + ph + 16}" text-anchor="middle" fill="#374151">{esc(num(t))}</text>')
    if x_label:
        out.append(f'<text x="{ml + pw / 2}" y="{height - 6}" text-anchor="middle" fill="#374151">'
                   f'{esc(x_label)}{" (log scale)" if log_x else ""}</text>')
    out.append(f'<text x="12" y="{mt + ph / 2}" text-anchor="middle" fill="#6b7280" '
               f'transform="rotate(-90 12 {mt + ph / 2})">{esc(y_label)}</text>')
    out.extend(_markers(markers, sx, ml, pw, mt, ph))
    if len(names) > 1:
        out.extend(_legend(names, colors, ml, 14))
    out.append("</svg>")
    return "".join(out)


def _markers(markers: Sequence[dict], sx, ml: float, pw: float, mt: float, ph: float) -> list[str]:
    """Dashed vertical lines with labels placed in rows so that close markers do not collide."""
    placed: list[tuple[float, dict, int]] = []
    rows_end: list[float] = []
    valid = [(k, m) for k, m in enumerate(markers) if isinstance(m.get("value"), int | float)]
    for k, m in sorted(valid, key=lambda km: km[1]["value"]):
        x = sx(float(m["value"]))
        label = f"{m.get('label', '')} = {num(m['value'])}".strip(" =")
        w = 6.6 * len(label) + 8
        start = x - w if x + w > ml + pw else x
        row = next((r for r, end in enumerate(rows_end) if end < start), len(rows_end))
        if row == len(rows_end):
            rows_end.append(0.0)
        rows_end[row] = start + w
        placed.append((x, {**m, "_label": label, "_k": k}, row))
    out = []
    for x, m, row in placed:
        col = MARKER_COLORS[m["_k"] % len(MARKER_COLORS)]
        out.append(f'<line x1="{_f(x)}" x2="{_f(x)}" y1="{mt - 4}" y2="{mt + ph}" stroke="{col}" '
                   f'stroke-width="1.5" stroke-dasharray="4 3"/>')
        right = x + 6.6 * len(m["_label"]) + 8 > ml + pw
        anchor, dx = ("end", -4) if right else ("start", 4)
        out.append(f'<text x="{_f(x + dx)}" y="{_f(mt + 8 + 13 * row)}" text-anchor="{anchor}" fill="{col}" '
                   f'font-weight="600">{esc(m["_label"])}</text>')
    return out


def _log_ticks(lo: float, hi: float) -> list[float]:
    lo_e, hi_e = math.floor(math.log10(lo)), math.ceil(math.log10(hi))
    ticks = [10.0 ** e for e in range(lo_e, hi_e + 1)]
    if len(ticks) <= 3:
        ticks = sorted({t * m for t in ticks for m in (1, 2, 5)})
    return [t for t in ticks if lo <= t <= hi]


def bars(labels: Sequence[str], series: dict[str, Sequence[float]], width: int = 860,
         max_label_chars: int = 28) -> str:
    """Horizontal grouped bars: suits long class names and many categories."""
    names = list(series)
    if not labels or not names:
        return ""
    n_series = len(names)
    bar_h = 12 if n_series == 1 else 8
    group_h = bar_h * n_series + 6
    longest = min(max((len(str(lb)) for lb in labels), default=4), max_label_chars)
    ml = min(16 + longest * 6.6, width * 0.4)
    mr, mt = 70, 24 if n_series > 1 else 6
    pw = width - ml - mr
    height = int(mt + group_h * len(labels) + 8)
    vmax = max((max((float(v) for v in vals), default=0.0) for vals in series.values()), default=0.0) or 1.0
    colors = [PALETTE[i % len(PALETTE)] if n_series > 1 else PALETTE[1] for i in range(n_series)]
    out = [f'<svg class="chart" viewBox="0 0 {width} {height}" width="{width}" height="{height}" role="img" '
           f'font-size="{FONT}" font-family="system-ui,sans-serif"><title>Bar chart</title>']
    if n_series > 1:
        out.extend(_legend(names, colors, ml, 14))
    for i, lab in enumerate(labels):
        y0 = mt + i * group_h
        text = str(lab)
        short = text if len(text) <= max_label_chars else text[: max_label_chars - 1] + "…"
        out.append(f'<text x="{_f(ml - 6)}" y="{_f(y0 + group_h / 2 + 1)}" text-anchor="end" fill="#374151">'
                   f'<title>{esc(text)}</title>{esc(short)}</text>')
        for s, name in enumerate(names):
            vals = series[name]
            v = float(vals[i]) if i < len(vals) and vals[i] is not None else 0.0
            w = max(pw * v / vmax, 0.0)
            y = y0 + 2 + s * bar_h
            out.append(f'<rect x="{_f(ml)}" y="{_f(y)}" width="{_f(w)}" height="{bar_h - 1}" rx="1.5" '
                       f'fill="{colors[s]}"><title>{esc(f"{text} · {name}: {num(vals[i] if i < len(vals) else None)}")}'
                       f'</title></rect>')
            out.append(f'<text x="{_f(ml + w + 4)}" y="{_f(y + bar_h - 2)}" fill="#4b5563" font-size="10">'
                       f'{esc(num(vals[i] if i < len(vals) else None))}</text>')
    out.append(f'<line x1="{_f(ml)}" x2="{_f(ml)}" y1="{mt - 2}" y2="{height - 6}" stroke="#9ca3af"/>')
    out.append("</svg>")
    return "".join(out)


def funnel(steps: Sequence[dict], total: int, width: int = 760) -> str:
    """Rows entering each stage (kept blue, rejected red), scaled to the input row count."""
    if not steps:
        return ""
    row_h, gap, ml, mr, mt = 26, 10, 150, 200, 8
    pw = width - ml - mr
    height = mt + len(steps) * (row_h + gap)
    scale = pw / (total or max((s.get("rows_in") or 0) for s in steps) or 1)
    out = [f'<svg class="chart funnel" viewBox="0 0 {width} {height}" width="{width}" height="{height}" role="img" '
           f'font-size="12" font-family="system-ui,sans-serif"><title>Rows through the stages</title>']
    for i, s in enumerate(steps):
        y = mt + i * (row_h + gap)
        kept = int(s.get("rows_kept") or 0)
        rej = int(s.get("rows_rejected") or 0)
        wk, wr = kept * scale, rej * scale
        if rej and wr < 2:
            wr = 2.0
        out.append(f'<text x="{ml - 8}" y="{y + row_h / 2 + 4}" text-anchor="end" fill="#111827" font-weight="600">'
                   f'{esc(s.get("name", "?"))}</text>')
        out.append(f'<rect x="{ml}" y="{y}" width="{_f(wk)}" height="{row_h}" rx="3" fill="#2563eb">'
                   f'<title>{esc(num(kept))} kept</title></rect>')
        out.append(f'<rect x="{_f(ml + wk)}" y="{y}" width="{_f(wr)}" height="{row_h}" rx="3" fill="#ef4444">'
                   f'<title>{esc(num(rej))} rejected</title></rect>')
        label = f"{num(kept)} kept" + (f" · −{num(rej)}" if rej else "")
        out.append(f'<text x="{_f(ml + wk + wr + 6)}" y="{y + row_h / 2 + 4}" fill="#374151">{esc(label)}</text>')
    out.append("</svg>")
    return "".join(out)


def meter(value: float, vmax: float, width: int = 120, color: str = "#ef4444") -> str:
    """A tiny inline bar (for table cells) - SVG so the CSP needs no inline styles."""
    w = 0.0 if not vmax else max(width * value / vmax, 1.0 if value else 0.0)
    return (f'<svg class="meter" width="{width}" height="10" viewBox="0 0 {width} 10" aria-hidden="true">'
            f'<rect width="{width}" height="10" rx="2" fill="#f1f5f9"/>'
            f'<rect width="{_f(w)}" height="10" rx="2" fill="{color}"/></svg>')


SHARE_COLORS = ("#ef4444", "#f97316", "#a855f7", "#ec4899", "#14b8a6", "#eab308", "#64748b", "#92400e")


def share_bar(segments: Sequence[tuple[str, float, str | None]], width: int = 900) -> str:
    """One 100 % bar of where the input rows went (kept, then each stage's rejects), with a
    legend; tiny segments get a minimum width so that every stage stays visible."""
    total = sum(v for _, v, _ in segments) or 1
    h, mt = 22, 2
    widths = [max(width * v / total, 3.0) if v > 0 else 0.0 for _, v, _ in segments]
    excess = sum(widths) - width
    if excess > 0 and widths:
        big = max(range(len(widths)), key=widths.__getitem__)
        widths[big] -= excess
    colors, k = [], 0
    for _, _, color in segments:
        colors.append(color or SHARE_COLORS[k % len(SHARE_COLORS)])
        k += 0 if color else 1
    legend, lx, ly = [], 0.0, h + mt + 18
    for (label, v, _), col in zip(segments, colors, strict=True):
        extra = f"{num(v)} · {100 * v / total:.2f}%"
        w = 6.4 * (len(label) + len(extra) + 1) + 30
        if lx > 0 and lx + w > width:
            lx, ly = 0.0, ly + 18
        legend.append(f'<rect x="{_f(lx)}" y="{_f(ly - 9)}" width="10" height="10" rx="2" fill="{col}"/>'
                      f'<text x="{_f(lx + 14)}" y="{_f(ly)}" fill="#374151">{esc(label)} '
                      f'<tspan fill="#6b7280">{esc(extra)}</tspan></text>')
        lx += w
    height = int(ly + 8)
    out = [f'<svg class="chart share" viewBox="0 0 {width} {height}" width="{width}" height="{height}" role="img" '
           f'font-size="12" font-family="system-ui,sans-serif"><title>Where the input rows went</title>']
    x = 0.0
    for (label, v, _), w, col in zip(segments, widths, colors, strict=True):
        if w > 0:
            out.append(f'<rect x="{_f(x)}" y="{mt}" width="{_f(w)}" height="{h}" fill="{col}">'
                       f'<title>{esc(f"{label}: {num(v)} rows ({100 * v / total:.2f}%)")}</title></rect>')
        x += w
    out.extend(legend)
    out.append("</svg>")
    return "".join(out)
