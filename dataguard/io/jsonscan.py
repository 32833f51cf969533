"""JSON structure found without parsing: ``JsonScanner`` finds the structural characters
outside strings (nesting depth, no recursion), and ``JsonArrayFramer`` cuts a JSON array into
its items' bytes so each one is size- and depth-checked before ``json.loads`` sees it.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

import numpy as np

from dataguard.io.bounded import RAW_KEEP_BYTES, Oversize, oversize

MAX_DEPTH = 100  # nesting (objects/arrays) a record may have; deeper is `too_deep`


# ------------------------------------------------------------------ JSON structure scanning
# Byte classes for the scanner: 1 quote, 2 "[", 3 "{", 4 "]", 5 "}", 6 ",", 7 ":"; 0 otherwise.
_CLASSES = bytearray(256)
for _code, _ch in enumerate(b'"[{]},:', start=1):
    _CLASSES[_ch] = _code
_CLASS_TABLE = bytes(_CLASSES)
OPEN_ARRAY, OPEN_OBJECT, CLOSE_ARRAY, CLOSE_OBJECT, COMMA, COLON = 2, 3, 4, 5, 6, 7
_BACKSLASH = 92


class JsonScanner:
    """Finds the structural characters of a JSON byte stream that lie outside strings.

    Vectorised per chunk (``bytes.translate`` + NumPy), with the in-string state and a
    trailing backslash run carried across chunks, so a reader can frame, depth-check and
    size-check JSON without parsing it (no recursion, no per-byte Python loop). Exact for
    valid JSON; on invalid JSON it may mis-frame, which only ever turns into rejected rows.
    """

    def __init__(self) -> None:
        self.in_string = False
        self.backslashes = 0  # length of the backslash run that ended the previous chunk

    def events(self, chunk: bytes) -> tuple[np.ndarray, np.ndarray]:
        """(offsets in ``chunk``, codes) of the structural characters outside strings."""
        codes = np.frombuffer(chunk.translate(_CLASS_TABLE), np.uint8)
        pos = np.flatnonzero(codes)
        kinds = codes[pos]
        is_quote = kinds == 1
        quotes = pos[is_quote]
        if len(quotes):
            quotes = self._unescaped(chunk, quotes)
        spos, skinds = pos[~is_quote], kinds[~is_quote]
        outside = ((np.searchsorted(quotes, spos) + int(self.in_string)) & 1) == 0
        self.in_string ^= bool(len(quotes) & 1)
        run = len(chunk) - len(chunk.rstrip(b"\\"))
        self.backslashes = run + self.backslashes if run == len(chunk) else run
        return spos[outside], skinds[outside]

    def _unescaped(self, chunk: bytes, quotes: np.ndarray) -> np.ndarray:
        """Drop the quotes preceded by an odd run of backslashes (``\\"`` inside a string)."""
        arr = np.frombuffer(chunk, np.uint8)
        before = quotes - 1
        after_bs = np.zeros(len(quotes), bool)
        after_bs[before >= 0] = arr[before[before >= 0]] == _BACKSLASH
        if quotes[0] == 0 and self.backslashes:
            after_bs[0] = True
        cand = np.flatnonzero(after_bs)
        if not len(cand):
            return quotes
        # Run lengths, a few steps at a time for all candidates; longer runs one by one.
        runs = np.zeros(len(cand), np.int64)
        cur = quotes[cand] - 1
        live = np.ones(len(cand), bool)
        for _ in range(8):
            ok = live & (cur >= 0)
            ok[ok] = arr[cur[ok]] == _BACKSLASH
            live &= ok
            if not live.any():
                break
            runs[live] += 1
            cur[live] -= 1
        for j in np.flatnonzero(live).tolist():  # still inside a run after 8 steps
            k = int(cand[j])
            seg = chunk[int(quotes[k - 1]) + 1 if k else 0: int(quotes[k])]  # a run cannot cross a quote
            runs[j] = len(seg) - len(seg.rstrip(b"\\"))
        at_start = (quotes[cand] - runs) == 0  # the run reaches back into the previous chunk
        runs[at_start] += self.backslashes
        keep = np.ones(len(quotes), bool)
        keep[cand] = (runs & 1) == 0
        return quotes[keep]


def json_depth(data: bytes) -> int:
    """Deepest nesting of arrays/objects in a JSON text (0 for a scalar), without parsing."""
    _, kinds = JsonScanner().events(data)
    if not len(kinds):
        return 0
    step = np.where(kinds <= OPEN_OBJECT, 1, np.where(kinds <= CLOSE_OBJECT, -1, 0)).astype(np.int64)
    return int(max(0, np.cumsum(step).max()))


def json_balance(data: bytes) -> int:
    """Opened minus closed arrays/objects outside strings: > 0 means the text is unfinished."""
    _, kinds = JsonScanner().events(data)
    return int(np.count_nonzero(kinds <= OPEN_OBJECT) - np.count_nonzero((kinds >= CLOSE_ARRAY) & (kinds <= CLOSE_OBJECT)))


# ------------------------------------------------------------------ JSON array framing
WHITESPACE = b" \t\r\n"
KEY_KEEP_BYTES = 64 * 1024  # a key longer than this cannot be the `json_key` we look for
PROBE_BYTES = 64 << 20  # how far to look for the keys of an object to name them in an error


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


class JsonArrayFramer:
    """Cuts the JSON array found under ``keys`` (none: the top-level array) into the byte
    spans of its items, fed chunk by chunk.

    Only structural characters outside strings are looked at (``JsonScanner``), so an item
    is size-checked before it is parsed and depth-checked without recursion: an item over
    ``max_bytes`` comes out as ``Oversize`` (hashed while skipped, never held whole), one
    nested deeper than ``max_depth`` as a ``too_deep`` ``Problem``, and the others as bytes for
    ``json.loads``. A syntax error stays inside its item; an unclosed array (truncated file),
    a stray closing bracket or data after the array is one ``Problem`` row.
    """

    def __init__(self, keys: list[str], max_bytes: int, max_depth: int = MAX_DEPTH) -> None:
        self.keys = keys
        self.max_bytes = max_bytes
        self.max_depth = max_depth
        self.scanner = JsonScanner()
        self.buf = bytearray()
        self.buf_start = 0  # stream offset of buf[0]
        self.end = 0  # stream offset after the last byte fed
        self.mode = "start"  # start -> nav (inside objects) -> items -> after | done
        self.depth = 0
        self.items = 0
        # navigation through objects to the array
        self.matched = 0
        self.level = 0
        self.mark: int | None = None
        self.want_value: int | None = None
        self.found: list[str] = []
        # the item being cut
        self.array_level = 0
        self.separators = 0
        self.item_start = 0
        self.too_deep = False
        self.hasher: Any = None
        self.head = b""
        self.hashed_to = 0

    @property
    def done(self) -> bool:
        return self.mode == "done"

    def feed(self, chunk: bytes) -> list[Item]:
        """The items completed by this chunk (raises FrameError if there is no array)."""
        out: list[Item] = []
        if self.mode == "done" or not chunk:
            return out
        base = self.end
        if self.mode == "after":
            self.end += len(chunk)
            self._trailing(chunk, out)
            return out
        if self.mode == "start":
            rest = chunk.lstrip(WHITESPACE)
            if not rest:
                self.end += len(chunk)
                self.buf_start = self.end
                return out
            if rest[:1] not in (b"[", b"{"):
                self.mode = "done"
                out.append(Problem("invalid_json", "not a JSON array: the file starts with "
                                   f"{rest[:20].decode('utf-8', 'backslashreplace')!r}", rest[:RAW_KEEP_BYTES]))
                return out
            self.mode = "top"
        self.buf += chunk
        self.end += len(chunk)
        pos, kinds = self.scanner.events(chunk)
        pos = pos + base
        i, n = 0, len(pos)
        while i < n and self.mode not in ("after", "done"):
            if self.mode == "items":
                i = self._items(pos, kinds, i, chunk, base, out)
                continue
            p, k = int(pos[i]), int(kinds[i])
            if self.mode == "nav":
                self._nav_event(p, k)
            else:
                self._top_event(p, k)
            i += 1
        self._after_chunk()
        return out

    def finish(self) -> list[Item]:
        """At the end of the stream: an unclosed array is one row; no array is a FrameError."""
        mode, head = self.mode, self.partial()
        self.mode = "done"
        if mode == "items":
            return [Problem("invalid_json", f"the file ends inside the JSON array after {self.items} items "
                            f"(truncated?); the last {self.end - self.item_start:,} bytes are not a complete item",
                            head)]
        if mode in ("nav", "top"):
            raise self._missing()
        return []

    def partial(self) -> bytes:
        """The first bytes of the item being cut (for the row that reports damage)."""
        if self.mode != "items" and self.hasher is None:
            return b""
        if self.hasher is not None:
            return self.head
        return bytes(self.buf[self.item_start - self.buf_start:][:RAW_KEEP_BYTES]).strip(WHITESPACE)

    # -- navigation
    def _top_event(self, p: int, k: int) -> None:
        self.depth = 1
        if k == OPEN_ARRAY:
            if self.keys:
                raise FrameError("is_array", [])
            self._start_array(p)
        else:
            self.mode, self.level, self.mark = "nav", 1, p + 1

    def _nav_event(self, p: int, k: int) -> None:
        if self.want_value is not None:
            between = bytes(self.buf[self.want_value + 1 - self.buf_start: p - self.buf_start])
            self.want_value = None
            last = self.matched == len(self.keys)
            if between.strip(WHITESPACE) or k != (OPEN_ARRAY if last else OPEN_OBJECT):
                raise FrameError("not_array", self.found)
            self.depth += 1
            if last:
                self._start_array(p)
            else:
                self.level, self.mark = self.depth, p + 1
            return
        if k <= OPEN_OBJECT:
            self.depth += 1
        elif k <= CLOSE_OBJECT:
            if self.depth == self.level:
                raise self._missing()
            self.depth -= 1
        elif self.depth == self.level:
            if k == COMMA:
                self.mark = p + 1
            else:
                key = self._key(p)
                if self.level == 1 and key is not None and len(self.found) < 50:
                    self.found.append(key)
                if self.matched < len(self.keys) and key == self.keys[self.matched]:
                    self.matched += 1
                    self.want_value = p
                self.mark = None

    def _key(self, colon: int) -> str | None:
        if self.mark is None or self.mark < self.buf_start:
            return None
        text = bytes(self.buf[self.mark - self.buf_start: colon - self.buf_start]).strip(WHITESPACE)
        try:
            key = json.loads(text.decode("utf-8"))
        except ValueError:
            return None
        return key if isinstance(key, str) else None

    def _missing(self) -> FrameError:
        kind = "object" if not self.keys else "missing"
        return FrameError(kind, self.found, complete=self.end <= PROBE_BYTES)

    # -- items
    def _start_array(self, p: int) -> None:
        self.mode = "items"
        self.array_level = self.depth
        self.item_start = p + 1
        self.separators = 0

    def _items(self, pos: np.ndarray, kinds: np.ndarray, i: int, chunk: bytes, base: int, out: list[Item]) -> int:
        """Cut items from events ``i:`` of a chunk, vectorised: depth by cumulative sum, and
        Python work only at the commas and the bracket of the array itself."""
        ps, ks = pos[i:], kinds[i:]
        step = np.zeros(len(ks), np.int64)
        step[ks <= OPEN_OBJECT] = 1
        step[(ks == CLOSE_ARRAY) | (ks == CLOSE_OBJECT)] = -1
        after = self.depth + np.cumsum(step)
        level = self.array_level
        bounds = np.flatnonzero((after - step == level) & (ks >= CLOSE_ARRAY) & (ks <= COMMA))
        deep = np.flatnonzero((step == 1) & (after - level > self.max_depth))
        deep_before = np.searchsorted(deep, bounds).tolist()
        seen_deep = 0
        for b, n_deep in zip(bounds.tolist(), deep_before, strict=True):
            if n_deep > seen_deep:
                self.too_deep, seen_deep = True, n_deep
            p, k = int(ps[b]), int(ks[b])
            if k == COMMA:
                self._end_item(p, out, closing=False)
                self.separators += 1
                continue
            if k == CLOSE_OBJECT:
                out.append(Problem("invalid_json", f"a '}}' at byte {p:,} closes the JSON array after {self.items} "
                                   "items; the rest of the file could not be read", self.partial()))
                self.mode = "done"
                return len(pos)
            self._end_item(p, out, closing=True)
            self.depth = level - 1
            if self.keys:
                self.mode = "done"  # the array under the key is read; the rest is not ours
            else:
                self.mode = "after"
                self._trailing(chunk[p + 1 - base:], out)
            return len(pos)
        if len(deep) > seen_deep:
            self.too_deep = True
        if len(after):
            self.depth = int(after[-1])
        return len(pos)

    def _end_item(self, p: int, out: list[Item], closing: bool) -> None:
        before = len(out)
        if self.hasher is not None:
            self.hasher.update(self.buf[self.hashed_to - self.buf_start: p - self.buf_start])
            out.append(Oversize(self.head, p - self.item_start, self.hasher.hexdigest()))
        else:
            span = bytes(self.buf[self.item_start - self.buf_start: p - self.buf_start])
            if not span.strip(WHITESPACE):
                if not (closing and self.separators == 0):
                    out.append(Problem("invalid_json", f"empty item at byte {p:,} (a stray or trailing comma)", b""))
            elif len(span) > self.max_bytes:
                out.append(oversize(span))
            elif self.too_deep:
                out.append(Problem("too_deep", f"item nests arrays/objects deeper than the limit {self.max_depth}",
                                   span[:RAW_KEEP_BYTES].strip(WHITESPACE)))
            else:
                out.append(span.strip(WHITESPACE))
        self.items += len(out) - before
        self.item_start, self.hasher, self.head, self.too_deep = p + 1, None, b"", False

    def _trailing(self, rest: bytes, out: list[Item]) -> None:
        data = rest.strip(WHITESPACE)
        if data:
            out.append(Problem("invalid_json", f"data after the end of the JSON array (after {self.items} items)",
                               data[:RAW_KEEP_BYTES]))
            self.mode = "done"

    def _after_chunk(self) -> None:
        """Bound memory: keep only what the open item or key needs; hash an item that grew too big."""
        keep = self.end
        if self.mode == "items":
            if self.hasher is None and self.end - self.item_start > self.max_bytes:
                data = bytes(self.buf[self.item_start - self.buf_start:])
                self.head, self.hasher = data[:RAW_KEEP_BYTES], hashlib.sha256(data)
            elif self.hasher is not None:
                self.hasher.update(self.buf[self.hashed_to - self.buf_start:])
            if self.hasher is not None:
                self.hashed_to = self.end
            else:
                keep = self.item_start
        elif self.mode == "nav":
            if self.want_value is not None:
                if bytes(self.buf[self.want_value + 1 - self.buf_start:]).strip(WHITESPACE):
                    raise FrameError("not_array", self.found)
                self.want_value = self.end - 1
                keep = self.want_value + 1
            if self.mark is not None and self.end - self.mark > KEY_KEEP_BYTES:
                self.mark = None
            if self.mark is not None:
                keep = min(keep, self.mark)
            if not self.keys and self.end > PROBE_BYTES:
                raise self._missing()
        del self.buf[: keep - self.buf_start]
        self.buf_start = keep
