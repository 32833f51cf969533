"""Label strata for drift resampling: keep the label distribution, never lose a class.

Resampling toward the reference on one column (say ``prompt_chars``) draws each row with an
expected number of uses w = min(reference share / training share of its bin, max_weight).
Classes are not spread evenly over the bins, so plain draws move the label distribution
too (a long-tailed banking77 slice with long prompts dropped: label PSI 0.19-0.23 between
the training labels before and after, 3-7 of 72 classes lost; see tests/test_drift_strata.py).
With a label column, resampling is *within strata*:

* each class y gets the factor s_y = M_y / A_y, with M_y its (weighted) mass before and A_y
  = sum over its rows of w x mass: the expected mass of every class after the draw equals
  its mass before, so the label distribution is kept up to sampling noise while, inside the
  class, rows are still drawn toward the reference's shape (w, rescaled, may exceed
  ``max_weight``, which bounds the ratio before the rescale);
* every class keeps at least one row: the class's *keeper*, the row with the smallest
  hash(seed, id) among its rows (found from mergeable per-batch minima, so it does not depend
  on batching), is drawn at least once. This adds at most one expected use per class.

Null labels form a stratum of their own (but have no keeper). Data with fewer than two
strata, and a correction that targets the label column itself, resample as before
(no rescale; keepers still apply when there are labels).

Per-batch summaries (all mergeable by addition or minimum): the label counts, per
(class, bin) counts of every numeric column, per (class, category) counts of every other
categorical column, and per class the smallest (hash, id).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from dataguard.stages.drift.reference import categories
from dataguard.stats.features import numeric_feature
from dataguard.stats.hashing import hash64
from dataguard.stats.psi import bin_index


def _encode(values: pa.Array) -> tuple[list[Any], np.ndarray]:
    """Distinct values (nulls as None) and each row's index into them."""
    enc = pc.dictionary_encode(values, null_encoding="encode")
    idx = np.asarray(enc.indices.to_numpy(zero_copy_only=False), dtype=np.int64)
    return enc.dictionary.to_pylist(), idx


def batch_strata(batch: pa.Table, label_column: str, columns: Sequence[str], categorical: Sequence[str],
                 edges: dict[str, np.ndarray], weights: np.ndarray | None, seed: int) -> dict[str, Any]:
    """Per-class counts of one batch: joint bins of each column, and each class's keeper."""
    labels, idx = _encode(categories(batch, label_column))
    n_lab = len(labels)
    w = np.ones(batch.num_rows) if weights is None else np.asarray(weights, dtype=np.float64)
    joint_num = {}
    for c in columns:
        nb = len(edges[c]) + 2
        b = bin_index(numeric_feature(batch, c), edges[c])
        counts = np.bincount(idx * nb + b, weights=w, minlength=n_lab * nb).reshape(n_lab, nb)
        joint_num[c] = {lab: counts[i] for i, lab in enumerate(labels)}
    joint_cat = {}
    for c in categorical:
        if c == label_column:
            continue
        cats, cidx = _encode(categories(batch, c))
        counts = np.bincount(idx * len(cats) + cidx, weights=w, minlength=n_lab * len(cats)).reshape(n_lab, len(cats))
        joint_cat[c] = {lab: Counter({k: float(v) for k, v in zip(cats, counts[i].tolist(), strict=True) if v})
                        for i, lab in enumerate(labels)}
    ids = batch.column("id").to_pylist()
    h = hash64(ids, seed, "drift-keep")
    order = np.lexsort((h, idx))
    first = order[np.r_[True, idx[order][1:] != idx[order][:-1]]] if order.size else order
    keepers = {labels[idx[i]]: (int(h[i]), ids[i]) for i in first.tolist() if labels[idx[i]] is not None}
    return {"num": joint_num, "cat": joint_cat, "keepers": keepers}


def merge_strata(parts: Sequence[dict[str, Any] | None]) -> dict[str, Any] | None:
    """Sum the joint counts and keep each class's smallest keeper over all batches."""
    parts = [p for p in parts if p is not None]
    if not parts:
        return None
    num: dict[str, dict[Any, np.ndarray]] = {}
    cat: dict[str, dict[Any, Counter]] = {}
    keepers: dict[Any, tuple[int, str]] = {}
    for p in parts:
        for c, per in p["num"].items():
            into = num.setdefault(c, {})
            for lab, arr in per.items():
                into[lab] = into[lab] + arr if lab in into else np.array(arr, dtype=np.float64)
        for c, per in p["cat"].items():
            into_c = cat.setdefault(c, {})
            for lab, cnt in per.items():
                into_c.setdefault(lab, Counter()).update(cnt)
        for lab, k in p["keepers"].items():
            if lab not in keepers or k < keepers[lab]:
                keepers[lab] = k
    return {"num": num, "cat": cat, "keepers": keepers}


def stratum_scales(strata: dict[str, Any], column: str, ratios: np.ndarray | None,
                   cat_ratios: dict[Any, float] | None, max_weight: float) -> dict[Any, float]:
    """s_y = mass before / expected mass after the clipped draw, per class (see module doc)."""
    scales: dict[Any, float] = {}
    if ratios is not None:
        w = np.minimum(ratios, max_weight)
        for lab, counts in strata["num"][column].items():
            before, after = float(counts.sum()), float(counts @ w)
            scales[lab] = before / after if after > 0 else 1.0
    else:
        mapping = cat_ratios or {}
        for lab, cnt in strata["cat"][column].items():
            before = float(sum(cnt.values()))
            after = float(sum(v * min(mapping.get(k, 1.0), max_weight) for k, v in cnt.items()))
            scales[lab] = before / after if after > 0 else 1.0
    return scales


def row_scales(batch: pa.Table, label_column: str, scales: dict[Any, float]) -> np.ndarray:
    """Each row's class factor (1 for a class the fit did not see)."""
    labels, idx = _encode(categories(batch, label_column))
    lookup = np.array([scales.get(lab, 1.0) for lab in labels] + [1.0], dtype=np.float64)
    return lookup[idx] if idx.size else np.ones(0)


def keeper_mask(batch: pa.Table, keepers: frozenset[str]) -> np.ndarray:
    """Rows that are their class's keeper (drawn at least once)."""
    if not keepers or batch.num_rows == 0:
        return np.zeros(batch.num_rows, dtype=bool)
    return np.asarray(pc.is_in(batch.column("id"), value_set=pa.array(sorted(keepers), pa.string()))
                      .to_numpy(zero_copy_only=False), dtype=bool)
