"""Real pipeline runs on the repository's sample data, for the report's tests and benchmark.

The audit report is checked on what the pipeline really writes - manifests, stage
descriptions, reason codes and rejected shards from the real stages - never on a hand-made
folder. :func:`sft_run` and :func:`classification_run` run small configs shaped like
``pipelines/sft.yaml`` and ``pipelines/classification.yaml`` through ``load_config`` and the
``Pipeline`` (as ``dataguard run`` does), minus the MiniLM-heavy options so a test session
pays seconds, not minutes. With ``payloads=True`` one extra input of hostile rows joins the
SFT run: script-injection strings that real stages keep or reject (exact duplicate, URL
filter, unparseable line, contamination), so the page is tested with data text everywhere.

:func:`scaled_copy` tiles a real run's rejected rows and counts to any size, for measuring
the report on runs too big to make in a benchmark's time (the report only previews kept
rows, so the kept shard is written once).

``sample_data/`` is part of the repository, not of the installed package: these helpers
need a checkout.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import math
import shutil
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

REPO = Path(__file__).resolve().parents[2]
SAMPLE_DATA = REPO / "sample_data"

# Script-injection strings planted in the data of the payload input.
PAYLOADS = (
    "<script>window.__pwned=1</script>",
    '<img src=x onerror="window.__pwned=2;document.body.setAttribute(\'data-pwned\',\'2\')">',
    "[click me](javascript:window.__pwned=3) <a href=\"javascript:window.__pwned=3\">link</a>",
    "</textarea></pre></details><script>window.__pwned=4</script>",
    "<svg onload=\"window.__pwned=5\"></svg><!-- </script> --><iframe src=\"https://example.com\"></iframe>",
    "\"'><img src=\"https://example.com/track.gif\"><style>body{display:none}</style>",
)

# The stages each run has after normalize, in order (the report's stage sections).
SFT_STAGES = ("normalize", "dedup", "length", "quality", "overlap")
CLASSIFICATION_STAGES = ("normalize", "noise", "longtail", "drift")

_SFT_INPUTS = (("alpaca_en_demo.json", "alpaca"), ("sharegpt_glaive_toolcall.json", "glaive_toolcall"),
               ("messages_kto_demo.json", "kto_messages"), ("messages_content_parts.jsonl", "sft_content_parts"))


def _sample(sample_data: Path | None) -> Path:
    root = Path(sample_data) if sample_data is not None else SAMPLE_DATA
    if not root.is_dir():
        raise FileNotFoundError(f"sample data not found: {root} (these helpers need a repository checkout)")
    return root


def gsm8k_test_item(index: int = 0) -> dict[str, str]:
    """One item of the shipped GSM8K test reference (question, answer)."""
    from dataguard.references import BUILTIN, HERE

    with gzip.open(HERE / BUILTIN["gsm8k_test"].file, "rt", encoding="utf-8") as f:
        for i, line in enumerate(f):
            if i == index:
                return json.loads(line)
    raise IndexError(index)


def write_payload_input(path: str | Path) -> Path:
    """A small Alpaca JSONL of hostile rows; which real stage takes each is noted beside it."""
    path = Path(path)
    gsm = gsm8k_test_item(0)
    rows: list[dict[str, str]] = []
    for i, p in enumerate(PAYLOADS):  # kept: payloads in prompt and answer
        rows.append({"instruction": f"Explain step {i} of setting up a Python virtual environment. {p}",
                     "input": "", "output": f"Step {i}: run python -m venv .venv, then activate it.\n{p}"})
    rows.append(dict(rows[0]))  # dedup: exact_duplicate
    rows.append({"instruction": f"List some documentation links. {PAYLOADS[1]}", "input": "",
                 "output": "See https://a.example/1 https://b.example/2 https://c.example/3 "
                           f"https://d.example/4 https://e.example/5 {PAYLOADS[2]}"})  # quality: URLs
    rows.append({"instruction": gsm["question"], "input": "",
                 "output": f"{gsm['answer']}\n{PAYLOADS[3]}"})  # overlap: contamination
    lines = [json.dumps(r, ensure_ascii=False) for r in rows]
    lines.append('{"instruction": "broken ' + PAYLOADS[0] + '",')  # normalize: invalid JSON
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def sft_config(out: str | Path, *, payloads: bool = False, sample_data: Path | None = None,
               workers: int = 1) -> dict[str, Any]:
    """The config of :func:`sft_run`, as ``dataguard run`` would read it from YAML."""
    root = _sample(sample_data)
    out = Path(out)
    inputs: list[dict[str, Any]] = [{"path": str(root / f), "name": n} for f, n in _SFT_INPUTS]
    if payloads:
        inputs.append({"path": str(write_payload_input(out.parent / f"{out.name}-payloads.jsonl")),
                       "name": "payloads"})
    return {
        "inputs": inputs,
        "output": str(out),
        "workers": workers,
        "batch_rows": 500,
        "normalize": {"check_placeholders": True},
        "stages": [
            {"dedup": {"action": "drop"}},
            {"length": {"percentile": 90, "factor": 1.5, "action": "truncate", "min_tokens": 4}},
            {"quality": {"char_repeat_threshold": 0.3, "url_count_threshold": 3,
                         "dup_ngram_max": {5: 0.30, 6: 0.28, 7: 0.26, 8: 0.24, 9: 0.22, 10: 0.20}}},
            {"overlap": {"references": ["gsm8k_test"], "action": "drop"}},
        ],
    }


def classification_config(out: str | Path, *, sample_data: Path | None = None,
                          workers: int = 1) -> dict[str, Any]:
    """The config of :func:`classification_run` (TF-IDF noise features, no text drift model)."""
    b77 = _sample(sample_data) / "banking77"
    spec = {"format": "labelled_text", "aliases": {"category": "label"}}
    return {
        "inputs": [{"path": str(b77 / "train.csv"), "name": "banking77_train", **spec}],
        "output": str(out),
        "workers": workers,
        "stages": [
            {"noise": {"action": "drop", "features": "tfidf"}},  # label_issue rows rejected
            {"longtail": {"tau": 1.0, "weighting": "effective_number", "beta": 0.999, "phases": [0.5, 0.8],
                          "schedule": [0.25, 0.5], "tail_boost": 2.0, "seed": 0}},
            {"drift": {"reference": {"path": str(b77 / "test.csv"), **spec},
                       "columns": ["prompt_chars", "prompt_words"], "categorical": ["label"],
                       "weight_column": "sample_weight", "text": False, "bins": 10, "seed": 0}},
        ],
    }


def run_config(config: dict[str, Any]) -> Path:
    """Validate ``config`` and run it, as ``dataguard run`` does; the output folder."""
    from dataguard.config import load_config

    loaded = load_config(config)
    loaded.pipeline().run(loaded.inputs, loaded.output)
    return Path(loaded.output)


def sft_run(out: str | Path, *, payloads: bool = False, sample_data: Path | None = None,
            workers: int = 1) -> Path:
    """Normalize -> dedup -> length -> quality -> overlap over the four SFT sample files."""
    return run_config(sft_config(out, payloads=payloads, sample_data=sample_data, workers=workers))


def classification_run(out: str | Path, *, sample_data: Path | None = None, workers: int = 1) -> Path:
    """Normalize -> noise -> longtail -> drift over the banking77 sample."""
    return run_config(classification_config(out, sample_data=sample_data, workers=workers))


def _read_all(files: list[Path]) -> pa.Table:
    tables = []
    for f in files:
        with pa.OSFile(str(f), "rb") as src:
            tables.append(pa.ipc.open_stream(src).read_all())
    return pa.concat_tables(tables)


def _write_shards(folder: Path, pieces: Iterator[pa.Table], schema: pa.Schema, shard_rows: int) -> list[dict]:
    """Stream ``pieces`` into ``rejected-NNNNN.arrow`` shards of about ``shard_rows`` rows."""
    folder.mkdir(parents=True, exist_ok=True)
    entries: list[dict[str, Any]] = []
    sink = writer = None
    rows = 0

    def close() -> None:
        writer.close()
        sink.close()
        path = folder / f"rejected-{len(entries):05d}.arrow"
        entries.append({"path": f"{folder.name}/{path.name}", "rows": rows, "bytes": path.stat().st_size,
                        "sha256": hashlib.sha256(path.read_bytes()).hexdigest()})

    for piece in pieces:
        if writer is None:
            sink = pa.OSFile(str(folder / f"rejected-{len(entries):05d}.arrow"), "wb")
            writer, rows = pa.ipc.new_stream(sink, schema), 0
        for batch in piece.to_batches(max_chunksize=4096):
            writer.write_batch(batch)
        rows += piece.num_rows
        if rows >= shard_rows:
            close()
            writer = None
    if writer is not None:
        close()
    return entries


def scaled_copy(run: str | Path, dest: str | Path, rows_in: int, *, rare_last: bool = True,
                shard_rows: int = 50_000) -> Path:
    """``run`` repeated ``ceil(rows_in / its rows in)`` times into ``dest``: every count
    multiplied, every rejected row really written once per copy (ids of copy k > 0 end in
    ``~k``), the kept shard written once and counted for all copies; ``run.json`` is kept.

    ``rare_last`` writes the rejected rows grouped by reason, the most frequent first, so a
    reader that wants samples of every reason has to scan to the end (the worst case)."""
    src, out = Path(run), Path(dest)
    manifest = json.loads((src / "manifest.json").read_text(encoding="utf-8"))
    k = max(1, math.ceil(rows_in / max(1, manifest["counts"]["rows_in"])))
    out.mkdir(parents=True, exist_ok=True)
    rejected = _read_all([src / f["path"] for f in manifest["outputs"]["rejected"]])
    if rare_last:
        reasons = rejected.column("reason").to_pylist()
        counts = Counter(reasons)
        groups = [rejected.take(pa.array([i for i, x in enumerate(reasons) if x == r], pa.int64()))
                  for r in sorted(counts, key=lambda r: (-counts[r], r))]
    else:
        groups = [rejected]

    def copies() -> Iterator[pa.Table]:
        for group in groups:
            for c in range(k):
                ids = group.column("id") if c == 0 else pc.binary_join_element_wise(
                    group.column("id"), pa.scalar(f"~{c}"), "")
                yield group.set_column(group.schema.get_field_index("id"), "id", ids)

    rej_files = _write_shards(out / "rejected", copies(), rejected.schema, shard_rows)
    (out / "data").mkdir(exist_ok=True)
    data_files = []
    for f in manifest["outputs"]["data"]:
        shutil.copyfile(src / f["path"], out / f["path"])
        data_files.append({**f, "rows": f["rows"] * k})
    manifest["outputs"] = {**manifest["outputs"], "data": data_files, "rejected": rej_files}
    manifest["counts"] = {key: v * k if isinstance(v, int) and not isinstance(v, bool) else v
                          for key, v in manifest["counts"].items()}
    for inp in manifest["inputs"]:
        inp["rows"] = inp["rows"] * k
    for stage in manifest["stages"]:
        for key in ("rows_in", "rows_kept", "rows_rejected"):
            stage[key] = stage[key] * k
        stage["reasons"] = {r: c * k for r, c in stage["reasons"].items()}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1, ensure_ascii=False), encoding="utf-8")
    if (src / "run.json").is_file():
        shutil.copyfile(src / "run.json", out / "run.json")
    return out
