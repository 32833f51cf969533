"""near_dedup's per-unit fit files, and reading back the rows a round task needs.

A unit's summarize writes two files (`dataguard.rounds.tasks.UnitFitFiles`):

* ``bands``: one entry per (row with text, band): ``bucket`` (uint64, the band key mixed with
  the band, `near_dedup_buckets.bucket_entries`) and ``row`` (uint32, position in the unit),
  sorted by (bucket, row), so a round-1 task cuts its bucket range out of every unit's file
  with two binary searches on the memory-mapped column;
* ``rows``: per row ``id``, ``length`` (characters), ``preferred`` (validation source),
  ``tools`` (hash of the offered tools) and ``material``: the shingle set (``verify``) or the
  MinHash signature, what a pair's similarity is computed from.

Rows are named across the run by ``unit << 32 | row``: sorting those keys is input order,
so every tie rule of the in-driver fit (smallest row first) holds on them unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from dataguard.rounds.tasks import column, open_arrow, write_arrow
from dataguard.stages.near_dedup_buckets import bucket_entries
from dataguard.text import minhash

ROW_BITS = np.uint64(32)
ROW_MASK = np.uint64(0xFFFFFFFF)


@dataclass
class NearDedupUnitSummary:
    """What a unit tells the driver: its rows, those without text, and its band entries."""

    rows: int
    without_text: int
    entries: int


@dataclass(frozen=True)
class UnitPaths:
    """One unit's number and its two fit files (what round tasks are given)."""

    unit: int
    bands: str
    rows: str


def write_unit(bands_path: Path, rows_path: Path, ids: list[str], sig: np.ndarray, lengths: np.ndarray,
               preferred: np.ndarray, tools: np.ndarray, material: tuple[np.ndarray, np.ndarray],
               bands: int, rows_per_band: int) -> NearDedupUnitSummary:
    """Write a unit's ``bands`` and ``rows`` files; ``material`` is (values, offsets)."""
    valid = (sig != np.uint32(0xFFFFFFFF)).any(axis=1) if len(ids) else np.zeros(0, bool)
    bucket, row = bucket_entries(minhash.band_keys(sig, bands, rows_per_band), valid)
    order = np.lexsort((row, bucket))
    write_arrow(bands_path, pa.table({"bucket": pa.array(bucket[order], pa.uint64()),
                                      "row": pa.array(row[order].astype(np.uint32), pa.uint32())}))
    values, offsets = material
    sets = pa.LargeListArray.from_arrays(pa.array(offsets.astype(np.int64), pa.int64()),
                                         pa.array(values, pa.uint32()))
    write_arrow(rows_path, pa.table({"id": pa.array(ids, pa.string()), "length": pa.array(lengths, pa.int64()),
                                     "preferred": pa.array(preferred, pa.bool_()),
                                     "tools": pa.array(tools, pa.uint64()), "material": sets}))
    return NearDedupUnitSummary(rows=len(ids), without_text=int((~valid).sum()), entries=len(bucket))


def bucket_slice(path: str, unit: int, lo: int, hi: int | None) -> tuple[np.ndarray, np.ndarray]:
    """(bucket, row key) of a unit's entries with ``lo <= bucket < hi`` (hi None: no end)."""
    table = open_arrow(Path(path))
    bucket = column(table, "bucket")
    start = int(np.searchsorted(bucket, np.uint64(lo), side="left"))
    end = len(bucket) if hi is None else int(np.searchsorted(bucket, np.uint64(hi), side="left"))
    rows = column(table, "row")[start:end].astype(np.uint64)
    return bucket[start:end].copy(), (np.uint64(unit) << ROW_BITS) | rows


@dataclass
class RowMaterial:
    """The rows a task needs, in the order of their sorted keys (index i = keys[i])."""

    keys: np.ndarray
    ids: list[str]
    lengths: np.ndarray
    preferred: np.ndarray
    tools: np.ndarray
    values: np.ndarray
    offsets: np.ndarray

    def similarity(self, pairs: np.ndarray, verify: bool, num_perm: int) -> np.ndarray:
        """Exact shingle Jaccard (``verify``) or the MinHash estimate per pair of local
        indices, 0 where the two rows offer other tools: as the in-driver fit computes it."""
        if verify:
            sim = minhash.exact_jaccard(self.values, self.offsets, pairs)
        else:
            sim = minhash.estimated_jaccard(self.values.reshape(len(self.keys), num_perm), pairs)
        if not len(pairs):
            return sim
        return np.where(self.tools[pairs[:, 0]] == self.tools[pairs[:, 1]], sim, 0.0)


def read_rows(units: Sequence[UnitPaths], keys: np.ndarray, with_ids: bool = True) -> RowMaterial:
    """Gather the rows named by the sorted ``keys`` from the units' memory-mapped ``rows`` files."""
    by_unit = {u.unit: u for u in units}
    unit_of = (keys >> ROW_BITS).astype(np.int64)
    ids: list[str] = []
    lengths, preferred, tools, values, sizes = [], [], [], [], []
    for unit in np.unique(unit_of).tolist():
        pos = (keys[unit_of == unit] & ROW_MASK).astype(np.int64)
        table = open_arrow(Path(by_unit[unit].rows)).take(pa.array(pos, pa.int64()))
        if with_ids:
            ids += table.column("id").to_pylist()
        lengths.append(column(table, "length"))
        preferred.append(column(table, "preferred"))
        tools.append(column(table, "tools"))
        mat = table.column("material").combine_chunks()
        values.append(mat.flatten().to_numpy(zero_copy_only=False))
        sizes.append(mat.value_lengths().to_numpy(zero_copy_only=False))
    size = np.concatenate(sizes) if sizes else np.zeros(0, np.int64)
    offsets = np.zeros(len(size) + 1, np.int64)
    np.cumsum(size, out=offsets[1:])
    return RowMaterial(keys=keys, ids=ids, lengths=_cat(lengths, np.int64), preferred=_cat(preferred, bool),
                       tools=_cat(tools, np.uint64), values=_cat(values, np.uint32), offsets=offsets)


def _cat(parts: list[np.ndarray], dtype: type) -> np.ndarray:
    return np.concatenate(parts).astype(dtype, copy=False) if parts else np.zeros(0, dtype)
