"""Drift resampling within label strata on real banking77: labels kept, no class lost, nothing lost."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pyarrow as pa
import pytest

from dataguard.stage import StageConfigError
from dataguard.stages.drift import DriftStage
from dataguard.stats.features import numeric_feature
from dataguard.stats.psi import psi_categorical
from dataguard.stats.repeat import multiplicity


def _long_tail_skewed(train: pa.Table) -> pa.Table:
    """banking77 train cut to a long tail (class i keeps ~60 * 0.95^i rows, at least 2), then
    85% of its longer half dropped (seeded): a length shift on data with rare classes, the
    case where unstratified resampling lost classes."""
    labels = np.array(train.column("label").to_pylist())
    classes = sorted(set(labels.tolist()))
    rng = np.random.default_rng(0)
    keep = np.zeros(len(labels), dtype=bool)
    for i, c in enumerate(classes):
        rows = np.flatnonzero(labels == c)
        keep[rng.permutation(rows)[:max(2, int(60 * 0.95 ** i))]] = True
    tail = train.filter(pa.array(keep))
    n = numeric_feature(tail, "prompt_chars")
    return tail.filter(pa.array((n <= np.median(n)) | (rng.random(n.size) < 0.15)))


def _run(stage: DriftStage, table: pa.Table, batch: int = 300):
    parts = [table.slice(i, batch) for i in range(0, table.num_rows, batch)]
    stage.fit([stage.summarize(p) for p in parts])
    outs = [stage.apply(p) for p in parts]
    stage.absorb([o.stats for o in outs])
    return pa.concat_tables([o.kept for o in outs]), pa.concat_tables([o.rejected for o in outs])


def _uses(kept: pa.Table) -> Counter:
    """Label -> rows a training run draws (repeat counts)."""
    out: Counter = Counter()
    for label, r in zip(kept.column("label").to_pylist(), multiplicity(kept).tolist(), strict=True):
        out[label] += r
    return out


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_stratified_resample_keeps_labels_and_every_class(banking77_splits, seed: int) -> None:
    train = _long_tail_skewed(banking77_splits["train"])
    before = Counter(train.column("label").to_pylist())
    assert len(before) > 70 and min(before.values()) == 1  # classes with a single row
    st = DriftStage(reference=banking77_splits["test"], columns=["prompt_chars"], text=False, correct="resample",
                    target="prompt_chars", seed=seed)
    kept, rejected = _run(st, train)
    # nothing lost: kept + rejected = input, once each
    assert sorted(kept.column("id").to_pylist() + rejected.column("id").to_pylist()) == \
        sorted(train.column("id").to_pylist())
    assert rejected.num_rows > 100  # a real correction happened
    after = _uses(kept)
    # the bound: label PSI (training labels before vs what the run draws after) < 0.03, about
    # 2x the sampling noise of ~800 draws over ~72 classes; unstratified draws give > 0.1
    assert psi_categorical(before, after) < 0.03
    assert set(after) == set(before)  # no class lost
    # the targeted column still moves from major to stable
    assert st.fitted.results["prompt_chars"]["verdict"] == "major" and st.psi_after()["prompt_chars"] < 0.1
    report = st.describe()["summary"]["label_psi"]
    assert report["classes_before"] == report["classes_after"] == len(before) and report["classes_lost"] == []
    assert report["psi_after_vs_before"] == pytest.approx(psi_categorical(before, after), abs=1e-6)
    assert st.describe()["summary"]["stratified_by"] == "label"


def test_unstratified_resample_is_what_lost_classes(banking77_splits) -> None:
    """label_column: null resamples as before the fix: on the same data it moves the labels
    and drops classes, which is what the strata prevent (the contrast keeps the test honest)."""
    train = _long_tail_skewed(banking77_splits["train"])
    before = Counter(train.column("label").to_pylist())
    lost, psis = 0, []
    for seed in range(4):
        st = DriftStage(reference=banking77_splits["test"], columns=["prompt_chars"], text=False, correct="resample",
                        target="prompt_chars", label_column=None, seed=seed)
        kept, _ = _run(st, train)
        after = _uses(kept)
        psis.append(psi_categorical(before, after))
        lost += len(set(before) - set(after))
        assert st.label_psi() is None and st.describe()["summary"]["stratified_by"] is None
    assert min(psis) > 0.1 and lost >= 1


def test_strata_are_deterministic_and_independent_of_batching(banking77_splits) -> None:
    train = _long_tail_skewed(banking77_splits["train"])
    kwargs = {"reference": banking77_splits["test"], "columns": ["prompt_chars"], "text": False, "correct": "resample",
              "target": "prompt_chars", "seed": 5}
    a, ra = _run(DriftStage(**kwargs), train, batch=97)
    b, rb = _run(DriftStage(**kwargs), train, batch=100_000)
    assert a.equals(b) and ra.equals(rb)


def test_stratified_on_full_train_and_label_target_is_not_stratified(banking77_splits) -> None:
    short = _long_tail_skewed(banking77_splits["train"])
    # correcting the label column itself is a label shift on purpose: no rescale by class
    st = DriftStage(reference=banking77_splits["test"], columns=[], categorical=["label"], text=False, correct="resample")
    _run(st, short)
    assert st.fitted.correction.column == "label" and not st.fitted.correction.scales
    assert st.psi_after()["label"] < st.fitted.results["label"]["psi"]
    assert st.describe()["summary"]["label_psi"]["classes_lost"] == []  # keepers still apply


def test_label_column_errors_name_the_parameter(banking77_splits) -> None:
    with pytest.raises(StageConfigError, match="label_column") as err:
        DriftStage(reference=banking77_splits["test"], text=False, label_column="")
    assert err.value.param == "label_column"
    st = DriftStage(reference=banking77_splits["test"], text=False, correct="resample", label_column="intent")
    with pytest.raises(StageConfigError, match="label_column 'intent' is not in the data"):
        st.summarize(banking77_splits["train"].slice(0, 10))
