"""Confident learning on out-of-sample probabilities, delegated to cleanlab.

cleanlab (Apache-2.0) is the reference implementation of Northcutt et al. (2021): per-class
thresholds (the mean self-confidence of each given class), the confident joint, the latent
noise matrices and the pruning rules behind ``find_label_issues``. We call it rather than
re-implement it, so our issue masks are cleanlab's by construction; what this module adds
is two simple rules (the fixed threshold on the given label's probability, and the seeds'
confident-disagreement rule), the flag budget, and one result object the stage can keep.
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np

METHODS = ("cleanlab", "threshold", "confidence")
FILTERS = ("prune_by_noise_rate", "prune_by_class", "both", "confident_learning", "predicted_neq_given")
RANKINGS = ("self_confidence", "normalized_margin", "confidence_weighted_entropy")


@dataclass
class NoiseEstimate:
    """Per-row verdicts and the dataset-level noise statistics behind them."""

    is_issue: np.ndarray            # bool (n,)
    quality: np.ndarray             # float32 (n,), lower = more likely mislabelled
    suggested: np.ndarray           # int64 (n,), argmax of the probabilities
    suggested_prob: np.ndarray      # float64 (n,), probability of the suggested class
    thresholds: np.ndarray          # float64 (k,), per-class confident thresholds
    confident_joint: np.ndarray     # int64 (k, k), rows = given, cols = true (estimated)
    noise_matrix: np.ndarray        # float64 (k, k), P(given = i | true = j); columns sum to 1


def find_issues(labels: np.ndarray, probs: np.ndarray, *, method: str = "cleanlab",
                filter_by: str = "prune_by_noise_rate", threshold: float = 0.8) -> np.ndarray:
    """Boolean issue mask.

    ``cleanlab``: ``cleanlab.filter.find_label_issues(labels, probs, filter_by=...)``.
    ``threshold``: the fixed rule - keep a row only when its given label is the model's top
    class with probability >= ``threshold``, i.e. flag ``p[given] < threshold``.
    ``confidence``: the seeds' rule - flag a row when the model is confident (top-class
    probability > ``threshold``) and its top class is not the given label. It needs no
    per-class statistics, so it is the rule to use on very small sets; it misses errors the
    model is unsure about (see benchmarks/bench_label_noise.py for its precision / recall).
    """
    labels = np.asarray(labels, dtype=np.int64)
    if labels.size == 0:
        return np.zeros(0, dtype=bool)
    if method == "threshold":
        return probs[np.arange(labels.size), labels] < threshold
    if method == "confidence":
        return (probs.max(axis=1) > threshold) & (probs.argmax(axis=1) != labels)
    if method != "cleanlab":
        raise ValueError(f"unknown method {method!r}")
    from cleanlab.filter import find_label_issues

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # cleanlab warns about tiny / unused classes
        return np.asarray(find_label_issues(labels, probs, filter_by=filter_by, n_jobs=1), dtype=bool)


def protect_rare_classes(labels: np.ndarray, is_issue: np.ndarray, quality: np.ndarray,
                         minimum: int) -> np.ndarray:
    """Unflag issues so that no given class keeps fewer than ``minimum`` unflagged rows.

    Why: out-of-sample classifiers rarely predict a class with a handful of rows, so confident
    learning calls most rows of a rare class mislabelled and dropping them would erase the
    class (on a long-tailed banking77 slice it emptied 14 of 77 classes). A class with
    ``n`` rows keeps at least ``min(n, minimum)`` of them; the flagged rows with the highest
    label quality (least suspicious) are the ones given back, ties broken by position.
    """
    out = is_issue.copy()
    if minimum <= 0 or not out.any():
        return out
    labels = np.asarray(labels, dtype=np.int64)
    k = int(labels.max()) + 1
    counts = np.bincount(labels, minlength=k)
    kept = counts - np.bincount(labels[out], minlength=k)
    short = np.minimum(counts, minimum) - kept
    for c in np.flatnonzero(short > 0):
        rows = np.flatnonzero(out & (labels == c))
        order = np.lexsort((rows, -quality[rows].astype(np.float64)))
        out[rows[order[:short[c]]]] = False
    return out


def budget_count(max_flagged: int | float | None, n: int) -> int | None:
    """The number of rows a budget allows: an int as is, a fraction f in (0, 1) as ceil(f * n)."""
    if max_flagged is None:
        return None
    if isinstance(max_flagged, float):
        return math.ceil(max_flagged * n)
    return int(max_flagged)


def limit_flags(is_issue: np.ndarray, quality: np.ndarray, budget: int | None) -> np.ndarray:
    """Keep only the ``budget`` worst issues: lowest label quality first, ties by row order.

    Why: a reviewer (or a cautious drop) has a fixed capacity; the ranking score orders
    rows better than the binary mask does (benchmarks: hits in the worst 2%), so the budget
    keeps the top of that ranking among the flagged rows. Deterministic by construction.
    """
    if budget is None or int(is_issue.sum()) <= budget:
        return is_issue.copy()
    rows = np.flatnonzero(is_issue)
    order = np.lexsort((rows, quality[rows].astype(np.float64)))
    out = np.zeros_like(is_issue)
    out[rows[order[:budget]]] = True
    return out


def estimate(labels: np.ndarray, probs: np.ndarray, *, method: str = "cleanlab",
             filter_by: str = "prune_by_noise_rate", threshold: float = 0.8,
             rank_by: str = "self_confidence", min_rows_per_class: int = 0) -> NoiseEstimate:
    """Issues, quality scores and the confident joint / noise matrix for one labelled set."""
    from cleanlab.count import estimate_py_and_noise_matrices_from_probabilities, get_confident_thresholds
    from cleanlab.rank import get_label_quality_scores

    labels = np.asarray(labels, dtype=np.int64)
    probs = np.asarray(probs, dtype=np.float64)
    n, k = probs.shape
    if n == 0:
        zeros = np.zeros((k, k))
        return NoiseEstimate(np.zeros(0, bool), np.zeros(0, np.float32), np.zeros(0, np.int64),
                             np.zeros(0), np.zeros(k), zeros.astype(np.int64), zeros)
    is_issue = find_issues(labels, probs, method=method, filter_by=filter_by, threshold=threshold)
    quality = np.asarray(get_label_quality_scores(labels, probs, method=rank_by), dtype=np.float32)
    is_issue = protect_rare_classes(labels, is_issue, quality, min_rows_per_class)
    suggested = probs.argmax(axis=1).astype(np.int64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        thresholds = np.asarray(get_confident_thresholds(labels, probs), dtype=np.float64)
        _, noise_matrix, _, joint = estimate_py_and_noise_matrices_from_probabilities(labels, probs)
    return NoiseEstimate(is_issue=is_issue, quality=quality, suggested=suggested,
                         suggested_prob=probs[np.arange(n), suggested], thresholds=thresholds,
                         confident_joint=np.asarray(joint, dtype=np.int64),
                         noise_matrix=np.asarray(noise_matrix, dtype=np.float64))


def within_budget(est: NoiseEstimate, max_flagged: int | float) -> tuple[NoiseEstimate, dict[str, Any]]:
    """``est`` with only its ``max_flagged`` worst issues still flagged, and the log the
    report shows."""
    budget = budget_count(max_flagged, len(est.is_issue))
    limited = limit_flags(est.is_issue, est.quality, budget)
    log = {"max_flagged": max_flagged, "allowed": budget, "issues_before": int(est.is_issue.sum()),
           "issues_after": int(limited.sum())}
    return dataclasses.replace(est, is_issue=limited), log
