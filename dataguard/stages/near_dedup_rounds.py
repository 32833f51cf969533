"""near_dedup's fit as two distributed rounds over the units' fit files (`near_dedup_files`).

* Round 1, one task per bucket range (ranges of the 64-bit bucket value, a fixed number of
  them for a given number of band entries, so they depend on the data and config alone):
  cut the range out of every unit's ``bands`` file, read the shingle sets (or signatures) of
  the rows that share a bucket from the units' ``rows`` files, pair and check them
  (`near_dedup_buckets.bucket_pairs`, as the in-driver fit does) and write every checked
  pair with its verdict. Memory: the range's entries plus the material of its candidates.
* Round 2, one task: the distinct checked pairs (a pair found in two ranges counts once),
  union-find over the accepted ones, the kept row of each cluster, the similarity of each
  dropped row to it, and per unit a small ``keep`` file of its clustered rows' decisions,
  read back by ``apply``. Memory: the number of pairs and of rows in clusters, not of rows.

The driver holds the per-unit counts and round 2's summary (counts, 20 examples).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from dataguard.rounds.tasks import (
    column,
    finish_task,
    open_arrow,
    range_bounds,
    task_file,
    task_marker,
    write_answers,
    write_arrow,
)
from dataguard.stages.near_dedup_buckets import bucket_pairs, shared_buckets
from dataguard.stages.near_dedup_files import UnitPaths, bucket_slice, read_rows
from dataguard.stats.clusters import connected_components, pick_kept

MAX_EXAMPLES = 20
SIZE_BINS = ((2, 2), (3, 3), (4, 5), (6, 10), (11, None))


@dataclass(frozen=True)
class Measure:
    """How a pair's similarity is computed and judged (the stage's parameters)."""

    threshold: float
    verify: bool
    num_perm: int


@dataclass(frozen=True)
class PairsTask:
    """Round 1: candidate pairs of the buckets in ``[lo, hi)``, checked."""

    marker: Path
    out: Path
    units: tuple[UnitPaths, ...]
    lo: int
    hi: int
    measure: Measure

    def run(self) -> dict[str, Any]:
        hi = None if self.hi >= 1 << 64 else self.hi
        parts = [bucket_slice(u.bands, u.unit, self.lo, hi) for u in self.units]
        group = np.concatenate([p[0] for p in parts]) if parts else np.zeros(0, np.uint64)
        keys = np.concatenate([p[1] for p in parts]) if parts else np.zeros(0, np.uint64)
        del parts
        group, keys = shared_buckets(group, keys)
        local = np.unique(keys)  # sorted keys: local index order is input order
        rows = np.searchsorted(local, keys)
        del keys
        material = read_rows(self.units, local, with_ids=False)
        m = self.measure
        _, checked, ok = bucket_pairs(group, rows, len(local), lambda p: material.similarity(p, m.verify, m.num_perm),
                                      m.threshold)
        a, b = local[checked // max(len(local), 1)], local[checked % max(len(local), 1)]
        written: list[Path] = []
        write_arrow(self.out, pa.table({"a": pa.array(a, pa.uint64()), "b": pa.array(b, pa.uint64()),
                                        "ok": pa.array(ok, pa.bool_())}), written)
        return finish_task(self, {"checked": int(len(checked)), "accepted": int(ok.sum())}, written)


@dataclass(frozen=True)
class ClustersTask:
    """Round 2: clusters from every range's pairs; per-unit keep decisions."""

    marker: Path
    folder: Path
    pair_files: tuple[Path, ...]
    units: tuple[UnitPaths, ...]
    keep_longest: bool
    measure: Measure

    def run(self) -> dict[str, Any]:
        a, b, ok = _distinct_pairs(self.pair_files)
        checked = len(a)
        a, b = a[ok], b[ok]
        nodes = np.unique(np.concatenate([a, b]))  # sorted: local order is input order
        edges = np.stack([np.searchsorted(nodes, a), np.searchsorted(nodes, b)], axis=1).astype(np.int64)
        del a, b, ok
        labels = connected_components(len(nodes), edges)
        rows = read_rows(self.units, nodes)
        kept = pick_kept(labels, rows.preferred, rows.lengths if self.keep_longest else None)
        roots, cluster_no = np.unique(labels, return_inverse=True)
        sizes = np.bincount(labels, minlength=len(nodes))[roots]
        dropped = np.flatnonzero(kept != np.arange(len(nodes)))
        m = self.measure
        sim = rows.similarity(np.stack([kept[dropped], dropped], axis=1), m.verify, m.num_perm) \
            if len(dropped) else np.zeros(0)
        score = np.ones(len(nodes))
        score[dropped] = sim
        written: list[Path] = []
        answered = write_answers(self.folder, nodes, rows.ids, cluster_no, kept, score, written)
        ex = dropped[:MAX_EXAMPLES].tolist()
        result = {
            "candidate_pairs": checked, "accepted_pairs": int(len(edges)), "clusters": int(len(roots)),
            "rows_in_clusters": int(len(nodes)), "largest_cluster": int(sizes.max()) if len(sizes) else 0,
            "size_counts": [int(((sizes >= lo) & (sizes <= (hi or sizes.max(initial=0)))).sum()) for lo, hi in SIZE_BINS],
            "examples": [[rows.ids[i], rows.ids[int(kept[i])], float(score[i])] for i in ex],
            "units": answered,
        }
        return finish_task(self, result, written)


def _distinct_pairs(paths: Sequence[Path]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every checked pair once (a pair whose two rows share buckets in two ranges was
    checked in both, with the same verdict), sorted by (a, b)."""
    tables = [open_arrow(p) for p in paths]
    a = np.concatenate([column(t, "a") for t in tables]) if tables else np.zeros(0, np.uint64)
    b = np.concatenate([column(t, "b") for t in tables]) if tables else np.zeros(0, np.uint64)
    ok = np.concatenate([column(t, "ok") for t in tables]).astype(bool) if tables else np.zeros(0, bool)
    order = np.lexsort((b, a))
    a, b, ok = a[order], b[order], ok[order]
    first = np.ones(len(a), dtype=bool)
    first[1:] = (a[1:] != a[:-1]) | (b[1:] != b[:-1])
    return a[first], b[first], ok[first]


def plan_and_run(summaries: Sequence[Any], ctx: Any, measure: Measure, keep_longest: bool,
                 per_task: int) -> tuple[dict[str, Any], list[int]]:
    """Run both rounds through ``ctx`` (`dataguard.rounds.tasks.RoundContext`); returns the
    fit statistics (as the in-driver fit records them) and the units that got a keep file."""
    units = tuple(UnitPaths(u.unit, str(u.path("bands")), str(u.path("rows"))) for u in ctx.units)
    bounds = range_bounds(sum(s.entries for s in summaries), per_task)
    folder = ctx.folder
    folder.mkdir(parents=True, exist_ok=True)
    pairs = [PairsTask(task_marker(folder, 1, r), task_file(folder, 1, r, "pairs"), units, bounds[r], bounds[r + 1],
                       measure) for r in range(len(bounds) - 1)]
    ctx.run(pairs, f"candidate pairs ({len(pairs)} bucket ranges)")
    done = ctx.run([ClustersTask(task_marker(folder, 2, 0), folder, tuple(t.out for t in pairs), units, keep_longest,
                                 measure)], "clusters")[0]
    stats = {key: done[key] for key in ("candidate_pairs", "accepted_pairs", "clusters", "rows_in_clusters",
                                        "largest_cluster", "size_counts")}
    stats.update(rows=sum(s.rows for s in summaries), rows_without_text=sum(s.without_text for s in summaries),
                 examples=[tuple(e) for e in done["examples"]])
    return stats, list(done["units"])
