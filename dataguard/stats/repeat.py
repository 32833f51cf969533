"""Row multiplicity (``repeat``) for resampling without duplicating rows.

Oversampling by copying rows would break the pipeline's accounting (rows in == kept +
rejected) and blow up shards. Instead a resampling stage writes an int32 ``repeat``
column: how many times a training run should use the row (its sampling multiplicity).
Rows that draw 0 copies are rejected; rows drawing k >= 1 copies are kept with
``repeat = k``. A row that already carries ``repeat`` counts that many times in later
summaries, and a later resampling multiplies it (expected copies = repeat * factor).
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from dataguard.stats.hashing import uniforms
from dataguard.stats.reweighting import copies

REPEAT_COLUMN = "repeat"
REPEAT_TYPE = pa.int32()


def multiplicity(table: pa.Table) -> np.ndarray | None:
    """The rows' ``repeat`` as float64 (nulls -> 1), or None when the column is absent."""
    if REPEAT_COLUMN not in table.column_names:
        return None
    col = table.column(REPEAT_COLUMN).cast(pa.float64()).fill_null(1.0)
    return np.asarray(col.to_numpy(), dtype=np.float64) if table.num_rows else np.empty(0)


def draw_repeat(table: pa.Table, factor: np.ndarray, seed: int, salt: str) -> np.ndarray:
    """Integer copies per row for expected copies ``factor`` x the current multiplicity."""
    base = multiplicity(table)
    expected = factor if base is None else factor * base
    return copies(expected, uniforms(table.column("id").to_pylist(), seed, salt))



def weighted_value_counts(values: pa.Array, weights: np.ndarray | None) -> Counter:
    """Category -> count (or summed weight), vectorised with Arrow; nulls are ``None``."""
    if len(values) == 0:
        return Counter()
    if weights is None:
        return Counter({d["values"]: d["counts"] for d in pc.value_counts(values).to_pylist()})
    grouped = pa.table({"v": values, "w": pa.array(weights, pa.float64())}).group_by("v").aggregate([("w", "sum")])
    return Counter(dict(zip(grouped.column("v").to_pylist(), grouped.column("w_sum").to_pylist(), strict=True)))
