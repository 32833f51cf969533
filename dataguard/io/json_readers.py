"""JSON lines and JSON array readers: each record is parsed on its own, so a bad one is one
rejected row and the hot path (ordinary JSON) stays a single ``json.loads``.
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

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
    preview,
    read_first,
    read_some,
)
from dataguard.io.changes import CrcReader, Stamp, file_stamp
from dataguard.io.json_parse import SLOW, parse_json_bytes, parse_jsonl_line, plain_json
from dataguard.io.jsonscan import FrameError, JsonArrayFramer, Problem
from dataguard.io.line_index import RangeReader
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


# ------------------------------------------------------------------ JSON lines
def _jsonl_lines(path: Path, max_bytes: int, f: BinaryIO | None = None, position: int = 0, line_base: int = 0,
                 strip_bom: bool = True) -> Iterator[tuple[int, int, bytes | ReadError]]:
    """(position, line number, raw bytes or the reader's own error) of each non-blank line,
    of the whole file or of the byte range ``f`` reads (numbered from ``position`` and
    ``line_base``)."""
    stream = open_binary(path) if f is None else contextlib.nullcontext(f)
    with stream as fh:
        for line_no, line in bounded_lines(fh, max_bytes, strip_bom):
            line_no += line_base
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
        batch.add_empty_file()
    if len(batch):
        yield batch


class CountedSplit(ABC):
    """What every byte-range split of a file shares when a worker reads it: ``records`` rows
    of ``path`` as its index counted them. ``records == 0`` stands for an input without any
    (one ``empty_file`` row). A file changed since the run was planned (another stamp,
    other bytes in the unit's range than the index's ``digest``, another count) is refused:
    never a silently shorter or longer unit, nor rows the manifest's sha256 does not describe
    (see `dataguard.io.changes`)."""

    path: str
    records: int
    max_bytes: int
    digest: int | None  # crc32 of the unit's byte range when indexed (None: unchecked)
    stamp: Stamp | None  # the file's stamp when the run was planned (None: unchecked)

    def read(self, source: str) -> RawBatch:
        batch = RawBatch(source=source, max_record_bytes=self.max_bytes)
        self._check_stamp(source)
        if self.records == 0:
            batch.add_empty_file()
            return batch
        crc = self.fill(batch, source, Path(self.path))
        if len(batch) != self.records:
            raise InputError(f"input {source!r}: {self.path} changed while it was read ({self.where()} held "
                             f"{self.records} records, now {len(batch)})")
        if self.digest is not None and crc != self.digest:
            raise InputError(f"input {source!r}: {self.path} changed while it was read ({self.where()} hold other "
                             "bytes than when the run was planned); run again once the file stays put")
        return batch

    def _check_stamp(self, source: str) -> None:
        if self.stamp is None:
            return
        try:
            now = file_stamp(Path(self.path))
        except OSError as exc:
            raise InputError(f"input {source!r}: {self.path} cannot be read again ({exc.strerror or exc})") from None
        if now != self.stamp:
            raise InputError(f"input {source!r}: {self.path} changed while it was read (its size, time or inode "
                             "differ from when the run was planned); run again once the file stays put")

    @abstractmethod
    def fill(self, batch: RawBatch, source: str, path: Path) -> int:
        """Add the unit's rows (each split reads its own way); the crc32 of its byte range."""

    @abstractmethod
    def where(self) -> str:
        """The unit's range, as the error names it."""


@dataclass(frozen=True)
class LineSplit(CountedSplit):
    """One unit of a JSON-lines file as a worker reads it: the byte range of its lines, the
    position and line number its first record continues from, and how many records the
    index found there. Small and picklable: what the driver sends instead of rows."""

    path: str
    start: int
    end: int
    position: int
    line_base: int
    records: int
    max_bytes: int
    digest: int | None = None
    stamp: Stamp | None = None

    def fill(self, batch: RawBatch, source: str, path: Path) -> int:
        """The unit's lines, unparsed (``RawBatch.parse_pending`` parses them)."""
        with open_binary(path) as f:
            f.seek(self.start)
            stream = CrcReader(RangeReader(f, self.end - self.start))  # type: ignore[arg-type]
            batch.pending.extend(_jsonl_lines(path, self.max_bytes, stream,  # type: ignore[arg-type]
                                              self.position, self.line_base, strip_bom=self.start == 0))
            return stream.drain()

    def where(self) -> str:
        return f"bytes {self.start:,}-{self.end:,}"


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
                chunk = read_first(f, bounded.READ_CHUNK_BYTES)[0] if first else read_some(f, bounded.READ_CHUNK_BYTES)
            except READ_ERRORS as exc:
                broken = Broken(describe_error(exc), framer.partial())
                damage = damage_error(path, broken, f"byte {framer.end:,} of the uncompressed data")
                if framer.mode == "tail":  # the array was whole: one row for what follows it, damage included
                    for item in framer.finish():
                        if isinstance(item, Problem):
                            item = Problem(item.reason, f"{item.detail}; then {damage.detail}", item.head)
                        yield item_row(position, item, max_bytes)
                    return
                yield position, None, damage.reason, f"item {position}: {damage.detail}", damage.raw
                return
            first = False
            try:
                items = framer.feed(chunk) if chunk else framer.finish()
            except FrameError as exc:
                raise InputError(frame_message(source, json_key, exc)) from None
            for item in items:
                yield item_row(position, item, max_bytes)
                position += 1
            if not chunk:
                return


def item_row(position: int, item: bytes | Oversize | Problem, max_bytes: int) -> Row:
    where = f"item {position}"
    if isinstance(item, bytes):
        record = plain_json(item)
        if record is not SLOW:
            return position, record, None, None, None
        record, error, detail, raw = parse_json_bytes(item, where, depth_checked=True)
        return (position, record, None, None, None) if error is None else (position, None, error, detail, raw)
    if isinstance(item, Oversize):
        return position, None, "record_too_large", item.detail(where, max_bytes), item.raw()
    return position, None, item.reason, f"{where}: {item.detail}", preview(item.head)
