"""Item ranges of a JSON array that workers read on their own: index, plan, read back.

A JSON array cannot be cut at arbitrary bytes (a comma or bracket may sit inside a
string), so one worker *indexes* the file with the same framer the whole-file reader uses
(`index_array`), noting the stream offset where every ``every``-th item starts: just after
a comma at the array's own level, where the framer holds no state but the array's depth and
the item count. From the index the driver plans units of ``every`` rows (`array_splits`),
and each unit's worker frames and parses its own byte range (`ArraySplit.read`) with a
framer resumed there (`JsonArrayFramer.resume`). The rows, their positions and every
problem's wording are those of `dataguard.io.json_readers.read_json_array`, cut into the
batches `read_batches` gives, so the output bytes do not depend on which path read them.

What the index cannot vouch for is read whole, by the driver, as before: a file that is
not an array where expected (one row, or the input's one-line error), a read error, and the
rare file whose final row, data after the array, would start a unit of its own (a stray
``}`` always stands in for an item that began after a comma, so a unit starts there).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from dataguard.io import bounded
from dataguard.io.bounded import READ_ERRORS, InputError, open_binary, read_first, read_some
from dataguard.io.changes import CrcReader, Stamp, range_crcs
from dataguard.io.json_readers import CountedSplit, item_row
from dataguard.io.jsonscan import FrameError, JsonArrayFramer
from dataguard.io.raw import RawBatch


@dataclass
class ArrayIndex:
    """What the indexing worker found: ``starts`` holds the stream offset (after a BOM) of
    the first item of each unit; ``rows`` counts every row the reader gives (items, and a
    last row for a damaged end). ``splittable`` False: read the file whole instead."""

    splittable: bool
    bom: int = 0
    level: int = 0
    rows: int = 0
    starts: list[int] = field(default_factory=list)
    digests: list[int] = field(default_factory=list)  # crc32 of each unit's bytes (empty: unchecked)


def index_array(path: Path, json_key: str | None, max_bytes: int, every: int) -> ArrayIndex:
    """Frame the whole file as `read_json_array` does, counting rows and noting unit starts."""
    every = max(1, every)
    framer = JsonArrayFramer(json_key.split(".") if json_key else [], max_bytes, mark_every=every)
    rows = bom = 0
    try:
        with open_binary(path) as f:
            first = True
            while not framer.done:
                if first:
                    chunk, bom = read_first(f, bounded.READ_CHUNK_BYTES)
                else:
                    chunk = read_some(f, bounded.READ_CHUNK_BYTES)
                first = False
                rows += len(framer.feed(chunk) if chunk else framer.finish())
                if not chunk:
                    break
    except (FrameError, *READ_ERRORS):
        return ArrayIndex(splittable=False)
    cutter = framer.cutter
    if cutter is None:  # not an array at all: one row, read whole
        return ArrayIndex(splittable=False)
    rows += cutter.counted  # the items the index's cutter counted without building them
    starts = [cutter.start, *cutter.marks]
    if max(1, -(-rows // every)) != len(starts):  # the damaged end is a unit's first row
        return ArrayIndex(splittable=False)
    digests = range_crcs(path, [start + bom for start in starts], None)
    return ArrayIndex(splittable=True, bom=bom, level=cutter.level, rows=rows, starts=starts, digests=digests)


@dataclass(frozen=True)
class ArraySplit(CountedSplit):
    """One unit of a JSON array as a worker reads it: ``records`` rows from the item that
    starts at stream offset ``start``; the last unit reads to the end of the file, the others
    to ``end`` (just after the comma before the next unit). Small and picklable: what the
    driver sends instead of rows."""

    path: str
    json_key: str | None
    bom: int
    level: int
    start: int
    end: int | None
    position: int
    records: int
    max_bytes: int
    digest: int | None = None
    stamp: Stamp | None = None

    def fill(self, batch: RawBatch, source: str, path: Path) -> int:
        """The unit's rows, framed and parsed here (in the worker); the crc32 of its range
        (the last unit's: to the end of the file, as `index_array` took it)."""
        keys = self.json_key.split(".") if self.json_key else []
        framer = JsonArrayFramer.resume(keys, self.max_bytes, self.level, self.start, self.position)
        position = self.position
        with open_binary(path) as f:
            f.seek(self.start + self.bom)
            stream = CrcReader(f, None if self.end is None else self.end - self.start)
            try:
                while not framer.done:
                    chunk = read_some(stream, bounded.READ_CHUNK_BYTES)  # type: ignore[arg-type]
                    items = framer.feed(chunk) if chunk else ([] if self.end is not None else framer.finish())
                    for item in items:
                        batch.add_row(item_row(position, item, self.max_bytes))
                        position += 1
                    if not chunk:
                        break
                return stream.drain()
            except (FrameError, *READ_ERRORS) as exc:
                raise InputError(f"input {source!r}: {path} could not be read again at byte "
                                 f"{framer.end:,} ({exc.__class__.__name__})") from None

    def where(self) -> str:
        return f"the items from byte {self.start:,}"


def array_splits(path: str, json_key: str | None, index: ArrayIndex, batch_rows: int,
                 max_bytes: int, stamp: Stamp | None = None) -> list[ArraySplit]:
    """The units of one indexed array: ``batch_rows`` rows each, the last one the rest;
    each checks its bytes against the index's crc, and the file against ``stamp``."""
    starts = index.starts
    return [ArraySplit(path, json_key, index.bom, index.level, start,
                       starts[k + 1] if k + 1 < len(starts) else None, k * batch_rows,
                       min(batch_rows, index.rows - k * batch_rows), max_bytes,
                       index.digests[k] if index.digests else None, stamp)
            for k, start in enumerate(starts)]
