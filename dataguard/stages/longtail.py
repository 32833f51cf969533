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

from dataguard.records import empty_rejected, reject_rows, set_column
from dataguard.stage import Outcome, Stage, StageConfigError
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

REASON_RESAMPLED_OUT = "resampled_out"


def _validate(label_column: str, tau: float, weighting: str, beta: float, resample: Any,
              phases: Sequence[float], tail_boost: float, seed: int) -> None:
    """Per-parameter checks; each error names its parameter."""
    if not isinstance(label_column, str) or not label_column:
        raise StageConfigError(f"label_column must be a non-empty string, got {label_column!r}")
    if not isinstance(tau, int | float) or isinstance(tau, bool) or not np.isfinite(tau) or tau < 0:
        raise StageConfigError(f"tau must be a finite number >= 0, got {tau!r}")
    if weighting not in WEIGHTINGS:
        raise StageConfigError(f"weighting must be one of {WEIGHTINGS}, got {weighting!r}")
    if not isinstance(beta, int | float) or isinstance(beta, bool) or not 0.0 < beta < 1.0:
        raise StageConfigError(f"beta must be in (0, 1), got {beta!r}")
    if resample is not None and resample != "balanced":
        if not isinstance(resample, Mapping) or not resample:
            raise StageConfigError(f"resample must be None, 'balanced' or a {{class: share}} mapping, got {resample!r}")
        for k, v in resample.items():
            if not isinstance(k, str) or not isinstance(v, int | float) or isinstance(v, bool) or v < 0:
                raise StageConfigError(f"resample: share for {k!r} must be a number >= 0, got {v!r}")
        if sum(resample.values()) <= 0:
            raise StageConfigError("resample: target shares must not all be 0")
    p = list(phases) if isinstance(phases, Sequence) and not isinstance(phases, str) else None
    if (p is None or any(not isinstance(b, int | float) or isinstance(b, bool) for b in p)
            or any(not 0.0 < b <= 1.0 for b in p) or any(b2 <= b1 for b1, b2 in zip(p, p[1:], strict=False))):
        raise StageConfigError(f"phases must be increasing fractions of the classes in (0, 1], got {phases!r}")
    if not isinstance(tail_boost, int | float) or isinstance(tail_boost, bool) or tail_boost <= 0:
        raise StageConfigError(f"tail_boost must be a number > 0, got {tail_boost!r}")
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise StageConfigError(f"seed must be an integer, got {seed!r}")


def _validate_schedule(phases: Sequence[float], head_share: float, schedule: Any, unit: str) -> None:
    if not isinstance(head_share, int | float) or isinstance(head_share, bool) or not 0.0 <= head_share < 1.0:
        raise StageConfigError(f"head_share must be a fraction in [0, 1), got {head_share!r}")
    p = list(schedule) if isinstance(schedule, Sequence) and not isinstance(schedule, str) else None
    if (p is None or any(not isinstance(b, int | float) or isinstance(b, bool) for b in p)
            or any(not 0.0 < b <= 1.0 for b in p) or any(b2 <= b1 for b1, b2 in zip(p, p[1:], strict=False))):
        raise StageConfigError(f"schedule must be increasing fractions of the run in (0, 1], got {schedule!r}")
    if len(p) != len(phases):
        raise StageConfigError(f"schedule needs one boundary per entry of phases ({len(phases)}), got {schedule!r}")
    if unit not in ("steps", "epochs"):
        raise StageConfigError(f"schedule_unit must be 'steps' or 'epochs', got {unit!r}")


class LongTailStage(Stage):
    """Class priors + logit offsets, per-row weights, curriculum phase, optional resampling."""

    name = "longtail"
    needs_fit = True

    def __init__(self, *, label_column: str = "label", tau: float = 1.0, weighting: str = "inverse",
                 beta: float = 0.999, resample: str | Mapping[str, float] | None = None,
                 phases: Sequence[float] = (0.5, 0.8), head_share: float = 0.01,
                 schedule: Sequence[float] = (0.25, 0.5), schedule_unit: str = "steps",
                 tail_boost: float = 2.0, seed: int = 0) -> None:
        _validate(label_column, tau, weighting, beta, resample, phases, tail_boost, seed)
        _validate_schedule(phases, head_share, schedule, schedule_unit)
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
        self._rows_resampled_out = 0
        self._rows_repeated = 0

    # -- contract ---------------------------------------------------------------------------
    def output_columns(self) -> dict[str, pa.DataType]:
        cols = {"sample_weight": pa.float32(), "curriculum_phase": pa.int8()}
        if self.resample is not None:
            cols[REPEAT_COLUMN] = REPEAT_TYPE
        return cols

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
        stats = {"after": after, "resampled_out": int(rejected.num_rows),
                 "repeated": int((reps > 1).sum()) if reps is not None else 0}
        return Outcome(kept=kept, rejected=rejected, stats=stats)

    def absorb(self, stats: Sequence[Any]) -> None:
        after: Counter = Counter()
        out = dup = 0
        for s in stats:
            if not s:
                continue
            after.update(s["after"])
            out += s["resampled_out"]
            dup += s["repeated"]
        self._after = after
        self._rows_resampled_out = out
        self._rows_repeated = dup

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
        if not self._fitted:
            return {"title": "Long-tail rebalancing", "summary": {"fitted": False}, "blocks": []}
        state = self.training_state()
        counts = self.counts
        after = self._after if self._after is not None else \
            Counter({c: float(e) for c, e in zip(self.classes, self.expected, strict=True)})
        after_counts = np.array([after.get(c, 0) for c in self.classes], dtype=np.float64)

        def ratio(x: np.ndarray) -> float | None:
            pos = x[x > 0]
            return float(pos.max() / pos.min()) if pos.size else None

        n_phases = len(self.phases) + 1
        phase_rows = [int(counts[self.class_phase == k].sum()) for k in range(1, n_phases + 1)]
        phase_text = "; ".join(
            f"phase {k}: {len(state['curriculum']['phase_classes'][k - 1])} new classes, "
            f"{phase_rows[k - 1]} rows" for k in range(1, n_phases + 1))
        summary = {
            "rows": int(counts.sum()) + self._unlabelled,
            "classes": len(self.classes),
            "unlabelled_rows": self._unlabelled,
            "imbalance_ratio_before": ratio(counts),
            "imbalance_ratio_after": ratio(after_counts),
            "tau": self.tau,
            "weighting": self.weighting,
            "resample": self.resample if self.resample is None or isinstance(self.resample, str) else "mapping",
            "rows_resampled_out": self._rows_resampled_out,
            "rows_repeated": self._rows_repeated,
            "min_weight": float(self.weights.min()) if len(self.weights) else None,
            "max_weight": float(self.weights.max()) if len(self.weights) else None,
        }
        labels = list(self.classes)
        blocks: list[dict[str, Any]] = [
            {"type": "bar", "title": "Rows per class (head first)", "labels": labels,
             "series": {"before": [int(c) for c in counts], "after": [float(c) for c in after_counts]}},
            {"type": "bar", "title": f"Per-class sample weight ({self.weighting})", "labels": labels,
             "series": {"weight": state["class_weights"]}},
            {"type": "bar", "title": f"Logit offsets tau*log(pi), tau={self.tau}", "labels": labels,
             "series": {"offset": state["logit_offsets"]}},
            {"type": "table", "title": "Classes",
             "columns": ["class", "rows", "prior", "logit_offset", "weight", "phase"],
             "rows": [[c, int(n), round(float(p), 6), None if o is None else round(o, 6), round(w, 6), int(ph)]
                      for c, n, p, o, w, ph in zip(labels, counts, state["priors"], state["logit_offsets"],
                                                   state["class_weights"], state["curriculum"]["class_phase"],
                                                   strict=True)]},
            {"type": "text", "title": "Curriculum",
             "text": (f"Phases by classes, most frequent first: phase 1 = the first {self.phases[0]:.0%} of "
                      f"classes with a share >= {self.head_share:g}, then the first "
                      f"{', '.join(f'{b:.0%}' for b in self.phases[1:]) or '-'}, then all; {phase_text}. "
                      f"Schedule: phase k ends at {list(self.schedule)} of the run ({self.schedule_unit}). "
                      f"In phase {n_phases} the tail classes are weighted x{self.tail_boost}. Each row's "
                      f"curriculum_phase column is the phase its class enters.")},
        ]
        # the full training_state() goes to the manifest's "training" section (see pipeline)
        return {"title": "Long-tail rebalancing", "summary": summary, "blocks": blocks}
