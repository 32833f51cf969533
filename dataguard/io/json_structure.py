"""Where a JSON text's structure is, found without parsing it.

Readers must size- and depth-check untrusted JSON before ``json.loads`` sees it (a 2 GB
item or 10,000 nested brackets would exhaust memory or the recursion limit), so they need
the brackets, commas and colons that lie outside strings. ``JsonScanner`` finds them a chunk
at a time, vectorised; ``json_depth`` and ``json_balance`` answer the two questions a reader
asks of one complete text.
"""

from __future__ import annotations

import numpy as np

MAX_DEPTH = 100  # nesting (objects/arrays) a record may have; deeper is `too_deep`
WHITESPACE = b" \t\r\n"  # what JSON allows between tokens


# Byte classes for the scanner: 1 quote, 2 "[", 3 "{", 4 "]", 5 "}", 6 ",", 7 ":"; 0 otherwise.
_CLASSES = bytearray(256)
for _code, _ch in enumerate(b'"[{]},:', start=1):
    _CLASSES[_ch] = _code
_CLASS_TABLE = bytes(_CLASSES)
OPEN_ARRAY, OPEN_OBJECT, CLOSE_ARRAY, CLOSE_OBJECT, COMMA, COLON = 2, 3, 4, 5, 6, 7
_BACKSLASH = 92

try:  # the compiled scanner (dataguard/io/_jsonscan.c), built at install; else the NumPy one
    from dataguard.io import _jsonscan as _compiled
except ImportError:  # pragma: no cover - a checkout whose extensions were not built
    _compiled = None


class JsonScanner:
    """Finds the structural characters of a JSON byte stream that lie outside strings.

    One compiled pass per chunk (``_jsonscan.c``; a vectorised NumPy twin where it is not
    built), with the in-string state and a trailing backslash run carried across chunks, so a reader can frame, depth-check and
    size-check JSON without parsing it (no recursion, no per-byte Python loop). Exact for
    valid JSON; on invalid JSON it may mis-frame, which only ever turns into rejected rows.
    """

    def __init__(self) -> None:
        self.in_string = False
        self.backslashes = 0  # length of the backslash run that ended the previous chunk

    def events(self, chunk: bytes) -> tuple[np.ndarray, np.ndarray]:
        """(offsets in ``chunk``, codes) of the structural characters outside strings."""
        if _compiled is None:
            return self.numpy_events(chunk)
        pos, kinds, self.in_string, self.backslashes = _compiled.events(chunk, self.in_string, self.backslashes)
        return np.frombuffer(pos, np.int64), np.frombuffer(kinds, np.uint8)

    def numpy_events(self, chunk: bytes) -> tuple[np.ndarray, np.ndarray]:
        """``events`` in NumPy: the reference the compiled scanner is tested against, and what
        runs where it was not built."""
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

