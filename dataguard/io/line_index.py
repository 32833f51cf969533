"""Byte ranges of a JSON-lines file that workers read on their own: plan, index, read back.

The driver only *plans*: it cuts a file every ``split_bytes`` and moves each cut forward to
the next line start (reading at most the rest of one line per cut, never holding it), so
every range is a sequence of whole lines. A worker *indexes* its range (counts lines and
records, and notes where every ``every``-th record starts) with `index_lines`, which follows
the rules of `dataguard.io.bounded.bounded_lines` exactly (lines end at ``\\n``, ``\\r\\n`` or
``\\r``; a blank line is no record; a line over the size limit is one record whatever it
holds; a BOM only at the start of the file). From the counts the driver knows each record's
position and line number without reading a row, and each unit's byte range.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

import numpy as np

from dataguard.io import bounded
from dataguard.io.bounded import BOM, READ_ERRORS
from dataguard.io.changes import range_crcs

TERMINATOR = re.compile(rb"\r\n|\r|\n")
_BLANK = re.compile(rb"\n[ \t\x0b\x0c]*\n")  # a blank line between two "\n" (no "\r" here)


class RangeReader:
    """A binary file seen from its current position for ``length`` bytes, then EOF."""

    def __init__(self, f: BinaryIO, length: int) -> None:
        self._f = f
        self._left = max(0, length)

    def read(self, size: int = -1) -> bytes:
        if self._left <= 0:
            return b""
        size = self._left if size is None or size < 0 else min(size, self._left)
        data = self._f.read(size)
        self._left -= len(data)
        return data

    read1 = read


def next_line_start(f: BinaryIO, offset: int, size: int) -> int:
    """The first line start at or after ``offset`` (``size`` if none): a position just after
    ``\\n``, after ``\\r\\n``, or after a ``\\r`` not followed by ``\\n``."""
    if offset <= 0:
        return 0
    if offset >= size:
        return size
    f.seek(offset - 1)
    at = offset - 1
    while True:
        chunk = f.read(bounded.READ_CHUNK_BYTES)
        if not chunk:
            return size
        if chunk.endswith(b"\r"):
            chunk += f.read(1)  # a "\r\n" never straddles two reads
        m = TERMINATOR.search(chunk)
        if m is not None:
            return at + m.end()
        at += len(chunk)


def plan_line_ranges(path: Path, split_bytes: int) -> list[tuple[int, int]]:
    """[start, end) byte ranges of whole lines, cut near every ``split_bytes``; depends
    only on the file's bytes and ``split_bytes``."""
    size = path.stat().st_size
    cuts = [0]
    with open(path, "rb") as f:
        offset = split_bytes
        while offset < size:
            start = next_line_start(f, offset, size)
            if start >= size:
                break
            if start > cuts[-1]:
                cuts.append(start)
            # a line longer than split_bytes swallows the cuts inside it
            offset = max(offset + split_bytes, (start // split_bytes + 1) * split_bytes)
    return list(zip(cuts, [*cuts[1:], size], strict=True))


@dataclass
class LineIndex:
    """What a worker found in one range: its records and lines, and for every ``every``-th
    record (counted from the range start) its byte offset and the lines/records before it."""

    start: int
    end: int
    records: int = 0
    lines: int = 0
    marks: list[tuple[int, int, int]] = field(default_factory=list)
    digests: list[int] = field(default_factory=list)  # crc32 of each unit's bytes (empty: unchecked)


def index_lines(path: Path, start: int, end: int, max_bytes: int, every: int) -> LineIndex:
    """Index the lines in ``[start, end)`` as `bounded_lines` would read them (see module)."""
    index = LineIndex(start, end)
    state = _Scan(index, max_bytes, every, start)
    with open(path, "rb") as f:
        f.seek(start)
        reader = RangeReader(f, end - start)
        first = start == 0
        while True:
            try:
                chunk = reader.read(bounded.READ_CHUNK_BYTES)
                if chunk.endswith(b"\r"):
                    chunk += reader.read(1)
            except READ_ERRORS:
                state.record_at_line_start()  # the reader ends the range with one error row
                return index
            if not chunk:
                break
            begin = 0
            if first:
                first = False
                while len(chunk) < 3 and BOM.startswith(chunk):  # as bounded_lines does
                    more = reader.read(bounded.READ_CHUNK_BYTES)
                    if not more:
                        break
                    chunk += more
                begin = 3 if chunk.startswith(BOM) else 0
            state.feed(chunk, begin)
    state.finish()
    index.digests = range_crcs(path, [mark[0] for mark in index.marks], end)
    return index


class _Scan:
    """The line being scanned (its start offset, length and whether it is blank so far)."""

    def __init__(self, index: LineIndex, max_bytes: int, every: int, start: int) -> None:
        self.index, self.max_bytes, self.every = index, max_bytes, max(1, every)
        self.pos = start  # offset of the next chunk's first byte
        self.line_start = start
        self.carry_len = 0
        self.carry_text = False  # the carried part holds a non-whitespace byte

    def record_at_line_start(self) -> None:
        index = self.index
        if index.records % self.every == 0:
            index.marks.append((self.line_start, index.lines, index.records))
        index.records += 1
        index.lines += 1

    def _line(self, length: int, text: bool) -> None:
        if text or length > self.max_bytes:
            self.record_at_line_start()
        else:
            self.index.lines += 1

    def feed(self, chunk: bytes, begin: int) -> None:
        """Scan one read. The common case (``\\n`` endings, no blank line) counts lines in C
        and looks up only the unit starts; anything else goes line by line."""
        first = chunk.find(b"\n", begin)
        last = chunk.rfind(b"\n")
        if first < 0 or b"\r" in chunk or _BLANK.search(chunk, first, last + 1) is not None:
            self._feed_lines(chunk, begin)
            return
        self._feed_lines(chunk[:first + 1], begin)  # the line the previous read began
        index, every = self.index, self.every
        base = self.pos  # _feed_lines advanced it to chunk[first + 1]
        n = chunk.count(b"\n", first + 1, last + 1)  # whole lines, none blank: all records
        ks = np.arange(-index.records % every, n, every)  # line numbers (from first + 1) of unit starts
        if len(ks):
            ends = np.flatnonzero(np.frombuffer(chunk, np.uint8, last - first, first + 1) == 10)  # from first + 1
            starts = np.where(ks == 0, 0, ends[np.maximum(ks - 1, 0)] + 1)
            index.marks.extend(zip((self.pos + starts).tolist(), (index.lines + ks).tolist(),
                                   (index.records + ks).tolist(), strict=True))
        index.records += n
        index.lines += n
        self.line_start = self.pos = base + (last - first)
        self._feed_lines(chunk[last + 1:], 0)

    def _feed_lines(self, chunk: bytes, begin: int) -> None:
        i = begin
        for m in TERMINATOR.finditer(chunk, begin):
            piece = chunk[i:m.start()]
            self._line(self.carry_len + len(piece), self.carry_text or bool(piece.strip()))
            i = m.end()
            self.line_start = self.pos + i
            self.carry_len, self.carry_text = 0, False
        if i < len(chunk):
            tail = chunk[i:]
            self.carry_len += len(tail)
            self.carry_text = self.carry_text or bool(tail.strip())
        self.pos += len(chunk)

    def finish(self) -> None:
        if self.carry_len:
            self._line(self.carry_len, self.carry_text)
