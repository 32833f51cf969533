"""Input splits: what the driver sends workers instead of rows.

A plain (uncompressed) JSON-lines file is cut into byte ranges of whole lines
(`dataguard.io.line_index.plan_line_ranges`, every ``split_bytes``); workers index the
ranges in parallel (`IndexTask`), and from the counts alone the driver turns each range into
units of at most ``batch_rows`` records, each a `LineSplit` (path, byte range, first position
and line number) that the worker of that unit reads, parses and processes itself. Unit
boundaries depend on the file's bytes, ``split_bytes`` and ``batch_rows`` only, never on
scheduling; a file smaller than ``split_bytes`` gets exactly the units the whole-file reader
gives (``batch_rows`` records each).

A plain JSON array (top-level, or under ``json_key``) is indexed by one worker
(`ArrayIndexTask`, a sequential scan: a comma may sit inside a string), and the driver turns
the offsets where every ``batch_rows``-th item starts into `ArraySplit` units
(`dataguard.io.array_split`); what the index cannot vouch for is read whole, as before.

A Parquet file is planned from its footer alone (`dataguard.io.parquet_split`), a saved
Hugging Face dataset from its length (`dataguard.io.hf_split`; memory-mapped): units of
``batch_rows`` rows that the workers read themselves.

Other inputs are read in the driver as before (`dataguard.io.readers.read_batches`, JSON
lines parsed in the worker): a ``.gz`` stream cannot be entered in the middle, CSV (quoted
fields may hold newlines) has no exact split without a sequential scan of its own, and
in-memory datasets do not travel to workers.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dataguard.io.array_split import ArrayIndex, ArraySplit, array_splits, index_array
from dataguard.io.bounded import text_encoding
from dataguard.io.changes import Stamp, file_stamp
from dataguard.io.hf_split import HfLayout, HfSplit, hf_layout, hf_splits
from dataguard.io.json_readers import LineSplit
from dataguard.io.line_index import LineIndex, index_lines, plan_line_ranges
from dataguard.io.parquet_split import ParquetLayout, ParquetSplit, parquet_layout, parquet_splits
from dataguard.io.readers import (
    DEFAULT_MAX_RECORD_BYTES,
    InputError,
    InputSpec,
    RawBatch,
    describe_input,
    read_batches,
)

SPLIT_BYTES = 64 << 20  # a range per this many bytes of a JSON-lines file
InputSplit = LineSplit | ArraySplit | ParquetSplit | HfSplit  # what a worker reads itself


@dataclass(frozen=True)
class IndexTask:
    """Index one byte range of one input in a worker (see `index_lines`)."""

    input: int
    part: int  # which range of the input
    path: str
    start: int
    end: int
    every: int
    max_bytes: int = DEFAULT_MAX_RECORD_BYTES

    def run(self) -> dict[str, Any]:
        index = index_lines(Path(self.path), self.start, self.end, self.max_bytes, self.every)
        return {"rows_in": 0, "key": (self.input, self.part), "index": index}


@dataclass(frozen=True)
class ArrayIndexTask:
    """Index one JSON array input in a worker (see `index_array`)."""

    input: int
    path: str
    json_key: str | None
    every: int
    max_bytes: int = DEFAULT_MAX_RECORD_BYTES

    def run(self) -> dict[str, Any]:
        index = index_array(Path(self.path), self.json_key, self.max_bytes, self.every)
        return {"rows_in": 0, "key": (self.input, 0), "array": index}


def split_kind(spec: InputSpec) -> str | None:
    """How workers read this input in parts: ``jsonl`` or ``json`` (a plain, uncompressed
    file), ``parquet`` (a file) or ``hf`` (a saved dataset); None: the driver reads it (an
    in-memory dataset, a ``.gz`` stream, CSV, or a path that is not there, which the reader
    then reports). The format is resolved once here, since for ``.json`` that reads the file."""
    if spec.dataset is not None or spec.path is None or not Path(spec.path).exists():
        return None
    path, reader = Path(spec.path), spec.resolved_reader()
    if reader in ("jsonl", "json"):
        plain = path.is_file() and not path.name.lower().endswith(".gz") and _utf8(path)
        return reader if plain else None
    if reader == "parquet":
        return reader if path.is_file() else None
    return reader if reader == "hf" else None


def _utf8(path: Path) -> bool:
    """False for a UTF-16/32 text: its readers transcode it as they go (`bounded.open_binary`),
    so byte offsets of the file are not offsets of what they read; the driver reads it whole."""
    try:
        with open(path, "rb") as f:
            return text_encoding(f.read(4)) is None
    except OSError:  # the reader reports it
        return True


@dataclass(frozen=True)
class DescribeTask:
    """An input's manifest facts (checksum, size, reader) computed in a worker, so hashing
    a large file overlaps with indexing instead of holding up the driver."""

    input: int
    spec: InputSpec

    def run(self) -> dict[str, Any]:
        return {"rows_in": 0, "key": (self.input, -1), "info": describe_input(self.spec)}


PlanTask = IndexTask | ArrayIndexTask | DescribeTask  # what the plan runs in workers


class InputPlan:
    """Every input's facts and units, in input order: `LineSplit`s for split inputs, else
    raw batches. The workers hash the input files and index the ranges in one round."""

    def __init__(self, specs: Sequence[InputSpec], batch_rows: int, split_bytes: int,
                 run_tasks: Callable[[list[PlanTask]], list[dict[str, Any]]]) -> None:
        self.specs = list(specs)
        self.batch_rows = batch_rows
        kinds = [split_kind(spec) for spec in self.specs]
        # taken before the file is hashed and indexed: a unit refuses a file changed since
        self.stamps = {i: _stamp(spec) for i, spec in enumerate(self.specs) if kinds[i] in ("jsonl", "json")}
        tasks: list[PlanTask] = [DescribeTask(i, spec) for i, spec in enumerate(self.specs) if spec.dataset is None]
        # the longest task first: a large array's sequential scan overlaps everything else
        tasks[:0] = [ArrayIndexTask(i, str(spec.path), spec.json_key, batch_rows)
                     for i, spec in enumerate(self.specs) if kinds[i] == "json"]
        tasks += [IndexTask(i, r, str(spec.path), start, end, batch_rows)
                  for i, spec in enumerate(self.specs) if kinds[i] == "jsonl"
                  for r, (start, end) in enumerate(_ranges(spec, split_bytes))]
        self.indexes: dict[int, list[LineIndex]] = {}
        self.arrays: dict[int, ArrayIndex] = {}
        # else (None) the whole-file reader reports what is wrong, as a row or one error line
        self.layouts: dict[int, ParquetLayout | HfLayout] = {}
        for i, spec in enumerate(self.specs):
            layout = (parquet_layout(Path(spec.path), batch_rows) if kinds[i] == "parquet" else
                      hf_layout(spec, batch_rows) if kinds[i] == "hf" else None)
            if layout is not None:
                self.layouts[i] = layout
        infos: dict[int, dict[str, Any]] = {}
        for result in sorted(run_tasks(tasks), key=lambda res: res["key"]) if tasks else []:
            if "info" in result:
                infos[result["key"][0]] = result["info"]
            elif "array" in result:
                if result["array"].splittable:
                    self.arrays[result["key"][0]] = result["array"]
            else:
                self.indexes.setdefault(result["key"][0], []).append(result["index"])
        for i, stamp in self.stamps.items():
            if _stamp(self.specs[i]) != stamp:
                raise InputError(f"input {self.specs[i].name!r}: {self.specs[i].path} changed while the run was "
                                 "planned; run again once the file stays put")
        # in-memory datasets are described here: they do not travel to workers
        self.input_info = [infos[i] if i in infos else describe_input(spec) for i, spec in enumerate(self.specs)]

    def units(self) -> Iterator[tuple[InputSpec, InputSplit | RawBatch]]:
        """(input, what its next unit reads), lazily: raw batches are read only when asked for."""
        for i, spec in enumerate(self.specs):
            if i in self.indexes:
                for split in line_splits(str(spec.path), self.indexes[i], self.batch_rows,
                                         stamp=self.stamps.get(i)):
                    yield spec, split
            elif i in self.arrays:
                for part in array_splits(str(spec.path), spec.json_key, self.arrays[i], self.batch_rows,
                                         DEFAULT_MAX_RECORD_BYTES, self.stamps.get(i)):
                    yield spec, part
            elif i in self.layouts:
                layout = self.layouts[i]
                parts = (parquet_splits(str(spec.path), layout, self.batch_rows, DEFAULT_MAX_RECORD_BYTES)
                         if isinstance(layout, ParquetLayout) else
                         hf_splits(spec, layout, self.batch_rows, DEFAULT_MAX_RECORD_BYTES))
                for part in parts:
                    yield spec, part
            else:
                for raw in read_batches(spec, batch_rows=self.batch_rows, defer_parse=True):
                    yield spec, raw


def _stamp(spec: InputSpec) -> Stamp:
    path = Path(spec.path)
    try:
        return file_stamp(path)
    except OSError as exc:  # worded as describe_input words it
        raise InputError(f"input {spec.name!r}: cannot read {exc.filename or path}: {exc.strerror or exc}") from None


def _ranges(spec: InputSpec, split_bytes: int) -> list[tuple[int, int]]:
    path = Path(spec.path)
    try:
        return plan_line_ranges(path, split_bytes)
    except OSError as exc:  # worded as describe_input words it
        raise InputError(f"input {spec.name!r}: cannot read {exc.filename or path}: {exc.strerror or exc}") from None


def line_splits(path: str, indexes: Sequence[LineIndex], batch_rows: int,
                max_bytes: int = DEFAULT_MAX_RECORD_BYTES, stamp: Stamp | None = None) -> Iterator[LineSplit]:
    """The units of one file from its ranges' indexes (in file order); each checks its bytes
    against the index's crc, and the file against ``stamp``."""
    position = line_base = 0
    for index in indexes:
        marks = index.marks
        for k, (offset, lines_before, records_before) in enumerate(marks):
            end = marks[k + 1][0] if k + 1 < len(marks) else index.end
            records = min(batch_rows, index.records - records_before)
            yield LineSplit(path, offset, end, position + records_before, line_base + lines_before, records,
                            max_bytes, index.digests[k] if index.digests else None, stamp)
        position += index.records
        line_base += index.lines
    if position == 0:  # no records at all: one unit holding the empty_file row
        yield LineSplit(path, 0, 0, 0, 0, 0, max_bytes, stamp=stamp)
