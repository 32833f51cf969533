"""Saved Hugging Face datasets (a ``save_to_disk`` folder or an ``.arrow`` file) read by the
workers in row ranges: the data is memory-mapped, so opening it in every worker costs
milliseconds and the driver only needs its length.

The units are the ones the whole-dataset reader gives (``batch_rows`` rows each), with the
same rows: the same Arrow-to-record conversion (`arrow_reader._arrow_rows`), where a row's
record does not depend on which rows are converted with it. A dataset the whole reader
refuses (a DatasetDict, a folder that is not a dataset, too deep a schema) is left to it,
so its one-line error or rows stay the same. In-memory datasets passed from Python are
not split: they do not travel to workers.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dataguard.io.arrow_reader import _arrow_rows, _load_dataset, dataset_plan, open_dataset
from dataguard.io.bounded import InputError
from dataguard.io.input_spec import InputSpec
from dataguard.io.jsonscan import MAX_DEPTH
from dataguard.io.parquet_split import row_ranges
from dataguard.io.raw import RawBatch


@dataclass(frozen=True)
class HfLayout:
    """What the driver learns from a saved dataset without reading its rows."""

    rows: int
    chunk_rows: int
    fingerprint: str | None  # a worker refuses a dataset that changed since


def hf_layout(spec: InputSpec, batch_rows: int) -> HfLayout | None:
    """The dataset's length and conversion chunk, or None where the whole reader must run
    (it turns every problem into the error or rows it gives today)."""
    if spec.dataset is not None or spec.path is None:
        return None
    try:
        dataset = open_dataset(spec, str(spec.name))
        n = len(dataset)
        depth, chunk_rows = dataset_plan(dataset, batch_rows) if n else (1, 1)
    except Exception:  # noqa: BLE001 - InputError or anything `datasets` raises: the whole reader reports it
        return None
    if depth > MAX_DEPTH:
        return None
    return HfLayout(rows=n, chunk_rows=chunk_rows, fingerprint=getattr(dataset, "_fingerprint", None))


def hf_splits(spec: InputSpec, layout: HfLayout, batch_rows: int, max_bytes: int) -> Iterator[HfSplit]:
    """Units of ``batch_rows`` rows (one unit standing for the empty_file row of an empty dataset)."""
    for start, rows in row_ranges(layout.rows, batch_rows):
        yield HfSplit(spec, start, rows, layout, max_bytes)


@dataclass(frozen=True)
class HfSplit:
    """Rows ``start`` .. ``start + rows`` of a saved dataset, as a worker reads them."""

    spec: InputSpec
    start: int
    rows: int
    layout: HfLayout
    max_bytes: int

    def read(self, source: str) -> RawBatch:
        batch = RawBatch(source=source, max_record_bytes=self.max_bytes)
        dataset = _opened(self.spec)
        if len(dataset) != self.layout.rows or getattr(dataset, "_fingerprint", None) != self.layout.fingerprint:
            raise InputError(f"input {source!r}: {self.spec.path} changed while it was read (its rows or "
                             "fingerprint differ from when the run was planned)")
        if self.rows == 0:
            batch.add_empty_file()
            return batch
        arrow = dataset.with_format("arrow")
        end = self.start + self.rows
        for lo in range(self.start, end, self.layout.chunk_rows):
            hi = min(end, lo + self.layout.chunk_rows)
            for row in _arrow_rows(arrow[lo:hi], lo, self.max_bytes):
                batch.add_row(row)
        return batch


_OPENED: dict[str, Any] = {}  # {"key": the files' stamps, "dataset": the memory-mapped dataset}


def _stamp(path: Path) -> tuple[Any, ...]:
    """(name, size, mtime, inode) of the file or of every file in the folder: ``save_to_disk``
    into the same folder rewrites files in place, which the folder's own mtime misses."""
    files = sorted(p for p in path.iterdir() if p.is_file()) if path.is_dir() else [path]
    return tuple((p.name, st.st_size, st.st_mtime_ns, st.st_ino) for p in files for st in [p.stat()])


def _opened(spec: InputSpec) -> Any:
    """The dataset, opened once per worker while its units arrive (memory-mapped: cheap),
    and again whenever one of its files changed (then the fingerprint check refuses it)."""
    path = Path(spec.path)
    key = (str(path), _stamp(path))
    if _OPENED.get("key") != key:
        _OPENED.clear()
        _OPENED["dataset"] = _load_dataset(spec, str(spec.name))
        _OPENED["key"] = key
    return _OPENED["dataset"]
