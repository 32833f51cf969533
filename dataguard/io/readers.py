"""Streaming readers: every input format becomes a sequence of bounded `RawBatch`es.

Readers never hold a whole file (or a whole oversized record) in memory and never raise
on bad data: a line that is not JSON, bytes that are not UTF-8, a lone surrogate escape,
nesting deeper than ``MAX_DEPTH``, a record over the size limit, a CSV row with the wrong
number of fields or a stray quote, the damaged end of a ``.gz`` - each becomes an error row
(one per input row, in its own position) that normalization turns into a rejected row
with a preview of the raw text. Only a problem with the input as a whole raises
``InputError`` (missing or unreadable path, unknown reader, a JSON object without
``json_key``, a folder that is not a dataset): that is a configuration error, one line.
"""

from __future__ import annotations

import csv
import gzip
import hashlib
import json
import math
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from dataguard.io import raw as _raw
from dataguard.io.raw import (
    MAX_DEPTH,
    RAW_KEEP_BYTES,
    READ_ERRORS,
    Broken,
    FrameError,
    JsonArrayFramer,
    Line,
    Oversize,
    Problem,
    RawBatch,
    ReadError,
    SourceOptions,
    bounded_lines,
    describe_error,
    json_balance,
    json_depth,
    oversize,
    preview,
    read_head,
    read_some,
)
from dataguard.records import safe_text

READERS = ("auto", "json", "jsonl", "csv", "tsv", "parquet", "hf")
DEFAULT_BATCH_ROWS = 5000
# A single record larger than this is rejected (its first bytes, size and hash are kept)
# rather than carried through every stage; huge fields are almost always broken exports.
DEFAULT_MAX_RECORD_BYTES = 8 * 1024 * 1024
# Arrow rows are converted to Python in batches of about this many bytes.
ARROW_BATCH_BYTES = 64 << 20


class InputError(ValueError):
    """An input cannot be read at all (missing file, unknown reader, no array to read)."""


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
    json_key: str | None = None  # read the array under this key of a top-level JSON object ("a.b": nested)
    dataset: Any = None  # a datasets.Dataset, for the Python API

    def __post_init__(self) -> None:
        if self.path is None and self.dataset is None:
            raise InputError("an input needs a path or a dataset")
        if self.reader not in READERS:
            raise InputError(f"unknown reader {self.reader!r} (expected one of {', '.join(READERS)})")
        if self.name is None:
            self.name = Path(self.path).name if self.path is not None else "dataset"
        # A file name that is not UTF-8 (surrogate-escaped by the OS layer) would end up in
        # every row id; Arrow cannot store it.
        self.name = safe_text(str(self.name))

    def options(self) -> SourceOptions:
        return SourceOptions(
            name=str(self.name), format=self.format, aliases=dict(self.aliases),
            text_field=self.text_field, label_field=self.label_field,
        )

    def resolved_reader(self) -> str:
        """Pick a reader from the file name (and, for .json, the first bytes).

        Raises only InputError: e.g. for a ``.json`` file holding one JSON object (not an
        array, not JSON lines) and no ``json_key``, naming the keys it found.
        """
        if self.dataset is not None:
            return "hf"
        if self.reader != "auto":
            return self.reader
        path = Path(self.path)
        if path.is_dir():
            return "hf"
        name = path.name.lower().removesuffix(".gz")
        if name.endswith(".jsonl") or name.endswith(".ndjson"):
            return "jsonl"
        if name.endswith(".json"):
            return "json" if self.json_key else _sniff_json(path, str(self.name))
        if name.endswith(".csv"):
            return "csv"
        if name.endswith(".tsv"):
            return "tsv"
        if name.endswith(".parquet") or name.endswith(".pq"):
            return "parquet"
        if name.endswith(".arrow"):
            return "hf"
        raise InputError(f"cannot tell the format of {path} from its name; set `reader:`")


def _open_binary(path: Path) -> BinaryIO:
    try:
        if path.name.lower().endswith(".gz"):
            return gzip.open(path, "rb")  # type: ignore[return-value]
        return open(path, "rb")
    except OSError as exc:
        raise InputError(f"cannot read {path}: {exc.strerror or exc}") from None


def _sniff_json(path: Path, source: str) -> str:
    """``json`` for an array, ``jsonl`` for JSON lines; a lone object is an InputError."""
    with _open_binary(path) as f:
        first = read_head(f, 64 * 1024).lstrip()[:1]
    if first != b"{":
        return "json" if first == b"[" else "jsonl"
    # "{" starts JSON lines, or one (pretty-printed) object holding the records: JSON lines
    # have a first line that is complete on its own, followed by another object line.
    lines: list[Line] = []
    with _open_binary(path) as f:
        for _, line in bounded_lines(f, DEFAULT_MAX_RECORD_BYTES):
            if not isinstance(line, bytes) or line.strip():
                lines.append(line)
            if len(lines) == 2:
                break
    head = lines[0] if lines else b""
    if not isinstance(head, bytes) or json_balance(head) <= 0:
        return "jsonl"
    if len(lines) == 2 and isinstance(lines[1], bytes) and lines[1].lstrip().startswith(b"{") \
            and json_balance(lines[1]) == 0:
        return "jsonl"  # a broken first record of a JSON-lines file
    raise InputError(_frame_message(source, None, _object_keys(path)))


def _object_keys(path: Path) -> FrameError:
    """The top-level keys of a JSON object file (scans at most ``PROBE_BYTES``)."""
    framer = JsonArrayFramer([], DEFAULT_MAX_RECORD_BYTES)
    try:
        with _open_binary(path) as f:
            first = True
            while True:
                try:
                    chunk = read_some(f, _raw.READ_CHUNK_BYTES)
                except READ_ERRORS:
                    chunk = b""
                if first and chunk.startswith(_raw.BOM):
                    chunk = chunk[3:]
                first = False
                if not chunk:
                    framer.finish()
                    break
                framer.feed(chunk)
    except FrameError as exc:
        return exc
    return FrameError("object", framer.found, complete=False)


def _frame_message(source: str, json_key: str | None, exc: FrameError) -> str:
    keys = ", ".join(exc.found) + ("" if exc.complete else ", ...") if exc.found else "none"
    if exc.kind == "object":
        return (f"input {source!r} is a JSON object, not an array or JSON lines; set json_key: to the key "
                f"holding the records (found keys: {keys})")
    if exc.kind == "missing":
        return f"input {source!r} has no key {json_key!r} holding the records (found keys: {keys})"
    if exc.kind == "is_array":
        return f"input {source!r} is a JSON array: json_key {json_key!r} does not apply; remove it"
    return f"input {source!r}: json_key {json_key!r} does not hold a JSON array"


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
        yield from _deferred_jsonl(Path(spec.path), source, batch_rows, max_record_bytes)
        return
    if reader == "jsonl":
        gen = _read_jsonl(Path(spec.path), source, max_record_bytes)
    elif reader == "json":
        gen = _read_json_array(Path(spec.path), source, spec.json_key, max_record_bytes)
    elif reader in ("csv", "tsv"):
        gen = _read_csv(Path(spec.path), source, "\t" if reader == "tsv" else ",", max_record_bytes)
    elif reader == "parquet":
        gen = _read_parquet(Path(spec.path), source, batch_rows, max_record_bytes)
    else:
        gen = _read_hf(spec, source, batch_rows, max_record_bytes)
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


def _damage(path: Path, broken: Broken, where: str) -> ReadError:
    """The one row that stands for the unreadable rest of a file."""
    compressed = path.name.lower().endswith(".gz")
    reason = "corrupt_compressed_file" if compressed else "unreadable_file"
    what = "compressed data is damaged or truncated" if compressed else "the file could not be read"
    return ReadError(reason, f"{what} at {where} ({broken.message}); the rows before it are kept, "
                             "the rest of the file is lost", preview(broken.head))


# ------------------------------------------------------------------ JSON records
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def _has_lone_surrogate(record: Any) -> bool:
    try:
        json.dumps(record, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def parse_json_bytes(data: bytes, where: str, depth_checked: bool = False) -> tuple[Any, str | None, str, str]:
    """(record, None, "", "") or (None, reason, detail, raw preview) for one JSON text.

    Depth is measured before parsing (only when the text has enough brackets to be deep),
    so ``json.loads`` and everything after it never recurse past ``MAX_DEPTH``. A lone
    surrogate escape (``"\\ud800"``) decodes to a string no UTF-8 writer accepts: the row is
    ``invalid_unicode``; the check runs only when the raw text holds such an escape.
    """
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        return None, "invalid_utf8", f"{where}: {exc}", preview(data)
    if not depth_checked and data.count(b"[") + data.count(b"{") > MAX_DEPTH and json_depth(data) > MAX_DEPTH:
        return None, "too_deep", f"{where} nests arrays/objects deeper than the limit {MAX_DEPTH}", preview(data)
    try:
        record = json.loads(text)
    except json.JSONDecodeError as exc:
        at = f"line {exc.lineno} column {exc.colno}" if exc.lineno > 1 else f"column {exc.colno}"
        return None, "invalid_json", f"{where}: {exc.msg} at {at}", preview(data)
    except RecursionError:  # not reachable after the depth check; kept as a last guard
        return None, "too_deep", f"{where} nests arrays/objects too deeply", preview(data)
    if b"\\u" in data and _SURROGATE_ESCAPE.search(data) and _has_lone_surrogate(record):
        return None, "invalid_unicode", (f"{where}: a \\u escape encodes a lone surrogate (half of a UTF-16 pair), "
                                         "which is not a character"), preview(data)
    return record, None, "", ""


def _plain_json(data: bytes) -> Any:
    """The parsed record when ``data`` is an ordinary JSON text (UTF-8, too few brackets to be
    too deep, no surrogate escape), else ``_SLOW``: the hot path of every JSON reader."""
    if (len(data) <= MAX_DEPTH or data.count(b"[") + data.count(b"{") <= MAX_DEPTH) \
            and b"\\ud" not in data and b"\\uD" not in data:
        try:
            return json.loads(data.decode("utf-8"))
        except ValueError:  # UnicodeDecodeError, JSONDecodeError: the slow path says which
            pass
    return _SLOW


_SLOW = object()


def parse_jsonl_line(position: int, line_no: int, line: bytes, max_bytes: int) -> Row:
    """One JSONL line -> a parsed record or an error row that keeps a preview of the raw text."""
    if len(line) <= max_bytes:
        record = _plain_json(line)
        if record is not _SLOW:
            return position, record, None, None, None
    if len(line) > max_bytes:
        big = oversize(line)
        return position, None, "record_too_large", big.detail(f"line {line_no}", max_bytes), big.raw()
    record, error, detail, raw = parse_json_bytes(line, f"line {line_no}")
    if error is None:
        return position, record, None, None, None
    return position, None, error, detail, raw


# ------------------------------------------------------------------ JSON lines
def _jsonl_lines(path: Path, max_bytes: int) -> Iterator[tuple[int, int, bytes | ReadError]]:
    """(position, line number, raw bytes or the reader's own error) of each non-blank line."""
    position = 0
    with _open_binary(path) as f:
        for line_no, line in bounded_lines(f, max_bytes):
            if isinstance(line, bytes):
                if not line.strip():
                    continue  # blank lines are separators, not records
                yield position, line_no, line
            elif isinstance(line, Oversize):
                yield position, line_no, ReadError("record_too_large", line.detail(f"line {line_no}", max_bytes),
                                                   line.raw())
            else:
                yield position, line_no, _damage(path, line, f"line {line_no}")
            position += 1


def _read_jsonl(path: Path, source: str, max_bytes: int) -> Iterator[Row]:
    for position, line_no, line in _jsonl_lines(path, max_bytes):
        if isinstance(line, ReadError):
            yield position, None, line.reason, line.detail, line.raw
        else:
            yield parse_jsonl_line(position, line_no, line, max_bytes)


def _deferred_jsonl(path: Path, source: str, batch_rows: int, max_bytes: int) -> Iterator[RawBatch]:
    batch = RawBatch(source=source, max_record_bytes=max_bytes)
    seen = 0
    for item in _jsonl_lines(path, max_bytes):
        seen += 1
        batch.pending.append(item)
        if len(batch.pending) >= batch_rows:
            yield batch
            batch = RawBatch(source=source, max_record_bytes=max_bytes)
    if seen == 0:
        batch.add_error(0, "empty_file", f"input {source!r} contains no records", "")
    if len(batch):
        yield batch


# ------------------------------------------------------------------ JSON arrays
def _read_json_array(path: Path, source: str, json_key: str | None, max_bytes: int) -> Iterator[Row]:
    """Stream the items of a JSON array (top-level, or under ``json_key``) in bounded memory.

    ``JsonArrayFramer`` cuts the bytes into items before anything is parsed, so a syntax
    error, bad UTF-8, excess depth or size stays a rejected row of its own item. A truncated
    file, a stray bracket or data after the array is one more row; the items before are kept.
    """
    framer = JsonArrayFramer(json_key.split(".") if json_key else [], max_bytes)
    position = 0
    with _open_binary(path) as f:
        first = True
        while not framer.done:
            try:
                chunk = read_some(f, _raw.READ_CHUNK_BYTES)
            except READ_ERRORS as exc:
                broken = Broken(describe_error(exc), framer.partial())
                damage = _damage(path, broken, f"byte {framer.end:,} of the uncompressed data")
                yield position, None, damage.reason, f"item {position}: {damage.detail}", damage.raw
                return
            if first and chunk.startswith(_raw.BOM):
                chunk = chunk[3:]
            first = False
            try:
                items = framer.feed(chunk) if chunk else framer.finish()
            except FrameError as exc:
                raise InputError(_frame_message(source, json_key, exc)) from None
            for item in items:
                yield _item_row(position, item, max_bytes)
                position += 1
            if not chunk:
                return


def _item_row(position: int, item: bytes | Oversize | Problem, max_bytes: int) -> Row:
    where = f"item {position}"
    if isinstance(item, bytes):
        record = _plain_json(item)
        if record is not _SLOW:
            return position, record, None, None, None
        record, error, detail, raw = parse_json_bytes(item, where, depth_checked=True)
        return (position, record, None, None, None) if error is None else (position, None, error, detail, raw)
    if isinstance(item, Oversize):
        return position, None, "record_too_large", item.detail(where, max_bytes), item.raw()
    return position, None, item.reason, f"{where}: {item.detail}", preview(item.head)


# ------------------------------------------------------------------ CSV / TSV
class _LineTooLarge(Exception):
    def __init__(self, line_no: int, big: Oversize) -> None:
        super().__init__(line_no)
        self.line_no, self.big = line_no, big


class _StreamBroken(Exception):
    def __init__(self, line_no: int, broken: Broken) -> None:
        super().__init__(line_no)
        self.line_no, self.broken = line_no, broken


class _CsvFeed:
    """Bounded, decoded physical lines for ``csv.reader``; remembers the lines of the record
    being read, so a record that must be rejected is rejected line by line, each line
    keeping its own text. Bytes that are not UTF-8 pass as surrogate escapes and flag it."""

    def __init__(self, lines: Iterator[tuple[int, Line]]) -> None:
        self.lines = lines
        self.taken: list[tuple[int, bytes]] = []
        self.bad_utf8 = False

    def __iter__(self) -> _CsvFeed:
        return self

    def __next__(self) -> str:
        line_no, line = next(self.lines)
        if isinstance(line, Oversize):
            raise _LineTooLarge(line_no, line)
        if isinstance(line, Broken):
            raise _StreamBroken(line_no, line)
        self.taken.append((line_no, line))
        try:
            return line.decode("utf-8") + "\n"
        except UnicodeDecodeError:
            self.bad_utf8 = True
            return line.decode("utf-8", "surrogateescape") + "\n"

    def take(self) -> tuple[list[tuple[int, bytes]], bool]:
        taken, bad = self.taken, self.bad_utf8
        self.taken, self.bad_utf8 = [], False
        return taken, bad


@dataclass
class _CsvRecord:
    lines: list[tuple[int, bytes]]
    bad_utf8: bool
    fields: list[str] | None = None
    error: str | None = None  # csv.Error text (strict quoting, unclosed quote at EOF, field too large)
    too_large: tuple[int, Oversize] | None = None
    broken: tuple[int, Broken] | None = None

    def blank(self) -> bool:
        return self.fields is not None and (not self.fields or (len(self.fields) == 1 and not self.fields[0].strip()))


def _csv_records(path: Path, delimiter: str, max_bytes: int) -> Iterator[_CsvRecord]:
    """Every record of a CSV file with the physical lines it was read from (strict quoting)."""
    csv.field_size_limit(max_bytes)
    with _open_binary(path) as f:
        feed = _CsvFeed(bounded_lines(f, max_bytes))
        reader = csv.reader(feed, delimiter=delimiter, strict=True)
        while True:
            try:
                fields = next(reader)
            except StopIteration:
                return
            except csv.Error as exc:
                yield _CsvRecord(*feed.take(), error=str(exc))
            except _LineTooLarge as exc:
                yield _CsvRecord(*feed.take(), too_large=(exc.line_no, exc.big))
            except _StreamBroken as exc:
                yield _CsvRecord(*feed.take(), broken=(exc.line_no, exc.broken))
                return
            else:
                yield _CsvRecord(*feed.take(), fields=fields)
                continue
            reader = csv.reader(feed, delimiter=delimiter, strict=True)  # start clean after an error


def _multiline_records(path: Path, delimiter: str, max_bytes: int, enough: int = 2) -> int:
    """How many well-formed records span several lines (counting stops at ``enough``).

    A quoted field may hold line breaks, but a stray quote also makes the rows after it
    one "field": a file whose only multi-line record is that one is damaged there.
    """
    header: int | None = None
    found = 0
    for rec in _csv_records(path, delimiter, max_bytes):
        if rec.fields is None or rec.blank():
            continue
        if header is None:
            header = len(rec.fields)
        elif len(rec.lines) > 1 and len(rec.fields) == header:
            found += 1
            if found >= enough:
                break
    return found


def _line_rows(position: int, lines: list[tuple[int, bytes]], reason: str, detail: str) -> list[Row]:
    """One rejected row per non-blank physical line, each with its own text."""
    rows: list[Row] = []
    for line_no, line in lines:
        if line.strip():
            rows.append((position + len(rows), None, reason, f"line {line_no}: {detail}", preview(line)))
    return rows


def _span(lines: list[tuple[int, bytes]]) -> str:
    return f"lines {lines[0][0]}-{lines[-1][0]}" if len(lines) > 1 else f"line {lines[0][0]}" if lines else "EOF"


def _header_name(name: str) -> str:
    """A column name; bytes that are not UTF-8 (surrogate-escaped by the feed) as ``\\xff``."""
    if not name.isascii():
        name = name.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    return name.lstrip("\ufeff").strip()


def _unique(names: list[str]) -> list[str]:
    """Column names made unique (``name_2``, ...), so no column's values silently vanish."""
    seen: set[str] = set()
    out = []
    for name in names:
        candidate, n = name, 1
        while candidate in seen:
            n += 1
            candidate = f"{name}_{n}"
        seen.add(candidate)
        out.append(candidate)
    return out


def _read_csv(path: Path, source: str, delimiter: str, max_bytes: int) -> Iterator[Row]:
    """CSV/TSV rows as dicts keyed by the header, read with strict quoting.

    A record that cannot be trusted - a quoting error, a quoted field still open at the
    end of the file, the wrong number of fields, or a line break inside a field when no
    other record in the file has one (a stray quote that swallowed the next rows) - is
    rejected as ``malformed_csv`` one physical line at a time: no merged row is ever kept.
    """
    multiline_ok = _multiline_records(path, delimiter, max_bytes) >= 2
    header: list[str] | None = None
    header_problem: str | None = None
    position = 0
    for rec in _csv_records(path, delimiter, max_bytes):
        rows: list[Row] = []
        if rec.broken is not None:
            line_no, broken = rec.broken
            partial = Broken(broken.message, b"\n".join(line for _, line in rec.lines)[:RAW_KEEP_BYTES]
                             or broken.head)
            damage = _damage(path, partial, f"line {line_no}")
            yield position, None, damage.reason, damage.detail, damage.raw
            return
        if header is None and header_problem is None:
            if rec.blank():
                continue
            if rec.fields is not None:
                header = _unique([_header_name(h) for h in rec.fields])
                continue
            header_problem = (f"the header ({_span(rec.lines)}) is not valid CSV "
                              f"({rec.error or 'a line over the size limit'}); the file cannot be read")
            rows = _line_rows(position, rec.lines[1:], "malformed_csv", header_problem)
        elif header_problem is not None:
            rows = _line_rows(position, rec.lines, "malformed_csv", header_problem)
            if rec.too_large is not None:
                rows.append((position + len(rows), None, "malformed_csv", f"line {rec.too_large[0]}: {header_problem}",
                             rec.too_large[1].raw()))
        elif rec.too_large is not None:
            line_no, big = rec.too_large
            rows = _line_rows(position, rec.lines, "malformed_csv", f"part of a record cut by the oversized line {line_no}")
            rows.append((position + len(rows), None, "record_too_large", big.detail(f"line {line_no}", max_bytes),
                         big.raw()))
        elif rec.error is not None:
            if "unexpected end of data" in rec.error:
                detail = (f"a quoted field opened on line {rec.lines[0][0] if rec.lines else '?'} never closes; "
                          f"{_span(rec.lines)} cannot be split into rows")
            else:
                detail = f"{rec.error} (in the record on {_span(rec.lines)})"
            rows = _line_rows(position, rec.lines, "malformed_csv", detail)
        else:
            assert rec.fields is not None and header is not None
            if rec.blank():
                continue
            fields = rec.fields
            if len(rec.lines) > 1 and (len(fields) != len(header) or not multiline_ok):
                why = (f"has {len(fields)} fields, the header {len(header)}" if len(fields) != len(header)
                       else "is the only record in the file with a line break inside a field")
                rows = _line_rows(position, rec.lines, "malformed_csv",
                                  f"the record on {_span(rec.lines)} {why}; a stray quote may have merged rows")
            else:
                raw_text = b"\n".join(line for _, line in rec.lines)
                if len(fields) != len(header):
                    rows = [(position, None, "malformed_csv",
                             f"row {position + 1} ({_span(rec.lines)}) has {len(fields)} fields, the header has "
                             f"{len(header)}", preview(raw_text))]
                elif rec.bad_utf8:
                    rows = [(position, None, "invalid_utf8", f"row {position + 1} ({_span(rec.lines)}) has bytes "
                             "that are not UTF-8", preview(raw_text))]
                else:
                    rows = [(position, dict(zip(header, fields, strict=True)), None, None, None)]
        yield from rows
        position += len(rows)


# ------------------------------------------------------------------ Parquet / Arrow datasets
def _type_depth(t: Any) -> int:
    """Nesting of lists/structs/maps in an Arrow type (0 for a scalar), without recursion."""
    import pyarrow as pa

    deepest, stack = 0, [(t, 0)]
    while stack:
        typ, depth = stack.pop()
        if isinstance(typ, pa.ExtensionType):
            typ = typ.storage_type
        if pa.types.is_dictionary(typ):
            typ = typ.value_type
        if pa.types.is_map(typ):
            stack += [(typ.key_type, depth + 1), (typ.item_type, depth + 1)]
        elif pa.types.is_list(typ) or pa.types.is_large_list(typ) or pa.types.is_fixed_size_list(typ):
            stack.append((typ.value_type, depth + 1))
        elif pa.types.is_struct(typ):
            stack += [(typ.field(i).type, depth + 1) for i in range(typ.num_fields)]
        deepest = max(deepest, depth)
    return deepest


def _value_nbytes(arr: Any) -> np.ndarray:
    """Approximate bytes of each value of an Arrow array (text/binary lengths summed through
    lists and structs), vectorised: the size check needs no Python objects."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    if isinstance(arr, pa.ExtensionArray):
        arr = arr.storage
    typ = arr.type
    if pa.types.is_dictionary(typ):
        arr = arr.dictionary_decode()
        typ = arr.type
    n = len(arr)
    if pa.types.is_string(typ) or pa.types.is_large_string(typ) or pa.types.is_binary(typ) \
            or pa.types.is_large_binary(typ):
        return pc.fill_null(pc.binary_length(arr), 0).to_numpy(zero_copy_only=False).astype(np.int64)
    if pa.types.is_list(typ) or pa.types.is_large_list(typ) or pa.types.is_map(typ):
        offsets = arr.offsets.to_numpy(zero_copy_only=False).astype(np.int64)
        child = arr.values  # the whole child: `offsets` index into it even when `arr` is a slice
        sums = np.concatenate([[0], np.cumsum(_value_nbytes(child))])
        return sums[offsets[1:]] - sums[offsets[:-1]] + 8
    if pa.types.is_fixed_size_list(typ):
        per = _value_nbytes(arr.flatten())
        return per.reshape(n, typ.list_size).sum(axis=1) if n else np.zeros(0, np.int64)
    if pa.types.is_struct(typ):
        total = np.full(n, 2, np.int64)
        for child in arr.flatten():
            total += _value_nbytes(child)
        return total
    width = typ.bit_width // 8 if hasattr(typ, "bit_width") and typ.bit_width >= 8 else 8
    return np.full(n, width, np.int64)


def _row_nbytes(table: Any) -> np.ndarray:
    try:
        total = np.zeros(table.num_rows, np.int64)
        for column in table.columns:
            total += _value_nbytes(column)
        return total
    except Exception:  # noqa: BLE001 - an exotic type: measure the rows one by one instead
        return np.array([len(_dump_row(table.slice(i, 1))) for i in range(table.num_rows)], np.int64)


def _dump_row(one_row: Any) -> bytes:
    """One Arrow row as JSON bytes (for a preview and a hash); text that is not UTF-8 escaped."""
    try:
        rows = one_row.to_pylist()
    except (UnicodeDecodeError, ValueError):
        try:
            rows = _binary_view(one_row).to_pylist()
        except (UnicodeDecodeError, ValueError):  # bad text nested in a list or struct
            return b"[a row holding nested text that is not UTF-8]"
    return json.dumps(_plain(rows[0]), ensure_ascii=False, sort_keys=True, default=str).encode("utf-8", "replace")


def _binary_view(table: Any) -> Any:
    """The table with text columns as binary, for rows whose text is not valid UTF-8."""
    import pyarrow as pa

    cols = []
    for column in table.columns:
        if pa.types.is_string(column.type):
            column = column.cast(pa.binary())
        elif pa.types.is_large_string(column.type):
            column = column.cast(pa.large_binary())
        cols.append(column)
    return pa.Table.from_arrays(cols, names=table.column_names)


def _arrow_rows(table: Any, position: int, max_bytes: int) -> Iterator[Row]:
    """Rows of an Arrow table as plain records; an oversized row is rejected from its Arrow
    size (the record itself is only serialised to keep a preview and a hash), a row with
    invalid UTF-8 text is ``invalid_utf8``."""
    sizes = _row_nbytes(table)
    big = sizes > max_bytes
    good_rows: list[Any] | None = None
    if not big.any():
        try:
            good_rows = table.to_pylist()
        except (UnicodeDecodeError, ValueError):
            good_rows = None
    for i in range(table.num_rows):
        where = f"row {position + i}"
        if big[i]:
            data = _dump_row(table.slice(i, 1))
            info = oversize(data)
            detail = (f"{where} is about {int(sizes[i]):,} bytes (limit {max_bytes:,}); "
                      f"sha256 of its JSON {info.sha256}")
            yield position + i, None, "record_too_large", detail, info.raw()
            continue
        if good_rows is not None:
            yield position + i, _plain(good_rows[i]), None, None, None
            continue
        one = table.slice(i, 1)
        try:
            yield position + i, _plain(one.to_pylist()[0]), None, None, None
        except (UnicodeDecodeError, ValueError) as exc:
            yield (position + i, None, "invalid_utf8", f"{where}: text that is not UTF-8 ({exc})",
                   preview(_dump_row(one)))


def _too_deep_rows(position: int, n: int, depth: int) -> Iterator[Row]:
    for i in range(n):
        yield (position + i, None, "too_deep",
               f"row {position + i}: the schema nests lists/structs {depth} levels (limit {MAX_DEPTH})", "")


def _read_parquet(path: Path, source: str, batch_rows: int, max_bytes: int) -> Iterator[Row]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        parquet = pq.ParquetFile(path)
        depth = 1 + max((_type_depth(f.type) for f in parquet.schema_arrow), default=0)
        meta = parquet.metadata
        avg = max(1, sum(meta.row_group(i).total_byte_size for i in range(meta.num_row_groups))
                  // max(1, meta.num_rows))
    except Exception as exc:  # noqa: BLE001 - any pyarrow failure means "not a readable parquet file"
        yield (0, None, "unreadable_file", f"not a readable Parquet file: {exc}", "")
        return
    if depth > MAX_DEPTH:
        yield from _too_deep_rows(0, meta.num_rows, depth)
        return
    rows_per_batch = max(1, min(batch_rows, ARROW_BATCH_BYTES // avg))
    position = 0
    batches = parquet.iter_batches(batch_size=rows_per_batch)
    while True:
        try:
            batch = next(batches)
        except StopIteration:
            return
        except Exception as exc:  # noqa: BLE001 - a damaged row group: keep what was read, report the rest
            yield (position, None, "unreadable_file",
                   f"Parquet data unreadable after {position} rows ({type(exc).__name__}: {exc}); the rest is lost", "")
            return
        yield from _arrow_rows(pa.Table.from_batches([batch]), position, max_bytes)
        position += batch.num_rows


def _load_dataset(spec: InputSpec, source: str) -> Any:
    try:
        import datasets
    except ImportError:
        raise InputError(f"input {source!r}: reading a dataset folder or .arrow file needs `datasets`") from None
    path = Path(spec.path)
    if path.is_dir() and not any((path / name).is_file() for name in _DATASET_FILES):
        raise InputError(f"input {source!r}: {path} is a folder but not a saved Hugging Face dataset "
                         f"(no {', '.join(_DATASET_FILES)}); give a data file or a dataset saved with save_to_disk")
    try:
        if path.is_file():
            return datasets.Dataset.from_file(str(path))
        return datasets.load_from_disk(str(path))
    except Exception as exc:  # noqa: BLE001 - whatever `datasets` raises, the user gets one line
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        kind = "an Arrow file" if path.is_file() else "a Hugging Face dataset"
        raise InputError(f"input {source!r}: {path} cannot be read as {kind} ({type(exc).__name__}: {reason})") \
            from None


_DATASET_FILES = ("state.json", "dataset_info.json", "dataset_dict.json")


def _read_hf(spec: InputSpec, source: str, batch_rows: int, max_bytes: int) -> Iterator[Row]:
    dataset = spec.dataset if spec.dataset is not None else _load_dataset(spec, source)
    if hasattr(dataset, "keys") and not hasattr(dataset, "column_names"):
        raise InputError(f"input {source!r} is a DatasetDict; name one split (e.g. {spec.path}/train)")
    if not hasattr(dataset, "with_format") or not hasattr(dataset, "__len__"):
        raise InputError(f"input {source!r}: expected a datasets.Dataset, got {type(dataset).__name__}")
    arrow = dataset.with_format("arrow")
    n = len(dataset)
    if not n:
        return
    first = arrow[0:1]
    depth = 1 + max((_type_depth(f.type) for f in first.schema), default=0)
    if depth > MAX_DEPTH:
        yield from _too_deep_rows(0, n, depth)
        return
    avg = max(1, int(_row_nbytes(first).sum()))
    try:
        avg = max(avg, dataset.data.nbytes // max(1, dataset.data.num_rows))
    except Exception:  # noqa: BLE001 - only a batch-size hint
        pass
    step = max(1, min(batch_rows, ARROW_BATCH_BYTES // avg))
    for start in range(0, n, step):
        yield from _arrow_rows(arrow[start: start + step], start, max_bytes)


def _plain(value: Any) -> Any:
    """Make Parquet/Arrow values JSON-like (NaN floats become null; bytes become text)."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, bytes):
        return value.decode("utf-8", "backslashreplace")
    if isinstance(value, float) and math.isnan(value):
        return None
    return value


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
