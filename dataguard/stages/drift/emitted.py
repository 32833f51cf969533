"""What the drift stage's ``apply`` emitted, counted on the reference's bins: the "after" side.

Split from `dataguard.stages.drift.stage` so the stage keeps the stage contract. Each batch
records the rows it kept, weighted as a training run will see them (``drift_weight`` x
``weight_column`` x ``repeat``), in the batch's tally; ``absorb`` merges the tallies and
`after` turns them into the counts `dataguard.stages.drift.describe` compares with the
reference (PSI and KL after correction, the label distribution after).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from dataguard.stages.drift.reference import categories
from dataguard.stats.features import numeric_feature
from dataguard.stats.psi import bin_counts
from dataguard.stats.repeat import weighted_value_counts
from dataguard.tally import Tally


def record(stats: Tally, kept: pa.Table, weights: np.ndarray, *, columns: Sequence[str],
           categorical: Sequence[str], label: str | None, edges: Mapping[str, np.ndarray]) -> None:
    """Add the kept rows' weighted counts per reference bin, category and label to ``stats``."""
    for c in columns:
        stats.hist(f"numeric:{c}", bin_counts(numeric_feature(kept, c), edges[c], weights))
    for c in categorical:
        stats.count(f"categorical:{c}", weighted_value_counts(categories(kept, c), weights))
    if label:
        stats.count("labels", weighted_value_counts(categories(kept, label), weights))


def after(tally: Tally, *, columns: Sequence[str], categorical: Sequence[str],
          ref_counts: Mapping[str, np.ndarray]) -> dict[str, Any]:
    """The merged counts of what apply emitted, shaped like the reference's (a column no
    batch counted is all zeros)."""
    return {"numeric": {c: np.zeros_like(ref_counts[c]) + tally.hists.get(f"numeric:{c}", 0) for c in columns},
            "categorical": {c: tally.counters.get(f"categorical:{c}", Counter()) for c in categorical},
            "labels": tally.counters.get("labels")}
