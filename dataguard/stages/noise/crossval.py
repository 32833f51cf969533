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


C_GRID = (1.0, 10.0, 100.0)


def make_classifier(classifier: str | Any, *, seed: int, C: float, n_train: int) -> Any:
    """A fresh, unfitted estimator with ``predict_proba`` for one fold.

    ``C`` is the inverse L2 strength in LogisticRegression's sense for both built-ins; for
    SGD it becomes ``alpha = 1 / (C * n_train)``, which is the same objective up to scale.
    """
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

        # One-vs-rest logistic models by SGD (probabilities renormalised). Fast on sparse
        # TF-IDF, and in our measurements it ranks label errors better than the multinomial
        # model (benchmarks/bench_label_noise.py).
        return SGDClassifier(loss="log_loss", alpha=1.0 / (C * max(n_train, 1)), max_iter=50, tol=1e-4,
                             random_state=seed)
    raise ValueError(f"unknown classifier {classifier!r}; choose from {CLASSIFIERS} or pass an estimator")


def out_of_sample_probs(features: np.ndarray | sp.spmatrix, labels: np.ndarray, n_classes: int, *,
                        folds: int = 5, seed: int = 0, classifier: str | Any = "sgd",
                        C: float | None = None) -> np.ndarray:
    """Cross-validated probabilities; ``C=None`` picks C from `C_GRID` (see `select_C`)."""
    if C is not None:
        return _cv_probs(features, labels, n_classes, folds=folds, seed=seed, classifier=classifier, C=C)
    return select_C(features, labels, n_classes, folds=folds, seed=seed, classifier=classifier)[1]


def select_C(features: np.ndarray | sp.spmatrix, labels: np.ndarray, n_classes: int, *, folds: int = 5,
             seed: int = 0, classifier: str | Any = "sgd", grid: tuple[float, ...] = C_GRID
             ) -> tuple[float, np.ndarray]:
    """(best C, its probabilities): the C whose out-of-sample argmax agrees most with the given labels.

    Agreement with noisy labels is still maximised by the model closest to the truth when
    noise is below 50%, and it needs no held-out clean data. Ties go to the stronger
    regularisation (smaller C). Costs one cross-validation per grid point.
    """
    labels = np.asarray(labels, dtype=np.int64)
    best: tuple[float, float, np.ndarray] | None = None
    for C in grid:
        probs = _cv_probs(features, labels, n_classes, folds=folds, seed=seed, classifier=classifier, C=C)
        acc = float((probs.argmax(axis=1) == labels).mean()) if labels.size else 0.0
        if best is None or acc > best[1]:
            best = (C, acc, probs)
    assert best is not None
    return best[0], best[2]


def _splits(labels: np.ndarray, n_classes: int, *, folds: int, seed: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """Seeded (stratified when every class can fill the folds) K-fold splits of >= 2 rows."""
    from sklearn.model_selection import KFold, StratifiedKFold

    n = labels.shape[0]
    k = max(2, min(folds, n))
    counts = np.bincount(labels, minlength=n_classes)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        splitter = (StratifiedKFold(k, shuffle=True, random_state=seed) if counts[counts > 0].max() >= k
                    else KFold(k, shuffle=True, random_state=seed))
        return list(splitter.split(np.zeros(n), labels))


def _cv_probs(features: np.ndarray | sp.spmatrix, labels: np.ndarray, n_classes: int, *,
              folds: int, seed: int, classifier: str | Any, C: float) -> np.ndarray:
    """(n, n_classes) float64 probabilities, row i predicted by a model trained without row i.

    ``labels`` are class indices in ``[0, n_classes)``. With fewer rows than folds per the
    smallest class, StratifiedKFold still splits (it only warns); we silence that warning.
    """
    labels = np.asarray(labels, dtype=np.int64)
    n = labels.shape[0]
    probs = np.zeros((n, n_classes), dtype=np.float64)
    if n == 0:
        return probs
    if n < 2:
        probs[:, labels] = 1.0
        return probs
    for fold, (train, test) in enumerate(_splits(labels, n_classes, folds=folds, seed=seed)):
        present = np.unique(labels[train])
        if present.size == 1:  # a one-class training fold: that class is all it can predict
            probs[np.ix_(test, present)] = 1.0
            continue
        est = make_classifier(classifier, seed=seed + fold, C=C, n_train=len(train))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # convergence chatter on tiny folds
            est.fit(features[train], labels[train])
            fold_probs = est.predict_proba(features[test])
        probs[np.ix_(test, np.asarray(est.classes_, dtype=np.int64))] = fold_probs
    row_sums = probs.sum(axis=1, keepdims=True)
    np.divide(probs, row_sums, out=probs, where=row_sums > 0)
    return probs


def refit_probs(features: np.ndarray | sp.spmatrix, labels: np.ndarray, n_classes: int, keep: np.ndarray, *,
                folds: int = 5, seed: int = 0, classifier: str | Any = "sgd", C: float = 1.0) -> np.ndarray:
    """Probabilities for all rows from models trained only on the ``keep`` rows.

    One round of iterative cleaning: the kept rows get out-of-fold probabilities by K-fold
    over the kept rows alone (the same splits `_cv_probs` would make on them); every excluded
    row gets the mean of the K fold models' probabilities (none of them saw it, so it is
    out-of-sample too). Each fold model is fitted once. With nothing excluded this is
    exactly `_cv_probs` on all rows.
    """
    labels = np.asarray(labels, dtype=np.int64)
    keep = np.asarray(keep, dtype=bool)
    if keep.all():
        return _cv_probs(features, labels, n_classes, folds=folds, seed=seed, classifier=classifier, C=C)
    kept = np.flatnonzero(keep)
    out = np.flatnonzero(~keep)
    probs = np.zeros((labels.shape[0], n_classes), dtype=np.float64)
    if kept.size < 2 or np.unique(labels[kept]).size < 2:  # nothing to learn from: the kept rows' prior
        probs[:] = np.bincount(labels[kept], minlength=n_classes) / max(kept.size, 1)
        return probs
    splits = _splits(labels[kept], n_classes, folds=folds, seed=seed)
    for fold, (train, test) in enumerate(splits):
        rows, held = kept[train], kept[test]
        present = np.unique(labels[rows])
        if present.size == 1:
            probs[np.ix_(held, present)] = 1.0
            probs[np.ix_(out, present)] += 1.0 / len(splits)
            continue
        est = make_classifier(classifier, seed=seed + fold, C=C, n_train=len(rows))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            est.fit(features[rows], labels[rows])
            cols = np.asarray(est.classes_, dtype=np.int64)
            probs[np.ix_(held, cols)] = est.predict_proba(features[held])
            probs[np.ix_(out, cols)] += est.predict_proba(features[out]) / len(splits)
    row_sums = probs.sum(axis=1, keepdims=True)
    np.divide(probs, row_sums, out=probs, where=row_sums > 0)
    return probs
