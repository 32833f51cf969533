"""Text features for classifiers that estimate label quality.

``auto`` (`choose_features`) picks the short-text ensemble or TF-IDF by median length.
Two kinds, chosen by measurement (see ``benchmarks/bench_label_noise.py``): embeddings win
on short intents (banking77), TF-IDF wins on long posts (20 Newsgroups), where MiniLM's
128-token window sees little more than the headers; stacking both was worse than the
better single view on both sets.

* ``tfidf``: word 1-2 gram TF-IDF (sublinear tf, L2 rows). It must be fitted on all rows at
  once (the vocabulary and idf are global), so it is computed in the driver from texts.
  Fitting it on every row before cross-validation uses no labels, so it leaks nothing.
* ``embedding``: sentence embeddings from the shared offline `Embedder` (all-MiniLM-L6-v2,
  384 dims, first 128 tokens, on the stage's ``backend``). Row-local, so workers compute
  them per batch.

``combine`` joins both into one sparse matrix: the embedding block is appended as extra
columns after the TF-IDF block, each block L2-normalised per row and the embedding block
scaled by ``embedding_weight``, so one linear model sees both views.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from dataguard.embed import Embedder

FEATURE_KINDS = ("embedding", "tfidf", "both")
FEATURE_CHOICES = (*FEATURE_KINDS, "ensemble", "auto")  # ensemble: see dataguard/stages/noise/views.py
# ``auto``: texts whose median length is at most this many words get the short-text
# ensemble, longer ones TF-IDF. Measured (benchmarks/bench_label_noise.py, part ``lengths``):
# 20 Newsgroups posts cut to 16 words, ensemble and TF-IDF tie (31 vs 32 confirmed errors in
# the worst 151 rows); cut to 32 words TF-IDF leads (42 vs 38) and in full it wins outright;
# banking77 intents (median 10 words) are the other way round (F1 0.88 ensemble vs 0.78).
AUTO_MAX_WORDS = 16
AUTO_SHORT = "ensemble"
AUTO_LONG = "tfidf"


def word_count(text: str | None) -> int:
    """Whitespace-separated words: cheap, tokenizer-free, and what the auto rule was measured with."""
    return len(text.split()) if text else 0


def choose_features(word_counts: Sequence[int] | np.ndarray) -> tuple[str, dict[str, object]]:
    """``features: auto``: (kind, why) from the labelled texts' median word count.

    Why the median: one long outlier must not flip a set of intents to TF-IDF. Why length:
    on short texts TF-IDF has a handful of sparse words and the sentence embedding (plus its
    neighbours) generalises; on longer ones TF-IDF sees every word while MiniLM reads only
    its first 128 word pieces (the length it was trained with). Where the cut lies is measured, see
    `AUTO_MAX_WORDS`; length is a proxy - topic posts favoured TF-IDF even when cut short.
    """
    counts = np.asarray(word_counts, dtype=np.int64)
    median = float(np.median(counts)) if counts.size else 0.0
    kind = AUTO_SHORT if median <= AUTO_MAX_WORDS else AUTO_LONG
    why = (f"median {median:g} words {'<=' if kind == AUTO_SHORT else '>'} {AUTO_MAX_WORDS}: "
           f"{'short texts, ensemble of embedding, TF-IDF and kNN models' if kind == AUTO_SHORT else 'long texts, TF-IDF'}")
    return kind, {"chosen": kind, "median_words": median, "max_words_for_short": AUTO_MAX_WORDS, "why": why}


def tfidf_features(texts: Sequence[str], *, max_features: int = 100_000, ngram_max: int = 2,
                   min_df: int = 2) -> sp.csr_matrix:
    """Fit TF-IDF on ``texts`` and return the (n, vocab) float32 CSR matrix.

    ``min_df`` drops hapaxes (they cannot generalise across folds anyway); it falls back to 1
    for tiny inputs where nothing would survive.
    """
    from sklearn.feature_extraction.text import TfidfVectorizer

    texts = [t or "" for t in texts]
    if not texts:
        return sp.csr_matrix((0, 0), dtype=np.float32)
    vec = TfidfVectorizer(sublinear_tf=True, min_df=min_df if len(texts) >= 20 else 1,
                          ngram_range=(1, ngram_max), max_features=max_features, dtype=np.float32,
                          strip_accents="unicode", token_pattern=r"(?u)\b\w+\b")
    try:
        return vec.fit_transform(texts).tocsr()
    except ValueError:  # empty vocabulary (all texts empty / only stop characters)
        return sp.csr_matrix((len(texts), 1), dtype=np.float32)


def embed_texts(texts: Sequence[str], embedder: Embedder | None = None, *,
                cache_dir: str | Path | None = None) -> np.ndarray:
    """(n, dim) float32 L2-normalised embeddings, optionally cached on disk by content hash.

    The cache key hashes the model id and every text, so a changed text or model never
    reuses stale vectors. It exists for benchmarks that re-run on the same corpus.
    """
    embedder = embedder or Embedder()
    if cache_dir is None:
        return embedder.encode(list(texts))
    digest = hashlib.sha256(embedder.model_id.encode())
    for t in texts:
        digest.update(t.encode("utf-8", "surrogatepass"))
        digest.update(b"\0")
    path = Path(cache_dir) / f"emb-{digest.hexdigest()[:24]}.npy"
    if path.exists():
        return np.load(path)
    vecs = embedder.encode(list(texts))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp.npy")
    np.save(tmp, vecs)
    tmp.replace(path)
    return vecs


def combine(tfidf: sp.csr_matrix | None, embeddings: np.ndarray | None, *,
            embedding_weight: float = 1.0) -> sp.csr_matrix | np.ndarray:
    """One feature matrix from whichever views are present (sparse when TF-IDF is)."""
    if tfidf is None and embeddings is None:
        raise ValueError("combine: no features given")
    if tfidf is None:
        return np.ascontiguousarray(embeddings, dtype=np.float32)
    if embeddings is None:
        return tfidf
    if embeddings.shape[0] != tfidf.shape[0]:
        raise ValueError(f"combine: {tfidf.shape[0]} TF-IDF rows but {embeddings.shape[0]} embedding rows")
    dense = sp.csr_matrix(np.asarray(embeddings, dtype=np.float32) * np.float32(embedding_weight))
    return sp.hstack([tfidf, dense], format="csr", dtype=np.float32)
