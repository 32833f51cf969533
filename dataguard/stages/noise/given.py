"""Class scores a user hands the noise stage (a column or a ``.npy`` file), and the class list.

The stage's ``fit`` asks these two questions before any classifier runs: which classes
there are (given, or the sorted labels seen) and, when the user supplied their model's
scores, which row of scores belongs to which labelled row.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from dataguard.stages.noise.probs import to_probabilities


def class_list(labels: list[str], classes: Sequence[str] | None, k_probs: int | None) -> list[str]:
    """``classes`` as given (every label must be one) or the sorted labels seen; the number
    of probability columns, when scores were given, must match."""
    if classes is not None:
        missing = sorted(set(labels) - set(classes))
        if missing:
            raise ValueError(f"noise stage: labels {missing[:5]} are not in classes")
        out = list(classes)
    else:
        out = sorted(set(labels))
    if k_probs is not None and k_probs != len(out):
        raise ValueError(f"noise stage: probabilities have {k_probs} columns but there are {len(out)} "
                         "classes; pass classes=[...] in probability-column order")
    return out


def gather_probs(summaries: Sequence[Any], column: str | None, path: str | None, inputs: str,
                 temperature: float) -> np.ndarray | None:
    """The labelled rows' given scores as probabilities (None when the model makes them):
    from the summaries' column values, or from a file with one row per input row."""
    if column is not None:
        parts = [s.probs for s in summaries if s.probs is not None and len(s.probs)]
        return to_probabilities(np.concatenate(parts), inputs, temperature) if parts else None
    if path is None:
        return None
    table = np.load(path)
    total = sum(s.n_rows for s in summaries)
    if table.ndim != 2 or table.shape[0] != total:
        raise ValueError(f"noise stage: probabilities file has shape {table.shape}, expected "
                         f"({total}, n_classes): one row per input row, in input order")
    offsets = np.cumsum([0] + [s.n_rows for s in summaries[:-1]]) if summaries else []
    rows = [s.positions + off for s, off in zip(summaries, offsets, strict=True)]
    return to_probabilities(table[np.concatenate(rows)] if rows else table[:0], inputs, temperature)
