"""The length stage on preference pairs: both responses are judged against the cap.

A pair is trained as two conversations, the prompt + chosen and the prompt + rejected
response, so its length (``n_tokens``) is the longer of the two: a rejected response over
the cap is truncated or rejected exactly as a chosen one would be. Truncation keeps ONE
prompt for both (a pair whose two sides saw different histories would compare answers to
different questions): history is removed for the longer response, which the shorter one
then fits too; with ``cut_final``, both responses are cut to the same token budget
(``truncate_pair`` in `dataguard.stages.length_truncate`). ``message_tokens`` stays the
chosen conversation's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np


def pair_totals(tok: Any, totals: np.ndarray, counts: np.ndarray, offsets: np.ndarray,
                rejected: Sequence[str | None]) -> np.ndarray:
    """``totals`` with each pair's raised to its rejected conversation's, where longer (its
    final turn counted with the rejected response's tokens instead of the chosen's)."""
    rows = [i for i, r in enumerate(rejected) if r is not None and offsets[i + 1] > offsets[i]]
    if not rows:
        return totals
    r_counts = tok.count_batch([rejected[i] for i in rows])
    out = totals.copy()
    for i, rc in zip(rows, r_counts.tolist(), strict=True):
        out[i] = max(int(totals[i]), int(totals[i] - counts[offsets[i + 1] - 1] + rc))
    return out
