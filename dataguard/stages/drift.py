"""Distribution shift between the training data and a reference set (PSI + domain classifier).

The reference (a validation split, a sample of production inputs) is loaded once when the
stage is built - through the same readers and normalizer as the pipeline's inputs, or from
a previous dataguard output folder (whose shards carry score columns) - and reduced to
small state: per numeric column the reference's quantile bin edges and bin counts, per
categorical column its value counts, and a bottom-k sample of its texts. Nothing else of
the reference is kept, so the stage pickles small.

Because the bin edges are known before the training data is read, each batch's summary
is the *exact* count of its rows per reference bin (plus min/max for the report), which
merges by addition: no approximate histogram is needed and memory is bounded by
columns x bins. See `dataguard.stats.psi` for the binning and epsilon conventions.

Text drift: a deterministic bottom-k sample (smallest key from a hash of seed + id, see
`_text_sample`) of training and reference texts is embedded with MiniLM and a logistic regression tries to tell them
apart; the 5-fold out-of-fold ROC AUC is the score (0.5 = indistinguishable).

Correction (``correct``), only when the targeted column's PSI verdict is "major". One
column is corrected: ``target``, or by default the major column with the highest PSI.
(Per-column ratios would multiply only if the columns were independent, and score columns
rarely are - character and word counts move together - so multiplying over-corrects.)

- ``"importance_weights"``: column ``drift_weight`` = reference share / training share of
  the row's bin (or category) in the targeted column, clipped at ``max_weight``;
- ``"resample"``: the same weight is the expected number of uses per row, drawn from a hash
  of (seed, id) so it is deterministic: rows drawing 0 are rejected with
  ``drift_resampled_out``, the others are kept once with an int32 ``repeat`` column (see
  `dataguard.stats.repeat`; an incoming ``repeat`` is multiplied, and always counted).

``weight_column`` (e.g. ``sample_weight`` from the long-tail stage) makes the training side
a weighted distribution - what a weighted training run actually sees - for PSI and for
the correction ratios, and the text sample is drawn with those weights.

Correction is skipped (with a note) when fewer than half of the training rows fall in bins
or categories that the reference has: no reweighting can turn disjoint data into the
reference. PSI after correction is measured on what ``apply`` actually emitted (weighted counts, or
the counts of the resampled rows) for every column. The text AUC is not re-measured.
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from dataguard.records import empty_rejected, message_texts, reject_rows, set_column
from dataguard.stage import Outcome, Stage, StageConfigError
from dataguard.stats.features import has_feature, numeric_feature
from dataguard.stats.hashing import hash64
from dataguard.stats.psi import (
    DEFAULT_EPSILON,
    DEFAULT_THRESHOLDS,
    bin_counts,
    bin_index,
    category_keys,
    psi_from_counts,
    quantile_edges,
    shares,
    verdict,
)
from dataguard.stats.repeat import (
    REPEAT_COLUMN,
    REPEAT_TYPE,
    draw_repeat,
    multiplicity,
    weighted_value_counts,
)

REASON_RESAMPLED_OUT = "drift_resampled_out"
CORRECTIONS = (None, "importance_weights", "resample")
TEXT_ROLES = {"prompt": ("system", "user", "tool"), "response": ("assistant",),
              "full": ("system", "user", "assistant", "tool")}
MAX_BAR_CATEGORIES = 30
# Below this share of training rows inside the reference's support, correction is skipped.
MIN_SUPPORT = 0.5


# ----------------------------------------------------------------------------- reference
def load_reference(reference: Any) -> pa.Table:
    """The reference as a canonical table (plus any score columns it carries).

    Accepts a `pyarrow.Table`; a dataguard output folder (``data/*.arrow``) or a single
    ``.arrow`` stream file; any file the pipeline's readers handle, given as a path or as a
    mapping of `InputSpec` fields (``{"path": ..., "format": "labelled_text",
    "aliases": {"category": "label"}}``), normalized exactly like an input.
    """
    if isinstance(reference, pa.Table):
        return reference
    spec_fields: dict[str, Any] = dict(reference) if isinstance(reference, Mapping) else {"path": reference}
    path = Path(spec_fields.get("path", ""))
    if path.is_dir() and (path / "data").is_dir() and sorted((path / "data").glob("*.arrow")):
        from dataguard.io.writer import read_table

        return pa.concat_tables([read_table(p) for p in sorted((path / "data").glob("*.arrow"))],
                                promote_options="default")
    if path.is_file() and path.suffix == ".arrow":
        from dataguard.io.writer import read_table

        return read_table(path)
    from dataguard.io.readers import InputSpec, read_batches
    from dataguard.stages.normalize import Normalizer

    spec_fields.setdefault("name", "reference")
    spec = InputSpec(**spec_fields)
    normalizer = Normalizer()
    tables = [normalizer.normalize(rb, spec.options()).kept for rb in read_batches(spec)]
    return pa.concat_tables(tables) if tables else normalizer.schema.empty_table()


def _bottom_k(items: Sequence[tuple[float, str]], k: int) -> list[tuple[float, str]]:
    return heapq.nsmallest(k, items)


def _text_sample(table: pa.Table, roles: tuple[str, ...], seed: int, k: int,
                 weights: np.ndarray | None = None) -> list[tuple[float, str]]:
    """Bottom-k sample of (key, text) that merges across batches (keep the k smallest keys).

    key = -ln(u) / w with u a uniform from hash(seed, id): exponential races, i.e.
    weighted sampling without replacement (Efraimidis-Spirakis); with w = 1 it is a uniform
    sample. Rows with weight <= 0 are never sampled.
    """
    if table.num_rows == 0:
        return []
    u = (hash64(table.column("id").to_pylist(), seed, "drift-text").astype(np.float64) + 1.0) / 2.0**64
    w = np.ones(table.num_rows) if weights is None else np.asarray(weights, dtype=np.float64)
    with np.errstate(divide="ignore"):
        keys = np.where(w > 0, -np.log(u) / np.where(w > 0, w, 1.0), np.inf)
    texts = message_texts(table, roles)
    return _bottom_k([(kk, t) for kk, t in zip(keys.tolist(), texts, strict=True) if t and kk < np.inf], k)


def _categories(table: pa.Table, column: str) -> pa.Array:
    """The column as one string array (categories are compared as strings)."""
    return table.column(column).cast(pa.string()).combine_chunks()


def _round(x: float | None, digits: int = 6) -> float | None:
    """JSON-safe number: NaN (an empty side) becomes None."""
    return None if x is None or x != x else round(float(x), digits)


# ----------------------------------------------------------------------------- validation
def _is_num(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and bool(np.isfinite(x))


def _check_pair(name: str, value: Any, low: float, high: float) -> tuple[float, float]:
    if (not isinstance(value, Sequence) or isinstance(value, str) or len(value) != 2
            or not all(_is_num(v) for v in value) or not low < value[0] < value[1] <= high):
        raise StageConfigError(f"{name} must be two increasing numbers in ({low}, {high}], got {value!r}")
    return float(value[0]), float(value[1])


def _check_names(name: str, value: Any) -> list[str]:
    if isinstance(value, str) or not isinstance(value, Sequence) or not all(isinstance(v, str) and v for v in value):
        raise StageConfigError(f"{name} must be a list of column names, got {value!r}")
    if len(set(value)) != len(value):
        raise StageConfigError(f"{name} lists a column twice: {list(value)!r}")
    return list(value)


class DriftStage(Stage):
    """PSI per numeric / categorical column and a text domain classifier vs a reference."""

    name = "drift"
    needs_fit = True

    def __init__(self, *, reference: Any, columns: Sequence[str] = ("prompt_chars",),
                 categorical: Sequence[str] = ("label",), text: bool | str = True, bins: int = 10,
                 epsilon: float = DEFAULT_EPSILON, thresholds: Sequence[float] = DEFAULT_THRESHOLDS,
                 auc_thresholds: Sequence[float] = (0.6, 0.75), text_sample: int = 1000,
                 correct: str | None = None, target: str | None = None, max_weight: float = 10.0,
                 weight_column: str | None = None, seed: int = 0) -> None:
        self.columns = _check_names("columns", columns)
        self.categorical = _check_names("categorical", categorical)
        if set(self.columns) & set(self.categorical):
            raise StageConfigError(f"columns and categorical overlap: {sorted(set(self.columns) & set(self.categorical))}")
        if text is True:
            text = "prompt"
        if text is not False and text not in TEXT_ROLES:
            raise StageConfigError(f"text must be true, false or one of {sorted(TEXT_ROLES)}, got {text!r}")
        if not isinstance(bins, int) or isinstance(bins, bool) or bins < 2:
            raise StageConfigError(f"bins must be an integer >= 2, got {bins!r}")
        if not _is_num(epsilon) or not 0 < epsilon <= 0.01:
            raise StageConfigError(f"epsilon must be in (0, 0.01], got {epsilon!r}")
        self.thresholds = _check_pair("thresholds", thresholds, 0.0, float("inf"))
        self.auc_thresholds = _check_pair("auc_thresholds", auc_thresholds, 0.5, 1.0)
        if not isinstance(text_sample, int) or isinstance(text_sample, bool) or text_sample < 10:
            raise StageConfigError(f"text_sample must be an integer >= 10, got {text_sample!r}")
        if correct not in CORRECTIONS:
            raise StageConfigError(f"correct must be one of {CORRECTIONS}, got {correct!r}")
        if target is not None and target not in self.columns and target not in self.categorical:
            raise StageConfigError(f"target must be one of columns/categorical, got {target!r}")
        if weight_column is not None and (not isinstance(weight_column, str) or not weight_column):
            raise StageConfigError(f"weight_column must be a column name or null, got {weight_column!r}")
        if not _is_num(max_weight) or max_weight <= 1:
            raise StageConfigError(f"max_weight must be a number > 1, got {max_weight!r}")
        if not isinstance(seed, int) or isinstance(seed, bool):
            raise StageConfigError(f"seed must be an integer, got {seed!r}")
        self.text = text
        self.bins = bins
        self.epsilon = float(epsilon)
        self.text_sample = text_sample
        self.correct = correct
        self.target = target
        self.weight_column = weight_column
        self.max_weight = float(max_weight)
        self.seed = seed
        self._load(reference)
        self._fitted = False
        self._after: dict[str, Any] | None = None
        self._rows_resampled_out = 0
        self._rows_repeated = 0

    def _load(self, reference: Any) -> None:
        if reference is None or not isinstance(reference, pa.Table | str | Path | Mapping):
            raise StageConfigError(f"reference must be a path, an input mapping or a table, got {type(reference).__name__}")
        try:
            ref = load_reference(reference)
        except StageConfigError:
            raise
        except Exception as e:  # noqa: BLE001 - any read failure is a configuration error here
            raise StageConfigError(f"reference could not be read: {e}") from e
        if ref.num_rows == 0:
            raise StageConfigError("reference has no rows")
        cols = ref.column_names
        missing = [c for c in self.columns if not has_feature(cols, c)]
        if missing:
            raise StageConfigError(f"columns {missing} are neither in the reference nor derivable from its "
                                   f"messages (reference columns: {cols})")
        missing = [c for c in self.categorical if c not in cols]
        if missing:
            raise StageConfigError(f"categorical columns {missing} are not in the reference (columns: {cols})")
        if self.text and ("messages" not in cols or "id" not in cols):
            raise StageConfigError("text drift needs 'id' and 'messages' in the reference; set text: false")
        self.reference_rows = ref.num_rows
        self.ref_edges: dict[str, np.ndarray] = {}
        self.ref_counts: dict[str, np.ndarray] = {}
        self.ref_range: dict[str, tuple[float, float]] = {}
        for c in self.columns:
            v = numeric_feature(ref, c)
            self.ref_edges[c] = quantile_edges(v, self.bins)
            self.ref_counts[c] = bin_counts(v, self.ref_edges[c])
            finite = v[~np.isnan(v)]
            self.ref_range[c] = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 0.0)
        self.ref_cats: dict[str, Counter] = {c: weighted_value_counts(_categories(ref, c), None)
                                              for c in self.categorical}
        self.ref_texts = (_text_sample(ref, TEXT_ROLES[self.text], self.seed, self.text_sample)
                          if self.text else [])

    # -- contract ---------------------------------------------------------------------------
    def output_columns(self) -> dict[str, pa.DataType]:
        cols = {"drift_weight": pa.float32()}
        if self.correct == "resample":
            cols[REPEAT_COLUMN] = REPEAT_TYPE
        return cols

    def _check_batch(self, batch: pa.Table) -> None:
        cols = batch.column_names
        missing = [c for c in self.columns if not has_feature(cols, c)] + \
            [c for c in self.categorical if c not in cols] + \
            ([self.weight_column] if self.weight_column and self.weight_column not in cols else [])
        if missing:
            raise StageConfigError(f"columns {missing} are not in the data and cannot be derived (columns: {cols})")

    def _row_weights(self, batch: pa.Table) -> np.ndarray | None:
        """How much each training row counts: ``weight_column`` x ``repeat`` (None = 1 each)."""
        w = multiplicity(batch)
        if self.weight_column is not None:
            v = np.nan_to_num(numeric_feature(batch, self.weight_column), nan=1.0)
            w = v if w is None else w * v
        return w

    def summarize(self, batch: pa.Table) -> dict[str, Any]:
        """Exact per-bin counts, category counts, min/max and a bottom-k text sample."""
        self._check_batch(batch)
        rw = self._row_weights(batch)
        numeric: dict[str, np.ndarray] = {}
        ranges: dict[str, tuple[float, float] | None] = {}
        for c in self.columns:
            v = numeric_feature(batch, c)
            numeric[c] = bin_counts(v, self.ref_edges[c], rw)
            finite = v[~np.isnan(v)]
            ranges[c] = (float(finite.min()), float(finite.max())) if finite.size else None
        cats = {c: weighted_value_counts(_categories(batch, c), rw) for c in self.categorical}
        texts = _text_sample(batch, TEXT_ROLES[self.text], self.seed, self.text_sample, rw) if self.text else []
        return {"rows": batch.num_rows, "numeric": numeric, "ranges": ranges, "categorical": cats, "texts": texts}

    def fit(self, summaries: Sequence[dict[str, Any]]) -> None:
        rows = 0
        numeric = {c: np.zeros_like(self.ref_counts[c]) for c in self.columns}
        ranges: dict[str, tuple[float, float] | None] = {c: None for c in self.columns}
        cats: dict[str, Counter] = {c: Counter() for c in self.categorical}
        texts: list[tuple[float, str]] = []
        for s in summaries:
            rows += s["rows"]
            for c in self.columns:
                numeric[c] = numeric[c] + s["numeric"][c]
                r, sr = ranges[c], s["ranges"][c]
                ranges[c] = sr if r is None else (r if sr is None else (min(r[0], sr[0]), max(r[1], sr[1])))
            for c in self.categorical:
                cats[c].update(s["categorical"][c])
            texts = _bottom_k(texts + s["texts"], self.text_sample)
        self.rows = rows
        self.train_counts = numeric
        self.train_range = ranges
        self.train_cats = cats
        self.results: dict[str, dict[str, Any]] = {}
        # per-bin correction ratios (reference share / training share), major columns only
        self.ratios: dict[str, np.ndarray] = {}
        self.cat_ratios: dict[str, dict[Any, float]] = {}
        for c in self.columns:
            value = psi_from_counts(self.ref_counts[c], numeric[c], self.epsilon)
            self.results[c] = {"kind": "numeric", "psi": value, "verdict": verdict(value, self.thresholds)}
        for c in self.categorical:
            keys = category_keys(self.ref_cats[c], cats[c])
            ref = [self.ref_cats[c].get(k, 0) for k in keys]
            act = [cats[c].get(k, 0) for k in keys]
            value = psi_from_counts(ref, act, self.epsilon)
            self.results[c] = {"kind": "categorical", "psi": value, "verdict": verdict(value, self.thresholds)}
        major = sorted((c for c, r in self.results.items() if r["verdict"] == "major"),
                       key=lambda c: -self.results[c]["psi"])
        self.corrected = (self.target if self.target in major else None) if self.target else \
            (major[0] if major else None)
        c = self.corrected
        self.correction_note: str | None = None
        if self.correct and c is not None:
            support = self._support(c)
            if support < MIN_SUPPORT:
                self.correction_note = (f"correction of {c!r} skipped: only {support:.1%} of the training rows fall "
                                        f"in bins/categories the reference has (< {MIN_SUPPORT:.0%}); reweighting "
                                        f"cannot create what the training data lacks")
                c = None
        if self.correct and c in self.columns:
            self.ratios[c] = shares(self.ref_counts[c], self.epsilon) / shares(numeric[c], self.epsilon)
        elif self.correct and c in self.categorical:
            keys = category_keys(self.ref_cats[c], cats[c])
            r = shares([self.ref_cats[c].get(k, 0) for k in keys], self.epsilon) / \
                shares([cats[c].get(k, 0) for k in keys], self.epsilon)
            self.cat_ratios[c] = dict(zip(keys, r.tolist(), strict=True))
        self.text_auc: float | None = None
        self.text_sizes = (len(texts), len(self.ref_texts))
        if self.text:
            from dataguard.stats.domain import domain_classifier_auc, embed_texts

            if texts and self.ref_texts:
                self.text_auc = domain_classifier_auc(embed_texts([t for _, t in texts]),
                                                      embed_texts([t for _, t in self.ref_texts]), self.seed)
        self._fitted = True

    def _support(self, c: str) -> float:
        """Share of training rows in bins/categories that also hold reference rows."""
        if c in self.columns:
            train, ref = self.train_counts[c], self.ref_counts[c]
            total = train.sum()
            return float(train[ref > 0].sum() / total) if total else 0.0
        total = sum(self.train_cats[c].values())
        inside = sum(v for k, v in self.train_cats[c].items() if self.ref_cats[c].get(k, 0) > 0)
        return float(inside / total) if total else 0.0

    def _weights(self, batch: pa.Table) -> np.ndarray:
        w = np.ones(batch.num_rows, dtype=np.float64)
        for c, ratio in self.ratios.items():
            w *= ratio[bin_index(numeric_feature(batch, c), self.ref_edges[c])]
        for c, mapping in self.cat_ratios.items():
            keys = list(mapping)
            ratio = np.array([mapping[k] for k in keys] + [1.0], dtype=np.float64)
            pos = pc.index_in(_categories(batch, c), value_set=pa.array(keys, pa.string()), skip_nulls=False)
            w *= ratio[np.asarray(pos.fill_null(len(keys)).to_numpy(zero_copy_only=False), dtype=np.int64)]
        return np.minimum(w, self.max_weight)

    def apply(self, batch: pa.Table) -> Outcome:
        if not self._fitted:
            raise RuntimeError("DriftStage.apply called before fit")
        self._check_batch(batch)
        n = batch.num_rows
        w = self._weights(batch) if (self.ratios or self.cat_ratios) else np.ones(n)
        drift_weight = w if self.correct == "importance_weights" else np.ones(n)
        # a second drift stage (another reference) replaces the column rather than duplicating it
        scored = set_column(batch, "drift_weight", pa.array(drift_weight.astype(np.float32), pa.float32()))
        rejected = empty_rejected()
        kept = scored
        if self.correct == "resample":
            if self.ratios or self.cat_ratios:
                k = draw_repeat(batch, w, self.seed, "drift")
            else:  # nothing to correct: keep the current multiplicity
                base = multiplicity(batch)
                k = np.ones(n, dtype=np.int64) if base is None else base.astype(np.int64)
            scored = set_column(scored, REPEAT_COLUMN, pa.array(k, REPEAT_TYPE))
            out = k == 0
            if out.any():
                details = [f"drift resampling toward the reference on {self.corrected!r}: "
                           f"{x:.4f} expected uses per row, drew 0" for x in w[out]]
                rejected = reject_rows(scored, out, self.name, REASON_RESAMPLED_OUT, details)
            kept = scored.filter(pa.array(~out))
        # what the training run will see, for PSI after correction
        weights = kept.column("drift_weight").to_numpy().astype(np.float64) if kept.num_rows else np.empty(0)
        rw = self._row_weights(kept)
        if rw is not None:
            weights = weights * rw
        after_num = {c: bin_counts(numeric_feature(kept, c), self.ref_edges[c], weights) for c in self.columns}
        after_cat = {c: weighted_value_counts(_categories(kept, c), weights) for c in self.categorical}
        reps = multiplicity(kept)
        stats = {"numeric": after_num, "categorical": after_cat, "resampled_out": int(rejected.num_rows),
                 "repeated": int((reps > 1).sum()) if reps is not None and self.correct == "resample" else 0}
        return Outcome(kept=kept, rejected=rejected, stats=stats)

    def absorb(self, stats: Sequence[Any]) -> None:
        num = {c: np.zeros_like(self.ref_counts[c]) for c in self.columns}
        cat: dict[str, Counter] = {c: Counter() for c in self.categorical}
        out = dup = 0
        for s in stats:
            if not s:
                continue
            for c in self.columns:
                num[c] = num[c] + s["numeric"][c]
            for c in self.categorical:
                cat[c].update(s["categorical"][c])
            out += s["resampled_out"]
            dup += s["repeated"]
        self._after = {"numeric": num, "categorical": cat}
        self._rows_resampled_out = out
        self._rows_repeated = dup

    # -- results ----------------------------------------------------------------------------
    def psi_after(self) -> dict[str, float]:
        """PSI of what apply emitted (weighted by ``drift_weight``), per column."""
        if self._after is None:
            return {}
        res = {c: psi_from_counts(self.ref_counts[c], self._after["numeric"][c], self.epsilon) for c in self.columns}
        for c in self.categorical:
            keys = category_keys(self.ref_cats[c], self._after["categorical"][c], self.train_cats[c])
            res[c] = psi_from_counts([self.ref_cats[c].get(k, 0) for k in keys],
                                     [self._after["categorical"][c].get(k, 0) for k in keys], self.epsilon)
        return res

    def text_verdict(self) -> str:
        if self.text_auc is None:
            return "unknown"
        return verdict(self.text_auc, self.auc_thresholds)

    def _numeric_block(self, c: str, after: dict[str, float]) -> dict[str, Any]:
        edges = self.ref_edges[c]
        lo = min(self.ref_range[c][0], (self.train_range[c] or self.ref_range[c])[0])
        hi = max(self.ref_range[c][1], (self.train_range[c] or self.ref_range[c])[1])
        full = [lo, *[float(e) for e in edges], hi]
        nb = len(edges) + 1

        def frac(counts: np.ndarray) -> list[float]:
            tot = counts.sum()
            return [round(float(x / tot), 6) if tot else 0.0 for x in counts[:nb]]

        series = {"reference": frac(self.ref_counts[c]), "training": frac(self.train_counts[c])}
        if self._after is not None and self.correct:
            series["after correction"] = frac(self._after["numeric"][c])
        return {"type": "histogram", "title": f"{c}: share per reference quantile bin (PSI "
                f"{self.results[c]['psi']:.4f}, {self.results[c]['verdict']})",
                "edges": full, "series": series, "x_label": c}

    def _categorical_block(self, c: str) -> dict[str, Any]:
        ref_s, tr_s = self.ref_cats[c], self.train_cats[c]
        rt, tt = sum(ref_s.values()) or 1, sum(tr_s.values()) or 1
        keys = category_keys(ref_s, tr_s)
        keys = sorted(keys, key=lambda k: -abs(tr_s.get(k, 0) / tt - ref_s.get(k, 0) / rt))[:MAX_BAR_CATEGORIES]
        series = {"reference": [round(ref_s.get(k, 0) / rt, 6) for k in keys],
                  "training": [round(tr_s.get(k, 0) / tt, 6) for k in keys]}
        if self._after is not None and self.correct:
            a = self._after["categorical"][c]
            at = sum(a.values()) or 1
            series["after correction"] = [round(a.get(k, 0) / at, 6) for k in keys]
        return {"type": "bar", "title": f"{c}: shares (largest differences first, PSI "
                f"{self.results[c]['psi']:.4f}, {self.results[c]['verdict']})",
                "labels": ["(null)" if k is None else str(k) for k in keys], "series": series}

    def describe(self) -> dict[str, Any]:
        if not self._fitted:
            return {"title": "Distribution shift (PSI)", "summary": {"fitted": False}, "blocks": []}
        after = self.psi_after()
        rows = []
        for c, r in self.results.items():
            a = after.get(c)
            rows.append([c, r["kind"], _round(r["psi"]), r["verdict"],
                         None if a is None or not self.correct else _round(a),
                         None if a is None or not self.correct else verdict(a, self.thresholds),
                         c in self.ratios or c in self.cat_ratios])
        major = [c for c, r in self.results.items() if r["verdict"] == "major"]
        summary: dict[str, Any] = {
            "training_rows": self.rows, "reference_rows": self.reference_rows,
            "weight_column": self.weight_column,
            "max_psi": _round(max((r["psi"] for r in self.results.values() if r["psi"] == r["psi"]),
                                  default=float("nan"))),
            "columns_major": len(major),
            "columns_moderate": sum(r["verdict"] == "moderate" for r in self.results.values()),
            "text_auc": None if self.text_auc is None else round(self.text_auc, 4),
            "text_verdict": self.text_verdict() if self.text else None,
            "correction": self.correct,
            "corrected_column": self.corrected if self.correct and not self.correction_note else None,
            "rows_resampled_out": self._rows_resampled_out,
            "rows_repeated": self._rows_repeated,
        }
        blocks: list[dict[str, Any]] = [{
            "type": "table", "title": "PSI per column (reference = expected)",
            "columns": ["column", "kind", "psi", "verdict", "psi_after", "verdict_after", "corrected"],
            "rows": rows,
        }]
        if self.correction_note:
            blocks.append({"type": "text", "title": "Correction", "text": self.correction_note})
        blocks += [self._numeric_block(c, after) for c in self.columns]
        blocks += [self._categorical_block(c) for c in self.categorical]
        if self.text:
            auc = "n/a" if self.text_auc is None else f"{self.text_auc:.4f}"
            n1, n2 = self.text_sizes
            # Mann-Whitney standard deviation of the AUC of a random scorer: how far from 0.5
            # sampling noise alone moves it (out-of-fold AUCs vary somewhat more).
            null_sd = ((n1 + n2 + 1) / (12 * n1 * n2)) ** 0.5 if n1 and n2 else float("nan")
            blocks.append({"type": "text", "title": "Text domain classifier", "text": (
                f"Logistic regression on MiniLM embeddings of {n1} training and {n2} reference "
                f"{self.text} texts, 5-fold out-of-fold ROC AUC = {auc} ({self.text_verdict()}; thresholds "
                f"{list(self.auc_thresholds)}; 0.5 = indistinguishable, sampling noise ~ +/-{null_sd:.3f} per sd; "
                f"use text_sample >= 500 for a steady estimate).")})
        blocks.append({"type": "text", "title": "Method", "text": (
            f"PSI = sum (a - e) ln(a / e) over {self.bins} reference quantile bins (numeric) or categories; "
            f"empty shares replaced by epsilon = {self.epsilon}; verdicts: < {self.thresholds[0]} stable, "
            f"< {self.thresholds[1]} moderate, else major.")})
        return {"title": "Distribution shift (PSI)", "summary": summary, "blocks": blocks,
                "psi": {c: {"psi": _round(r["psi"], 12), "verdict": r["verdict"],
                            "psi_after": _round(after.get(c), 12)}
                        for c, r in self.results.items()}}
