"""Which column the drift stage corrects, its ratios, each row's expected uses, and the draw.

One column is corrected: ``target``, or by default the major column with the highest PSI;
correction is skipped (with a note) when fewer than ``MIN_SUPPORT`` of the training rows
fall in bins or categories the reference has. The ratio of a bin (or category) is reference
share / training share, clipped at ``max_weight``; with label strata (resample) each row's
ratio is multiplied by its class factor (see `dataguard.stages.drift.strata`). ``resample``
turns expected uses into whole copies per row (`resample`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from dataguard.records import empty_rejected, reject_rows, set_column
from dataguard.stages.drift.measure import counter_pair
from dataguard.stages.drift.params import DriftSettings
from dataguard.stages.drift.reference import ReferenceState, categories
from dataguard.stages.drift.state import Correction, TrainingSide
from dataguard.stages.drift.strata import keeper_mask, row_scales, stratum_scales
from dataguard.stats.features import numeric_feature
from dataguard.stats.psi import bin_index, category_keys, shares
from dataguard.stats.repeat import REPEAT_COLUMN, REPEAT_TYPE, draw_repeat, multiplicity

MIN_SUPPORT = 0.5  # below this share of training rows inside the reference's support, no correction
REASON_RESAMPLED_OUT = "drift_resampled_out"


def choose_correction(results: dict[str, dict[str, Any]], train: TrainingSide, s: DriftSettings,
                      ref: ReferenceState) -> Correction:
    """The corrected column, its ratios, and (resample with labels) the strata factors."""
    major = sorted((c for c, r in results.items() if r["verdict"] == "major"), key=lambda c: -results[c]["psi"])
    chosen = (s.target if s.target in major else None) if s.target else (major[0] if major else None)
    c, note = chosen, None
    ratios: dict[str, np.ndarray] = {}
    cat_ratios: dict[str, dict[Any, float]] = {}
    scales: dict[Any, float] = {}
    keepers: frozenset[str] = frozenset()
    if s.correct and c is not None:
        inside = support(c, train, ref)
        if inside < MIN_SUPPORT:
            note = (f"correction of {c!r} skipped: only {inside:.1%} of the training rows fall "
                    f"in bins/categories the reference has (< {MIN_SUPPORT:.0%}); reweighting "
                    f"cannot create what the training data lacks")
            c = None
    if s.correct and c in s.columns:
        ratios[c] = shares(ref.counts[c], s.epsilon) / shares(train.counts[c], s.epsilon)
    elif s.correct and c in s.categorical:
        keys = category_keys(ref.cats[c], train.cats[c])
        ref_c, act = counter_pair(ref.cats[c], train.cats[c])
        cat_ratios[c] = dict(zip(keys, (shares(ref_c, s.epsilon) / shares(act, s.epsilon)).tolist(), strict=True))
    strata = train.strata
    if strata is not None and c is not None:
        keepers = frozenset(i for _, i in strata["keepers"].values())
        per_class = strata["num"].get(c) if c in s.columns else strata["cat"].get(c)
        if per_class is not None and len(per_class) >= 2:  # c is not the label column itself
            scales = stratum_scales(strata, c, ratios.get(c), cat_ratios.get(c), s.max_weight)
    return Correction(column=chosen, note=note, ratios=ratios, cat_ratios=cat_ratios, scales=scales,
                      keepers=keepers)


def support(c: str, train: TrainingSide, ref: ReferenceState) -> float:
    """Share of training rows in bins/categories that also hold reference rows."""
    if c in train.counts:
        counts, ref_counts = train.counts[c], ref.counts[c]
        total = counts.sum()
        return float(counts[ref_counts > 0].sum() / total) if total else 0.0
    total = sum(train.cats[c].values())
    inside = sum(v for k, v in train.cats[c].items() if ref.cats[c].get(k, 0) > 0)
    return float(inside / total) if total else 0.0


def expected_uses(batch: pa.Table, cor: Correction, s: DriftSettings, edges: Mapping[str, np.ndarray]) -> np.ndarray:
    """Expected uses per row: the clipped ratio of its bin, times its class factor."""
    w = np.ones(batch.num_rows, dtype=np.float64)
    for c, ratio in cor.ratios.items():
        w *= ratio[bin_index(numeric_feature(batch, c), edges[c])]
    for c, mapping in cor.cat_ratios.items():
        keys = list(mapping)
        ratio = np.array([mapping[k] for k in keys] + [1.0], dtype=np.float64)
        pos = pc.index_in(categories(batch, c), value_set=pa.array(keys, pa.string()), skip_nulls=False)
        w *= ratio[np.asarray(pos.fill_null(len(keys)).to_numpy(zero_copy_only=False), dtype=np.int64)]
    w = np.minimum(w, s.max_weight)
    if cor.scales and s.label_column in batch.column_names:
        w *= row_scales(batch, s.label_column, cor.scales)
    return w


def resample(scored: pa.Table, uses: np.ndarray, *, draw: bool, keepers: frozenset[str], seed: int,
             corrected: str | None, stage: str) -> tuple[pa.Table, pa.Table]:
    """(kept, rejected): copies per row drawn from ``uses`` (deterministic per id; a class's
    keeper draws at least one) into ``repeat``, rows drawing none rejected. Without ``draw``
    (nothing to correct) each row keeps its current multiplicity."""
    if draw:
        k = draw_repeat(scored, uses, seed, "drift")
        k = np.where(keeper_mask(scored, keepers) & (k == 0), 1, k)
    else:
        base = multiplicity(scored)
        k = np.ones(scored.num_rows, dtype=np.int64) if base is None else base.astype(np.int64)
    scored = set_column(scored, REPEAT_COLUMN, pa.array(k, REPEAT_TYPE))
    out = k == 0
    rejected = empty_rejected()
    if out.any():
        details = [f"drift resampling toward the reference on {corrected!r}: "
                   f"{x:.4f} expected uses per row, drew 0" for x in uses[out]]
        rejected = reject_rows(scored, out, stage, REASON_RESAMPLED_OUT, details)
    return scored.filter(pa.array(~out)), rejected
