"""LongTailStage and the logit-adjustment helpers."""

from __future__ import annotations

import json
import math
import pickle
from collections import Counter

import numpy as np
import pyarrow as pa
import pytest

from dataguard.records import canonical_table
from dataguard.stage import StageConfigError
from dataguard.stages.longtail import LongTailStage
from dataguard.stats.logit_adjust import logit_adjusted_loss, logit_adjusted_loss_torch, posthoc_adjust
from dataguard.stats.reweighting import curriculum_phases, effective_number_weights

COUNTS = {"a": 50, "b": 30, "c": 10, "d": 5, "e": 5}


def _table(counts: dict[str, int], unlabelled: int = 0) -> pa.Table:
    labels = [c for c, n in counts.items() for _ in range(n)] + [None] * unlabelled
    order = np.random.default_rng(1).permutation(len(labels))  # interleave classes
    return canonical_table([{"id": f"s:{i}", "source": "s", "label": labels[j],
                             "messages": [{"role": "user", "content": f"text {i}"}]}
                            for i, j in enumerate(order)])


def _run(stage: LongTailStage, table: pa.Table, batch: int = 37):
    parts = [table.slice(i, batch) for i in range(0, table.num_rows, batch)]
    stage.fit([stage.summarize(p) for p in parts])
    outs = [stage.apply(p) for p in parts]
    stage.absorb([o.stats for o in outs])
    return (pa.concat_tables([o.kept for o in outs]), pa.concat_tables([o.rejected for o in outs]))


def test_priors_offsets_and_inverse_weights() -> None:
    st = LongTailStage(tau=0.5)
    kept, rejected = _run(st, _table(COUNTS, unlabelled=3))
    state = st.training_state()
    assert state["classes"] == ["a", "b", "c", "d", "e"]
    np.testing.assert_allclose(state["priors"], [0.5, 0.3, 0.1, 0.05, 0.05])
    np.testing.assert_allclose(state["logit_offsets"], 0.5 * np.log([0.5, 0.3, 0.1, 0.05, 0.05]))
    # inverse frequency, mean row weight 1: w_c = N / (K n_c)
    np.testing.assert_allclose(state["class_weights"], [100 / (5 * n) for n in COUNTS.values()])
    assert rejected.num_rows == 0 and kept.num_rows == 103
    w = dict(zip(kept.column("label").to_pylist(), kept.column("sample_weight").to_pylist(), strict=True))
    assert w["a"] == pytest.approx(0.4) and w["e"] == pytest.approx(4.0) and w[None] == 1.0
    assert kept.schema.field("sample_weight").type == pa.float32()
    assert kept.schema.field("curriculum_phase").type == pa.int8()


def test_effective_number_weights_follow_cui_et_al() -> None:
    n = np.array([50.0, 30, 10, 5, 5])
    beta = 0.99
    raw = (1 - beta) / (1 - beta ** n)
    expected = raw * n.sum() / (raw * n).sum()
    np.testing.assert_allclose(effective_number_weights(n, beta), expected)
    st = LongTailStage(weighting="effective_number", beta=beta)
    _run(st, _table(COUNTS))
    np.testing.assert_allclose(st.training_state()["class_weights"], expected)
    # less extreme than inverse frequency, but still favouring the tail
    inv = n.sum() / (len(n) * n)
    assert expected[-1] / expected[0] < inv[-1] / inv[0] and expected[-1] > expected[0]


def test_curriculum_phases_and_multipliers() -> None:
    # by classes: first ceil(50%) = 3 classes | first ceil(80%) = 4 | all 5
    np.testing.assert_array_equal(curriculum_phases([50, 30, 10, 5, 5], (0.5, 0.8)), [1, 1, 1, 2, 3])
    np.testing.assert_array_equal(curriculum_phases([50, 30, 10, 5, 5], (0.2, 0.4)), [1, 2, 3, 3, 3])
    # phase 1 is the head: of the first half only classes with >= 1% of the rows (at least one)
    np.testing.assert_array_equal(curriculum_phases([1000] + [5] * 9, (0.5, 0.8)), [1] + [2] * 7 + [3] * 2)
    np.testing.assert_array_equal(curriculum_phases([10] * 4, (0.5, 0.8), head_share=0.3), [1, 2, 2, 2])
    # a steep tail (imbalance 100 over 77 classes, as in benchmarks/bench_train.py): the head
    # by share >= 1% is 30 classes, not the 11 that cover half the rows
    n = np.round(100 * 100 ** (-np.arange(77) / 76))
    assert np.bincount(curriculum_phases(n, (0.5, 0.8)), minlength=4)[1:].tolist() == [30, 32, 15]
    st = LongTailStage(tail_boost=3.0)
    kept, _ = _run(st, _table(COUNTS))
    phase = dict(zip(kept.column("label").to_pylist(), kept.column("curriculum_phase").to_pylist(), strict=True))
    assert phase == {"a": 1, "b": 1, "c": 1, "d": 2, "e": 3}
    cur = st.training_state()["curriculum"]
    assert cur["phase_classes"] == [["a", "b", "c"], ["d"], ["e"]]
    assert cur["phase_multipliers"] == [[1, 1, 1, 0, 0], [1, 1, 1, 1, 0], [1, 1, 1, 1, 3]]
    # the schedule the runner reads: when each phase ends, in which unit
    assert (cur["boundaries"], cur["unit"], cur["class_fractions"]) == ([0.25, 0.5], "steps", [0.5, 0.8])
    custom = LongTailStage(schedule=(0.4, 0.7), schedule_unit="epochs")
    _run(custom, _table(COUNTS))
    assert custom.training_state()["curriculum"]["boundaries"] == [0.4, 0.7]
    assert custom.training_state()["curriculum"]["unit"] == "epochs"


def test_balanced_resampling_loses_nothing_and_is_deterministic() -> None:
    table = _table(COUNTS, unlabelled=2)
    st = LongTailStage(resample="balanced", seed=7)
    kept, rejected = _run(st, table)
    ids = kept.column("id").to_pylist()
    # nothing lost, nothing duplicated: every input row is kept once or rejected once
    assert kept.num_rows + rejected.num_rows == table.num_rows
    assert sorted(ids + rejected.column("id").to_pylist()) == sorted(table.column("id").to_pylist())
    assert set(rejected.column("reason").to_pylist()) == {"resampled_out"}
    assert "0.4000 expected uses" in rejected.column("detail")[0].as_py()  # head class a: 20 / 50
    reps = kept.column("repeat").to_numpy()
    assert kept.schema.field("repeat").type == pa.int32() and reps.min() >= 1
    after = Counter()
    for label, r in zip(kept.column("label").to_pylist(), reps.tolist(), strict=True):
        after[label] += r
    assert after[None] == 2
    for c in COUNTS:  # target 20 uses each (binomial noise from row-local decisions)
        assert 10 <= after[c] <= 30, (c, after[c])
    # tail classes (5 rows, factor 4) are kept whole, each row used 4 times
    assert set(r for label, r in zip(kept.column("label").to_pylist(), reps.tolist(), strict=True)
               if label in ("d", "e")) == {4}
    d = st.describe()["summary"]
    assert d["imbalance_ratio_after"] < 3 < d["imbalance_ratio_before"]
    assert d["rows_resampled_out"] == rejected.num_rows and d["rows_repeated"] > 0
    # inverse weights on the balanced distribution are all 1: no double correction
    np.testing.assert_allclose(st.training_state()["class_weights"], 1.0)
    # same rows whatever the batching; same bytes on a second run; another seed differs
    kept2, rejected2 = _run(LongTailStage(resample="balanced", seed=7), table, batch=1000)
    assert kept2.equals(kept) and rejected2.equals(rejected)
    kept3, _ = _run(LongTailStage(resample="balanced", seed=8), table)
    assert kept3.column("id").to_pylist() != ids


def test_incoming_repeat_counts_and_multiplies() -> None:
    table = _table({"a": 10, "b": 10})
    labels = table.column("label").to_pylist()
    table = table.append_column("repeat", pa.array([3 if x == "a" else 1 for x in labels], pa.int32()))
    st = LongTailStage(resample="balanced")
    assert st.summarize(table) == Counter({"a": 30, "b": 10})
    kept, _ = _run(st, table)
    assert kept.column_names.count("repeat") == 1
    # balanced on effective counts: a rows (3 uses each) keep ~2 uses, b rows get 2 uses
    assert st.training_state()["counts"] == [30, 10]
    np.testing.assert_allclose(st.factors, [20 / 30, 2.0])
    b_reps = [r for x, r in zip(kept.column("label").to_pylist(), kept.column("repeat").to_pylist(), strict=True)
              if x == "b"]
    assert b_reps == [2] * 10


def test_resample_to_explicit_target() -> None:
    st = LongTailStage(resample={"a": 1, "b": 1, "c": 0, "d": 0, "e": 0})
    kept, rejected = _run(st, _table(COUNTS))
    assert set(kept.column("label").to_pylist()) == {"a", "b"}
    assert kept.num_rows + rejected.num_rows == 100
    np.testing.assert_allclose(st.training_state()["priors"], [0.5, 0.5, 0, 0, 0])
    with pytest.raises(StageConfigError, match="resample"):
        _run(LongTailStage(resample={"zzz": 1}), _table(COUNTS))


def test_empty_batch_has_same_columns_and_pickle_roundtrip() -> None:
    table = _table(COUNTS)
    st = LongTailStage(resample="balanced")
    st.fit([st.summarize(table)])
    clone = pickle.loads(pickle.dumps(st))
    full = st.apply(table)
    assert clone.apply(table).kept.equals(full.kept)
    empty = st.apply(table.slice(0, 0))
    assert empty.kept.num_rows == 0 and empty.kept.schema == full.kept.schema
    assert st.output_columns() == {"sample_weight": pa.float32(), "curriculum_phase": pa.int8(), "repeat": pa.int32()}
    assert "repeat" not in LongTailStage().output_columns()


@pytest.mark.parametrize("kwargs, param", [
    ({"tau": -1}, "tau"), ({"weighting": "sqrt"}, "weighting"), ({"beta": 1.0}, "beta"),
    ({"resample": "up"}, "resample"), ({"resample": {"a": -1}}, "resample"),
    ({"phases": (0.8, 0.5)}, "phases"), ({"phases": (0.5, 1.2)}, "phases"),
    ({"head_share": 1.0}, "head_share"), ({"schedule": (0.5, 0.4)}, "schedule"),
    ({"schedule": (0.5,)}, "schedule"), ({"schedule_unit": "days"}, "schedule_unit"),
    ({"tail_boost": 0}, "tail_boost"), ({"seed": "x"}, "seed"), ({"label_column": ""}, "label_column"),
])
def test_config_errors_name_the_parameter(kwargs: dict, param: str) -> None:
    with pytest.raises(StageConfigError, match=param):
        LongTailStage(**kwargs)


def test_real_banking77_describe_is_json_and_small(real_data) -> None:
    import csv

    with open(real_data / "banking77" / "train.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    table = canonical_table([{"id": f"b:{i}", "source": "b", "label": r["category"],
                              "messages": [{"role": "user", "content": r["text"]}]} for i, r in enumerate(rows)])
    st = LongTailStage(weighting="effective_number")
    _run(st, table, batch=4000)
    d = st.describe()
    assert d["summary"]["classes"] == 77 and d["summary"]["rows"] == 10003
    assert d["summary"]["imbalance_ratio_before"] == pytest.approx(187 / 35)
    assert len(json.dumps(d)) < 50_000
    state = st.training_state()
    json.dumps(state)
    phases = Counter(state["curriculum"]["class_phase"])
    # banking77 is nearly balanced (every class > 1%): phases follow the class fractions
    assert (phases[1], phases[2], phases[3]) == (39, 23, 15)
    assert math.isclose(sum(state["priors"]), 1.0)


# ---------------------------------------------------------------- logit adjustment helpers
def test_posthoc_adjust_subtracts_tau_log_prior() -> None:
    logits = np.array([[2.0, 1.5], [0.0, 0.0]])
    priors = [0.9, 0.1]
    adj = posthoc_adjust(logits, priors, tau=1.0)
    np.testing.assert_allclose(adj, logits - np.log(priors))
    assert adj[0].argmax() == 1  # the tail class wins once its prior is discounted
    np.testing.assert_allclose(posthoc_adjust(logits, priors, tau=0.0), logits)


def test_logit_adjusted_loss_numpy_matches_torch_and_reduces_to_ce() -> None:
    import torch

    rng = np.random.default_rng(0)
    logits = rng.normal(size=(8, 4))
    labels = rng.integers(0, 4, size=8)
    priors = np.array([0.6, 0.25, 0.1, 0.05])
    w = rng.uniform(0.5, 2, size=8)
    ref = logit_adjusted_loss(logits, labels, priors, tau=1.0, sample_weight=w)
    got = logit_adjusted_loss_torch(torch.tensor(logits), torch.tensor(labels), priors, 1.0, torch.tensor(w))
    assert float(got) == pytest.approx(ref, rel=1e-12)
    ce = torch.nn.functional.cross_entropy(torch.tensor(logits), torch.tensor(labels))
    assert logit_adjusted_loss(logits, labels, priors, tau=0.0) == pytest.approx(float(ce), rel=1e-12)


def test_posthoc_adjustment_raises_balanced_accuracy_on_imbalanced_data() -> None:
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import balanced_accuracy_score

    rng = np.random.default_rng(0)
    n = np.array([2000, 200, 20])
    means = np.array([[0.0, 0.0], [1.5, 0.0], [0.0, 1.5]])
    x = np.vstack([rng.normal(means[c], 1.0, size=(k, 2)) for c, k in enumerate(n)])
    y = np.repeat(np.arange(3), n)
    xt = np.vstack([rng.normal(means[c], 1.0, size=(1000, 2)) for c in range(3)])
    yt = np.repeat(np.arange(3), 1000)
    clf = LogisticRegression(max_iter=1000).fit(x, y)
    plain = balanced_accuracy_score(yt, clf.decision_function(xt).argmax(1))
    adjusted = balanced_accuracy_score(yt, posthoc_adjust(clf.decision_function(xt), n / n.sum()).argmax(1))
    assert adjusted > plain + 0.05
