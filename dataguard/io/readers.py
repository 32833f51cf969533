"""Streaming readers: every input format becomes a sequence of bounded `RawBatch`es.

Readers never hold a whole file (or a whole oversized record) in memory and never raise
on bad data: a line that is not JSON, bytes that are not UTF-8, a lone surrogate escape,
nesting deeper than ``MAX_DEPTH``, a record over the size limit, a CSV row with the wrong
number of fields or a stray quote, the damaged end of a ``.gz`` - each becomes an error row
(one per input row, in its own position) that normalization turns into a rejected row
with a preview of the raw text. Only a problem with the input as a whole raises
``InputError`` (missing or unreadable path, unknown reader, a JSON object without
``json_key``, a folder that is not a dataset): that is a configuration error, one line.

This module picks the reader and batches its rows; the formats are read in ``json_readers``,
``csv_reader`` and ``arrow_reader``.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from dataguard.io.arrow_reader import ARROW_BATCH_BYTES, read_hf, read_parquet
from dataguard.io.bounded import (
    RAW_KEEP_BYTES,
    InputError,
    Row,
)
from dataguard.io.csv_reader import read_csv
from dataguard.io.input_spec import READERS, InputSpec
from dataguard.io.json_parse import DEFAULT_MAX_RECORD_BYTES
from dataguard.io.json_readers import (
    deferred_jsonl,
    parse_json_bytes,
    parse_jsonl_line,
    read_json_array,
    read_jsonl,
)
from dataguard.io.jsonscan import MAX_DEPTH
from dataguard.io.raw import RawBatch
from dataguard.records import safe_text

# Names other modules and tests import from here; they live in the modules above.
__all__ = [
    "ARROW_BATCH_BYTES", "DEFAULT_BATCH_ROWS", "DEFAULT_MAX_RECORD_BYTES", "MAX_DEPTH", "RAW_KEEP_BYTES",
    "READERS", "InputError", "InputSpec", "RawBatch", "Row", "describe_input", "dumps_raw", "file_sha256",
    "parse_json_bytes", "parse_jsonl_line", "read_batches",
]

DEFAULT_BATCH_ROWS = 5000


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def read_batches(spec: InputSpec, batch_rows: int = DEFAULT_BATCH_ROWS,
                 max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES, defer_parse: bool = False) -> Iterator[RawBatch]:
    """Yield the input as RawBatches of at most `batch_rows` rows, in file order.

    With ``defer_parse`` JSONL batches carry raw lines and are parsed by
    ``RawBatch.parse_pending()`` later - in a worker process - so the driver that reads
    the file is not the bottleneck of a parallel run.
    """
    if spec.dataset is None:
        path = Path(spec.path)
        if not path.exists():
            raise InputError(f"input {spec.name!r}: no such file or folder: {path}")
    reader = spec.resolved_reader()
    source = str(spec.name)
    if reader == "jsonl" and defer_parse:
        yield from deferred_jsonl(Path(spec.path), source, batch_rows, max_record_bytes)
        return
    if reader == "jsonl":
        gen = read_jsonl(Path(spec.path), source, max_record_bytes)
    elif reader == "json":
        gen = read_json_array(Path(spec.path), source, spec.json_key, max_record_bytes)
    elif reader in ("csv", "tsv"):
        gen = read_csv(Path(spec.path), source, "\t" if reader == "tsv" else ",", max_record_bytes)
    elif reader == "parquet":
        gen = read_parquet(Path(spec.path), source, batch_rows, max_record_bytes)
    else:
        gen = read_hf(spec, source, batch_rows, max_record_bytes)
    yield from _rebatch(gen, source, batch_rows)


def _rebatch(rows: Iterator[Row], source: str, batch_rows: int) -> Iterator[RawBatch]:
    batch = RawBatch(source=source)
    seen = 0
    for row in rows:
        seen += 1
        batch.add_row(row)
        if len(batch) >= batch_rows:
            yield batch
            batch = RawBatch(source=source)
    if seen == 0:
        batch.add_empty_file()
    if len(batch):
        yield batch


def describe_input(spec: InputSpec) -> dict[str, Any]:
    """Static facts about an input for the manifest (checksum, size, reader).

    Raises only InputError (an unreadable file or folder is one line, not a traceback).
    """
    info: dict[str, Any] = {"name": spec.name, "reader": spec.resolved_reader(), "format": spec.format}
    if spec.dataset is not None:
        info["path"] = None
        fingerprint = getattr(spec.dataset, "_fingerprint", None)
        info["fingerprint"] = fingerprint
        return info
    path = Path(spec.path)
    info["path"] = safe_text(str(spec.path))
    try:
        if path.is_file():
            info["bytes"] = path.stat().st_size
            info["sha256"] = file_sha256(path)
        else:
            files = sorted(p for p in path.rglob("*") if p.is_file())
            digest = hashlib.sha256()
            total = 0
            for p in files:
                digest.update(os.fsencode(p.relative_to(path)))
                digest.update(file_sha256(p).encode())
                total += p.stat().st_size
            info["bytes"] = total
            info["sha256"] = digest.hexdigest()
    except OSError as exc:
        raise InputError(f"input {spec.name!r}: cannot read {exc.filename or path}: {exc.strerror or exc}") from None
    return info


def dumps_raw(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=str)
