"""Population stability index (PSI) between a reference and an actual distribution.

    PSI = sum_i (a_i - e_i) * ln(a_i / e_i)

where ``e_i`` is the share of the *reference* (expected) rows in bin ``i`` and ``a_i`` the
share of the *actual* (training) rows. Conventions, fixed here so every stage agrees:

- Numeric columns use quantile bins of the reference (default 10): the inner edges are
  the reference's 1/10, 2/10, ... quantiles (numpy "linear" method), duplicates removed
  (discrete data with ties gives fewer bins), and the outer bins are open, so actual
  values outside the reference range still land in the first / last bin. A bin is
  ``[edge_i, edge_{i+1})``. Missing values (NaN / null) form one extra bin.
- Categorical columns use one bin per category seen on either side (sorted); nulls are the
  category ``None``.
- Empty bins: a share of exactly 0 is replaced by ``epsilon`` (default 1e-4, the value
  evidently uses) *without* renormalising, so a bin empty on both sides contributes 0 and a
  category that exists on only one side contributes a large but finite amount.
- Verdicts: PSI < 0.1 stable, 0.1 <= PSI < 0.25 moderate, PSI >= 0.25 major (configurable).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Iterable, Mapping, Sequence

import numpy as np

DEFAULT_EPSILON = 1e-4
DEFAULT_THRESHOLDS = (0.1, 0.25)
VERDICTS = ("stable", "moderate", "major")


def shares(counts: Sequence[float] | np.ndarray, epsilon: float = DEFAULT_EPSILON) -> np.ndarray:
    """Counts -> proportions, with exact zeros replaced by ``epsilon`` (no renormalisation)."""
    c = np.asarray(counts, dtype=np.float64)
    total = c.sum()
    if total <= 0:
        return np.full(c.shape, np.nan)
    p = c / total
    return np.where(p == 0.0, epsilon, p)


def psi_terms(expected_counts: Sequence[float] | np.ndarray, actual_counts: Sequence[float] | np.ndarray,
              epsilon: float = DEFAULT_EPSILON) -> np.ndarray:
    """Per-bin PSI contributions (their sum is the PSI)."""
    e = shares(expected_counts, epsilon)
    a = shares(actual_counts, epsilon)
    if e.shape != a.shape:
        raise ValueError(f"psi: {e.shape[0]} reference bins vs {a.shape[0]} actual bins")
    return (a - e) * np.log(a / e)


def psi_from_counts(expected_counts: Sequence[float] | np.ndarray, actual_counts: Sequence[float] | np.ndarray,
                    epsilon: float = DEFAULT_EPSILON) -> float:
    """PSI from per-bin counts (reference first). NaN when either side is empty."""
    return float(psi_terms(expected_counts, actual_counts, epsilon).sum())


def quantile_edges(reference: Sequence[float] | np.ndarray, bins: int = 10) -> np.ndarray:
    """Inner bin edges: the reference's 1/bins .. (bins-1)/bins quantiles, deduplicated."""
    if bins < 1:
        raise ValueError(f"bins must be >= 1, got {bins}")
    ref = np.asarray(reference, dtype=np.float64)
    ref = ref[~np.isnan(ref)]
    if ref.size == 0 or bins == 1:
        return np.empty(0, dtype=np.float64)
    return np.unique(np.quantile(ref, np.linspace(0.0, 1.0, bins + 1)[1:-1]))


def bin_index(values: Sequence[float] | np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Bin of each value for the given inner edges; NaN goes to the last (missing) bin."""
    v = np.asarray(values, dtype=np.float64)
    idx = np.searchsorted(edges, v, side="right")
    return np.where(np.isnan(v), len(edges) + 1, idx).astype(np.int64)


def bin_counts(values: Sequence[float] | np.ndarray, edges: np.ndarray,
               weights: Sequence[float] | np.ndarray | None = None) -> np.ndarray:
    """Counts per bin (len(edges) + 1 value bins, then the missing bin)."""
    idx = bin_index(values, edges)
    w = None if weights is None else np.asarray(weights, dtype=np.float64)
    return np.bincount(idx, weights=w, minlength=len(edges) + 2).astype(np.float64)


def psi_numeric(reference: Sequence[float] | np.ndarray, actual: Sequence[float] | np.ndarray,
                bins: int = 10, epsilon: float = DEFAULT_EPSILON) -> float:
    """PSI of a numeric column with quantile bins taken from the reference."""
    edges = quantile_edges(reference, bins)
    return psi_from_counts(bin_counts(reference, edges), bin_counts(actual, edges), epsilon)


def category_keys(*counters: Mapping[Hashable, float]) -> list[Hashable]:
    """Union of categories, sorted (None first) so bins line up deterministically."""
    keys = set().union(*counters)
    return sorted(keys, key=lambda k: (k is not None, str(k)))


def psi_categorical(reference: Mapping[Hashable, float] | Iterable[Hashable],
                    actual: Mapping[Hashable, float] | Iterable[Hashable],
                    epsilon: float = DEFAULT_EPSILON) -> float:
    """PSI of a categorical column from value counts (or raw values)."""
    ref = reference if isinstance(reference, Mapping) else Counter(reference)
    act = actual if isinstance(actual, Mapping) else Counter(actual)
    keys = category_keys(ref, act)
    return psi_from_counts([ref.get(k, 0) for k in keys], [act.get(k, 0) for k in keys], epsilon)


def verdict(value: float, thresholds: Sequence[float] = DEFAULT_THRESHOLDS) -> str:
    """'stable' below thresholds[0], 'moderate' below thresholds[1], else 'major'."""
    if value != value:  # NaN: nothing to compare
        return "unknown"
    low, high = thresholds
    if value < low:
        return "stable"
    return "moderate" if value < high else "major"
