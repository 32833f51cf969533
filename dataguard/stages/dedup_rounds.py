"""dedup's fit as one distributed round, hash-partitioned like near_dedup's buckets.

Each unit's summarize writes ``hashes`` (`dataguard.rounds.tasks.UnitFitFiles`): its rows'
content hashes with their position and id, sorted by (hash, row). One task per hash range
(ranges of the 64-bit hash, as many as the row count asks for: data and config alone) cuts
its range out of every unit's file, finds each hash's first row in input order (rows are
named ``unit << 32 | row``, whose order is input order) and writes the hashes seen more than
once with the id of that first row, sorted. ``apply`` looks each row's hash up in the file of
its range (memory-mapped, a binary search per row). The driver holds the ranges and counts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from dataguard.rounds.tasks import (
    RoundContext,
    column,
    finish_task,
    open_arrow,
    range_bounds,
    task_file,
    task_marker,
    write_arrow,
)

ROWS_PER_TASK = 1 << 22  # hashes per task: ~100 MB of keys, ids and sort


@dataclass
class DedupUnitSummary:
    """What a unit tells the driver: how many rows it hashed."""

    rows: int


def write_unit_hashes(path: Path, hashes: np.ndarray, ids: list[str]) -> DedupUnitSummary:
    rows = np.arange(len(hashes), dtype=np.uint32)
    order = np.lexsort((rows, hashes))
    write_arrow(path, pa.table({"hash": pa.array(hashes[order], pa.uint64()), "row": pa.array(rows[order], pa.uint32()),
                                "id": pa.array(ids, pa.string()).take(pa.array(order, pa.int64()))}))
    return DedupUnitSummary(rows=len(hashes))


@dataclass(frozen=True)
class FirstRowsTask:
    """The hashes of ``[lo, hi)`` seen more than once, each with its first row's id."""

    marker: Path
    out: Path
    units: tuple[tuple[int, str], ...]  # (unit, hashes file)
    lo: int
    hi: int

    def run(self) -> dict[str, Any]:
        hashes, keys, ids = [], [], []
        for unit, path in self.units:
            table = open_arrow(Path(path))
            h = column(table, "hash")
            start = int(np.searchsorted(h, np.uint64(self.lo)))
            end = len(h) if self.hi >= 1 << 64 else int(np.searchsorted(h, np.uint64(self.hi)))
            hashes.append(h[start:end].copy())
            keys.append((np.uint64(unit) << np.uint64(32)) | column(table, "row")[start:end].astype(np.uint64))
            ids.append(table.column("id").slice(start, end - start))
        h = np.concatenate(hashes) if hashes else np.zeros(0, np.uint64)
        k = np.concatenate(keys) if keys else np.zeros(0, np.uint64)
        order = np.lexsort((k, h))
        h = h[order]
        first = np.ones(len(h), dtype=bool)
        first[1:] = h[1:] != h[:-1]
        starts = np.flatnonzero(first)
        counts = np.diff(np.append(starts, len(h)))
        repeated = starts[counts > 1]
        all_ids = pa.chunked_array([c for i in ids for c in i.chunks], pa.string()) if ids else pa.chunked_array(
            [], pa.string())
        first_ids = all_ids.take(pa.array(order[repeated], pa.int64()))
        written: list[Path] = []
        write_arrow(self.out, pa.table({"hash": pa.array(h[repeated], pa.uint64()), "first": first_ids}), written)
        return finish_task(self, {"distinct": int(len(starts)), "repeated": int(len(repeated))}, written)


def run_first_rows(summaries: Sequence[DedupUnitSummary], ctx: RoundContext,
                   per_task: int) -> tuple[list[int], list[str], int]:
    """(range bounds, each range's file, distinct contents) after the round ran."""
    bounds = range_bounds(sum(s.rows for s in summaries), per_task)
    ctx.folder.mkdir(parents=True, exist_ok=True)
    units = tuple((u.unit, str(u.path("hashes"))) for u in ctx.units)
    tasks = [FirstRowsTask(task_marker(ctx.folder, 1, r), task_file(ctx.folder, 1, r, "repeated"), units,
                           bounds[r], bounds[r + 1]) for r in range(len(bounds) - 1)]
    results = ctx.run(tasks, f"first occurrences ({len(tasks)} hash ranges)")
    return bounds, [str(t.out) for t in tasks], sum(r["distinct"] for r in results)


def first_ids(hashes: np.ndarray, ids: np.ndarray, bounds: Sequence[int], files: Sequence[str]) -> np.ndarray:
    """Per row, the id of its content's first row (its own id where the content is seen once)."""
    first = ids.copy()
    which = np.searchsorted(np.array(bounds[1:-1], dtype=np.uint64), hashes, side="right") \
        if len(bounds) > 2 else np.zeros(len(hashes), np.int64)
    for r in np.unique(which).tolist():
        rows = np.flatnonzero(which == r)
        table = open_arrow(Path(files[r]))
        keys = column(table, "hash")
        pos = np.searchsorted(keys, hashes[rows])
        found = pos < len(keys)
        found[found] = keys[pos[found]] == hashes[rows][found]
        if found.any():
            first[rows[found]] = table.column("first").take(pa.array(pos[found], pa.int64())).to_pylist()
    return first
