"""semantic_dedup's fit as distributed rounds over per-unit embedding files.

Each unit's summarize writes ``vectors`` (`dataguard.rounds.tasks.UnitFitFiles`): per row
its id, whether it has text, length, validation flag and unit vector (float32), one Arrow
record batch a task memory-maps. Rows with text are numbered in input order ("valid rank").

* At most ``exact_max_rows`` rows with text: one task runs the exact top-k search over all
  of them (memory bounded by that parameter, not by the input).
* Above: ``centroids`` (one task) fits the seeded spherical k-means on its seeded sample of
  at most ``SAMPLE`` rows, as `dataguard.stats.neighbours.spherical_kmeans` does; ``assign``
  (one task per unit) labels the unit's rows with their nearest centroid and writes them
  sorted by (partition, row); ``pairs`` (one task per run of consecutive partitions, a
  fixed count for the row count) runs the exact search inside each of its partitions.
* ``clusters`` (one task): union-find over the pairs, the kept row per cluster and the
  cosine of each other row to it; per unit a small ``keep`` file that ``apply`` reads.

Rows inside a partition are in input order and the float work is the in-driver fit's on the
same vectors with one math thread, so the output is the in-driver fit's, byte for byte.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from dataguard.executors.process import one_math_thread
from dataguard.rounds.tasks import (
    RoundContext,
    column,
    finish_task,
    open_arrow,
    task_file,
    task_marker,
    write_answers,
    write_arrow,
)
from dataguard.stats.clusters import connected_components, pick_kept
from dataguard.stats.neighbours import exact_pairs, fit_centroids, nearest_centroid

SAMPLE, ITERS = 100_000, 10  # as spherical_kmeans
ROWS_PER_TASK = 100_000  # rows of partitions per pairs task
MAX_EXAMPLES = 20
ROW_BITS = np.uint64(32)


@dataclass
class SemanticUnitSummary:
    rows: int
    valid: int


def write_unit_vectors(path: Path, ids: list[str], vectors: np.ndarray, valid: np.ndarray, lengths: np.ndarray,
                       preferred: np.ndarray) -> SemanticUnitSummary:
    dim = vectors.shape[1]
    flat = pa.FixedSizeListArray.from_arrays(pa.array(vectors.reshape(-1), pa.float32()), dim)
    write_arrow(path, pa.table({"id": pa.array(ids, pa.string()), "valid": pa.array(valid, pa.bool_()),
                                "length": pa.array(lengths, pa.int64()), "preferred": pa.array(preferred, pa.bool_()),
                                "vector": flat}))
    return SemanticUnitSummary(rows=len(ids), valid=int(valid.sum()))


def _vectors(table: pa.Table, rows: np.ndarray | slice, name: str = "vector") -> np.ndarray:
    """The (len(rows), dim) float32 vectors of these rows of a unit table."""
    col = table.column(name).combine_chunks() if table.column(name).num_chunks != 1 else table.column(name).chunk(0)
    dim = col.type.list_size
    flat = col.flatten().to_numpy(zero_copy_only=False).reshape(-1, dim)
    return flat[rows]


def gather(units: Sequence[tuple[int, str]], keys: np.ndarray, attrs: bool = False) -> dict[str, Any]:
    """Vectors (and, with ``attrs``, ids, lengths, validation flags) of the rows named by the
    sorted ``keys``, read from the units' memory-mapped files."""
    paths = dict(units)
    unit_of = (keys >> ROW_BITS).astype(np.int64)
    out: dict[str, list] = {"x": [], "ids": [], "lengths": [], "preferred": []}
    for unit in np.unique(unit_of).tolist():
        rows = (keys[unit_of == unit] & np.uint64(0xFFFFFFFF)).astype(np.int64)
        table = open_arrow(Path(paths[unit]))
        out["x"].append(_vectors(table, rows))
        if attrs:
            out["ids"] += table.column("id").take(pa.array(rows, pa.int64())).to_pylist()
            out["lengths"].append(column(table, "length")[rows])
            out["preferred"].append(column(table, "preferred")[rows])
    x = np.concatenate(out["x"]) if out["x"] else np.zeros((0, 1), np.float32)
    return {"x": np.ascontiguousarray(x), "ids": out["ids"],
            "lengths": np.concatenate(out["lengths"]) if out["lengths"] else np.zeros(0, np.int64),
            "preferred": np.concatenate(out["preferred"]).astype(bool) if out["preferred"] else np.zeros(0, bool)}


def valid_keys(unit: int, path: str) -> np.ndarray:
    table = open_arrow(Path(path))
    return (np.uint64(unit) << ROW_BITS) | np.flatnonzero(column(table, "valid")).astype(np.uint64)


@dataclass(frozen=True)
class CentroidsTask:
    """Spherical k-means on the seeded sample of valid ranks (the in-driver fit's sample)."""

    marker: Path
    out: Path
    units: tuple[tuple[int, str], ...]
    valid: int
    k: int
    seed: int

    def run(self) -> dict[str, Any]:
        with one_math_thread():
            rng = np.random.default_rng(self.seed)
            sample = np.sort(rng.choice(self.valid, size=min(SAMPLE, self.valid), replace=False))
            keys = np.concatenate([valid_keys(u, p) for u, p in self.units])[sample]
            xs = gather(self.units, keys)["x"]
            k = max(1, min(self.k, self.valid))
            cent = fit_centroids(xs, k, rng, ITERS)
        written: list[Path] = []
        dim = cent.shape[1]
        write_arrow(self.out, pa.table({"centroid": pa.FixedSizeListArray.from_arrays(
            pa.array(cent.reshape(-1).astype(np.float32), pa.float32()), dim)}), written)
        return finish_task(self, {"k": int(k)}, written)


@dataclass(frozen=True)
class AssignTask:
    """A unit's valid rows with their partition, sorted by (partition, row)."""

    marker: Path
    out: Path
    unit: tuple[int, str]
    centroids: Path

    def run(self) -> dict[str, Any]:
        with one_math_thread():
            cent = _vectors(open_arrow(self.centroids), slice(None), "centroid")
            keys = valid_keys(*self.unit)
            labels = nearest_centroid(gather((self.unit,), keys)["x"], cent) if len(keys) else np.zeros(0, np.int64)
        order = np.lexsort((keys, labels))
        written: list[Path] = []
        write_arrow(self.out, pa.table({"part": pa.array(labels[order], pa.int64()),
                                        "key": pa.array(keys[order], pa.uint64())}), written)
        return finish_task(self, {}, written)


@dataclass(frozen=True)
class PairsTask:
    """Exact top-k pairs inside each partition of ``[lo, hi)``; ``labels`` None: one
    partition of every valid row."""

    marker: Path
    out: Path
    units: tuple[tuple[int, str], ...]
    labels: tuple[str, ...] | None
    lo: int
    hi: int
    threshold: float
    top_k: int

    def run(self) -> dict[str, Any]:
        if self.labels is None:
            keys = np.concatenate([valid_keys(u, p) for u, p in self.units]) if self.units else np.zeros(0, np.uint64)
            part_of = np.zeros(len(keys), np.int64)
        else:
            part_of, keys = self._slices()
        order = np.lexsort((keys, part_of))
        part_of, keys = part_of[order], keys[order]
        a, b = [], []
        with one_math_thread():
            for p in np.unique(part_of).tolist() if len(keys) else []:
                rows = keys[part_of == p]
                if len(rows) < 2:
                    continue
                pp, _ = exact_pairs(gather(self.units, rows)["x"], self.threshold, self.top_k)
                a.append(rows[pp[:, 0]])
                b.append(rows[pp[:, 1]])
        written: list[Path] = []
        a_all = np.concatenate(a) if a else np.zeros(0, np.uint64)
        write_arrow(self.out, pa.table({"a": pa.array(a_all, pa.uint64()),
                                        "b": pa.array(np.concatenate(b) if b else a_all, pa.uint64())}), written)
        return finish_task(self, {"pairs": int(len(a_all))}, written)

    def _slices(self) -> tuple[np.ndarray, np.ndarray]:
        parts, keys = [], []
        for path in self.labels or ():
            table = open_arrow(Path(path))
            part = column(table, "part")
            s, e = np.searchsorted(part, self.lo), np.searchsorted(part, self.hi)
            parts.append(part[s:e].copy())
            keys.append(column(table, "key")[s:e].copy())
        return (np.concatenate(parts) if parts else np.zeros(0, np.int64),
                np.concatenate(keys) if keys else np.zeros(0, np.uint64))


@dataclass(frozen=True)
class ClustersTask:
    """Union-find over every partition's pairs; per-unit keep decisions."""

    marker: Path
    folder: Path
    pair_files: tuple[Path, ...]
    units: tuple[tuple[int, str], ...]
    keep_longest: bool

    def run(self) -> dict[str, Any]:
        tables = [open_arrow(p) for p in self.pair_files]
        a = np.concatenate([column(t, "a") for t in tables]) if tables else np.zeros(0, np.uint64)
        b = np.concatenate([column(t, "b") for t in tables]) if tables else np.zeros(0, np.uint64)
        nodes = np.unique(np.concatenate([a, b]))
        edges = np.stack([np.searchsorted(nodes, a), np.searchsorted(nodes, b)], axis=1).astype(np.int64)
        labels = connected_components(len(nodes), edges)
        rows = gather(self.units, nodes, attrs=True)
        kept = pick_kept(labels, rows["preferred"], rows["lengths"] if self.keep_longest else None)
        roots, cluster_no = np.unique(labels, return_inverse=True)
        sizes = np.bincount(labels, minlength=len(nodes))[roots]
        dropped = np.flatnonzero(kept != np.arange(len(nodes)))
        x = rows["x"]
        with one_math_thread():
            cos = np.einsum("ij,ij->i", x[dropped], x[kept[dropped]]) if len(dropped) else np.zeros(0)
        score = np.ones(len(nodes))
        score[dropped] = cos
        written: list[Path] = []
        answered = write_answers(self.folder, nodes, rows["ids"], cluster_no, kept, score, written)
        ids = rows["ids"]
        result = {"pairs": int(len(edges)), "clusters": int(len(roots)), "rows_in_clusters": int(len(nodes)),
                  "largest_cluster": int(sizes.max()) if len(sizes) else 0, "units": answered,
                  "examples": [[ids[i], ids[int(kept[i])], float(score[i])] for i in dropped[:MAX_EXAMPLES].tolist()]}
        return finish_task(self, result, written)


def plan_and_run(summaries: Sequence[SemanticUnitSummary], ctx: RoundContext, *, threshold: float, top_k: int,
                 exact_max_rows: int, partitions: int | None, partition_rows: int, seed: int,
                 keep_longest: bool, rows_per_task: int = ROWS_PER_TASK) -> tuple[dict[str, Any], list[int]]:
    """Run the rounds; returns the fit statistics (as the in-driver fit has them) and the
    units that got a keep file."""
    folder = ctx.folder
    folder.mkdir(parents=True, exist_ok=True)
    units = tuple((u.unit, str(u.path("vectors"))) for u in ctx.units)
    n = sum(s.rows for s in summaries)
    valid = sum(s.valid for s in summaries)
    if valid <= exact_max_rows:
        method, parts = "exact", 1
        pair_tasks = [PairsTask(task_marker(folder, 3, 0), task_file(folder, 3, 0, "pairs"), units, None, 0, 1,
                                threshold, top_k)]
    else:
        method, parts = "k-means partitions", partitions or -(-valid // partition_rows)
        cent = CentroidsTask(task_marker(folder, 1, 0), task_file(folder, 1, 0, "centroids"), units, valid, parts, seed)
        k = ctx.run([cent], "k-means on a sample")[0]["k"]
        assign = [AssignTask(task_marker(folder, 2, i), task_file(folder, 2, i, "labels"), unit, cent.out)
                  for i, unit in enumerate(units)]
        ctx.run(assign, "nearest centroids")
        per_task = max(1, -(-k // max(1, -(-valid // rows_per_task))))
        labels = tuple(str(t.out) for t in assign)
        pair_tasks = [PairsTask(task_marker(folder, 3, i), task_file(folder, 3, i, "pairs"), units, labels, lo,
                                min(k, lo + per_task), threshold, top_k)
                      for i, lo in enumerate(range(0, k, per_task))]
    ctx.run(pair_tasks, f"top-{top_k} pairs ({len(pair_tasks)} tasks)")
    done = ctx.run([ClustersTask(task_marker(folder, 4, 0), folder, tuple(t.out for t in pair_tasks), units,
                                 keep_longest)], "clusters")[0]
    stats = {"rows": n, "rows_without_text": n - valid, "method": method, "partitions": parts,
             **{key: done[key] for key in ("pairs", "clusters", "rows_in_clusters", "largest_cluster")},
             "examples": [tuple(e) for e in done["examples"]]}
    return stats, list(done["units"])
