"""What the drift stage measures at fit time: PSI and KL per column, MMD on samples, labels.

* PSI (``dataguard.stats.psi``) and KL(training || reference) (``dataguard.stats.kl``) per
  numeric column (reference quantile bins) and per categorical column, each with a verdict
  (``thresholds``, default 0.1 / 0.25; ``kl_thresholds``, default 0.05 / 0.125).
* MMD (``dataguard.stats.mmd``): an RBF-kernel permutation test on bounded bottom-k samples,
  over the numeric ``columns`` as feature vectors (standardised by the reference sample) and,
  with ``text`` on, over the text embeddings the domain classifier already computed;
  verdict on the p-value (``mmd_thresholds``, default 0.01 / 0.05).
* The label column's distribution: before (training) vs after correction, and vs the
  reference when it has the column.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np

from dataguard.stages.drift.params import DriftSettings
from dataguard.stages.drift.reference import ReferenceState, bottom_k
from dataguard.stages.drift.state import SampleMeasures, TrainingSide
from dataguard.stages.drift.strata import merge_strata
from dataguard.stats.kl import kl_from_counts
from dataguard.stats.mmd import mmd_test, mmd_verdict, standardize
from dataguard.stats.psi import category_keys, psi_from_counts, verdict


def rounded(x: float | None, digits: int = 6) -> float | None:
    """JSON-safe number: NaN (an empty side) becomes None."""
    return None if x is None or x != x else round(float(x), digits)


def counter_pair(ref: Counter, act: Counter, *more: Counter) -> tuple[list[float], list[float]]:
    """Aligned counts of two category counters (keys: the union of all given)."""
    keys = category_keys(ref, act, *more)
    return [ref.get(k, 0) for k in keys], [act.get(k, 0) for k in keys]


def column_result(kind: str, ref_counts: Sequence[float], train_counts: Sequence[float], epsilon: float,
                  thresholds: tuple[float, float], kl_thresholds: tuple[float, float]) -> dict[str, Any]:
    """PSI and KL with their verdicts for one column's aligned counts."""
    psi = psi_from_counts(ref_counts, train_counts, epsilon)
    kl = kl_from_counts(ref_counts, train_counts, epsilon)
    return {"kind": kind, "psi": psi, "verdict": verdict(psi, thresholds),
            "kl": kl, "kl_verdict": verdict(kl, kl_thresholds)}


def mmd_summary(train: np.ndarray, ref: np.ndarray, *, scale: bool, seed: int, permutations: int,
                max_rows: int, thresholds: tuple[float, float]) -> dict[str, Any] | None:
    """The MMD test of two samples as a JSON-ready dict with its verdict (None: too few rows)."""
    if len(train) == 0 or len(ref) == 0:
        return None
    x, y = (standardize(train[:max_rows], ref[:max_rows]) if scale else (train, ref))
    res = mmd_test(x, y, seed=seed, permutations=permutations, max_rows=max_rows)
    if res is None:
        return None
    return {"mmd2": rounded(res.mmd2, 8), "p_value": rounded(res.p_value, 6), "verdict":
            mmd_verdict(res.p_value, thresholds), "n_training": res.n_x, "n_reference": res.n_y,
            "gamma": rounded(res.gamma, 8), "permutations": res.permutations}


def label_report(column: str, before: Counter, after: Counter | None, ref: Counter | None,
                 epsilon: float) -> dict[str, Any]:
    """Label PSI of the training data before/after correction, vs the reference and vs itself,
    and the classes present before and after (a class is present with mass > 0)."""
    out: dict[str, Any] = {"column": column}
    if ref is not None:
        out["psi_vs_reference_before"] = rounded(psi_from_counts(*counter_pair(ref, before), epsilon))
    classes = {k for k, v in before.items() if v > 0 and k is not None}
    out["classes_before"] = len(classes)
    if after is not None:
        if ref is not None:
            out["psi_vs_reference_after"] = rounded(psi_from_counts(*counter_pair(ref, after, before), epsilon))
        out["psi_after_vs_before"] = rounded(psi_from_counts(*counter_pair(before, after), epsilon))
        kept = {k for k, v in after.items() if v > 0 and k is not None}
        out["classes_after"] = len(kept & classes)
        out["classes_lost"] = sorted(str(k) for k in classes - kept)[:20]
    return out


def merge_summaries(summaries: Sequence[dict[str, Any]], s: DriftSettings, ref: ReferenceState) -> TrainingSide:
    """The training side's counts, ranges, samples, labels and strata, from all batches."""
    counts = {c: np.zeros_like(ref.counts[c]) for c in s.columns}
    ranges: dict[str, tuple[float, float] | None] = {c: None for c in s.columns}
    cats: dict[str, Counter] = {c: Counter() for c in s.categorical}
    texts: list[tuple[float, str]] = []
    features: list[tuple[float, Any]] = []
    labels: Counter | None = None
    for b in summaries:
        for c in s.columns:
            counts[c] = counts[c] + b["numeric"][c]
            r, br = ranges[c], b["ranges"][c]
            ranges[c] = br if r is None else (r if br is None else (min(r[0], br[0]), max(r[1], br[1])))
        for c in s.categorical:
            cats[c].update(b["categorical"][c])
        texts = bottom_k(texts + b["texts"], s.text_sample)
        features = bottom_k(features + b["features"], s.mmd_sample)
        if b["labels"] is not None:
            labels = Counter() if labels is None else labels
            labels.update(b["labels"])
    return TrainingSide(rows=sum(b["rows"] for b in summaries), counts=counts, ranges=ranges, cats=cats,
                        labels=labels, texts=texts, features=features,
                        strata=merge_strata([b["strata"] for b in summaries]))


def column_results(train: TrainingSide, s: DriftSettings, ref: ReferenceState) -> dict[str, dict[str, Any]]:
    """PSI and KL with their verdicts per column, numeric columns first."""
    results = {c: column_result("numeric", ref.counts[c], train.counts[c], s.epsilon, s.thresholds,
                                s.kl_thresholds) for c in s.columns}
    for c in s.categorical:
        results[c] = column_result("categorical", *counter_pair(ref.cats[c], train.cats[c]), s.epsilon,
                                   s.thresholds, s.kl_thresholds)
    return results


def measure_samples(train: TrainingSide, s: DriftSettings, ref: ReferenceState) -> SampleMeasures:
    """Text domain classifier AUC, and MMD on the feature and embedding samples."""
    text_auc = None
    mmd: dict[str, dict[str, Any] | None] = {}
    kwargs = {"seed": s.seed, "permutations": s.mmd_permutations, "max_rows": s.mmd_sample,
              "thresholds": s.mmd_thresholds}
    if s.mmd_sample and s.columns:
        x = np.array([v for _, v in train.features], dtype=np.float64).reshape(-1, len(s.columns))
        y = np.array([v for _, v in ref.features], dtype=np.float64).reshape(-1, len(s.columns))
        mmd["features"] = mmd_summary(x, y, scale=True, **kwargs)
    if s.text and train.texts and ref.texts:
        from dataguard.stats.domain import domain_classifier_auc, embed_texts

        emb_train = embed_texts([t for _, t in train.texts], backend=s.backend, max_seq_length=s.max_seq_length)
        emb_ref = embed_texts([t for _, t in ref.texts], backend=s.backend, max_seq_length=s.max_seq_length)
        text_auc = domain_classifier_auc(emb_train, emb_ref, s.seed)
        if s.mmd_sample:
            mmd["text"] = mmd_summary(emb_train, emb_ref, scale=False, **kwargs)
    return SampleMeasures(text_auc=text_auc, text_sizes=(len(train.texts), len(ref.texts)), mmd=mmd)
