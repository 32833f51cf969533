"""Out-of-sample predicted probabilities by seeded stratified K-fold cross-validation.

Confident learning needs, for every labelled row, class probabilities from a model that
never saw that row. We train one scikit-learn classifier per fold and predict the held-out
fold. Classes too small to appear in every training fold get probability 0 in the folds
that miss them (the columns are aligned by class index), which correctly makes a singleton
class look suspicious rather than crashing.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import scipy.sparse as sp

CLASSIFIERS = ("logreg", "sgd")


def make_classifier(classifier: str | Any, *, seed: int, C: float) -> Any:
    """A fresh, unfitted estimator with ``predict_proba`` for one fold."""
    from sklearn.base import clone

    if not isinstance(classifier, str):
        est = clone(classifier)
        if "random_state" in est.get_params():
            est.set_params(random_state=seed)
        return est
    if classifier == "logreg":
        from sklearn.linear_model import LogisticRegression

        # Multinomial L2 logistic regression: well-calibrated enough for ranking, and the
        # lbfgs solver is deterministic.
        return LogisticRegression(C=C, max_iter=1000, tol=1e-3, random_state=seed)
    if classifier == "sgd":
        from sklearn.linear_model import SGDClassifier

        # Much faster on large sparse inputs; log loss so predict_proba exists (one-vs-rest,
        # renormalised).
        return SGDClassifier(loss="log_loss", alpha=1.0 / (C * 1000.0), max_iter=50, tol=1e-4,
                             random_state=seed)
    raise ValueError(f"unknown classifier {classifier!r}; choose from {CLASSIFIERS} or pass an estimator")


def out_of_sample_probs(features: np.ndarray | sp.spmatrix, labels: np.ndarray, n_classes: int, *,
                        folds: int = 5, seed: int = 0, classifier: str | Any = "logreg",
                        C: float = 10.0) -> np.ndarray:
    """(n, n_classes) float64 probabilities, row i predicted by a model trained without row i.

    ``labels`` are class indices in ``[0, n_classes)``. With fewer rows than folds per the
    smallest class, StratifiedKFold still splits (it only warns); we silence that warning.
    """
    from sklearn.model_selection import KFold, StratifiedKFold

    labels = np.asarray(labels, dtype=np.int64)
    n = labels.shape[0]
    probs = np.zeros((n, n_classes), dtype=np.float64)
    if n == 0:
        return probs
    if n < 2:
        probs[:, labels] = 1.0
        return probs
    k = max(2, min(folds, n))
    counts = np.bincount(labels, minlength=n_classes)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        splitter = (StratifiedKFold(k, shuffle=True, random_state=seed) if counts[counts > 0].max() >= k
                    else KFold(k, shuffle=True, random_state=seed))
        splits = list(splitter.split(np.zeros(n), labels))
    for fold, (train, test) in enumerate(splits):
        present = np.unique(labels[train])
        if present.size == 1:  # a one-class training fold: that class is all it can predict
            probs[np.ix_(test, present)] = 1.0
            continue
        est = make_classifier(classifier, seed=seed + fold, C=C)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # convergence chatter on tiny folds
            est.fit(features[train], labels[train])
            fold_probs = est.predict_proba(features[test])
        probs[np.ix_(test, np.asarray(est.classes_, dtype=np.int64))] = fold_probs
    row_sums = probs.sum(axis=1, keepdims=True)
    np.divide(probs, row_sums, out=probs, where=row_sums > 0)
    return probs
