"""The validation split: the pipeline's own validation sources when the manifest names some,
else a seeded held-out fraction (the same rows for any process count)."""

from __future__ import annotations

import math

import numpy as np

from dataguard.train.data.shards import RunShards, validation_sources


# ------------------------------------------------------------------ validation split
def split_validation(n_rows: int, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Seeded held-out split: (train indices, validation indices), both sorted. At least one
    validation row when fraction > 0 and n_rows >= 2; never every row."""
    if not 0 <= fraction < 1:
        raise ValueError(f"fraction must be in [0, 1), got {fraction}")
    n_val = 0 if fraction == 0 or n_rows < 2 else min(max(1, math.floor(n_rows * fraction + 0.5)), n_rows - 1)
    perm = np.random.default_rng([seed, 0x5A11]).permutation(n_rows)
    return np.sort(perm[n_val:]).astype(np.int64), np.sort(perm[:n_val]).astype(np.int64)


def run_split(run: RunShards, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray, str]:
    """Row indices (train, validation) of a run and where the split came from: the
    pipeline's own validation sources when the manifest names some, else a seeded fraction."""
    names = validation_sources(run.manifest)
    if names and "source" in run.table.column_names:
        src = np.array([str(s) for s in run.table.column("source").to_pylist()], dtype=object)
        is_val = np.isin(src, names)
        if is_val.any() and not is_val.all():
            return (np.flatnonzero(~is_val).astype(np.int64), np.flatnonzero(is_val).astype(np.int64),
                    f"pipeline validation sources {names}")
    train, val = split_validation(run.table.num_rows, fraction, seed)
    return train, val, f"seeded held-out fraction {fraction:g} (seed {seed})"
