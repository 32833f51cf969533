"""PSI conventions: hand computations, bins from the reference, epsilon, verdicts."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest

from dataguard.stats.psi import (
    bin_counts,
    psi_categorical,
    psi_from_counts,
    psi_numeric,
    psi_terms,
    quantile_edges,
    verdict,
)


def test_numeric_psi_matches_hand_computation() -> None:
    reference = np.arange(1, 11, dtype=float)  # 1..10
    actual = np.array([1, 1, 2, 2, 2, 3, 7, 9, 10, 11], dtype=float)
    # quintile edges of 1..10 (linear interpolation): 2.8, 4.6, 6.4, 8.2
    edges = quantile_edges(reference, bins=5)
    np.testing.assert_allclose(edges, [2.8, 4.6, 6.4, 8.2], rtol=0, atol=1e-12)
    # actual per bin: {1,1,2,2,2}, {3}, {}, {7}, {9,10,11 (open last bin)}; missing bin empty
    np.testing.assert_array_equal(bin_counts(actual, edges), [5, 1, 0, 1, 3, 0])
    eps = 1e-4
    e = 0.2
    by_hand = ((0.5 - e) * math.log(0.5 / e) + (0.1 - e) * math.log(0.1 / e) + (eps - e) * math.log(eps / e)
               + (0.1 - e) * math.log(0.1 / e) + (0.3 - e) * math.log(0.3 / e))
    assert abs(psi_numeric(reference, actual, bins=5, epsilon=eps) - by_hand) < 1e-9
    assert by_hand == pytest.approx(1.97348, abs=1e-5)  # 0.27489+0.06931+1.51942+0.06931+0.04055


def test_categorical_psi_matches_hand_computation() -> None:
    ref = Counter({"a": 50, "b": 30, "c": 20})
    act = Counter({"a": 40, "b": 40, "d": 20})
    eps = 1e-3
    by_hand = ((0.4 - 0.5) * math.log(0.4 / 0.5) + (0.4 - 0.3) * math.log(0.4 / 0.3)
               + (eps - 0.2) * math.log(eps / 0.2) + (0.2 - eps) * math.log(0.2 / eps))
    assert abs(psi_categorical(ref, act, epsilon=eps) - by_hand) < 1e-9
    # raw values give the same result as counts
    raw_ref = ["a"] * 50 + ["b"] * 30 + ["c"] * 20
    raw_act = ["a"] * 40 + ["b"] * 40 + ["d"] * 20
    assert abs(psi_categorical(raw_ref, raw_act, epsilon=eps) - by_hand) < 1e-12


def test_psi_is_zero_for_identical_shares_and_positive_otherwise() -> None:
    assert psi_from_counts([10, 20, 30], [1, 2, 3]) == pytest.approx(0.0, abs=1e-15)
    assert psi_from_counts([10, 20, 30], [3, 2, 1]) > 0
    terms = psi_terms([10, 20, 30], [3, 2, 1])
    assert (terms >= 0).all()  # every PSI term is non-negative by construction


def test_bins_empty_on_both_sides_contribute_nothing() -> None:
    assert psi_from_counts([5, 0, 5], [5, 0, 5]) == pytest.approx(0.0, abs=1e-15)


def test_ties_collapse_edges_and_values_outside_range_use_open_bins() -> None:
    reference = np.array([1.0] * 50 + [2.0] * 50)
    edges = quantile_edges(reference, bins=10)
    assert len(edges) < 9 and np.all(np.diff(edges) > 0)
    counts = bin_counts(np.array([-100.0, 1000.0]), edges)
    assert counts[0] == 1 and counts[len(edges)] == 1


def test_missing_values_get_their_own_bin() -> None:
    edges = quantile_edges(np.arange(100.0), bins=4)
    counts = bin_counts(np.array([np.nan, 1.0, np.nan]), edges)
    assert counts[-1] == 2 and counts.sum() == 3
    # NaNs in the reference are ignored when placing the edges
    np.testing.assert_allclose(quantile_edges(np.r_[np.arange(100.0), np.nan], bins=4), edges)


def test_bin_counts_merge_by_addition_and_accept_weights() -> None:
    rng = np.random.default_rng(0)
    ref, x = rng.normal(size=1000), rng.normal(0.3, 1.2, size=999)
    edges = quantile_edges(ref)
    whole = bin_counts(x, edges)
    parts = bin_counts(x[:400], edges) + bin_counts(x[400:], edges)
    np.testing.assert_array_equal(whole, parts)
    np.testing.assert_allclose(bin_counts(x, edges, weights=np.full(x.size, 2.0)), 2 * whole)
    # reference quantile bins hold ~10% of the reference each
    np.testing.assert_allclose(bin_counts(ref, edges)[:-1] / 1000, 0.1, atol=0.002)


def test_verdict_boundaries_and_custom_thresholds() -> None:
    assert verdict(0.0999) == "stable"
    assert verdict(0.1) == "moderate"
    assert verdict(0.2499) == "moderate"
    assert verdict(0.25) == "major"
    assert verdict(0.15, (0.2, 0.3)) == "stable"
    assert verdict(float("nan")) == "unknown"


def test_empty_side_gives_nan() -> None:
    assert math.isnan(psi_from_counts([1, 2], [0, 0]))
