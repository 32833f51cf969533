"""Clusters of duplicate rows from pair edges, and which row of each cluster to keep.

Shared by the near-duplicate (MinHash) and semantic (embedding) dedup stages. Rows are
numbered in input order (the order ``fit`` receives summaries in), so everything here is
independent of how many workers produced them.
"""

from __future__ import annotations

import numpy as np


def connected_components(n: int, edges: np.ndarray) -> np.ndarray:
    """Component label of each of ``n`` nodes: the smallest node index in its component.

    Union-find done as vectorised min-label propagation with pointer jumping: every round
    hooks each edge's larger root under the smaller one, then compresses paths fully; it
    needs O(log n) rounds, each a few NumPy passes over the edges."""
    parent = np.arange(n, dtype=np.int64)
    if n == 0 or len(edges) == 0:
        return parent
    u, v = edges[:, 0].astype(np.int64), edges[:, 1].astype(np.int64)
    while True:
        ru, rv = parent[u], parent[v]
        diff = ru != rv
        if not diff.any():
            return parent
        lo, hi = np.minimum(ru[diff], rv[diff]), np.maximum(ru[diff], rv[diff])
        np.minimum.at(parent, hi, lo)
        while True:  # full path compression
            nxt = parent[parent]
            if np.array_equal(nxt, parent):
                break
            parent = nxt


def pick_kept(labels: np.ndarray, preferred: np.ndarray, length: np.ndarray | None = None) -> np.ndarray:
    """Index of the row kept in each row's cluster (an array as long as ``labels``).

    Order of preference inside a cluster: a ``preferred`` row (a validation row) first,
    then, if ``length`` is given, the longest, then the first in input order. Deterministic:
    ties always fall to the lowest row index."""
    n = len(labels)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    idx = np.arange(n, dtype=np.int64)
    size_key = -length.astype(np.int64) if length is not None else np.zeros(n, dtype=np.int64)
    # lexsort: last key is primary -> cluster, then preferred first, then longest, then index
    order = np.lexsort((idx, size_key, ~preferred.astype(bool), labels))
    sorted_labels = labels[order]
    first = np.ones(n, dtype=bool)
    first[1:] = sorted_labels[1:] != sorted_labels[:-1]
    best_of_label = np.empty(n, dtype=np.int64)
    best_of_label[sorted_labels[first]] = order[first]
    return best_of_label[labels]
