"""Kullback-Leibler divergence on the same bins as PSI.

    KL(actual || reference) = sum_i a_i ln(a_i / e_i)

with the PSI stage's bins (reference quantile bins for numeric columns, one bin per category)
and its epsilon: a share of exactly 0 becomes ``epsilon`` and, unlike PSI, both sides are then
renormalised so each is a distribution. Direction: the training data (actual) against the
reference, i.e. the information lost when the reference's distribution is used for the
training data's. PSI is the symmetric sum KL(a || e) + KL(e || a), so for small shifts
KL ~ PSI / 2; the default verdict thresholds are half of PSI's: < 0.05 stable, < 0.125
moderate, else major.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from dataguard.stats.psi import DEFAULT_EPSILON, shares

DEFAULT_KL_THRESHOLDS = (0.05, 0.125)


def kl_from_counts(expected_counts: Sequence[float] | np.ndarray, actual_counts: Sequence[float] | np.ndarray,
                   epsilon: float = DEFAULT_EPSILON) -> float:
    """KL(actual || expected) in nats from per-bin counts (reference first); NaN if a side is empty."""
    e = shares(expected_counts, epsilon)
    a = shares(actual_counts, epsilon)
    if e.shape != a.shape:
        raise ValueError(f"kl: {e.shape[0]} reference bins vs {a.shape[0]} actual bins")
    if np.isnan(e).any() or np.isnan(a).any():
        return float("nan")
    e, a = e / e.sum(), a / a.sum()
    return float(np.sum(a * np.log(a / e)))
