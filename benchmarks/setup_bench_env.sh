#!/usr/bin/env bash
# Benchmark-only environment for benchmarks/bench_text_quality.py: data-juicer and datatrove,
# installed WITHOUT their full dependency trees (only what importing the benchmarked ops needs),
# in a venv outside the repository. Never install these into the project's python.
set -euo pipefail
VENV="${1:-/work/benchenv-textq}"
python3 -m venv "$VENV"
"$VENV/bin/pip" install -q --no-deps py-data-juicer==1.6.1 datatrove==0.10.1
# Imports of data_juicer.ops.filter.{character_repetition,word_repetition,special_characters,
# token_num}_filter and datatrove's Gopher filters (spaCy's blank English tokenizer, no model).
"$VENV/bin/pip" install -q numpy pydantic loguru regex emoji nltk jsonargparse tqdm pillow psutil \
    tomli zstandard datasets aiohttp httpx wget requests bs4 tabulate humanize spacy transformers
"$VENV/bin/python" - <<'EOF'
from data_juicer.ops.filter.character_repetition_filter import CharacterRepetitionFilter  # noqa: F401
from datatrove.pipeline.filters.gopher_repetition_filter import GopherRepetitionFilter  # noqa: F401
print("benchmark env ready")
EOF
