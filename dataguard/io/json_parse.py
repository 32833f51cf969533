"""Parsing one JSON record from bytes: the hot path and the rejected-row reasons.

A leaf module (no reader, no batch): ``RawBatch.parse_pending`` in the workers and the JSON
readers in the driver share it without importing each other.
"""

from __future__ import annotations

import json
import re
from typing import Any

from dataguard.io.bounded import Row, oversize, preview
from dataguard.io.jsonscan import MAX_DEPTH, json_depth

# A single record larger than this is rejected (its first bytes, size and hash are kept)
# rather than carried through every stage; huge fields are almost always broken exports.
DEFAULT_MAX_RECORD_BYTES = 8 * 1024 * 1024

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


def plain_json(data: bytes) -> Any:
    """The parsed record when ``data`` is an ordinary JSON text (UTF-8, too few brackets to be
    too deep, no surrogate escape), else ``SLOW``: the hot path of every JSON reader."""
    if (len(data) <= MAX_DEPTH or data.count(b"[") + data.count(b"{") <= MAX_DEPTH) \
            and b"\\ud" not in data and b"\\uD" not in data:
        try:
            return json.loads(data.decode("utf-8"))
        except ValueError:  # UnicodeDecodeError, JSONDecodeError: the slow path says which
            pass
    return SLOW


SLOW = object()


def parse_jsonl_line(position: int, line_no: int, line: bytes, max_bytes: int) -> Row:
    """One JSONL line -> a parsed record or an error row that keeps a preview of the raw text."""
    if len(line) <= max_bytes:
        record = plain_json(line)
        if record is not SLOW:
            return position, record, None, None, None
    if len(line) > max_bytes:
        big = oversize(line)
        return position, None, "record_too_large", big.detail(f"line {line_no}", max_bytes), big.raw()
    record, error, detail, raw = parse_json_bytes(line, f"line {line_no}")
    if error is None:
        return position, record, None, None, None
    return position, None, error, detail, raw
