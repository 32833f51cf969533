"""DriftStage on real splits: expected verdicts, correction, nothing lost, determinism."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from dataguard.records import canonical_table
from dataguard.stage import StageConfigError
from dataguard.stages.drift import DriftStage
from dataguard.stats.features import numeric_feature


@pytest.fixture(scope="module")
def clinc(real_data) -> pa.Table:
    rows = json.loads((real_data / "clinc150" / "data_full.test.json").read_text())["test"]
    return canonical_table([{"id": f"clinc:{i}", "source": "clinc", "label": intent,
                             "messages": [{"role": "user", "content": text}]} for i, (text, intent) in enumerate(rows)])


def _run(stage: DriftStage, table: pa.Table, batch: int = 2500):
    parts = [table.slice(i, batch) for i in range(0, table.num_rows, batch)] or [table]
    stage.fit([stage.summarize(p) for p in parts])
    outs = [stage.apply(p) for p in parts]
    stage.absorb([o.stats for o in outs])
    return pa.concat_tables([o.kept for o in outs]), pa.concat_tables([o.rejected for o in outs])


def _split_by_length(table: pa.Table) -> tuple[pa.Table, pa.Table]:
    n = numeric_feature(table, "prompt_chars")
    short = pa.array(n <= np.median(n))
    return table.filter(short), table.filter(pc.invert(short))


@pytest.mark.slow
def test_banking77_train_vs_test_is_stable_and_text_is_indistinguishable(banking77_splits, clinc) -> None:
    st = DriftStage(reference=banking77_splits["test"], columns=["prompt_chars", "prompt_words"], text=True,
                    text_sample=250)
    _run(st, banking77_splits["train"])
    for col in ("prompt_chars", "prompt_words", "label"):
        assert st.fitted.results[col]["verdict"] == "stable", (col, st.fitted.results[col])
    assert st.fitted.results["label"]["psi"] == pytest.approx(0.0748, abs=1e-3)
    assert st.fitted.samples.text_auc is not None and st.fitted.samples.text_auc < 0.6 and st.text_verdict() == "stable"
    # a different domain (CLINC150 vs banking77): the text classifier separates them easily (the
    # reference sample is a prefix of the one above - same seed, smaller k - so it is not re-embedded)
    other = DriftStage(reference=banking77_splits["test"], columns=[], categorical=[], text=True, text_sample=100)
    _run(other, clinc)
    assert other.fitted.samples.text_auc > 0.9 and other.text_verdict() == "major"
    # the MMD test on the same embeddings agrees with the classifier on both pairs
    assert st.fitted.samples.mmd["text"]["verdict"] == "stable" and other.fitted.samples.mmd["text"]["verdict"] == "major"
    assert other.fitted.samples.mmd["text"]["mmd2"] > 10 * st.fitted.samples.mmd["text"]["mmd2"]
    d = st.describe()
    json.dumps(d)
    assert d["summary"]["columns_major"] == 0 and d["summary"]["text_verdict"] == "stable"


def test_short_vs_long_is_major_and_label_set_shift_is_major(banking77_splits, clinc) -> None:
    short, long_ = _split_by_length(banking77_splits["test"])
    st = DriftStage(reference=long_, columns=["prompt_chars", "prompt_words"], text=False)
    _run(st, short)
    assert st.fitted.results["prompt_chars"]["verdict"] == "major" and st.fitted.results["prompt_chars"]["psi"] > 2
    assert st.fitted.results["prompt_words"]["verdict"] == "major"
    # disjoint label sets: every category is epsilon on one side
    st2 = DriftStage(reference=banking77_splits["test"], columns=[], categorical=["label"], text=False, correct="resample")
    kept, rejected = _run(st2, clinc)
    assert st2.fitted.results["label"]["verdict"] == "major"
    # no training row has a reference label: correction is refused instead of dropping everything
    assert rejected.num_rows == 0 and kept.num_rows == clinc.num_rows
    assert "skipped" in st2.fitted.correction.note and st2.describe()["summary"]["corrected_column"] is None


def _skewed(train: pa.Table) -> pa.Table:
    """banking77 train with 85% of its longer half dropped (seeded): a real length shift."""
    n = numeric_feature(train, "prompt_chars")
    rng = np.random.default_rng(0)
    keep = (n <= np.median(n)) | (rng.random(n.size) < 0.15)
    return train.filter(pa.array(keep))


def test_resampling_lowers_the_targeted_psi_and_loses_nothing(banking77_splits) -> None:
    train = _skewed(banking77_splits["train"])
    st = DriftStage(reference=banking77_splits["test"], columns=["prompt_chars"], text=False, correct="resample", seed=3)
    kept, rejected = _run(st, train)
    before = st.fitted.results["prompt_chars"]["psi"]
    after = st.psi_after()["prompt_chars"]
    assert st.fitted.results["prompt_chars"]["verdict"] == "major"
    assert after < 0.1 < 0.25 <= before
    # nothing lost, nothing duplicated: kept + rejected = input; kept rows carry repeat >= 1
    ids = kept.column("id").to_pylist()
    rej = rejected.column("id").to_pylist()
    assert sorted(ids + rej) == sorted(train.column("id").to_pylist())
    assert set(rejected.column("reason").to_pylist()) == {"drift_resampled_out"}
    reps = kept.column("repeat").to_numpy()
    assert reps.min() >= 1 and reps.max() > 1
    # PSI after is the PSI of what was emitted (rows counted `repeat` times), recomputed independently
    check = DriftStage(reference=banking77_splits["test"], columns=["prompt_chars"], categorical=[], text=False)
    _run(check, kept)
    assert check.fitted.results["prompt_chars"]["psi"] == pytest.approx(after, rel=1e-9)
    # deterministic, independent of batching
    kept2, _ = _run(DriftStage(reference=banking77_splits["test"], columns=["prompt_chars"], text=False,
                               correct="resample", seed=3), train, batch=100_000)
    assert kept2.equals(kept)
    d = st.describe()
    assert d["summary"]["rows_resampled_out"] == len(rej)
    table = next(b for b in d["blocks"] if b["type"] == "table")
    row = dict(zip(table["columns"], next(r for r in table["rows"] if r[0] == "prompt_chars"), strict=True))
    assert row["verdict"] == "major" and row["verdict_after"] == "stable" and row["corrected"] is True


def test_importance_weights_bring_weighted_psi_to_about_zero(banking77_splits) -> None:
    train = _skewed(banking77_splits["train"])
    st = DriftStage(reference=banking77_splits["test"], columns=["prompt_chars", "prompt_words"], text=False,
                    correct="importance_weights", max_weight=50)
    kept, rejected = _run(st, train)
    assert rejected.num_rows == 0 and kept.num_rows == train.num_rows
    w = kept.column("drift_weight").to_numpy()
    assert w.min() < 1 < w.max()
    assert st.fitted.results["prompt_chars"]["psi"] >= 0.25
    assert st.psi_after()["prompt_chars"] < 1e-3
    # one column is corrected (the worst); the correlated one moves toward the reference too
    assert st.describe()["summary"]["corrected_column"] == "prompt_chars"
    assert st.psi_after()["prompt_words"] < st.fitted.results["prompt_words"]["psi"]
    words = DriftStage(reference=banking77_splits["test"], columns=["prompt_chars", "prompt_words"], text=False,
                       correct="importance_weights", target="prompt_words", max_weight=50)
    _run(words, train)
    assert words.fitted.correction.column == "prompt_words" and words.psi_after()["prompt_words"] < 1e-3


def test_no_correction_when_stable_and_empty_batch_schema(banking77_splits) -> None:
    st = DriftStage(reference=banking77_splits["test"], text=False, correct="resample")
    kept, rejected = _run(st, banking77_splits["train"])
    assert rejected.num_rows == 0 and kept.num_rows == banking77_splits["train"].num_rows
    assert pc.all(pc.equal(kept.column("drift_weight"), 1.0)).as_py()
    empty = st.apply(banking77_splits["train"].slice(0, 0))
    assert empty.kept.schema == kept.schema
    clone = pickle.loads(pickle.dumps(st))
    assert clone.apply(banking77_splits["train"].slice(0, 50)).kept.equals(st.apply(banking77_splits["train"].slice(0, 50)).kept)


def test_reference_from_csv_path_and_config_errors(real_data, tmp_path) -> None:
    path = tmp_path / "ref.jsonl"
    path.write_text("\n".join(json.dumps({"text": f"hello {i}", "label": "x"}) for i in range(20)) + "\n")
    st = DriftStage(reference=str(path), text=False)
    assert st.ref.rows == 20
    with pytest.raises(StageConfigError, match="reference"):
        DriftStage(reference=str(tmp_path / "missing.jsonl"))
    with pytest.raises(StageConfigError, match="columns"):  # found when the reference is read
        DriftStage(reference=str(path), columns=["n_tokens"], text=False).prepare()
    for kwargs, param in [({"bins": 1}, "bins"), ({"thresholds": (0.3, 0.1)}, "thresholds"),
                          ({"correct": "magic"}, "correct"), ({"epsilon": 0}, "epsilon"),
                          ({"text": "body"}, "text"), ({"target": "nope"}, "target"), ({"auc_thresholds": (0.4, 0.8)}, "auc_thresholds")]:
        with pytest.raises(StageConfigError, match=param):
            DriftStage(reference=str(path), **kwargs)


def test_weight_column_measures_the_weighted_training_distribution(banking77_splits) -> None:
    from dataguard.stages.longtail import LongTailStage

    lt = LongTailStage(weighting="inverse")
    lt.fit([lt.summarize(banking77_splits["train"])])
    weighted = lt.apply(banking77_splits["train"]).kept
    plain = DriftStage(reference=banking77_splits["test"], columns=["prompt_chars"], text=False)
    _run(plain, weighted)
    st = DriftStage(reference=banking77_splits["test"], columns=["prompt_chars"], text=False, weight_column="sample_weight")
    _run(st, weighted)
    # inverse-frequency weights give every class the same mass, like the balanced test split
    assert plain.fitted.results["label"]["psi"] > 0.05
    assert st.fitted.results["label"]["psi"] < 1e-6
    assert st.describe()["summary"]["weight_column"] == "sample_weight"
    with pytest.raises(StageConfigError, match="sample_weight"):
        st.summarize(banking77_splits["train"])


def test_reference_is_read_in_prepare_not_in_init(tmp_path) -> None:
    """Config validation builds stages; it must not read a reference dataset. The run reads
    it first thing, and a bad one stops the run before the output folder is touched."""
    from dataguard.pipeline import Pipeline, PipelineError

    bad = tmp_path / "ref.jsonl"
    bad.write_text("not json at all\n")
    st = DriftStage(reference=str(bad), text=False)  # exists: fine until it is read
    assert "ref" not in st.__dict__
    with pytest.raises(StageConfigError, match="reference"):
        st.prepare()
    data = Path(__file__).resolve().parent.parent / "sample_data" / "alpaca_en_demo.json"
    with pytest.raises(PipelineError, match="stage drift: reference"):
        Pipeline([DriftStage(reference=str(bad), text=False)], workers=1).run([str(data)], tmp_path / "out")
    assert not (tmp_path / "out").exists()
