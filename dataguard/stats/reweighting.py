"""Class weights, resampling factors and curriculum phases for long-tailed labels.

All functions take per-class counts in a fixed class order and return arrays in that order.

Weight normalisation: every scheme is scaled so that the *mean weight per row* is 1
(``sum_c w_c * n_c == N``). The loss keeps its scale, so a learning rate tuned without
weights still fits; only the relative weight of the classes changes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

WEIGHTINGS = ("inverse", "effective_number", "none")


def _normalise_per_row(raw: np.ndarray, counts: np.ndarray) -> np.ndarray:
    total = float(counts.sum())
    mass = float((raw * counts).sum())
    return raw * (total / mass) if mass > 0 else np.ones_like(raw)


def inverse_frequency_weights(counts: Sequence[float] | np.ndarray) -> np.ndarray:
    """w_c proportional to 1 / n_c (each class carries the same total weight)."""
    n = np.asarray(counts, dtype=np.float64)
    raw = np.where(n > 0, 1.0 / np.maximum(n, 1e-300), 0.0)
    return _normalise_per_row(raw, n)


def effective_number_weights(counts: Sequence[float] | np.ndarray, beta: float = 0.999) -> np.ndarray:
    """Cui et al. (2019): w_c proportional to (1 - beta) / (1 - beta**n_c).

    ``(1 - beta**n) / (1 - beta)`` is the "effective number" of samples of a class: it grows
    like n for small n and saturates at 1 / (1 - beta), so huge head classes are not
    down-weighted as brutally as with 1 / n. beta -> 1 recovers inverse frequency.
    """
    n = np.asarray(counts, dtype=np.float64)
    effective = (1.0 - np.power(beta, n)) / (1.0 - beta)
    raw = np.where(n > 0, 1.0 / np.maximum(effective, 1e-300), 0.0)
    return _normalise_per_row(raw, n)


def class_weights(counts: Sequence[float] | np.ndarray, scheme: str, beta: float = 0.999) -> np.ndarray:
    """Per-class weights for ``scheme`` in WEIGHTINGS (mean row weight 1)."""
    if scheme == "inverse":
        return inverse_frequency_weights(counts)
    if scheme == "effective_number":
        return effective_number_weights(counts, beta)
    if scheme == "none":
        return np.ones(len(counts), dtype=np.float64)
    raise ValueError(f"unknown weighting {scheme!r}; expected one of {WEIGHTINGS}")


def target_shares(classes: Sequence[str], target: str | Mapping[str, float]) -> np.ndarray:
    """Target class distribution: 'balanced' (uniform) or an explicit {class: share}."""
    if target == "balanced":
        return np.full(len(classes), 1.0 / len(classes)) if classes else np.empty(0)
    if not isinstance(target, Mapping):
        raise ValueError(f"resample target must be 'balanced' or a mapping, got {target!r}")
    unknown = sorted(set(target) - set(classes))
    if unknown:
        raise ValueError(f"resample target names classes not in the data: {unknown[:5]}")
    q = np.array([float(target.get(c, 0.0)) for c in classes], dtype=np.float64)
    if (q < 0).any() or q.sum() <= 0:
        raise ValueError("resample target shares must be >= 0 and not all 0")
    return q / q.sum()


def resample_factors(counts: Sequence[float] | np.ndarray, target: np.ndarray) -> np.ndarray:
    """Expected copies per row of each class so the total stays N and shares follow target.

    A class with n_c rows and target share q_c should end with about N * q_c rows, so each
    of its rows is kept ``r_c = N * q_c / n_c`` times on average (r_c < 1 downsamples).
    """
    n = np.asarray(counts, dtype=np.float64)
    total = n.sum()
    return np.where(n > 0, total * target / np.maximum(n, 1e-300), 0.0)


def copies(factor: np.ndarray, u: np.ndarray) -> np.ndarray:
    """Integer copies per row: floor(r) plus one more with probability frac(r).

    ``u`` are per-row uniforms in [0, 1) (from `hashing.uniforms`), so the decision is
    row-local and reproducible; the expected number of copies is exactly ``r``.
    """
    base = np.floor(factor)
    return (base + (u < (factor - base))).astype(np.int64)


def curriculum_phases(counts: Sequence[float] | np.ndarray, class_fractions: Sequence[float],
                      head_share: float = 0.01) -> np.ndarray:
    """Phase (1-based) in which each class enters a head-first curriculum, by classes.

    Classes are ranked by count (largest first; the caller passes them already ordered).
    Phase k (k <= len(class_fractions)) admits the first ``ceil(class_fractions[k-1] * C)``
    classes; phase 1 admits only those of them whose share of the rows is at least
    ``head_share`` (the head; always at least the largest class). The last phase
    (len(class_fractions) + 1) admits the rest. Phases are by classes, not by shares of
    rows: with a steep tail, row-share boundaries put a handful of classes in phase 1 and
    leave most classes to the last phase.
    """
    n = np.asarray(counts, dtype=np.float64)
    if n.size == 0:
        return np.empty(0, dtype=np.int64)
    if (np.diff(n) > 0).any():
        raise ValueError("curriculum_phases: counts must be sorted in decreasing order")
    c = n.size
    phases = np.full(c, len(class_fractions) + 1, dtype=np.int64)
    share = n / n.sum()
    for k in range(len(class_fractions), 0, -1):
        end = min(c, int(np.ceil(class_fractions[k - 1] * c - 1e-9)))
        phases[:end] = k
    if len(class_fractions):
        head = (phases == 1) & (share >= head_share)
        head[0] = True
        nxt = 2 if len(class_fractions) >= 2 else len(class_fractions) + 1
        phases[(phases == 1) & ~head] = nxt
    return phases
