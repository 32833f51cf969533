"""Embedding domain classifier: can a linear model tell training rows from reference rows?

If the two sets come from the same distribution, out-of-fold ROC AUC is about 0.5; the
closer to 1, the more the texts differ. This covers what per-column PSI cannot see
(topic, style, language). Embeddings come from the shared offline Embedder.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

# Several drift stages against the same reference embed the same sample; a bounded
# per-process cache avoids recomputing it (cleared wholesale when full). Keyed by the
# embedder's setup (backend, length) as well as the text.
_CACHE: dict[tuple[str, str], np.ndarray] = {}
_CACHE_MAX = 50_000


def embed_texts(texts: Sequence[str], batch_size: int = 64, *, backend: str | None = None,
                max_seq_length: int | None = None) -> np.ndarray:
    """L2-normalised sentence embeddings (n, dim), float32, from the shared Embedder.

    Uses ``dataguard.embed.Embedder`` (offline MiniLM by default on the default backend,
    one model load per process shared with the other stages). Texts are embedded in sorted
    order, so the result does not depend on batch composition.
    """
    from dataguard.embed import DEFAULT_BACKEND, Embedder

    embedder = Embedder(batch_size=batch_size, backend=backend or DEFAULT_BACKEND, max_seq_length=max_seq_length)
    setup = embedder.model_id
    pending = sorted({t for t in texts if (setup, t) not in _CACHE})
    if pending:
        emb = embedder.encode(pending)
        if len(_CACHE) + len(pending) > _CACHE_MAX:
            _CACHE.clear()
        _CACHE.update(zip(((setup, t) for t in pending), emb, strict=True))
    if not texts:
        return np.zeros((0, embedder.dimension), dtype=np.float32)
    return np.stack([_CACHE[(setup, t)] for t in texts])


def domain_classifier_auc(train: np.ndarray, reference: np.ndarray, seed: int = 0, folds: int = 5) -> float | None:
    """Cross-validated ROC AUC of logistic regression separating reference from training.

    Returns None when either side has fewer rows than ``folds`` (no honest estimate).
    """
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import roc_auc_score
    from sklearn.model_selection import StratifiedKFold, cross_val_predict

    if len(train) < folds or len(reference) < folds:
        return None
    x = np.vstack([train, reference]).astype(np.float64)
    y = np.concatenate([np.zeros(len(train), dtype=np.int64), np.ones(len(reference), dtype=np.int64)])
    cv = StratifiedKFold(n_splits=folds, shuffle=True, random_state=seed)
    clf = LogisticRegression(C=1.0, max_iter=2000)
    proba = cross_val_predict(clf, x, y, cv=cv, method="predict_proba")[:, 1]
    return float(roc_auc_score(y, proba))
