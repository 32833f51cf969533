"""Benchmark of the HTML audit report: size and speed for big runs, and the chart approach.

Part A - scale: a real run of the SFT sample pipeline (``dataguard.testing.runs.sft_run``:
normalize, dedup, length, quality, overlap over sample_data/ plus the payload rows; about
25 % of rows rejected, 12 reasons) copied to 10k, 100k and 1M input rows with
``scaled_copy``: every rejected row of every copy really written to Arrow stream shards,
grouped by reason with the rarest last (the sampler's worst case: it reads them all), the
kept shard written once since the report only previews it. For each: build time and peak
memory of ``build_report`` (in a fresh process), HTML and JSON size, rejected rows read by
the bounded sampler, and load time in headless Chromium (navigation to load event, first
contentful paint; median of 3).

Part B - chart approach: the same charts of the 1M report (every histogram and bar block)
drawn three ways in otherwise identical pages: static inline SVG generated in Python (what
the report uses), inline Plotly (plotly.min.js from the plotly wheel) and inline Vega-Lite
(vega + vega-lite + vega-embed from npm). Measured: page bytes, time until every chart is
drawn, and whether the page still draws under the report's strict Content-Security-Policy.

Setup (benchmark-only tools, never project dependencies):
    bash benchmarks/setup_bench_report.sh      # venv + npm packages in /work/benchenv-report
    bash scripts/install_chromium.sh           # Debian's chromium
Run:
    python benchmarks/bench_report.py [--sizes 10000,100000,1000000] [--env /work/benchenv-report]
Writes benchmarks/results/report.json and prints markdown tables.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from dataguard.report import collect
from dataguard.report.assets import CSS, csp_hash
from dataguard.report.blocks import render_block
from dataguard.testing.browser import Chromium
from dataguard.testing.runs import scaled_copy, sft_run

REPO = Path(__file__).resolve().parent.parent
PERF = ("(() => {const n = performance.getEntriesByType('navigation')[0];"
        "const f = performance.getEntriesByName('first-contentful-paint')[0];"
        "return {dcl: n.domContentLoadedEventEnd, load: n.loadEventEnd, fcp: f ? f.startTime : null,"
        " done: window.__done === undefined ? null : window.__done}})()")


def build_in_fresh_process(out: Path) -> dict:
    """Time and peak RSS of build_report alone (a fresh interpreter, so RSS is its own)."""
    # VmHWM, not ru_maxrss: on Linux ru_maxrss carries the parent's RSS across fork + exec.
    # Imports are timed apart: pyarrow imports pandas (~1 s here) on its first array.
    code = ("import json,re,time,sys;t0=time.perf_counter();import pyarrow as pa;pa.array(['x']);"
            "from dataguard.report import build_report;imp=time.perf_counter()-t0;"
            "t=time.perf_counter();p=build_report(sys.argv[1]);s=time.perf_counter()-t;"
            "hwm=int(re.search(r'VmHWM:\\s+(\\d+)',open('/proc/self/status').read()).group(1));"
            "print(json.dumps({'seconds':s,'import_seconds':imp,'peak_rss_mb':hwm/1024}))")
    r = subprocess.run([sys.executable, "-c", code, str(out)], capture_output=True, text=True, check=True, cwd=REPO)
    return json.loads(r.stdout.strip().splitlines()[-1])


def browser_times(browser: Chromium, page: Path, repeat: int = 3, wait_done: bool = False,
                  wait_limit: float = 20.0) -> dict:
    runs = []
    for _ in range(repeat):
        load = browser.load(page, settle=0.25)
        t0 = time.monotonic()
        while wait_done and browser.evaluate("window.__done === undefined") and time.monotonic() - t0 < wait_limit:
            time.sleep(0.02)
        perf = browser.evaluate(PERF)
        perf["errors"] = len(load.errors)
        perf["drawn_svgs"] = browser.evaluate("document.querySelectorAll('svg').length")
        runs.append(perf)
    med = {k: statistics.median([r[k] for r in runs]) if all(r[k] is not None for r in runs) else None
           for k in ("dcl", "load", "fcp", "done")}
    med["errors"] = max(r["errors"] for r in runs)
    med["drawn_svgs"] = runs[-1]["drawn_svgs"]
    return med


def part_a(sizes: list[int], work: Path, browser: Chromium) -> list[dict]:
    rows = []
    real = sft_run(work / "real", payloads=True)
    for n in sizes:
        print(f"scale {n:,}", file=sys.stderr, flush=True)
        out = work / f"run-{n}"
        t = time.perf_counter()
        scaled_copy(real, out, n)
        gen = time.perf_counter() - t
        built = build_in_fresh_process(out)
        html = out / "audit.html"
        model = json.loads(html.with_suffix(".json").read_text())
        times = browser_times(browser, html)
        rows.append({"rows_in": n, "rows_rejected": model["counts"]["rows_rejected"],
                     "rejected_rows_read": model["rejected_scan"]["rows_read"],
                     "fixture_seconds": round(gen, 2), "import_seconds": round(built["import_seconds"], 2),
                     "build_seconds": round(built["seconds"], 3),
                     "build_peak_rss_mb": round(built["peak_rss_mb"], 1),
                     "html_kb": round(html.stat().st_size / 1024, 1),
                     "json_kb": round(html.with_suffix(".json").stat().st_size / 1024, 1),
                     "browser_fcp_ms": times["fcp"], "browser_load_ms": times["load"],
                     "console_errors": times["errors"]})
    return rows


def _chart_blocks(model: dict) -> list[dict]:
    return [b for s in model["stages"] for b in s["blocks"] if b.get("type") in ("histogram", "bar")]


def _plotly_fig(b: dict) -> dict:
    if b["type"] == "histogram":
        e = b["edges"]
        x = [(e[i] + e[i + 1]) / 2 for i in range(len(e) - 1)]
        w = [e[i + 1] - e[i] for i in range(len(e) - 1)]
        data = [{"type": "bar", "name": k, "x": x, "y": v, "width": w, "opacity": 0.6} for k, v in b["series"].items()]
        shapes = [{"type": "line", "x0": m["value"], "x1": m["value"], "yref": "paper", "y0": 0, "y1": 1,
                   "line": {"dash": "dash", "color": "#dc2626"}} for m in b.get("markers", [])]
        layout = {"barmode": "overlay", "shapes": shapes, "height": 260, "margin": {"t": 30}}
    else:
        data = [{"type": "bar", "orientation": "h", "name": k, "y": b["labels"], "x": v} for k, v in b["series"].items()]
        layout = {"barmode": "group", "height": 60 + 22 * len(b["labels"]), "margin": {"t": 30}}
    return {"data": data, "layout": layout}


def _vega_spec(b: dict) -> dict:
    if b["type"] == "histogram":
        e = b["edges"]
        values = [{"series": k, "x0": e[i], "x1": e[i + 1], "n": c} for k, v in b["series"].items() for i, c in enumerate(v)]
        layers = [{"mark": {"type": "rect", "opacity": 0.6},
                   "encoding": {"x": {"field": "x0", "type": "quantitative"}, "x2": {"field": "x1"},
                                "y": {"field": "n", "type": "quantitative"}, "color": {"field": "series"}}}]
        if b.get("markers"):
            layers.append({"data": {"values": b["markers"]}, "mark": {"type": "rule", "strokeDash": [4, 3], "color": "#dc2626"},
                           "encoding": {"x": {"field": "value", "type": "quantitative"}}})
        return {"$schema": "https://vega.github.io/schema/vega-lite/v5.json", "width": 760, "height": 200,
                "data": {"values": values}, "layer": layers}
    values = [{"label": lab, "series": k, "n": v[i]} for k, v in b["series"].items() for i, lab in enumerate(b["labels"])]
    return {"$schema": "https://vega.github.io/schema/vega-lite/v5.json", "width": 760, "data": {"values": values},
            "mark": "bar", "encoding": {"y": {"field": "label", "type": "nominal"}, "yOffset": {"field": "series"},
                                        "x": {"field": "n", "type": "quantitative"}, "color": {"field": "series"}}}


def _page(body: str, script: str = "", libs: list[str] = (), strict_csp: bool = False) -> str:
    # An inlined library must not contain "</script" (it would end the element early).
    all_js = [j.replace("</script", "<\\/script") for j in ([*libs, script] if script else list(libs))]
    csp = ""
    if strict_csp:
        hashes = " ".join(csp_hash(j) for j in all_js) or "'none'"
        csp = (f'<meta http-equiv="Content-Security-Policy" content="default-src \'none\'; style-src {csp_hash(CSS)}; '
               f'script-src {hashes}; img-src data:">')
    scripts = "".join(f"<script>{j}</script>" for j in all_js)
    return f"<!DOCTYPE html><html><head><meta charset='utf-8'>{csp}<style>{CSS}</style></head><body>{body}{scripts}</body></html>"


def _json_script(value) -> str:
    return json.dumps(value).replace("</", "<\\/").replace("<!--", "<\\!--")


def part_b(model: dict, env: Path, work: Path, browser: Chromium) -> list[dict]:
    blocks = _chart_blocks(model)
    results = []
    svg_body = "".join(render_block(b) for b in blocks)
    variants = {"static SVG (Python)": (svg_body, "", [])}
    plotly_js = next(iter(env.glob("lib/python*/site-packages/plotly/package_data/plotly.min.js")), None)
    if plotly_js:
        figs = [_plotly_fig(b) for b in blocks]
        body = "".join(f'<h3>{b.get("title", "")}</h3><div id="c{i}"></div>' for i, b in enumerate(blocks))
        script = (f"var F={_json_script(figs)};Promise.all(F.map(function(f,i){{return Plotly.newPlot('c'+i,f.data,f.layout,"
                  "{staticPlot:true});})).then(function(){window.__done=performance.now();});")
        variants["inline Plotly"] = (body, script, [plotly_js.read_text(encoding="utf-8")])
    nm = env / "node_modules"
    vega_files = [nm / "vega/build/vega.min.js", nm / "vega-lite/build/vega-lite.min.js", nm / "vega-embed/build/vega-embed.min.js"]
    if all(p.is_file() for p in vega_files):
        specs = [_vega_spec(b) for b in blocks]
        body = "".join(f'<h3>{b.get("title", "")}</h3><div id="c{i}"></div>' for i, b in enumerate(blocks))
        script = (f"var S={_json_script(specs)};Promise.all(S.map(function(s,i){{return vegaEmbed('#c'+i,s,"
                  "{renderer:'svg',actions:false});})).then(function(){window.__done=performance.now();});")
        variants["inline Vega-Lite"] = (body, script, [p.read_text(encoding="utf-8") for p in vega_files])
    for name, (body, script, libs) in variants.items():
        row = {"approach": name, "charts": len(blocks)}
        for strict in (False, True):
            print(f"  {name} strict_csp={strict}", file=sys.stderr, flush=True)
            page = work / f"charts-{len(results)}-{int(strict)}.html"
            page.write_text(_page(body, script, libs, strict), encoding="utf-8")
            t = browser_times(browser, page, repeat=1 if strict else 3, wait_done=bool(script),
                              wait_limit=5.0 if strict else 20.0)
            drawn = t["drawn_svgs"] >= len(blocks)
            if not strict:
                row.update({"page_kb": round(page.stat().st_size / 1024, 1), "fcp_ms": t["fcp"],
                            "all_charts_drawn_ms": t["done"] if script else t["load"], "drawn": drawn,
                            "console_errors": t["errors"]})
            else:
                row["works_under_strict_csp"] = drawn and t["errors"] == 0
        results.append(row)
    return results


def _table(rows: list[dict]) -> str:
    cols = list(rows[0])
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join("" if r[c] is None else f"{r[c]:.3g}" if isinstance(r[c], float) else str(r[c])
                                for c in cols) + " |" for r in rows]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="10000,100000,1000000")
    ap.add_argument("--env", default="/work/benchenv-report", type=Path)
    ap.add_argument("--out", default=REPO / "benchmarks" / "results" / "report.json", type=Path)
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    with tempfile.TemporaryDirectory(prefix="bench-report-") as tmp, Chromium(width=1280, height=900) as browser:
        work = Path(tmp)
        a = part_a(sizes, work, browser)
        model = collect(work / f"run-{sizes[-1]}")
        b = part_b(model, args.env, work, browser)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"scale": a, "charts": b}, indent=1))
    print("## Report size and speed by run size\n")
    print(_table(a))
    print("\n## Chart approach (same charts of the largest run)\n")
    print(_table(b))


if __name__ == "__main__":
    main()
