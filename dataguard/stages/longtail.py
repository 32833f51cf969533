"""Long-tail rebalancing: class priors, logit offsets, sample weights and a curriculum.

The stage does not train anything; it measures the class distribution (a mergeable
Counter per batch), then writes what a training run needs to cope with a long tail:

- per-row ``sample_weight`` (float32): inverse frequency, effective-number class-balanced
  weights (Cui et al. 2019) or none, normalised to a mean of 1 per row;
- per-row ``curriculum_phase`` (int8): the first phase in which the row's class is trained.
  Phases are by classes (most frequent first): phase 1 = the head, i.e. the classes among
  the first ``phases[0]`` (50%) of classes whose share of the rows is >= ``head_share``
  (1%); phase 2 = the first ``phases[1]`` (80%) of classes; the last phase = all classes,
  with the tail classes - those entering last - up-weighted by ``tail_boost`` (x2);
- the curriculum *schedule*: phase k runs until training progress reaches ``schedule[k-1]``
  (fractions of the run, counted in ``schedule_unit``: optimizer steps or epochs; default
  [0.25, 0.5], so all classes train for the second half). The runner reads it from the
  manifest; its own ``curriculum_boundaries`` / ``curriculum_unit`` override it;
- `training_state()`: priors, logit offsets ``tau * log(pi)`` (Menon et al. 2021), class
  order and the curriculum schedule, for the training runner (the pipeline writes it to
  the manifest's ``training`` section).

Optional resampling to a target distribution ("balanced" or {class: share}) keeps the total
(effective) row count: each row of class c is used ``r_c = N q_c / n_c`` times in
expectation, drawn row-locally from a hash of (seed, id) so that it is deterministic and
independent of batching. Rows drawing 0 uses are rejected with reason ``resampled_out``;
rows drawing k >= 1 are kept once with an int32 ``repeat = k`` column (see
`dataguard.stats.repeat`: rows are never physically duplicated, so rows in = kept +
rejected still holds). Counts after resampling are close to, not exactly, the target.
An incoming ``repeat`` column (from an earlier stage) is honoured: rows count that many
times and resampling multiplies it. Priors, offsets and weights
describe the distribution the model will see, i.e. the expected one after resampling.
Rows without a label keep weight 1 and phase 1 and do not enter the priors.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from dataguard.params import NAME, Interval, ListOf, MapOf, Options, Satisfies, Text
from dataguard.records import empty_rejected, reject_rows, set_column
from dataguard.stage import Outcome, Stage, StageConfigError
from dataguard.stages.longtail_report import describe_longtail
from dataguard.stats.logit_adjust import logit_offsets
from dataguard.stats.repeat import (
    REPEAT_COLUMN,
    REPEAT_TYPE,
    draw_repeat,
    multiplicity,
    weighted_value_counts,
)
from dataguard.stats.reweighting import (
    WEIGHTINGS,
    class_weights,
    curriculum_phases,
    resample_factors,
    target_shares,
)
from dataguard.tally import Tally

REASON_RESAMPLED_OUT = "resampled_out"


def _increasing_fractions(value: Any) -> bool:
    fractions = ListOf(Interval(float, 0, 1, closed="right"), min_len=1)
    return fractions.ok(value) and all(b > a for a, b in zip(value, value[1:], strict=False))


_FRACTIONS = [Satisfies(_increasing_fractions, "increasing fractions in (0, 1]")]
_SHARES = MapOf(Text(), Interval(float, 0), min_len=1)


class LongTailStage(Stage):
    """Class priors + logit offsets, per-row weights, curriculum phase, optional resampling."""

    name = "longtail"
    needs_fit = True
    constraints = {
        "label_column": NAME,
        "tau": [Interval(float, 0)],
        "weighting": [Options(*WEIGHTINGS)],
        "beta": [Interval(float, 0, 1, closed="neither")],
        "resample": [Options("balanced"), _SHARES, None],
        "phases": _FRACTIONS,
        "head_share": [Interval(float, 0, 1, closed="left")],
        "schedule": _FRACTIONS,
        "schedule_unit": [Options("steps", "epochs")],
        "tail_boost": [Interval(float, 0, closed="neither")],
        "seed": [Interval(int)],
    }
    reasons = {REASON_RESAMPLED_OUT: "drew no copies when the classes were resampled to the target shares"}

    def __init__(self, *, label_column: str = "label", tau: float = 1.0, weighting: str = "inverse",
                 beta: float = 0.999, resample: str | Mapping[str, float] | None = None,
                 phases: Sequence[float] = (0.5, 0.8), head_share: float = 0.01,
                 schedule: Sequence[float] = (0.25, 0.5), schedule_unit: str = "steps",
                 tail_boost: float = 2.0, seed: int = 0) -> None:
        if isinstance(resample, Mapping) and sum(resample.values()) <= 0:
            raise StageConfigError("resample: target shares must not all be 0", param="resample")
        if len(schedule) != len(phases):
            raise StageConfigError(f"schedule needs one boundary per entry of phases ({len(phases)}), "
                                   f"got {schedule!r}", param="schedule")
        self.label_column = label_column
        self.tau = float(tau)
        self.weighting = weighting
        self.beta = float(beta)
        self.resample = resample if resample is None or resample == "balanced" else dict(resample)
        self.phases = tuple(float(b) for b in phases)
        self.head_share = float(head_share)
        self.schedule = tuple(float(b) for b in schedule)
        self.schedule_unit = schedule_unit
        self.tail_boost = float(tail_boost)
        self.seed = seed
        self._fitted = False
        self._after: Counter | None = None

    # -- contract ---------------------------------------------------------------------------
    def output_columns(self) -> dict[str, pa.DataType]:
        cols = {"sample_weight": pa.float32(), "curriculum_phase": pa.int8()}
        if self.resample is not None:
            cols[REPEAT_COLUMN] = REPEAT_TYPE
        return cols

    def apply_adds(self) -> frozenset[str] | None:
        """Without ``resample`` every row is kept and only weights and phases are added."""
        return frozenset(("sample_weight", "curriculum_phase")) if self.resample is None else None

    def columns_read(self) -> frozenset[str]:
        return frozenset(("id", self.label_column, REPEAT_COLUMN))

    def _labels(self, batch: pa.Table) -> pa.ChunkedArray:
        if self.label_column not in batch.column_names:
            raise StageConfigError(f"label_column {self.label_column!r} is not a column of the data "
                                   f"(columns: {batch.column_names})")
        return batch.column(self.label_column).cast(pa.string())

    def summarize(self, batch: pa.Table) -> Counter:
        """Class counts of the batch (``None`` = unlabelled, rows count ``repeat`` times)."""
        return weighted_value_counts(self._labels(batch).combine_chunks(), multiplicity(batch))

    def fit(self, summaries: Sequence[Counter]) -> None:
        total: Counter = Counter()
        for s in summaries:
            total.update(s)
        self._unlabelled = int(total.pop(None, 0))
        # head first; ties broken by name so the order is deterministic
        self.classes = [c for c, _ in sorted(total.items(), key=lambda kv: (-kv[1], kv[0]))]
        self.counts = np.array([total[c] for c in self.classes], dtype=np.float64)
        n_rows = float(self.counts.sum())
        if self.resample is None:
            self.factors = np.ones(len(self.classes))
        else:
            try:
                target = target_shares(self.classes, self.resample)
            except ValueError as e:
                raise StageConfigError(f"resample: {e}") from e
            self.factors = resample_factors(self.counts, target)
        self.expected = self.counts * self.factors
        self.priors = self.expected / n_rows if n_rows else self.expected
        present = self.priors > 0
        self.offsets = np.full(len(self.classes), np.nan)
        self.offsets[present] = logit_offsets(self.priors[present], self.tau)
        self.weights = class_weights(self.expected, self.weighting, self.beta)
        # head / tail is a property of the data, so the curriculum uses the original counts
        # (self.classes is already ordered head first)
        self.class_phase = curriculum_phases(self.counts, self.phases, self.head_share)
        self._fitted = True

    def apply(self, batch: pa.Table) -> Outcome:
        if not self._fitted:
            raise RuntimeError("LongTailStage.apply called before fit")
        n = batch.num_rows
        labels = self._labels(batch)
        idx_arr = pc.index_in(labels, value_set=pa.array(self.classes, pa.string())).combine_chunks() \
            if n else pa.array([], pa.int32())
        known = ~np.asarray(idx_arr.is_null().to_numpy(zero_copy_only=False), dtype=bool)
        idx = np.asarray(idx_arr.fill_null(0).to_numpy(zero_copy_only=False), dtype=np.int64)
        if not len(self.classes):
            known = np.zeros(n, dtype=bool)
        weight = np.where(known, self.weights[idx] if len(self.classes) else 1.0, 1.0)
        phase = np.where(known, self.class_phase[idx] if len(self.classes) else 1, 1)
        scored = set_column(batch, "sample_weight", pa.array(weight.astype(np.float32), pa.float32()))
        scored = set_column(scored, "curriculum_phase", pa.array(phase.astype(np.int8), pa.int8()))

        rejected = empty_rejected()
        if self.resample is None:
            kept = scored
        else:
            factor = np.where(known, self.factors[idx] if len(self.classes) else 1.0, 1.0)
            k = draw_repeat(batch, factor, self.seed, "longtail")
            scored = set_column(scored, REPEAT_COLUMN, pa.array(k, REPEAT_TYPE))
            out_mask = k == 0
            if out_mask.any():
                lab = np.array(labels.to_pylist(), dtype=object)[out_mask]
                fac = factor[out_mask]
                target = self.resample if isinstance(self.resample, str) else "mapping"
                details = [f"class {c!r} resampled to target {target}: {f:.4f} expected uses per row, "
                           f"this row drew 0" for c, f in zip(lab, fac, strict=True)]
                rejected = reject_rows(scored, out_mask, self.name, REASON_RESAMPLED_OUT, details)
            kept = scored.filter(pa.array(~out_mask))
        reps = multiplicity(kept)
        after = weighted_value_counts(self._labels(kept).combine_chunks(), reps)
        stats = Tally(counts=Counter(resampled_out=int(rejected.num_rows),
                                     repeated=int((reps > 1).sum()) if reps is not None else 0))
        stats.count("after", after)
        return Outcome(kept=kept, rejected=rejected, stats=stats)

    def absorb(self, stats: Sequence[Any]) -> None:
        super().absorb(stats)
        self._after = self.tally.counters.get("after", Counter())  # from now on: what apply emitted

    # -- outputs for the training runner and the report ------------------------------------
    def training_state(self) -> dict[str, Any]:
        """What a training run needs: class order, priors, logit offsets, weights, schedule.

        ``phase_multipliers[k][c]`` is the factor for class c in phase k+1: 0 before the
        class is admitted, 1 once admitted, ``tail_boost`` for tail classes (those that
        enter in the last phase) during the last phase. A runner multiplies the row's
        ``sample_weight`` by it.
        """
        if not self._fitted:
            raise RuntimeError("LongTailStage.training_state called before fit")
        n_phases = len(self.phases) + 1
        last = n_phases
        mult = []
        for k in range(1, n_phases + 1):
            m = np.where(self.class_phase <= k, 1.0, 0.0)
            if k == last:
                m = np.where(self.class_phase == last, self.tail_boost, m)
            mult.append([float(x) for x in m])
        return {
            "label_column": self.label_column,
            "classes": list(self.classes),
            "counts": [int(c) for c in self.counts],
            "priors": [float(p) for p in self.priors],
            "tau": self.tau,
            "logit_offsets": [None if np.isnan(o) else float(o) for o in self.offsets],
            "weighting": self.weighting,
            "beta": self.beta,
            "class_weights": [float(w) for w in self.weights],
            "curriculum": {
                "boundaries": list(self.schedule),
                "unit": self.schedule_unit,
                "class_fractions": list(self.phases),
                "head_share": self.head_share,
                "tail_boost": self.tail_boost,
                "class_phase": [int(p) for p in self.class_phase],
                "phase_classes": [[c for c, p in zip(self.classes, self.class_phase, strict=True) if p == k]
                                  for k in range(1, n_phases + 1)],
                "phase_multipliers": mult,
            },
        }

    def describe(self) -> dict[str, Any]:
        return describe_longtail(self)
