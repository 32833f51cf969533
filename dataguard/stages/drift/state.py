"""What the drift stage's ``fit`` decides, as values: the helpers that build it return these and
the stage holds one `Fitted`, which ``apply`` and the report read.

`TrainingSide` is the training data merged from the batch summaries (`measure.merge_summaries`);
`Correction` is what ``apply`` corrects and how (`correct.choose_correction`); `SampleMeasures`
are the tests on the bounded samples (`measure.measure_samples`).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dataguard.stages.drift.reference import Sample


@dataclass(frozen=True, eq=False)
class TrainingSide:
    """The training data's counts on the reference's bins, ranges, samples, labels and strata."""

    rows: int
    counts: dict[str, np.ndarray]                 # numeric column -> (weighted) count per reference bin
    ranges: dict[str, tuple[float, float] | None]  # numeric column -> min/max (None: no finite value)
    cats: dict[str, Counter]                       # categorical column -> (weighted) value counts
    labels: Counter | None                         # the label column's counts, when the data has it
    texts: Sample
    features: Sample
    strata: dict[str, Any] | None                  # per-class counts and keepers (resample with labels)


@dataclass(frozen=True, eq=False)
class Correction:
    """The corrected column and its ratios; empty ratios: ``apply`` changes nothing."""

    column: str | None = None      # chosen for correction (kept when the note skips it)
    note: str | None = None        # why the correction was skipped
    ratios: dict[str, np.ndarray] = field(default_factory=dict)            # per reference bin
    cat_ratios: dict[str, dict[Any, float]] = field(default_factory=dict)  # per category
    scales: dict[Any, float] = field(default_factory=dict)  # per-class factors of stratified resampling
    keepers: frozenset[str] = frozenset()  # one row id per class, drawn at least once


@dataclass(frozen=True)
class SampleMeasures:
    """The text domain classifier's AUC and the MMD tests on the bounded samples."""

    text_auc: float | None
    text_sizes: tuple[int, int]  # (training, reference) texts the classifier saw
    mmd: dict[str, dict[str, Any] | None]  # "features" / "text" -> test result


@dataclass(frozen=True, eq=False)
class Fitted:
    """Everything ``fit`` decided."""

    training: TrainingSide
    results: dict[str, dict[str, Any]]  # column -> PSI and KL with their verdicts
    correction: Correction
    samples: SampleMeasures
