"""Noticing an input rewritten during a run: the units of a split file are read by workers
long after the run was planned and the file hashed for the manifest, so each unit checks
that its bytes are still the ones planned.

Two checks, because neither is enough alone: the file's stamp (size, mtime, inode) catches
a replaced or grown file before a byte is read, but a same-size rewrite can keep the mtime
(it ticks coarsely); the crc32 of each unit's byte range, noted when the file was indexed
and compared by the worker that reads the range, catches that. crc32 runs at several GB/s,
well below the cost of parsing the rows; it guards against accidents, not against attacks.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import BinaryIO

from dataguard.io import bounded
from dataguard.io.bounded import READ_ERRORS, read_some

Stamp = tuple[int, int, int]  # (size, mtime_ns, inode)


def file_stamp(path: Path) -> Stamp:
    """What a rewrite or a replacement of the file changes (raises OSError)."""
    st = path.stat()
    return st.st_size, st.st_mtime_ns, st.st_ino


def range_crcs(path: Path, cuts: Sequence[int], end: int | None) -> list[int]:
    """crc32 of each byte range ``cuts[k]`` .. ``cuts[k + 1]`` of a file, the last one up to
    ``end`` (None: the end of the file). Empty where the file cannot be read: unchecked."""
    if not cuts:
        return []
    crcs = []
    try:
        with open(path, "rb") as f:
            f.seek(cuts[0])
            for lo, hi in zip(cuts, [*cuts[1:], end], strict=True):
                crcs.append(CrcReader(f, None if hi is None else hi - lo).drain())
    except READ_ERRORS:
        return []
    return crcs


class CrcReader:
    """A binary stream seen through: the crc32 of every byte read, up to ``length`` bytes
    (None: to the end). `drain` reads what the reader left, so the crc covers the range."""

    def __init__(self, f: BinaryIO, length: int | None = None) -> None:
        self._f = f
        self._left = length
        self.crc = 0

    def read(self, size: int = -1) -> bytes:
        if self._left is not None:
            size = self._left if size is None or size < 0 else min(size, self._left)
            if size <= 0:
                return b""
        data = read_some(self._f, size) if size is not None and size >= 0 else self._f.read()
        self.crc = zlib.crc32(data, self.crc)
        if self._left is not None:
            self._left -= len(data)
        return data

    read1 = read

    def drain(self) -> int:
        """The crc of the whole range, reading whatever is left of it."""
        while self.read(bounded.READ_CHUNK_BYTES):
            pass
        return self.crc
