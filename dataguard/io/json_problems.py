"""What a JSON array reader reports instead of an item, worded in one place.

The framer's state machine only decides *that* something is wrong; the reason codes and
the sentences users read in ``rejected`` (and in the error for a file with no array) live
here, so their wording stays consistent and the state machine stays short.
"""

from __future__ import annotations

from dataclasses import dataclass

from dataguard.io.bounded import RAW_KEEP_BYTES, Oversize
from dataguard.io.json_structure import WHITESPACE


@dataclass(frozen=True)
class Problem:
    """An array item (or the array itself) that cannot be a record: reason, detail, first bytes."""

    reason: str
    detail: str
    head: bytes


class FrameError(Exception):
    """No array where the reader was told to look: ``kind`` is ``object`` (a top-level object
    and no key given), ``missing`` (no such key), ``not_array`` (the key holds something
    else) or ``is_array`` (a key given, but the file is an array). ``found``: top-level keys."""

    def __init__(self, kind: str, found: list[str], complete: bool = True) -> None:
        super().__init__(kind)
        self.kind = kind
        self.found = found
        self.complete = complete


Item = bytes | Oversize | Problem


def not_an_array(rest: bytes) -> Problem:
    """The document starts with something other than ``[`` or ``{``."""
    start = rest[:20].decode("utf-8", "backslashreplace")
    return Problem("invalid_json", f"not a JSON array: the file starts with {start!r}", rest[:RAW_KEEP_BYTES])


def truncated(items: int, remaining: int, head: bytes) -> Problem:
    """The stream ended inside the array (``remaining`` bytes of an unfinished item)."""
    return Problem("invalid_json", f"the file ends inside the JSON array after {items} items "
                   f"(truncated?); the last {remaining:,} bytes are not a complete item", head)


def stray_close(at: int, items: int, head: bytes) -> Problem:
    """A ``}`` at the array's own level: the framing is lost, so reading stops."""
    return Problem("invalid_json", f"a '}}' at byte {at:,} closes the JSON array after {items} "
                   "items; the rest of the file could not be read", head)


def empty_item(at: int) -> Problem:
    """Nothing between two commas (or before the closing bracket)."""
    return Problem("invalid_json", f"empty item at byte {at:,} (a stray or trailing comma)", b"")


def too_deep(limit: int, span: bytes) -> Problem:
    """An item nested deeper than ``limit``; never handed to the recursive parser."""
    return Problem("too_deep", f"item nests arrays/objects deeper than the limit {limit}",
                   span[:RAW_KEEP_BYTES].strip(WHITESPACE))


def trailing_data(items: int, data: bytes) -> Problem:
    """Non-whitespace after the top-level array's closing bracket."""
    return Problem("invalid_json", f"data after the end of the JSON array (after {items} items)",
                   data[:RAW_KEEP_BYTES])
