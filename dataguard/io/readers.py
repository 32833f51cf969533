"""Streaming readers: every input format becomes a sequence of bounded `RawBatch`es.

Readers never hold a whole file in memory and never raise on bad data: a line that is
not JSON, bytes that are not UTF-8, a CSV row with the wrong number of fields, an empty
file - each becomes an error row that normalization turns into a rejected row with the
raw text preserved. Only an unreadable path (missing, permission) raises, because that
is a configuration error rather than a data error.
"""

from __future__ import annotations

import csv
import gzip
import hashlib
import io
import json
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ijson

from dataguard.io.raw import RawBatch, SourceOptions

READERS = ("auto", "json", "jsonl", "csv", "tsv", "parquet", "hf")
DEFAULT_BATCH_ROWS = 5000
# A single record larger than this is rejected (its first bytes are kept) rather than
# carried through every stage; huge fields are almost always broken exports.
DEFAULT_MAX_RECORD_BYTES = 8 * 1024 * 1024
RAW_KEEP_BYTES = 64 * 1024  # how much of an unparseable record we keep in `rejected`


class InputError(ValueError):
    """An input cannot be opened at all (missing file, unknown reader)."""


@dataclass
class InputSpec:
    """One input source: a file or a Hugging Face dataset (folder or in-memory object)."""

    path: str | Path | None = None
    name: str | None = None
    format: str = "auto"
    reader: str = "auto"
    aliases: dict[str, str] = field(default_factory=dict)
    text_field: str | None = None
    label_field: str | None = None
    json_key: str | None = None  # read the array under this key of a top-level JSON object
    dataset: Any = None  # a datasets.Dataset, for the Python API

    def __post_init__(self) -> None:
        if self.path is None and self.dataset is None:
            raise InputError("an input needs a path or a dataset")
        if self.reader not in READERS:
            raise InputError(f"unknown reader {self.reader!r} (expected one of {', '.join(READERS)})")
        if self.name is None:
            self.name = Path(self.path).name if self.path is not None else "dataset"

    def options(self) -> SourceOptions:
        return SourceOptions(
            name=str(self.name), format=self.format, aliases=dict(self.aliases),
            text_field=self.text_field, label_field=self.label_field,
        )

    def resolved_reader(self) -> str:
        """Pick a reader from the file name (and, for .json, the first byte)."""
        if self.dataset is not None:
            return "hf"
        if self.reader != "auto":
            return self.reader
        path = Path(self.path)
        if path.is_dir():
            return "hf"
        name = path.name.lower()
        for suffix in (".gz",):
            if name.endswith(suffix):
                name = name[: -len(suffix)]
        if name.endswith(".jsonl") or name.endswith(".ndjson"):
            return "jsonl"
        if name.endswith(".json"):
            return "json" if _first_significant_byte(path) == b"[" or self.json_key else "jsonl"
        if name.endswith(".csv"):
            return "csv"
        if name.endswith(".tsv"):
            return "tsv"
        if name.endswith(".parquet") or name.endswith(".pq"):
            return "parquet"
        if name.endswith(".arrow"):
            return "hf"
        raise InputError(f"cannot tell the format of {path} from its name; set `reader:`")


def _open_binary(path: Path) -> io.BufferedIOBase:
    if path.name.lower().endswith(".gz"):
        return gzip.open(path, "rb")  # type: ignore[return-value]
    return open(path, "rb")


def _first_significant_byte(path: Path) -> bytes:
    with _open_binary(path) as f:
        head = f.read(4096)
    if head.startswith(b"\xef\xbb\xbf"):
        head = head[3:]
    stripped = head.lstrip()
    return stripped[:1]


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _clip(text: str) -> str:
    if len(text) <= RAW_KEEP_BYTES:
        return text
    return text[:RAW_KEEP_BYTES] + f"... [{len(text) - RAW_KEEP_BYTES} more characters not kept]"


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
        yield from _deferred_jsonl(Path(spec.path), source, batch_rows, max_record_bytes)
        return
    if reader == "jsonl":
        gen = _read_jsonl(Path(spec.path), source, max_record_bytes)
    elif reader == "json":
        prefix = f"{spec.json_key}.item" if spec.json_key else "item"
        gen = _read_json_array(Path(spec.path), source, prefix)
    elif reader in ("csv", "tsv"):
        gen = _read_csv(Path(spec.path), source, "\t" if reader == "tsv" else ",", max_record_bytes)
    elif reader == "parquet":
        gen = _read_parquet(Path(spec.path), source, batch_rows)
    else:
        gen = _read_hf(spec, source, batch_rows)
    yield from _rebatch(gen, source, batch_rows)


# Each low-level reader yields (position, record | None, error | None, detail, raw).
Row = tuple[int, Any, str | None, str | None, str | None]


def _rebatch(rows: Iterator[Row], source: str, batch_rows: int) -> Iterator[RawBatch]:
    batch = RawBatch(source=source)
    seen = 0
    for position, record, error, detail, raw in rows:
        seen += 1
        if error is None:
            batch.add(position, record)
        else:
            batch.add_error(position, error, detail or error, raw)
        if len(batch) >= batch_rows:
            yield batch
            batch = RawBatch(source=source)
    if seen == 0:
        batch.add_error(0, "empty_file", f"input {source!r} contains no records", "")
    if len(batch):
        yield batch


def _jsonl_lines(path: Path) -> Iterator[tuple[int, int, bytes]]:
    """(position, line number, raw bytes) of each non-blank line."""
    position = 0
    with _open_binary(path) as f:
        for line_no, line in enumerate(f, start=1):
            if not line.strip():
                continue  # blank lines are separators, not records
            yield position, line_no, line
            position += 1


def parse_jsonl_line(position: int, line_no: int, line: bytes, max_bytes: int) -> Row:
    """One JSONL line -> a parsed record or an error row that keeps the raw text."""
    if len(line) > max_bytes:
        return (position, None, "record_too_large", f"line {line_no} is {len(line):,} bytes (limit {max_bytes:,})",
                _clip(line.decode("utf-8", "backslashreplace")))
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as exc:
        return (position, None, "invalid_utf8", f"line {line_no}: {exc}",
                _clip(line.decode("utf-8", "backslashreplace")))
    try:
        return (position, json.loads(text), None, None, None)
    except json.JSONDecodeError as exc:
        return (position, None, "invalid_json", f"line {line_no}: {exc.msg} at column {exc.colno}",
                _clip(text.rstrip("\n")))


def _read_jsonl(path: Path, source: str, max_bytes: int) -> Iterator[Row]:
    for position, line_no, line in _jsonl_lines(path):
        yield parse_jsonl_line(position, line_no, line, max_bytes)


def _deferred_jsonl(path: Path, source: str, batch_rows: int, max_bytes: int) -> Iterator[RawBatch]:
    batch = RawBatch(source=source, max_record_bytes=max_bytes)
    seen = 0
    for item in _jsonl_lines(path):
        seen += 1
        batch.pending.append(item)
        if len(batch.pending) >= batch_rows:
            yield batch
            batch = RawBatch(source=source, max_record_bytes=max_bytes)
    if seen == 0:
        batch.add_error(0, "empty_file", f"input {source!r} contains no records", "")
    if len(batch):
        yield batch


def _read_json_array(path: Path, source: str, prefix: str = "item") -> Iterator[Row]:
    """Stream the items of a top-level JSON array with ijson (bounded memory).

    A syntax error inside the array makes the rest of the file unreadable: the items
    before it are kept, and the unreadable remainder becomes one rejected row that
    says where parsing stopped and keeps the start of the remaining text.
    """
    if _first_significant_byte(path) == b"":
        return  # empty or whitespace-only: reported once as `empty_file`
    position = 0
    with _open_binary(path) as f:
        counted = _CountingReader(f)
        try:
            for item in ijson.items(counted, prefix, use_float=True):
                yield (position, item, None, None, None)
                position += 1
            return
        except (ijson.JSONError, UnicodeDecodeError, ValueError) as exc:
            text = str(exc).strip()
            error = "invalid_utf8" if isinstance(exc, UnicodeDecodeError) or "utf" in text.lower() else "invalid_json"
            failure = text.splitlines()[0] if text else type(exc).__name__
            offset = counted.last_chunk_start
    with _open_binary(path) as f:
        f.seek(offset) if not path.name.lower().endswith(".gz") else f.read(offset)
        tail = f.read(RAW_KEEP_BYTES).decode("utf-8", "backslashreplace")
    yield (position, None, error,
           f"JSON array broken after {position} items near byte {offset:,} ({failure}); "
           "the rest of the file could not be read",
           tail)


class _CountingReader:
    """Wraps a binary file to know roughly where a streaming parser stopped."""

    def __init__(self, inner: io.BufferedIOBase) -> None:
        self.inner = inner
        self.position = 0
        self.last_chunk_start = 0

    def read(self, size: int = -1) -> bytes:
        data = self.inner.read(size)
        self.last_chunk_start = self.position
        self.position += len(data)
        return data


def _read_csv(path: Path, source: str, delimiter: str, max_bytes: int) -> Iterator[Row]:
    csv.field_size_limit(max_bytes)
    opener = gzip.open if path.name.lower().endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8", errors="surrogateescape", newline="") as f:  # type: ignore[operator]
        reader = csv.reader(f, delimiter=delimiter)
        try:
            header = next(reader)
        except StopIteration:
            return
        except csv.Error as exc:
            yield (0, None, "malformed_csv", f"header: {exc}", "")
            return
        header = [h.lstrip("\ufeff").strip() for h in header]
        position = 0
        while True:
            try:
                row = next(reader)
            except StopIteration:
                return
            except csv.Error as exc:
                yield (position, None, "malformed_csv", f"row {position + 1}: {exc}", "")
                position += 1
                continue
            if not row or (len(row) == 1 and not row[0].strip()):
                continue
            raw_line = delimiter.join(row)
            if any(_has_surrogates(v) for v in row):
                yield (position, None, "invalid_utf8", f"row {position + 1} has bytes that are not UTF-8",
                       _clip(raw_line.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")))
            elif len(row) != len(header):
                yield (position, None, "malformed_csv",
                       f"row {position + 1} has {len(row)} fields, the header has {len(header)}", _clip(raw_line))
            else:
                yield (position, dict(zip(header, row, strict=True)), None, None, None)
            position += 1


def _has_surrogates(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _read_parquet(path: Path, source: str, batch_rows: int) -> Iterator[Row]:
    import pyarrow.parquet as pq

    position = 0
    try:
        parquet = pq.ParquetFile(path)
    except Exception as exc:  # noqa: BLE001 - any pyarrow failure means "not a readable parquet file"
        yield (0, None, "unreadable_file", f"not a readable Parquet file: {exc}", "")
        return
    for batch in parquet.iter_batches(batch_size=batch_rows):
        for row in batch.to_pylist():
            yield (position, _plain(row), None, None, None)
            position += 1


def _read_hf(spec: InputSpec, source: str, batch_rows: int) -> Iterator[Row]:
    dataset = spec.dataset
    if dataset is None:
        import datasets

        path = Path(spec.path)
        if path.is_file():
            dataset = datasets.Dataset.from_file(str(path))
        else:
            dataset = datasets.load_from_disk(str(path))
    if hasattr(dataset, "keys") and not hasattr(dataset, "column_names"):
        raise InputError(f"input {source!r} is a DatasetDict; name one split (e.g. {spec.path}/train)")
    position = 0
    for start in range(0, len(dataset), batch_rows):
        chunk = dataset[start : start + batch_rows]
        columns = list(chunk.keys())
        n = len(chunk[columns[0]]) if columns else 0
        for i in range(n):
            yield (position, _plain({c: chunk[c][i] for c in columns}), None, None, None)
            position += 1


def _plain(value: Any) -> Any:
    """Make Parquet/Arrow values JSON-like (NaN floats stay floats; bytes become text)."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, bytes):
        return value.decode("utf-8", "backslashreplace")
    if isinstance(value, float) and math.isnan(value):
        return None
    return value


def describe_input(spec: InputSpec) -> dict[str, Any]:
    """Static facts about an input for the manifest (checksum, size, reader)."""
    info: dict[str, Any] = {"name": spec.name, "reader": spec.resolved_reader(), "format": spec.format}
    if spec.dataset is not None:
        info["path"] = None
        fingerprint = getattr(spec.dataset, "_fingerprint", None)
        info["fingerprint"] = fingerprint
        return info
    path = Path(spec.path)
    info["path"] = str(spec.path)
    if path.is_file():
        info["bytes"] = path.stat().st_size
        info["sha256"] = file_sha256(path)
    else:
        files = sorted(p for p in path.rglob("*") if p.is_file())
        digest = hashlib.sha256()
        total = 0
        for p in files:
            digest.update(str(p.relative_to(path)).encode())
            digest.update(file_sha256(p).encode())
            total += p.stat().st_size
        info["bytes"] = total
        info["sha256"] = digest.hexdigest()
    return info


def dumps_raw(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=str)
