"""Out-of-sample probabilities from the prepared feature views, for round 1 and for refits.

A *view* is one feature matrix (embeddings, TF-IDF or both stacked). Single kinds train one
scikit-learn model per fold on one view. ``ensemble`` (what ``features: auto`` picks for
short texts) averages three out-of-fold models with equal weights: SGD logistic on the
embeddings, SGD logistic on TF-IDF, and cosine k-nearest neighbours on the embeddings.
On banking77 with 10% seeded noise this lifts detection F1 from 0.844 (embeddings alone)
to 0.88; each model's mistakes are partly independent (one boundary per class, exact
words, local paraphrases). All three use the same seeded folds.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from dataguard.stages.noise.crossval import out_of_sample_probs, refit_probs, select_C
from dataguard.stages.noise.knn import knn_probs
from dataguard.text.features import choose_features, combine, tfidf_features, word_count

Chosen = float | dict[str, float]


def _linear(X: Any, y: np.ndarray, k: int, C: float | None, **cv: Any) -> tuple[float, np.ndarray]:
    if C is None:
        return select_C(X, y, k, **cv)
    return C, out_of_sample_probs(X, y, k, C=C, **cv)


def first_probs(kind: str, views: dict[str, Any], y: np.ndarray, k: int, *, C: float | None, folds: int,
                seed: int, classifier: str | Any) -> tuple[Chosen, np.ndarray]:
    """(the C used - one per linear model for ``ensemble`` -, probabilities) for round 1."""
    cv = {"folds": folds, "seed": seed, "classifier": classifier}
    if kind != "ensemble":
        return _linear(views["X"], y, k, C, **cv)
    c_emb, p_emb = _linear(views["embedding"], y, k, C, **cv)
    c_tf, p_tf = _linear(views["tfidf"], y, k, C, **cv)
    p_knn = knn_probs(views["embedding"], y, k, folds=folds, seed=seed)
    return {"embedding": c_emb, "tfidf": c_tf}, (p_emb + p_tf + p_knn) / 3.0


def refit(kind: str, views: dict[str, Any], y: np.ndarray, k: int, keep: np.ndarray, chosen: Chosen, *,
          folds: int, seed: int, classifier: str | Any) -> np.ndarray:
    """Probabilities for all rows from models trained only on the ``keep`` rows (same Cs as round 1)."""
    cv = {"folds": folds, "seed": seed, "classifier": classifier}
    if kind != "ensemble":
        assert isinstance(chosen, float)
        return refit_probs(views["X"], y, k, keep, C=chosen, **cv)
    assert isinstance(chosen, dict)
    p_emb = refit_probs(views["embedding"], y, k, keep, C=chosen["embedding"], **cv)
    p_tf = refit_probs(views["tfidf"], y, k, keep, C=chosen["tfidf"], **cv)
    p_knn = knn_probs(views["embedding"], y, k, folds=folds, seed=seed, keep=keep)
    return (p_emb + p_tf + p_knn) / 3.0


def feature_views(features: str, embedder: Any, embedding_weight: float,
                  summaries: Sequence[Any]) -> tuple[str, dict[str, Any], dict[str, Any]]:
    """(kind, why ``auto`` chose it - empty unless ``features`` is auto -, matrices) for the
    classifiers from the noise stage's batch summaries; ``auto`` is resolved from the texts' lengths."""
    kind, auto_choice = features, {}
    if kind == "auto":
        kind, auto_choice = choose_features([word_count(t) for s in summaries for t in (s.texts or [])])
    tfidf = (tfidf_features([t for s in summaries for t in (s.texts or [])])
             if kind in ("tfidf", "both", "ensemble") else None)
    emb = _embeddings(embedder, summaries) if kind in ("embedding", "both", "ensemble") else None
    if kind == "ensemble":
        return kind, auto_choice, {"embedding": np.ascontiguousarray(emb, dtype=np.float32), "tfidf": tfidf}
    return kind, auto_choice, {"X": combine(tfidf, emb, embedding_weight=embedding_weight)}


def _embeddings(embedder: Any, summaries: Sequence[Any]) -> np.ndarray:
    """All labelled rows' embeddings; ``auto`` batches that skipped them are embedded here."""
    parts = [s.embeddings if s.embeddings is not None else embedder.encode(s.texts or [])
             for s in summaries if s.ids]
    return np.concatenate(parts) if parts else np.zeros((0, embedder.dimension), np.float32)
