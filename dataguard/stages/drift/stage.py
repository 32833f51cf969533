"""DriftStage: the stage contract (summarize / fit / apply / absorb) over the drift modules.

The stage holds its settings (`DriftSettings`), the reduced reference and, once fitted, one
`Fitted`; the helpers receive those values and return new ones, never the stage.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from dataguard.embed import DEFAULT_BACKEND
from dataguard.records import empty_rejected, set_column
from dataguard.stage import Outcome, Stage, StageConfigError
from dataguard.stages.drift import describe as _describe
from dataguard.stages.drift import emitted
from dataguard.stages.drift.correct import REASON_RESAMPLED_OUT, choose_correction, expected_uses, resample
from dataguard.stages.drift.measure import column_results, measure_samples, merge_summaries
from dataguard.stages.drift.params import CONSTRAINTS, check
from dataguard.stages.drift.reference import (
    TEXT_ROLES,
    ReferenceState,
    categories,
    feature_sample,
    load_reference,
    reduce_reference,
    text_sample,
)
from dataguard.stages.drift.state import Fitted
from dataguard.stages.drift.strata import batch_strata
from dataguard.stats.features import has_feature, numeric_feature
from dataguard.stats.kl import DEFAULT_KL_THRESHOLDS
from dataguard.stats.mmd import DEFAULT_MMD_THRESHOLDS, DEFAULT_PERMUTATIONS
from dataguard.stats.psi import (
    DEFAULT_EPSILON,
    DEFAULT_THRESHOLDS,
    bin_counts,
)
from dataguard.stats.repeat import (
    REPEAT_COLUMN,
    REPEAT_TYPE,
    multiplicity,
    weighted_value_counts,
)
from dataguard.tally import Tally


class DriftStage(Stage):
    """PSI, KL, MMD and a text domain classifier vs a reference; optional correction."""

    name = "drift"
    needs_fit = True
    constraints = CONSTRAINTS
    reasons = {REASON_RESAMPLED_OUT: "drew no copies when the data was resampled towards the reference"}

    def __init__(self, *, reference: Any, columns: Sequence[str] = ("prompt_chars",),
                 categorical: Sequence[str] = ("label",), text: bool | str = True, bins: int = 10,
                 epsilon: float = DEFAULT_EPSILON, thresholds: Sequence[float] = DEFAULT_THRESHOLDS,
                 kl_thresholds: Sequence[float] = DEFAULT_KL_THRESHOLDS,
                 auc_thresholds: Sequence[float] = (0.6, 0.75), mmd_thresholds: Sequence[float] = DEFAULT_MMD_THRESHOLDS,
                 mmd_sample: int = 500, mmd_permutations: int = DEFAULT_PERMUTATIONS, text_sample: int = 1000,
                 correct: str | None = None, target: str | None = None, max_weight: float = 10.0,
                 weight_column: str | None = None, label_column: str | None = "label", seed: int = 0,
                 backend: str = DEFAULT_BACKEND, max_seq_length: int | None = None) -> None:
        self.settings = check({k: v for k, v in locals().items() if k not in ("self", "reference", "__class__")})
        self._reference_spec = reference
        if isinstance(reference, str | Path) or (isinstance(reference, Mapping) and "path" in reference):
            path = Path(reference["path"] if isinstance(reference, Mapping) else reference).expanduser()
            if not path.exists():  # the cheap check now; reading waits for prepare()
                raise StageConfigError(f"reference: no such file or folder: {str(path)!r}", param="reference")
        self.fitted: Fitted | None = None
        self._after: dict[str, Any] | None = None  # what apply emitted, once absorbed

    def prepare(self) -> None:
        """Read and reduce the reference (once, in the driver, before any unit runs)."""
        if "ref" not in self.__dict__:
            self._load(self._reference_spec)
            self._reference_spec = None  # the reduced reference is what workers need

    def __getattr__(self, name: str) -> Any:
        # Used directly from Python (no Pipeline), the reference is read on first use.
        if name == "ref" and "_reference_spec" in self.__dict__:
            self.prepare()
            return self.__dict__[name]
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def _load(self, reference: Any) -> None:
        if reference is None:
            raise StageConfigError("reference: required (a path, an input mapping or a table)", param="reference")
        s = self.settings
        try:
            ref = load_reference(reference)
            self.ref: ReferenceState = reduce_reference(ref, s.columns, s.categorical, s.text, s.bins, s.seed,
                                                        s.text_sample, s.mmd_sample, s.label_column)
        except StageConfigError:
            raise
        except ValueError as e:
            raise StageConfigError(str(e), param="reference") from None
        except Exception as e:  # noqa: BLE001 - any read failure is a configuration error here
            raise StageConfigError(f"reference could not be read: {e}", param="reference") from e

    # -- contract ---------------------------------------------------------------------------
    def output_columns(self) -> dict[str, pa.DataType]:
        cols = {"drift_weight": pa.float32()}
        if self.settings.correct == "resample":
            cols[REPEAT_COLUMN] = REPEAT_TYPE
        return cols

    def apply_adds(self) -> frozenset[str] | None:
        """Unless it resamples, apply keeps every row and only writes ``drift_weight``."""
        return frozenset(("drift_weight",)) if self.settings.correct != "resample" else None

    def columns_read(self) -> frozenset[str]:
        """Its columns (a derived feature reads ``messages``), the label, weight and
        ``repeat`` columns, the texts and the ids (sample keys)."""
        s = self.settings
        cols = {"id", "messages", REPEAT_COLUMN, *s.columns, *s.categorical}
        cols.update(c for c in (s.label_column, s.weight_column) if c is not None)
        return frozenset(cols)

    def _label(self, batch: pa.Table) -> str | None:
        """The label column when the data has it (a configured one must exist)."""
        label_column = self.settings.label_column
        if label_column is None:
            return None
        if label_column in batch.column_names:
            return label_column
        if "label_column" in self.params():
            raise StageConfigError(f"label_column {label_column!r} is not in the data "
                                   f"(columns: {batch.column_names})", param="label_column")
        return None

    def _check_batch(self, batch: pa.Table) -> None:
        s, cols = self.settings, batch.column_names
        missing = [c for c in s.columns if not has_feature(cols, c)] + \
            [c for c in s.categorical if c not in cols] + \
            ([s.weight_column] if s.weight_column and s.weight_column not in cols else [])
        if missing:
            raise StageConfigError(f"columns {missing} are not in the data and cannot be derived (columns: {cols})")

    def _row_weights(self, batch: pa.Table) -> np.ndarray | None:
        """How much each training row counts: ``weight_column`` x ``repeat`` (None = 1 each)."""
        w = multiplicity(batch)
        if self.settings.weight_column is not None:
            v = np.nan_to_num(numeric_feature(batch, self.settings.weight_column), nan=1.0)
            w = v if w is None else w * v
        return w

    def summarize(self, batch: pa.Table) -> dict[str, Any]:
        """Exact per-bin and per-category counts, min/max, bounded samples, label strata."""
        self._check_batch(batch)
        s = self.settings
        label = self._label(batch)
        rw = self._row_weights(batch)
        numeric: dict[str, np.ndarray] = {}
        ranges: dict[str, tuple[float, float] | None] = {}
        for c in s.columns:
            v = numeric_feature(batch, c)
            numeric[c] = bin_counts(v, self.ref.edges[c], rw)
            finite = v[~np.isnan(v)]
            ranges[c] = (float(finite.min()), float(finite.max())) if finite.size else None
        return {
            "rows": batch.num_rows, "numeric": numeric, "ranges": ranges,
            "categorical": {c: weighted_value_counts(categories(batch, c), rw) for c in s.categorical},
            "texts": text_sample(batch, TEXT_ROLES[s.text], s.seed, s.text_sample, rw) if s.text else [],
            "features": feature_sample(batch, s.columns, s.seed, s.mmd_sample, rw),
            "labels": weighted_value_counts(categories(batch, label), rw) if label else None,
            "strata": batch_strata(batch, label, s.columns, s.categorical, self.ref.edges, rw, s.seed)
            if label and s.correct == "resample" else None,
        }

    def fit(self, summaries: Sequence[dict[str, Any]]) -> None:
        s, ref = self.settings, self.ref
        training = merge_summaries(summaries, s, ref)
        results = column_results(training, s, ref)
        self.fitted = Fitted(training=training, results=results,
                             correction=choose_correction(results, training, s, ref),
                             samples=measure_samples(training, s, ref))

    def apply(self, batch: pa.Table) -> Outcome:
        if self.fitted is None:
            raise RuntimeError("DriftStage.apply called before fit")
        self._check_batch(batch)
        s, cor = self.settings, self.fitted.correction
        label = self._label(batch)
        n = batch.num_rows
        w = expected_uses(batch, cor, s, self.ref.edges) if (cor.ratios or cor.cat_ratios) else np.ones(n)
        drift_weight = w if s.correct == "importance_weights" else np.ones(n)
        # a second drift stage (another reference) replaces the column rather than duplicating it
        scored = set_column(batch, "drift_weight", pa.array(drift_weight.astype(np.float32), pa.float32()))
        kept, rejected = scored, empty_rejected()
        if s.correct == "resample":
            kept, rejected = resample(scored, w, draw=bool(cor.ratios or cor.cat_ratios), keepers=cor.keepers,
                                      seed=s.seed, corrected=cor.column, stage=self.name)
        # what the training run will see, for PSI after correction
        weights = kept.column("drift_weight").to_numpy().astype(np.float64) if kept.num_rows else np.empty(0)
        rw = self._row_weights(kept)
        if rw is not None:
            weights = weights * rw
        reps = multiplicity(kept)
        stats = Tally(counts=Counter(resampled_out=int(rejected.num_rows), repeated=int((reps > 1).sum())
                                     if reps is not None and s.correct == "resample" else 0))
        emitted.record(stats, kept, weights, columns=s.columns, categorical=s.categorical, label=label,
                       edges=self.ref.edges)
        return Outcome(kept=kept, rejected=rejected, stats=stats)

    def absorb(self, stats: Sequence[Any]) -> None:
        super().absorb(stats)
        # from now on `_after` describes what apply emitted
        s = self.settings
        self._after = emitted.after(self.tally, columns=s.columns, categorical=s.categorical, ref_counts=self.ref.counts)

    # -- results ----------------------------------------------------------------------------
    def _reported(self) -> _describe.Reported | None:
        """What the report reads; None before fit."""
        if self.fitted is None:
            return None
        return _describe.Reported(s=self.settings, ref=self.ref, fit=self.fitted, after=self._after,
                                  tally=self.tally)

    def psi_after(self) -> dict[str, float]:
        """PSI of what apply emitted (weighted by ``drift_weight``), per column."""
        return _describe.psi_after(self._reported())

    def label_psi(self) -> dict[str, Any] | None:
        """Label distribution before/after correction (PSI, classes kept); None without labels."""
        return _describe.label_psi(self._reported())

    def text_verdict(self) -> str:
        return _describe.text_verdict(self._reported())

    def describe(self) -> dict[str, Any]:
        return _describe.describe(self._reported())
