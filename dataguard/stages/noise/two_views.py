"""Two views of each label: the cross-validated margin and a training run's AUM.

With cross-validated inputs (``features`` or ``probabilities``) and ``dynamics: RUN`` beside
them, the noise stage asks two models about each row: a small classifier that never saw the
row (the out-of-fold normalized margin) and the fine-tuned model that trained on it (the run's
AUM, or its cartography confidence). Their mistakes differ: the probe on frozen features misses
what only fine-tuning separates, the fine-tuned model slowly memorises some flipped rows.

* **How many** rows are flagged is the stage's ``method`` decision, unchanged (confident
  learning's count by default, as cleanlab's own ``low_normalized_margin`` filter takes its
  count from the confident joint).
* **Which** rows: the lowest by the mean of the two scores' percentile ranks. Ranks, because a
  logit margin and a probability margin live on different scales; a row the run never judged
  (not drawn, or a threshold row) keeps its cross-validated rank alone.
* Rare-class protection and ``max_flagged`` then act on the combined rank as usual.

Measured (``benchmarks/bench_label_noise.py --parts banking-dynamics``, banking77 with 20%
class-conditional noise, 1,998 flips): the CV stage alone F1 0.900, the run's AUM alone 0.907
at the same 2,031 flags, both together 0.934.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from dataguard.stages.noise import dynamics as D
from dataguard.stages.noise.confident import NoiseEstimate, limit_flags, protect_rare_classes


def percentile_ranks(values: np.ndarray) -> np.ndarray:
    """Each finite value's mid-rank share in (0, 1) among the finite values (ties share a
    rank, so the result does not depend on row order); NaN stays NaN."""
    out = np.full(len(values), np.nan)
    finite = np.isfinite(values)
    v = values[finite]
    if not v.size:
        return out
    order = np.sort(v, kind="stable")
    below = np.searchsorted(order, v, side="left")
    through = np.searchsorted(order, v, side="right")
    out[finite] = (below + through) / (2.0 * v.size)
    return out


def dynamics_rank(runs: Sequence[str], ids: list[str], score: str,
                  labels: Sequence[str] | None = None) -> tuple[np.ndarray, int, int]:
    """(the mean, over the runs that judge each row, of its score's percentile rank in that
    run, NaN where no run judges it; the rows judged; the rows some run trained under another
    label than ``labels`` gives them now, which it does not judge). Threshold rows are not
    judged by the run that trained them under the fake class."""
    ranks, other = [], 0
    for run in runs:
        rows, meta = D.load(run)
        view = D.run_view(rows, set(meta["threshold_rows"]), ids, score=score, cut=0.0, given=labels)
        D.require_judged(view.quality, run, view.other_label, D.chance_agreement(labels or []))
        ranks.append(percentile_ranks(view.quality))
        other += view.other_label
    stack = np.vstack(ranks)
    judged = np.isfinite(stack).sum(axis=0)
    mean = np.where(judged > 0, np.nansum(stack, axis=0) / np.maximum(judged, 1), np.nan)
    return mean, int((judged > 0).sum()), other


def combine(est: NoiseEstimate, y: np.ndarray, second: np.ndarray, *, min_rows_per_class: int) -> NoiseEstimate:
    """``est`` (its issue mask not yet protected) with as many issues, now the rows lowest by
    the mean rank of its quality and ``second`` (NaN: the first view's rank alone), then the
    rare-class protection. The combined rank becomes the row's label quality."""
    first = percentile_ranks(est.quality.astype(np.float64))
    quality = np.where(np.isfinite(second), (first + second) / 2.0, first)
    issue = limit_flags(np.ones(len(y), dtype=bool), quality, int(est.is_issue.sum()))  # the lowest, ties by row
    issue = protect_rare_classes(y, issue, quality, min_rows_per_class)
    return dataclasses.replace(est, is_issue=issue, quality=quality.astype(np.float32))
