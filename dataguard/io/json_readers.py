"""JSON lines and JSON array readers: each record is parsed on its own, so a bad one is one
rejected row and the hot path (ordinary JSON) stays a single ``json.loads``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from dataguard.io import bounded
from dataguard.io.bounded import (
    READ_ERRORS,
    Broken,
    InputError,
    Oversize,
    ReadError,
    Row,
    bounded_lines,
    damage_error,
    describe_error,
    open_binary,
    oversize,
    preview,
    read_some,
)
from dataguard.io.jsonscan import MAX_DEPTH, FrameError, JsonArrayFramer, Problem, json_depth
from dataguard.io.raw import RawBatch


def frame_message(source: str, json_key: str | None, exc: FrameError) -> str:
    keys = ", ".join(exc.found) + ("" if exc.complete else ", ...") if exc.found else "none"
    if exc.kind == "object":
        return (f"input {source!r} is a JSON object, not an array or JSON lines; set json_key: to the key "
                f"holding the records (found keys: {keys})")
    if exc.kind == "missing":
        return f"input {source!r} has no key {json_key!r} holding the records (found keys: {keys})"
    if exc.kind == "is_array":
        return f"input {source!r} is a JSON array: json_key {json_key!r} does not apply; remove it"
    return f"input {source!r}: json_key {json_key!r} does not hold a JSON array"


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
    with open_binary(path) as f:
        for line_no, line in bounded_lines(f, max_bytes):
            if isinstance(line, bytes):
                if not line.strip():
                    continue  # blank lines are separators, not records
                yield position, line_no, line
            elif isinstance(line, Oversize):
                yield position, line_no, ReadError("record_too_large", line.detail(f"line {line_no}", max_bytes),
                                                   line.raw())
            else:
                yield position, line_no, damage_error(path, line, f"line {line_no}")
            position += 1


def read_jsonl(path: Path, source: str, max_bytes: int) -> Iterator[Row]:
    for position, line_no, line in _jsonl_lines(path, max_bytes):
        if isinstance(line, ReadError):
            yield position, None, line.reason, line.detail, line.raw
        else:
            yield parse_jsonl_line(position, line_no, line, max_bytes)


def deferred_jsonl(path: Path, source: str, batch_rows: int, max_bytes: int) -> Iterator[RawBatch]:
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
def read_json_array(path: Path, source: str, json_key: str | None, max_bytes: int) -> Iterator[Row]:
    """Stream the items of a JSON array (top-level, or under ``json_key``) in bounded memory.

    ``JsonArrayFramer`` cuts the bytes into items before anything is parsed, so a syntax
    error, bad UTF-8, excess depth or size stays a rejected row of its own item. A truncated
    file, a stray bracket or data after the array is one more row; the items before are kept.
    """
    framer = JsonArrayFramer(json_key.split(".") if json_key else [], max_bytes)
    position = 0
    with open_binary(path) as f:
        first = True
        while not framer.done:
            try:
                chunk = read_some(f, bounded.READ_CHUNK_BYTES)
            except READ_ERRORS as exc:
                broken = Broken(describe_error(exc), framer.partial())
                damage = damage_error(path, broken, f"byte {framer.end:,} of the uncompressed data")
                yield position, None, damage.reason, f"item {position}: {damage.detail}", damage.raw
                return
            if first and chunk.startswith(bounded.BOM):
                chunk = chunk[3:]
            first = False
            try:
                items = framer.feed(chunk) if chunk else framer.finish()
            except FrameError as exc:
                raise InputError(frame_message(source, json_key, exc)) from None
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
