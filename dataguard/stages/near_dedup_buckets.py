"""LSH buckets to checked pairs: the part of near_dedup's fit that both the in-driver fit and
the distributed round-1 tasks run, so the two accept the same pairs.

A bucket is one 64-bit value per (row, band): the band's key mixed with the band number
(`bucket_entries`), so buckets of different bands never meet, except by a 64-bit collision,
which both paths treat alike. `bucket_pairs` pairs rows inside each bucket; a pair's
verdict depends on the two rows only, so the pairs a bucket accepts do not depend on which
other buckets are checked in the same call: a partition of the buckets by value range
accepts, in union, exactly what one call over all of them does.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from dataguard.text import minhash

MAX_ROUNDS = 8
_BAND_MIX = np.uint64(0x9E3779B97F4A7C15)

Similarity = Callable[[np.ndarray], np.ndarray]


def bucket_entries(keys: np.ndarray, valid: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(bucket, row) of every valid row in every band, row-major: ``keys`` is (n, bands)."""
    nb = keys.shape[1]
    rows = np.repeat(np.flatnonzero(valid), nb)
    band = np.tile(np.arange(nb, dtype=np.uint64), int(valid.sum()))
    return minhash.mix64(keys[valid].reshape(-1) ^ (band * _BAND_MIX)), rows


def shared_buckets(group: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Entries sorted by (bucket, row), only those of buckets holding at least two rows."""
    order = np.lexsort((rows, group))
    group, rows = group[order], rows[order]
    multi = _in_multi(group)
    return group[multi], rows[multi]


def _in_multi(group: np.ndarray) -> np.ndarray:
    multi = np.zeros(len(group), dtype=bool)
    if len(group) > 1:
        same = group[1:] == group[:-1]
        multi[1:] |= same
        multi[:-1] |= same
    return multi


def bucket_pairs(group: np.ndarray, rows: np.ndarray, n: int, similarity: Similarity,
                 threshold: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(accepted pairs (k, 2), checked pair keys ``a * n + b`` sorted, their verdicts) from
    entries sorted by (bucket, row) in buckets of two or more rows (`shared_buckets`).

    Round 1 pairs every bucket member with the bucket's first row. Members whose pair fails
    stay in their bucket for the next round, minus that first row, and are paired with the
    new first member; pairs already checked are not checked again."""
    checked_keys = np.zeros(0, np.int64)  # sorted pair keys already checked, and their verdict
    checked_ok = np.zeros(0, bool)
    accepted: list[np.ndarray] = []
    for _ in range(MAX_ROUNDS):
        if len(group) < 2:
            break
        new = np.ones(len(group), dtype=bool)
        new[1:] = group[1:] != group[:-1]
        first = rows[new][np.cumsum(new) - 1]
        member = ~new
        pairs = np.stack([first[member], rows[member]], axis=1)
        pkey = pairs[:, 0].astype(np.int64) * n + pairs[:, 1]
        uniq, inv = np.unique(pkey, return_inverse=True)
        pos = np.searchsorted(checked_keys, uniq)
        known = pos < len(checked_keys)
        known[known] = checked_keys[pos[known]] == uniq[known]
        ok_u = np.zeros(len(uniq), dtype=bool)
        ok_u[known] = checked_ok[pos[known]]
        pending = ~known
        if pending.any():
            ok_u[pending] = similarity(np.stack([uniq[pending] // n, uniq[pending] % n], axis=1)) >= threshold
            keys_all = np.concatenate([checked_keys, uniq[pending]])
            order = np.argsort(keys_all, kind="stable")
            checked_keys, checked_ok = keys_all[order], np.concatenate([checked_ok, ok_u[pending]])[order]
        ok = ok_u[inv]
        accepted.append(uniq[ok_u])
        failed = member.copy()
        failed[member] = ~ok
        group, rows = group[failed], rows[failed]
        keep = _in_multi(group)  # drop buckets left with one row
        group, rows = group[keep], rows[keep]
    acc = np.unique(np.concatenate(accepted)) if accepted else np.zeros(0, np.int64)
    pairs = np.stack([acc // max(n, 1), acc % max(n, 1)], axis=1).astype(np.int64)
    return pairs, checked_keys, checked_ok
