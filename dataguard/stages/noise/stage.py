"""Confidence-based label-noise cleaning (confident learning).

A row's label can only be judged against the whole labelled set, so this is a fit stage:

* ``summarize`` (workers) returns the batch's ids, labels and what the classifier needs:
  sentence embeddings (computed here, in parallel; an existing ``<text>_embedding`` column
  from an earlier stage is reused), the texts (TF-IDF needs a global vocabulary), or the
  user's own probabilities from a column. Memory in the driver: about 1.5 KiB per row for
  384-dim embeddings plus the texts for TF-IDF, i.e. ~150 MB for 100k rows, plus the
  (rows x classes) float64 probability matrix (62 MB for 100k rows x 77 classes), which
  stays in the driver (dropped when the stage is pickled to workers).
* ``fit`` (driver) builds the features, runs seeded stratified K-fold cross-validation with
  a scikit-learn classifier to get out-of-sample probabilities (or takes the user's from a
  column / ``.npy`` file), then runs confident learning through cleanlab: per-class
  thresholds, confident joint, noise matrix P(given | true), ``find_label_issues``; or the
  fixed-threshold rule (flag rows whose given label has probability < ``threshold``).
* ``apply`` looks each row up by id and adds ``label_quality`` (float32, cleanlab's label
  quality score, low = suspicious), ``suggested_label`` (string, the model's top class)
  and ``is_label_issue`` (bool). Rows without a label (or not seen by fit) get nulls and
  pass through. Actions: ``flag`` keeps everything; ``drop`` rejects issues with reason
  ``label_issue``; ``relabel`` replaces the label of an issue by the suggested one only when
  the model gives it probability >= ``relabel_min_confidence``, and records the label it
  replaced in ``original_label`` (null on rows it did not change).

Defaults are measured (benchmarks/bench_label_noise.py). Features: ``auto`` (the default
since 2026-12-01; it was ``embedding``) looks at the labelled texts' median word count. Up
to 16 words (intents) it averages three out-of-fold models - SGD logistic on MiniLM
embeddings, SGD logistic on TF-IDF, cosine kNN on the embeddings - which lifts banking77
detection F1 at 10% seeded noise from 0.844 (embeddings alone) to 0.881; longer texts get
TF-IDF alone (20 Newsgroups: 59 of 82 confirmed errors in the worst 2% vs 18 with
embeddings; MiniLM reads only the first 128 word pieces). ``embedding``, ``tfidf``,
``both`` (stacked) and ``ensemble`` can still be forced. Classifier: one-vs-rest SGD
logistic models rank label errors better than multinomial logistic regression on both
banking77 and 20 Newsgroups; ``C=None`` picks the regularisation from (1, 10, 100) by
cross-validated agreement with the given labels (short intents want ~10, long posts ~100);
the ``normalized_margin`` ranking beats ``self_confidence`` on both; 0.5 is the relabel bar
(the suggestion outweighs all other classes together; 98% of such relabels were right on
banking77 at 20% noise).

Rare classes are protected: a row is never flagged when that would leave its given class with
fewer than ``min_rows_per_class`` (default 5) unflagged rows; the least suspicious flagged
rows are given back first. Out-of-sample models seldom predict a class they saw a handful of
times, so without this rule cleaning a long-tailed set erases its tail (14 of 77 banking77
classes at imbalance 100 and 20% noise). ``min_rows_per_class: 0`` gives cleanlab's mask
unchanged.

Probabilities handed in as a ``.npy`` file must have one row per row reaching this stage,
in input order, with columns in ``classes`` order (default: the sorted distinct labels).
A fine-tuned model's logits go in the same way with ``inputs: logits`` (stable softmax,
optional ``temperature``); rows handed in as probabilities that are not (negative, or not
summing to 1) are refused with an error naming ``probabilities`` (`dataguard.stages.noise.probs`).

A training run's own view of each row goes in with ``inputs: dynamics`` and ``dynamics: RUN``
(the run folder of `dataguard train`, whose ``dynamics.arrow`` is read and checked when the
config loads): AUM or cartography confidence per row, a learned cut, the same budget and
class protection; sft runs flag ``hard_to_fit`` rows (`dataguard.stages.noise.dynamics`).
Beside cross-validated inputs (``features`` or ``probabilities``), ``dynamics: RUN`` is a
second view: the method still decides how many rows are flagged, and the mean percentile rank
of the out-of-fold margin and the run's AUM decides which (`dataguard.stages.noise.two_views`;
banking77 at 20% noise: F1 0.900 alone, 0.934 with a fine-tuned MiniLM's AUM).

Options (each measured in benchmarks/bench_label_noise.py): ``method: confidence`` is the
seeds' rule (flag max probability > ``threshold`` on a class other than the given one);
``rounds: N`` re-estimates N times, each round refitting on the rows the previous one kept
(`dataguard.stages.noise.rounds`); ``max_flagged`` caps the flags at a count or a fraction of the
labelled rows, keeping the worst by label quality (ties by row order). ``auto`` is decided
in ``fit`` on all labelled texts (`dataguard.text.features.choose_features`); ``summarize``
already embeds a batch whose own median is short, and ``fit`` embeds any batch that did
not when the whole set turns out short. Parameters are validated in
`dataguard.stages.noise.params`; describe() and the fit report live in `dataguard.stages.noise.report`,
the fitted verdicts and apply's per-row lookup in `dataguard.stages.noise.verdicts`.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from dataguard.embed import DEFAULT_BACKEND, embeddings_for, stage_embedder
from dataguard.records import full_texts, prompt_texts, response_texts
from dataguard.stage import Outcome, Stage
from dataguard.stages.noise import dynamics_stage, report, two_views
from dataguard.stages.noise import params as P
from dataguard.stages.noise.dynamics import run_list
from dataguard.stages.noise.given import class_list, gather_probs
from dataguard.stages.noise.rounds import CvOptions, estimate_issues
from dataguard.stages.noise.verdicts import REASON, Verdicts, judge
from dataguard.text.features import AUTO_MAX_WORDS, word_count

TEXTS = {"prompt": prompt_texts, "response": response_texts, "full": full_texts}


@dataclass
class NoiseSummary:
    """One batch's labelled rows: what ``fit`` needs to cross-validate them."""

    n_rows: int                          # all rows in the batch (aligns a .npy file)
    positions: np.ndarray                # int64, batch positions of the labelled rows
    ids: list[str]
    labels: list[str]
    texts: list[str] | None = None       # for TF-IDF (and for ``auto``, which decides in fit)
    embeddings: np.ndarray | None = None  # (n_labelled, dim) float32
    probs: np.ndarray | None = None       # (n_labelled, k) from a probabilities column


class NoiseStage(Stage):
    """Flags, drops or relabels rows whose label disagrees with out-of-sample predictions."""

    name = "noise"
    needs_fit = True
    constraints = P.CONSTRAINTS
    reasons = {REASON: "its label disagrees with out-of-sample predictions (confident learning)",
               dynamics_stage.HARD_TO_FIT: "its loss stayed an outlier through a training run (inputs: dynamics)"}

    def __init__(self, *, features: str = "auto", classifier: str | Any = "sgd", C: float | None = None,
                 folds: int = 5, seed: int = 0, method: str = "cleanlab",
                 filter_by: str = "prune_by_noise_rate", threshold: float = 0.8,
                 rank_by: str = "normalized_margin", probabilities: str | None = None,
                 inputs: str = "probabilities", temperature: float = 1.0,
                 classes: Sequence[str] | None = None, action: str = "flag",
                 relabel_min_confidence: float = 0.5, min_rows_per_class: int = 5,
                 max_flagged: int | float | None = None, rounds: int = 1, label_column: str = "label",
                 text: str = "prompt", embedding_column: str | None = None, embedding_weight: float = 1.0,
                 model: str | None = None, batch_size: int = 64, threads: int | None = None,
                 backend: str = DEFAULT_BACKEND, max_seq_length: int | None = None,
                 dynamics: str | Sequence[str] | None = None, dynamics_score: str = "aum", dynamics_cut: str | float = "auto") -> None:
        meta = P.check_together(method, threshold, probabilities, inputs, temperature, rounds, dynamics, dynamics_cut)
        runs = run_list(dynamics)
        self.dynamics: str | list[str] | None = (None if dynamics is None else runs[0]
                                                 if isinstance(dynamics, str | os.PathLike) else runs)
        self.dyn_task = meta["task"] if meta else None
        self.dynamics_score = dynamics_score
        self.dynamics_cut = dynamics_cut
        self.dynamics_log: dict[str, Any] = {}
        self.features = features
        self.classifier = classifier
        self.C = None if C is None else float(C)
        self.chosen_C: float | dict[str, float] | None = None
        self.folds = folds
        self.seed = seed
        self.method = method
        self.filter_by = filter_by
        self.threshold = float(threshold)
        self.rank_by = rank_by
        self.probabilities = None if probabilities is None else str(probabilities)
        self.inputs = inputs
        self.temperature = float(temperature)
        self.classes = list(classes) if classes is not None else None
        self.action = action
        self.relabel_min_confidence = float(relabel_min_confidence)
        self.min_rows_per_class = min_rows_per_class
        self.max_flagged = max_flagged
        self.rounds = rounds
        self.label_column = label_column
        self.text = text
        self.embedding_column = embedding_column if embedding_column is not None else f"{text}_embedding"
        self.embedding_weight = float(embedding_weight)
        self.embedder = stage_embedder(model, batch_size=batch_size, threads=threads, device="cpu", backend=backend,
                                       max_seq_length=max_seq_length)
        self.fitted = False
        self.features_used: str | None = None if features == "auto" else features
        self.auto_choice: dict[str, Any] = {}
        self.round_log: list[dict[str, Any]] = []
        self.budget_log: dict[str, Any] = {}
        self._probs: np.ndarray | None = None
        self.report: dict[str, Any] = {}

    def __getstate__(self) -> dict[str, Any]:
        """Workers need the per-row verdicts, not the (rows x classes) probability matrix."""
        state = dict(self.__dict__)
        state["_probs"] = None
        return state

    # -- config helpers ---------------------------------------------------------------
    @property
    def _probs_file(self) -> bool:
        return self.probabilities is not None and self.probabilities.endswith(".npy")

    @property
    def _probs_column(self) -> str | None:
        return self.probabilities if self.probabilities is not None and not self._probs_file else None

    def output_columns(self) -> dict[str, pa.DataType]:
        if self.dyn_task == "sft":
            return dict(dynamics_stage.SFT_COLUMNS)
        cols = {"label_quality": pa.float32(), "suggested_label": pa.string(), "is_label_issue": pa.bool_()}
        if self.action == "relabel":
            cols["original_label"] = pa.string()
        return cols

    def apply_adds(self) -> frozenset[str] | None:
        """``flag`` keeps every row and only adds the three verdict columns; ``drop`` rejects
        rows and ``relabel`` rewrites the label column."""
        return frozenset(("label_quality", "suggested_label", "is_label_issue")) if self.action == "flag" else None

    def columns_read(self) -> frozenset[str]:
        cols = {"id", "messages", self.label_column, self.embedding_column}
        if self._probs_column is not None:
            cols.add(self._probs_column)
        return frozenset(cols)

    # -- summarize / fit --------------------------------------------------------------
    def _labels(self, batch: pa.Table) -> pa.Array:
        if self.label_column not in batch.column_names:
            raise ValueError(f"noise stage: label_column {self.label_column!r} is not a column of the batch")
        col = batch.column(self.label_column)
        col = col.combine_chunks() if col.num_chunks else pa.array([], pa.string())
        return col.cast(pa.string())

    def summarize(self, batch: pa.Table) -> NoiseSummary:
        if self.dyn_task == "sft":  # every row is judged by its loss; no label needed
            return NoiseSummary(n_rows=batch.num_rows, positions=np.arange(batch.num_rows, dtype=np.int64),
                                ids=batch.column("id").to_pylist(), labels=[])
        labels = self._labels(batch)
        valid = pc.fill_null(pc.is_valid(labels), False).to_numpy(zero_copy_only=False)
        positions = np.flatnonzero(valid).astype(np.int64)
        sub = batch.take(pa.array(positions, pa.int64()))
        summary = NoiseSummary(n_rows=batch.num_rows, positions=positions,
                               ids=sub.column("id").to_pylist(), labels=labels.filter(pa.array(valid)).to_pylist())
        if self._probs_column is not None:
            if self._probs_column not in batch.column_names:
                raise ValueError(f"noise stage: probabilities column {self._probs_column!r} is not in the batch")
            rows = sub.column(self._probs_column).to_pylist()
            summary.probs = np.asarray(rows, dtype=np.float64).reshape(len(rows), -1)
            return summary
        if self._probs_file or self.inputs == "dynamics":
            return summary
        texts = TEXTS[self.text](sub)
        embed = self.features in ("embedding", "both", "ensemble")
        if self.features == "auto":  # fit decides on all rows; embed here (in parallel) where it will likely be used
            summary.texts = texts
            embed = (self.embedding_column in sub.column_names
                     or float(np.median([word_count(t) for t in texts] or [0])) <= AUTO_MAX_WORDS)
        if self.features in ("tfidf", "both", "ensemble"):
            summary.texts = texts
        if embed:
            summary.embeddings = embeddings_for(sub, self.embedding_column, texts, self.embedder)
        return summary

    def _cv_options(self) -> CvOptions:
        """What `estimate_issues` reads: the stage's attributes of the same names, frozen."""
        return CvOptions(**{f.name: getattr(self, f.name) for f in fields(CvOptions)})

    def runs_read(self) -> list[str]:
        """The runs whose verdicts only the row id ties to a row: sft runs, and classify runs
        from before dynamics recorded each row's label (a run that records it is checked row
        by row, so a hand-relabelled input is not refused whole)."""
        from dataguard.stages.noise.dynamics import labels_recorded

        return [run for run in run_list(self.dynamics) if not labels_recorded(run)]

    def fit(self, summaries: Sequence[NoiseSummary]) -> None:
        summaries = list(summaries)
        if self.inputs == "dynamics":
            dynamics_stage.fit(self, summaries)
            return
        ids = [i for s in summaries for i in s.ids]
        labels = [lab for s in summaries for lab in s.labels]
        if len(set(ids)) != len(ids):
            raise ValueError("noise stage: row ids are not unique; cannot look rows up in apply")
        probs = gather_probs(summaries, self._probs_column, self.probabilities if self._probs_file else None,
                             self.inputs, self.temperature)
        classes = class_list(labels, self.classes, None if probs is None else probs.shape[1])
        index = {c: i for i, c in enumerate(classes)}
        y = np.fromiter((index[lab] for lab in labels), dtype=np.int64, count=len(labels))
        k = len(classes)
        second = None
        if self.dynamics is not None:  # a training run's view beside the cross-validated one
            runs = run_list(self.dynamics)
            second, judged, other = two_views.dynamics_rank(runs, ids, self.dynamics_score, labels)
            self.dynamics_log = {"runs": runs, "score": self.dynamics_score, "rows_judged": judged,
                                 "rows_unjudged": len(ids) - judged, "rows_other_label": other}
        cv = estimate_issues(self._cv_options(), summaries, y, k, probs, second)
        probs, est = cv.probs, cv.est
        self.features_used, self.auto_choice, self.chosen_C = cv.features_used, cv.auto_choice, cv.chosen_C
        self.round_log, self.budget_log = cv.round_log, cv.budget_log
        relabel = est.is_issue & (est.suggested != y) & (est.suggested_prob >= self.relabel_min_confidence)
        self._classes = classes
        self._verdicts = Verdicts(
            ids=pa.array(ids, pa.string()), given=pa.array(labels, pa.string()),
            quality=pa.array(est.quality, pa.float32()),
            suggested=pa.array(np.asarray(classes, dtype=object)[est.suggested] if len(y) else [], pa.string()),
            suggested_prob=est.suggested_prob, issue=pa.array(est.is_issue, pa.bool_()),
            relabel=pa.array(relabel, pa.bool_()))
        self._probs = probs  # kept for users and tests (benchmarks read it); not in describe
        self.report = report.fit_report(y, est, relabel, k, self.action)
        self.fitted = True

    @property
    def oof_probs(self) -> np.ndarray:
        """The (labelled rows, classes) probabilities fit used, rows in input order."""
        if not self.fitted or self._probs is None:
            raise RuntimeError("noise stage: not fitted here (probabilities stay in the driver)")
        return self._probs

    @property
    def classes_(self) -> list[str]:
        """Class names in probability-column order."""
        if not self.fitted:
            raise RuntimeError("noise stage: not fitted")
        return list(self._classes)

    # -- apply ------------------------------------------------------------------------
    def apply(self, batch: pa.Table) -> Outcome:
        if not self.fitted:
            raise RuntimeError("noise stage: apply() before fit()")
        if self.dyn_task == "sft":
            return dynamics_stage.apply_sft(self, batch)
        rule = (dynamics_stage.rule_text(self) if self.inputs == "dynamics"
                else report.rule_text(self.method, self.filter_by, self.threshold, self.dynamics_score
                                      if self.dynamics is not None else None))
        rank = self.dynamics_score if self.inputs == "dynamics" else self.rank_by
        return judge(self._verdicts, batch, self._labels(batch), action=self.action, label_column=self.label_column,
                     stage=self.name, texts_of=TEXTS[self.text], rule=rule, rank=rank)

    # -- describe ---------------------------------------------------------------------
    def describe(self) -> dict[str, Any]:
        if self.dyn_task == "sft":
            return dynamics_stage.describe_sft(self)
        return report.describe(self)
