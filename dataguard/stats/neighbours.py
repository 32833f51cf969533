"""Pairs of rows whose normalised embeddings have cosine >= a threshold, never quadratic in
memory, and not quadratic in time for large sets.

* ``exact_pairs``: exact top-k per row by blocked matrix products (``BLOCK`` rows against
  all rows at a time, float32), for sets up to a few 10^4 rows.
* ``partitioned_pairs``: SemDeDup-style: spherical k-means (centroids started from seeded
  random rows, fitted on a seeded sample, fixed iterations: deterministic) splits the rows
  into partitions, then
  ``exact_pairs`` runs inside each partition. Duplicates at cosine >= 0.9 are nearly always
  nearest to the same centroid; pairs split across partitions are missed (the price of
  never comparing everything with everything).
"""

from __future__ import annotations

import numpy as np

BLOCK = 512


def exact_pairs(x: np.ndarray, threshold: float, top_k: int) -> tuple[np.ndarray, np.ndarray]:
    """(pairs (i, j) with i < j, their cosines) among each row's ``top_k`` nearest rows.

    ``x`` is (n, d) float32 with unit rows. A pair is kept if either row has the other in
    its top k (ties broken by index, so the result is deterministic)."""
    n = x.shape[0]
    if n < 2:
        return np.zeros((0, 2), np.int64), np.zeros(0, np.float32)
    k = min(top_k, n - 1)
    out_i, out_j, out_s = [], [], []
    for lo in range(0, n, BLOCK):
        hi = min(n, lo + BLOCK)
        sims = x[lo:hi] @ x.T
        sims[np.arange(hi - lo), np.arange(lo, hi)] = -np.inf  # not its own neighbour
        if k < n - 1:
            part = np.argpartition(-sims, k - 1, axis=1)[:, :k]
            part.sort(axis=1)
        else:
            part = np.broadcast_to(np.arange(n), (hi - lo, n))
        top = np.take_along_axis(sims, part, axis=1)
        rows, cols = np.nonzero(top >= threshold)
        out_i.append(rows + lo)
        out_j.append(part[rows, cols])
        out_s.append(top[rows, cols])
    i, j, s = np.concatenate(out_i), np.concatenate(out_j), np.concatenate(out_s)
    a, b = np.minimum(i, j).astype(np.int64), np.maximum(i, j).astype(np.int64)
    key, first = np.unique(a * n + b, return_index=True)
    return np.stack([key // n, key % n], axis=1), s[first].astype(np.float32)


def spherical_kmeans(x: np.ndarray, k: int, seed: int, iters: int = 10, sample: int = 100_000) -> np.ndarray:
    """Partition label of every row: k-means on the unit sphere (cosine), fitted on a seeded
    sample of at most ``sample`` rows, centroids initialised from seeded distinct rows."""
    n = x.shape[0]
    rng = np.random.default_rng(seed)
    fit_rows = np.sort(rng.choice(n, size=min(sample, n), replace=False))
    return nearest_centroid(x, fit_centroids(x[fit_rows], k, rng, iters))


def fit_centroids(xs: np.ndarray, k: int, rng: np.random.Generator, iters: int = 10) -> np.ndarray:
    """Spherical k-means centroids of the sample ``xs``, initialised from ``k`` distinct rows
    drawn with ``rng`` (the draw after the sample's: the distributed fit makes the same two)."""
    k = max(1, min(k, xs.shape[0]))
    cent = xs[np.sort(rng.choice(len(xs), size=k, replace=False))].copy()
    for _ in range(iters):
        lab = nearest_centroid(xs, cent)
        sums = np.zeros_like(cent)
        np.add.at(sums, lab, xs)
        norms = np.linalg.norm(sums, axis=1, keepdims=True)
        empty = norms[:, 0] == 0
        cent = np.where(empty[:, None], cent, sums / np.where(norms == 0, 1, norms))
    return cent


def nearest_centroid(x: np.ndarray, cent: np.ndarray) -> np.ndarray:
    """The index of each row's nearest centroid by dot product, in blocks of 8,192 rows."""
    out = np.empty(x.shape[0], dtype=np.int64)
    for lo in range(0, x.shape[0], 8192):
        out[lo:lo + 8192] = np.argmax(x[lo:lo + 8192] @ cent.T, axis=1)
    return out


def partitioned_pairs(x: np.ndarray, threshold: float, top_k: int, partitions: int,
                      seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``exact_pairs`` inside each k-means partition, as global row indices."""
    labels = spherical_kmeans(x, partitions, seed)
    order = np.argsort(labels, kind="stable")
    bounds = np.searchsorted(labels[order], np.arange(labels.max() + 2))
    pairs, sims = [], []
    for p in range(len(bounds) - 1):
        rows = order[bounds[p]:bounds[p + 1]]  # ascending: stable sort of ascending indices
        if len(rows) < 2:
            continue
        pp, ss = exact_pairs(x[rows], threshold, top_k)
        pairs.append(rows[pp])
        sims.append(ss)
    if not pairs:
        return np.zeros((0, 2), np.int64), np.zeros(0, np.float32)
    return np.concatenate(pairs), np.concatenate(sims)
