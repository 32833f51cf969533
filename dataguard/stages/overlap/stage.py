"""The overlap stage itself: validated configuration, and glue between fit (index.py),
measurement (measure.py), spans/masking (spans.py) and reporting (report.py)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import fields, replace
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from dataguard.params import (
    OPTIONAL_NAME,
    SOURCES,
    Flag,
    Interval,
    ListOf,
    MapOf,
    Options,
    Satisfies,
)
from dataguard.records import ROLES, reject_rows, set_column
from dataguard.references import DEFAULT_REFERENCES, ReferenceError, ReferenceSpec, parse_specs
from dataguard.stage import Outcome, Stage, StageConfigError
from dataguard.stages.overlap import report
from dataguard.stages.overlap.encoding import Encoder, scan_rows
from dataguard.stages.overlap.index import VALIDATION_SET, ReferenceIndex, build_index, validation_summary
from dataguard.stages.overlap.measure import item_threshold, measure
from dataguard.stages.overlap.spans import mask_rows, row_spans
from dataguard.text.normalize_text import NormalizeConfig
from dataguard.text.tokenizers import check_tokenizer_spec

REASON = "contamination"
MODES = ("token", "word")
ACTIONS = ("flag", "drop", "mask")


_SHARE = [Interval(float, 0, 1, closed="right")]
_REFERENCE = Satisfies(lambda v: isinstance(v, str | Mapping), "a reference set name or {name, path, fields, ...}")


class OverlapStage(Stage):
    """n-gram overlap with benchmarks and with the run's validation split (package docstring)."""

    name = "overlap"
    needs_fit = True
    constraints = {
        "references": [ListOf(_REFERENCE), _REFERENCE],
        "validation_sources": SOURCES,
        "n": [Interval(int, 8, 50)],
        "mode": [Options(*MODES)],
        "tokenizer": OPTIONAL_NAME,
        "threshold": _SHARE,
        "ref_threshold": _SHARE,
        "action": [Options(*ACTIONS)],
        "normalize": [Flag(), MapOf(Options(*NormalizeConfig.__dataclass_fields__), Flag()),
                      Satisfies(lambda v: isinstance(v, NormalizeConfig), "a NormalizeConfig"), None],
        "roles": [ListOf(Options(*ROLES), min_len=1), Options(*ROLES)],
        "near_duplicate": _SHARE,
        "max_examples": [Interval(int, 0, 50)],
        "exact_min_tokens": [Interval(int, 1, 1000)],
    }
    reasons = {REASON: "shares n-grams (or is an exact copy) with a validation row or a benchmark item"}

    def __init__(
        self,
        *,
        references: Sequence[str | Mapping[str, Any]] = DEFAULT_REFERENCES,
        validation_sources: Sequence[str] = (),
        n: int = 13,
        mode: str = "token",
        tokenizer: str | None = None,
        threshold: float = 0.5,
        ref_threshold: float = 0.3,
        action: str = "flag",
        normalize: bool | Mapping[str, bool] | None = None,
        roles: Sequence[str] = ROLES,
        near_duplicate: float = 0.9,
        max_examples: int = 20,
        exact_min_tokens: int = 6,
    ) -> None:
        if isinstance(references, str | Mapping):
            references = [references]
        try:
            self.references: list[ReferenceSpec] = parse_specs(list(references))
        except ReferenceError as exc:
            raise StageConfigError(f"references: {exc}") from exc
        if isinstance(validation_sources, str):
            validation_sources = [validation_sources]
        if VALIDATION_SET in {r.name for r in self.references}:
            raise StageConfigError(f"references: the name {VALIDATION_SET!r} is reserved for the validation split")
        if not self.references and not validation_sources:
            raise StageConfigError("references: give at least one reference set or validation_sources")
        self.n = n
        # a benchmark item of a few tokens ("true.", "Who are you?") is ordinary text in chat
        # data: whole-sequence copies count only from this length (validation rows: any length)
        self.exact_min_tokens = exact_min_tokens
        try:
            check_tokenizer_spec(tokenizer)  # fail here, not in a worker
        except ValueError as exc:
            raise StageConfigError(str(exc), param="tokenizer") from None
        self.threshold = float(threshold)
        self.ref_threshold = float(ref_threshold)
        self.near_duplicate = float(near_duplicate)
        try:
            self.norm = NormalizeConfig.from_param(normalize)
        except ValueError as exc:
            raise StageConfigError(f"normalize: {exc}", param="normalize") from exc
        if self.norm.punctuation and not isinstance(normalize, NormalizeConfig) and not (
                isinstance(normalize, Mapping) and "intraword" in normalize):
            # folding punctuation here also means deleting it inside words, so that
            # "Zacks" / "3/5" -> "35" / "10foot" edits of a copy still match (opt out: intraword: false)
            self.norm = replace(self.norm, intraword=True)
        roles = [roles] if isinstance(roles, str) else list(roles)
        self.max_examples = max_examples
        self.validation_sources = tuple(validation_sources)
        self.mode, self.action = mode, action
        self.roles = tuple(roles)
        self.tokenizer_spec = tokenizer
        self._encoder = Encoder(mode, self.norm, tokenizer)
        self._ref: ReferenceIndex | None = None  # fitted state, shipped to workers
        self._item_texts: list[str] | None = None  # driver only

    def __getstate__(self) -> dict[str, Any]:
        """Workers need the index, not the texts (the encoder drops its tokenizer itself)."""
        state = self.__dict__.copy()
        state["_item_texts"] = None
        return state

    def fitted(self) -> ReferenceIndex:
        if self._ref is None:
            raise RuntimeError("OverlapStage.apply called before fit()")
        return self._ref

    def _report_options(self) -> report.ReportOptions:
        """What `report` reads: the stage's attributes of the same names, frozen."""
        return report.ReportOptions(**{f.name: getattr(self, f.name) for f in fields(report.ReportOptions)})

    def output_columns(self) -> dict[str, pa.DataType]:
        cols = {
            "overlap_ratio": pa.float64(),
            "overlap_longest": pa.int64(),
            "overlap_ngrams": pa.int64(),
            "overlap_ref_set": pa.string(),
            "overlap_ref_item": pa.string(),
            "overlap_ref_coverage": pa.float64(),
            "overlap_exact": pa.bool_(),
            "contaminated": pa.bool_(),
        }
        if self.action == "mask":
            cols["overlap_masked"] = pa.bool_()
        return cols

    # -- fit ------------------------------------------------------------------------------
    def summarize(self, batch: pa.Table) -> dict[str, Any] | None:
        """The validation rows of the batch: they become the ``validation`` reference set at
        fit time, encoded in the driver with the same tokenizer as the benchmarks."""
        return validation_summary(batch, self.validation_sources, self.roles)

    def fit(self, summaries: Sequence[Any]) -> None:
        """Tokenise the reference sets and merge them with the validation postings."""
        self._ref, self._item_texts = build_index(self.references, summaries, self.validation_sources,
                                                  self._encoder, self.n, exact_min_tokens=self.exact_min_tokens)

    # -- apply ----------------------------------------------------------------------------
    def apply(self, batch: pa.Table) -> Outcome:
        ref = self.fitted()
        n_rows = batch.num_rows
        rows = scan_rows(batch, self.roles, self._encoder)
        is_val = self._is_val(batch)
        m = measure(ref, rows, is_val, self.n)
        m["need"] = item_threshold(ref.item_len[np.maximum(m["best_item"], 0)], self.ref_threshold, self.n)
        by_ngrams = (m["ratio"] >= self.threshold) | (m["coverage"] >= m["need"])
        contaminated = m["exact"] | ((m["ngrams"] > 0) & by_ngrams)
        table = batch
        for name, col in (("overlap_ratio", pa.array(m["ratio"], pa.float64())),
                          ("overlap_longest", pa.array(m["longest"], pa.int64())),
                          ("overlap_ngrams", pa.array(m["ngrams"], pa.int64())),
                          ("overlap_ref_set", pa.array(m["set_name"], pa.string())),
                          ("overlap_ref_item", pa.array(m["item_name"], pa.string())),
                          ("overlap_ref_coverage", pa.array(m["coverage"], pa.float64())),
                          ("overlap_exact", pa.array(m["exact"], pa.bool_())),
                          ("contaminated", pa.array(contaminated, pa.bool_()))):
            table = set_column(table, name, col)
        ids = batch.column("id").to_pylist() if n_rows else []
        example_rows = np.flatnonzero(contaminated)[: self.max_examples]
        need_spans = set(example_rows.tolist())
        if self.action == "mask":
            need_spans |= set(np.flatnonzero(contaminated).tolist())
        spans = {r: row_spans(ref, self._encoder, rows, r, bool(is_val[r]), self.n, m["exact_docs"])
                 for r in sorted(need_spans)}

        drop = np.zeros(n_rows, dtype=bool)
        masked = np.zeros(n_rows, dtype=bool)
        spoiled: dict[int, str] = {}
        original = table  # rejected rows keep the text as it came in, never a masked copy
        if self.action == "drop":
            drop = contaminated.copy()
        elif self.action == "mask":
            table, masked, spoiled = mask_rows(table, spans, contaminated, self.roles)
            # a contaminated row whose spans could not be located is dropped, not kept as is
            drop = contaminated & ~masked
            drop[list(spoiled)] = True
            table = set_column(table, "overlap_masked", pa.array(masked, pa.bool_()))
            original = set_column(original, "overlap_masked", pa.array(np.zeros(n_rows, bool), pa.bool_()))
        opts = self._report_options()
        details = [report.detail(opts, ref, m, int(r)) + self._mask_note(masked, spoiled, int(r))
                   for r in np.flatnonzero(drop)]
        stats = report.batch_stats(opts, ref, batch, rows, m, contaminated, is_val, ids, spans, example_rows,
                                   int(drop.sum()), int(masked.sum()))
        if not drop.any():
            return Outcome(kept=table, stats=stats)
        rejected = reject_rows(original, drop, self.name, REASON, details)
        return Outcome(kept=table.filter(pa.array(~drop, pa.bool_())), rejected=rejected, stats=stats)

    def _mask_note(self, masked: np.ndarray, spoiled: dict[int, str], r: int) -> str:
        if self.action != "mask":
            return ""
        return f"; {spoiled[r]}" if masked[r] else "; spans could not be located for masking"

    def _is_val(self, batch: pa.Table) -> np.ndarray:
        if not self.validation_sources or batch.num_rows == 0:
            return np.zeros(batch.num_rows, dtype=bool)
        mask = pc.is_in(batch.column("source"), value_set=pa.array(self.validation_sources, pa.string()))
        return pc.fill_null(mask, False).to_numpy(zero_copy_only=False).astype(bool)

    # -- report (``apply``'s tallies are merged into ``self.tally`` by the base ``absorb``) --
    def _item_text(self, it: int) -> str:
        if self._item_texts is None:  # in a process that did not fit: reload the references
            texts: list[str] = []
            for spec in self.references:
                texts.extend(t for _, t in spec.load().items)
            self._item_texts = texts  # validation texts are not recoverable here
        return self._item_texts[it] if it < len(self._item_texts) else ""

    def training_state(self) -> dict[str, Any]:
        """The sources this run treats as validation: a runner evaluates on them, never trains."""
        return {"splits": {"validation": list(self.validation_sources)}}

    def describe(self) -> dict[str, Any]:
        return report.describe(self._report_options(), self._ref, self.tally, self._item_text)
