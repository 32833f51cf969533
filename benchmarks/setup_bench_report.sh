#!/usr/bin/env bash
# Benchmark-only environment for benchmarks/bench_report.py (never the project's dependencies):
# a venv with plotly (for its bundled plotly.min.js) and vega / vega-lite / vega-embed from npm,
# all under /work/benchenv-report (outside the repo). Idempotent.
set -euo pipefail
ENV=${BENCHENV_REPORT:-/work/benchenv-report}
mkdir -p "$ENV"
[ -x "$ENV/bin/python" ] || python3 -m venv "$ENV"
"$ENV/bin/pip" install -q "plotly==6.*"
if [ ! -f "$ENV/node_modules/vega-embed/build/vega-embed.min.js" ]; then
    npm install --silent --no-audit --no-fund --prefix "$ENV" vega@5 vega-lite@5 vega-embed@6
fi
echo "benchmark env ready: $ENV"
