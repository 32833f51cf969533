#!/usr/bin/env bash
# Benchmark-only environment for benchmarks/bench_near_dedup.py: datatrove's and data-juicer's
# MinHash deduplication, installed WITHOUT their full dependency trees (only what importing and
# running the benchmarked code needs), in a venv outside the repository. Never install these
# into the project's python (the benchmark runs dataguard with the project's own python).
set -euo pipefail
VENV="${1:-/work/benchenv-dedup}"
python3 -m venv "$VENV"
"$VENV/bin/pip" install -q --no-deps py-data-juicer==1.6.1 datatrove==0.10.1
# datatrove.pipeline.dedup.minhash (signatures, buckets, clusters, filter) runs on local files
# through fsspec; data-juicer's DocumentMinhashDeduplicator needs scipy (LSH band optimiser),
# regex, and data-juicer's package __init__ imports (PIL, aiohttp, httpx, wget, emoji, bs4, ...).
# The pip resolver warns that data-juicer pins multiprocess==0.70.16; the dedup op does not care.
# xxhash 4 refuses str input, which datatrove 0.10.1 passes (shingles are hashed as str): pin < 4.
"$VENV/bin/pip" install -q numpy scipy pydantic loguru regex nltk jsonargparse tqdm psutil \
    tomli zstandard datasets fsspec huggingface_hub humanize multiprocess dill "xxhash<4" \
    pyarrow pandas tabulate tokenizers orjson spacy pillow aiohttp httpx wget emoji requests beautifulsoup4
"$VENV/bin/python" - <<'PY'
from datatrove.pipeline.dedup.minhash import MinhashDedupSignature  # noqa: F401
from data_juicer.ops.deduplicator.document_minhash_deduplicator import DocumentMinhashDeduplicator  # noqa: F401
from datatrove.pipeline.readers import JsonlReader
JsonlReader("/tmp")  # needs orjson
print("benchmark env ready")
PY
