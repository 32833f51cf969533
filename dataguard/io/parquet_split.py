"""Parquet inputs read by the workers: the driver plans row ranges from the file's footer
(no row is read there), and each unit's worker reads only the row groups its range touches.

The units are the ones the whole-file reader gives (``batch_rows`` rows each, in file
order), and so are their rows: the same Arrow-to-record conversion (`arrow_reader`; a row's
record does not depend on which rows are converted with it). A worker decodes a row group in
chunks and keeps its place (`_GroupCursor`), so the units of one group, dispatched in
order, cost each worker one pass over the group and about one chunk of memory. One difference, on purpose: a damaged row group costs only the units
that touch it (one ``unreadable_file`` row each, after the rows read before it), where
the whole-file reader stops at the first damage and loses the rest of the file.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from dataguard.io.arrow_reader import _arrow_rows, parquet_plan
from dataguard.io.bounded import InputError, describe_error
from dataguard.io.jsonscan import MAX_DEPTH
from dataguard.io.raw import RawBatch


@dataclass(frozen=True)
class ParquetLayout:
    """What the driver learns from a Parquet footer: rows, the first row of each row group,
    and the conversion chunk size the whole-file reader would use."""

    rows: int
    group_starts: tuple[int, ...]
    chunk_rows: int
    stamp: tuple[int, int]  # (size, mtime_ns) when planned: a worker refuses a changed file


def parquet_layout(path: Path, batch_rows: int) -> ParquetLayout | None:
    """The footer's facts, or None where the whole-file reader must handle the file (an
    unreadable footer or a schema nested deeper than allowed: it turns those into rows)."""
    import pyarrow.parquet as pq

    try:
        stat = path.stat()
        parquet = pq.ParquetFile(path)
        depth, chunk_rows = parquet_plan(parquet, batch_rows)
    except Exception:  # noqa: BLE001 - any pyarrow failure: the reader reports it as a row
        return None
    if depth > MAX_DEPTH:
        return None
    meta = parquet.metadata
    starts = np.cumsum([0] + [meta.row_group(i).num_rows for i in range(meta.num_row_groups)])[:-1]
    return ParquetLayout(rows=meta.num_rows, group_starts=tuple(int(x) for x in starts), chunk_rows=chunk_rows,
                         stamp=(stat.st_size, stat.st_mtime_ns))


def parquet_splits(path: str, layout: ParquetLayout, batch_rows: int, max_bytes: int) -> Iterator[ParquetSplit]:
    """Units of ``batch_rows`` rows (one unit standing for the empty_file row of an empty file);
    each carries only the row groups its rows lie in, so a split pickles small."""
    starts = layout.group_starts
    for start, rows in row_ranges(layout.rows, batch_rows):
        first = max(0, bisect.bisect_right(starts, start) - 1)
        last = max(first, bisect.bisect_right(starts, start + rows - 1) - 1)
        ends = starts[first + 1:last + 1] + (starts[last + 1] if last + 1 < len(starts) else layout.rows,)
        groups = tuple(zip(range(first, last + 1), starts[first:last + 1], ends, strict=True))
        yield ParquetSplit(path, start, rows, groups, layout.chunk_rows, layout.stamp, max_bytes)


def row_ranges(total: int, batch_rows: int) -> Iterator[tuple[int, int]]:
    """(first row, rows) of each unit; one (0, 0) for no rows at all: the unit that stands
    for the ``empty_file`` row the whole-file readers give."""
    if total == 0:
        yield 0, 0
    for start in range(0, total, batch_rows):
        yield start, min(batch_rows, total - start)


@dataclass(frozen=True)
class ParquetSplit:
    """One unit of a Parquet file as a worker reads it: rows ``start`` .. ``start + rows``,
    lying in ``groups`` (index, first row, end row). Small and picklable, like
    `dataguard.io.json_readers.LineSplit`."""

    path: str
    start: int
    rows: int
    groups: tuple[tuple[int, int, int], ...]
    chunk_rows: int
    stamp: tuple[int, int]
    max_bytes: int

    def read(self, source: str) -> RawBatch:
        batch = RawBatch(source=source, max_record_bytes=self.max_bytes)
        stat = Path(self.path).stat()
        if (stat.st_size, stat.st_mtime_ns) != self.stamp:
            raise InputError(f"input {source!r}: {self.path} changed while it was read (planned from its footer "
                             "at the start of the run)")
        if self.rows == 0:
            batch.add_empty_file()
            return batch
        for row in self._rows():
            batch.add_row(row)
        return batch

    def _rows(self) -> Iterator[tuple[int, Any, str | None, str | None, Any]]:
        """The range's rows, decoded and converted at most ``chunk_rows`` at a time."""
        end, position = self.start + self.rows, self.start
        for index, group_start, group_end in self.groups:
            while position < min(end, group_end):
                hi = min(end, group_end, position + self.chunk_rows)
                table = self._group_rows(index, group_start, position, hi)
                if isinstance(table, str):  # a damaged row group: keep what was read, report the rest
                    yield (position, None, "unreadable_file",
                           f"Parquet rows {position}-{end - 1} unreadable: row group {index} (rows "
                           f"{group_start}-{group_end - 1}) is damaged ({table}); the rest of this unit is lost", "")
                    return
                yield from _arrow_rows(table, position, self.max_bytes)
                position = hi

    def _group_rows(self, group: int, group_start: int, lo: int, hi: int) -> Any:
        """Rows ``lo`` .. ``hi`` as an Arrow table, or what is wrong with the row group.

        A failed read leaves the worker's cursor broken (a later unit would get
        ``StopIteration``), and what the error says may depend on where that cursor stood:
        so the cursor is dropped and the group read again from its start with a freshly
        opened file. What that read says depends on the file's bytes alone, so the reject
        reads the same for any worker count and any order the units arrive in."""
        args = (self.path, self.stamp, group, group_start, lo, hi, self.chunk_rows)
        try:
            return _GROUP.rows(*args)
        except Exception:  # noqa: BLE001 - any pyarrow failure: retried from a clean start below
            _GROUP.reset()
        try:
            return _GROUP.rows(*args)
        except Exception as exc:  # noqa: BLE001 - the group is damaged: one line for the reject
            _GROUP.reset()
            return describe_error(exc)


class _GroupCursor:
    """A worker's place in one row group: batches of ``chunk_rows`` decoded in order and
    dropped once passed, so memory stays at about one chunk however large the group is.
    Units of one group reach a worker in increasing order (it skips the other workers'
    units by decoding past them); an earlier row restarts the group."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """Forget the place and the open file (after a failed read neither can be trusted)."""
        self.key: tuple[Any, ...] | None = None
        self.file_key: tuple[Any, ...] | None = None
        self.file: Any = None  # the open file: its footer is parsed once, not once per row group
        self.batches: Iterator[Any] = iter(())
        self.at = 0  # the group's row where ``pending`` starts
        self.pending: Any = None

    def rows(self, path: str, stamp: tuple[int, int], group: int, group_start: int, lo: int, hi: int,
             chunk_rows: int) -> Any:
        """Rows ``lo`` .. ``hi`` (file rows) of row group ``group`` as one Arrow table."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        key = (path, stamp, group, chunk_rows)
        lo, hi = lo - group_start, hi - group_start
        if key != self.key or lo < self.at:
            self.key, self.at, self.pending = None, 0, None
            if (path, stamp) != self.file_key:
                self.file, self.file_key = None, None
                self.file, self.file_key = pq.ParquetFile(path), (path, stamp)
            self.batches = self.file.iter_batches(batch_size=chunk_rows, row_groups=[group])
            self.key = key
        parts = []
        while True:
            if self.pending is None or self.at + self.pending.num_rows <= lo:
                if self.pending is not None:
                    self.at += self.pending.num_rows
                self.pending = pa.Table.from_batches([next(self.batches)])
                continue
            take = self.pending.slice(max(0, lo - self.at), hi - max(lo, self.at))
            parts.append(take)
            if self.at + self.pending.num_rows >= hi:
                return pa.concat_tables(parts) if len(parts) > 1 else parts[0]
            lo = self.at + self.pending.num_rows
            self.at, self.pending = lo, pa.Table.from_batches([next(self.batches)])


_GROUP = _GroupCursor()  # one per worker process
