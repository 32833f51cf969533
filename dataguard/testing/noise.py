"""Seeded class-conditional label noise, for tests and benchmarks of noise detection.

Real annotation noise is class-conditional: a "card_arrival" row is mislabelled as
"card_delivery_estimate" far more often than as "exchange_rate". We mimic that: every true
class j gets a few (``targets_per_class``) confusion targets with Dirichlet weights, and
exactly ``round(rate * n_j)`` of its rows, chosen at random, are flipped to one of them.
The transition matrix P(given | true) is therefore sparse and asymmetric, as in the
confident-learning paper's benchmarks.
"""

from __future__ import annotations

import numpy as np


def inject_class_conditional_noise(labels: np.ndarray, rate: float, n_classes: int, *, seed: int = 0,
                                   targets_per_class: int = 3) -> tuple[np.ndarray, np.ndarray]:
    """(noisy labels, flipped mask) for integer ``labels``; deterministic given ``seed``."""
    if not 0.0 <= rate < 1.0:
        raise ValueError(f"rate must be in [0, 1), got {rate!r}")
    if n_classes < 2:
        raise ValueError("need at least two classes to flip labels")
    labels = np.asarray(labels, dtype=np.int64)
    rng = np.random.default_rng(seed)
    noisy = labels.copy()
    m = min(targets_per_class, n_classes - 1)
    for j in range(n_classes):
        rows = np.flatnonzero(labels == j)
        others = np.delete(np.arange(n_classes), j)
        targets = rng.choice(others, size=m, replace=False)
        weights = rng.dirichlet(np.ones(m))
        n_flip = int(round(rate * rows.size))
        if n_flip == 0:
            continue
        flip = rng.choice(rows, size=n_flip, replace=False)
        noisy[flip] = rng.choice(targets, size=n_flip, p=weights)
    return noisy, noisy != labels
