"""NoiseStage options on real data: logits in, the seeds' confidence rule, iterative
re-estimation, the flag budget and ``features: auto``.

20 Newsgroups: cleanlab's published out-of-sample probabilities (7,532 rows, 82 confirmed
label errors) and the first 600 full posts; banking77: 8 intents with seeded noise.
TF-IDF only, except the one ``auto`` test on short intents (MiniLM, marked slow).
"""

from __future__ import annotations

import csv
import gzip
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from cleanlab.filter import find_label_issues

from dataguard.records import canonical_table
from dataguard.stage import StageConfigError
from dataguard.stages.noise.confident import limit_flags
from dataguard.stages.noise.crossval import _cv_probs, refit_probs
from dataguard.stages.noise.knn import knn_probs
from dataguard.stages.noise.probs import softmax, to_probabilities
from dataguard.stages.noise.stage import NoiseStage
from dataguard.testing.noise import inject_class_conditional_noise
from dataguard.text.features import AUTO_MAX_WORDS, choose_features, tfidf_features, word_count

N_CLASSES = 8


def _run(stage: NoiseStage, table: pa.Table, batch: int = 2000) -> tuple[pa.Table, pa.Table]:
    parts = [table.slice(i, batch) for i in range(0, table.num_rows, batch)] or [table]
    stage.fit([stage.summarize(p) for p in parts])
    outs = [stage.apply(p) for p in parts]
    stage.absorb([o.stats for o in outs])
    return pa.concat_tables([o.kept for o in outs]), pa.concat_tables([o.rejected for o in outs])


def _mask(table: pa.Table) -> np.ndarray:
    return np.asarray(table.column("is_label_issue").to_pylist(), dtype=bool)


def _with_matrix(table: pa.Table, name: str, matrix: np.ndarray) -> pa.Table:
    return table.append_column(name, pa.array(list(matrix), pa.list_(pa.float64())))


@pytest.fixture(scope="module")
def news(real_data: Path):
    d = real_data / "20news_label_errors"
    with gzip.open(d / "20news_test_texts.text200.jsonl.gz", "rt") as f:
        rows = [json.loads(line) for line in f]
    errors = {r["id"] for r in json.loads((d / "20news_mturk.json").read_text()) if r["mturk"]["given"] < 3}
    table = canonical_table([{"id": f"20news:{r['index']}", "source": "20news",
                              "messages": [{"role": "user", "content": r["text"]}], "label": r["label_name"]}
                             for r in rows])
    return {"table": table, "labels": np.array([r["label"] for r in rows]), "errors": errors,
            "pyx": np.load(d / "20news_test_set_pyx.npy")}


@pytest.fixture(scope="module")
def banking(real_data: Path):
    with open(real_data / "banking77" / "train.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    classes = sorted({r["category"] for r in rows})[:N_CLASSES]
    rows = [r for r in rows if r["category"] in classes]
    true = np.array([classes.index(r["category"]) for r in rows])
    noisy, flipped = inject_class_conditional_noise(true, 0.10, N_CLASSES, seed=0)
    table = canonical_table([{"id": f"b:{i}", "source": "b", "messages": [{"role": "user", "content": r["text"]}],
                              "label": classes[noisy[i]]} for i, r in enumerate(rows)])
    return {"table": table, "classes": classes, "noisy": noisy, "flipped": flipped}


# -- logits in ---------------------------------------------------------------------------
def test_softmax_is_stable_and_tempered():
    z = np.array([[1e4, 1e4 - 1.0, -1e4], [0.0, 0.0, 0.0], [-800.0, -801.0, -802.0]])
    p = softmax(z)
    assert np.isfinite(p).all() and np.allclose(p.sum(axis=1), 1.0)
    e = np.exp([0.0, -1.0])
    assert np.allclose(p[0, :2], e / e.sum()) and p[0, 2] == 0.0
    assert np.allclose(p[1], 1 / 3) and np.allclose(p[2], p[0] * 0 + softmax(np.array([[0.0, -1.0, -2.0]]))[0])
    hot = softmax(np.array([[2.0, 0.0]]), temperature=2.0)  # T=2 halves the logit gap
    assert np.allclose(hot, softmax(np.array([[1.0, 0.0]])))


def test_logits_column_gives_the_published_verdicts(news):
    """log(p) + an arbitrary per-row shift are logits of p: same 95 flags, same 55 confirmed errors."""
    pyx = news["pyx"]
    shift = np.random.default_rng(0).normal(0, 50, size=(len(pyx), 1))
    logits = np.log(np.clip(pyx, 1e-300, None)) + shift
    table = _with_matrix(news["table"], "z", logits)
    stage = NoiseStage(probabilities="z", inputs="logits", min_rows_per_class=0)
    kept, _ = _run(stage, table)
    mask = _mask(kept)
    assert np.array_equal(mask, find_label_issues(news["labels"], pyx, filter_by="prune_by_noise_rate"))
    assert mask.sum() == 95 and len(news["errors"] & set(np.flatnonzero(mask).tolist())) == 55
    assert stage.describe()["summary"]["inputs"] == "logits (softmax, temperature 1)"
    # temperature 2 flattens the distribution: p ~ sqrt(pyx), renormalised
    warm = NoiseStage(probabilities="z", inputs="logits", temperature=2.0, min_rows_per_class=0)
    _run(warm, table)
    expected = np.sqrt(pyx) / np.sqrt(pyx).sum(axis=1, keepdims=True)
    assert np.allclose(warm.oof_probs, expected, atol=1e-9)


def test_logits_handed_in_as_probabilities_are_refused(news, tmp_path):
    pyx = news["pyx"][:400]
    table = news["table"].slice(0, 400)
    logits = np.log(np.clip(pyx, 1e-12, None))
    with pytest.raises(StageConfigError, match=r"probabilities: 400 of 400 labelled rows are not probabilities"
                                               r".*set inputs: logits") as exc:
        _run(NoiseStage(probabilities="z"), _with_matrix(table, "z", logits))
    assert exc.value.param == "probabilities"
    doubled = pyx * 2  # non-negative but summing to 2
    np.save(tmp_path / "p.npy", doubled)
    with pytest.raises(StageConfigError, match="row 0: min 0, sum 2"):
        _run(NoiseStage(probabilities=str(tmp_path / "p.npy")), table)
    bad = pyx.copy()
    bad[7, 3] = np.nan
    with pytest.raises(StageConfigError, match="row 7 .* NaN"):
        _run(NoiseStage(probabilities="z", inputs="logits"), _with_matrix(table, "z", bad))
    # float16-rounded probabilities are still probabilities
    assert np.array_equal(to_probabilities(pyx.astype(np.float16)), pyx.astype(np.float16).astype(np.float64))


# -- the seeds' rule ---------------------------------------------------------------------
def test_confidence_rule_flags_confident_disagreements(news, pyx_file):
    pyx = news["pyx"]
    stage = NoiseStage(probabilities=pyx_file, method="confidence", threshold=0.8,
                       min_rows_per_class=0, action="drop")
    kept, rejected = _run(stage, news["table"])
    y = news["labels"]
    expected = (pyx.max(axis=1) > 0.8) & (pyx.argmax(axis=1) != y)
    flagged = np.zeros(len(y), bool)
    flagged[[int(i.split(":")[1]) for i in rejected.column("id").to_pylist()]] = True
    assert np.array_equal(flagged, expected)
    assert kept.num_rows + rejected.num_rows == news["table"].num_rows
    assert "max p > 0.8 on another class" in rejected.column("detail")[0].as_py()
    assert stage.describe()["summary"]["threshold"] == 0.8
    # on these probabilities it is a stricter rule than confident learning: fewer flags, fewer errors found
    found = len(news["errors"] & set(np.flatnonzero(flagged).tolist()))
    assert 0 < flagged.sum() < 95 and 0 < found < 55


@pytest.fixture(scope="module")
def pyx_file(news, tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("pyx") / "pyx.npy"
    np.save(path, news["pyx"])
    return str(path)


# -- the flag budget ---------------------------------------------------------------------
def test_limit_flags_keeps_worst_and_breaks_ties_by_row_order():
    issue = np.array([1, 1, 0, 1, 1, 1], bool)
    quality = np.array([0.2, 0.1, 0.0, 0.2, 0.2, 0.05], np.float32)
    assert np.flatnonzero(limit_flags(issue, quality, 3)).tolist() == [0, 1, 5]
    assert np.flatnonzero(limit_flags(issue, quality, 4)).tolist() == [0, 1, 3, 5]
    assert limit_flags(issue, quality, 0).sum() == 0
    assert np.array_equal(limit_flags(issue, quality, 10), issue)


@pytest.mark.parametrize("max_flagged, allowed", [(40, 40), (0.005, 38), (500, 500)])
def test_budget_keeps_the_worst_flagged_rows(news, pyx_file, max_flagged, allowed):
    path = pyx_file
    full = NoiseStage(probabilities=path, min_rows_per_class=0)
    base, _ = _run(full, news["table"])
    capped = NoiseStage(probabilities=path, min_rows_per_class=0, max_flagged=max_flagged, action="drop")
    kept, rejected = _run(capped, news["table"])
    assert kept.num_rows + rejected.num_rows == news["table"].num_rows
    n_flags = min(allowed, 95)
    assert rejected.num_rows == n_flags
    q = np.asarray(base.column("label_quality").to_pylist())
    rows = np.flatnonzero(_mask(base))
    worst = set(rows[np.lexsort((rows, q[rows]))[:n_flags]].tolist())
    assert {int(i.split(":")[1]) for i in rejected.column("id").to_pylist()} == worst
    budget = capped.describe()["summary"]["budget"]
    assert budget == {"max_flagged": max_flagged, "allowed": allowed, "issues_before": 95, "issues_after": n_flags}


# -- iterative re-estimation -------------------------------------------------------------
def test_refit_probs_with_nothing_excluded_is_plain_cross_validation(banking):
    X = tfidf_features([m[0]["content"] for m in banking["table"].column("messages").to_pylist()])
    y = banking["noisy"]
    keep = np.ones(len(y), bool)
    assert np.array_equal(refit_probs(X, y, N_CLASSES, keep, C=10.0), _cv_probs(
        X, y, N_CLASSES, folds=5, seed=0, classifier="sgd", C=10.0))
    keep[::9] = False
    probs = refit_probs(X, y, N_CLASSES, keep, C=10.0)
    assert np.allclose(probs.sum(axis=1), 1.0)
    # the kept rows' probabilities are plain cross-validation over the kept rows only
    sub = _cv_probs(X[np.flatnonzero(keep)], y[keep], N_CLASSES, folds=5, seed=0, classifier="sgd", C=10.0)
    assert np.array_equal(probs[keep], sub)


def test_second_round_refits_on_kept_rows(banking):
    one = NoiseStage(features="tfidf", C=10.0)
    k1, _ = _run(one, banking["table"], batch=300)
    two = NoiseStage(features="tfidf", C=10.0, rounds=2, min_rows_per_class=0, action="drop")
    kept, rejected = _run(two, banking["table"], batch=300)
    assert kept.num_rows + rejected.num_rows == banking["table"].num_rows
    log = two.describe()["summary"]["rounds"]
    n = banking["table"].num_rows
    assert [e["round"] for e in log] == [1, 2]
    assert log[0]["trained_on"] == n and log[1]["trained_on"] == n - log[0]["issues"]
    assert log[0]["issues"] == int(_mask(k1).sum())  # round 1 is the one-round stage
    assert log[1]["issues"] == rejected.num_rows
    # round 2's mask is cleanlab's on round 2's probabilities, over all rows
    y = np.asarray([two.classes_.index(c) for c in banking["table"].column("label").to_pylist()])
    expected = find_label_issues(y, two.oof_probs, filter_by="prune_by_noise_rate")
    assert int(expected.sum()) == rejected.num_rows
    flipped = banking["flipped"]
    found = len(set(np.flatnonzero(flipped)) & {int(i.split(":")[1]) for i in rejected.column("id").to_pylist()})
    assert found / flipped.sum() > 0.7  # still finds most seeded errors
    table = next(b for b in two.describe()["blocks"] if b["title"].startswith("Iterative"))
    assert [r[0] for r in table["rows"]] == [1, 2]
    json.dumps(two.describe())


def test_knn_votes_come_only_from_other_folds_and_kept_rows(banking):
    X = tfidf_features([m[0]["content"] for m in banking["table"].column("messages").to_pylist()]).toarray()
    X /= np.maximum(np.linalg.norm(X, axis=1, keepdims=True), 1e-12)
    y = banking["noisy"]
    probs = knn_probs(X, y, N_CLASSES, folds=5, seed=0)
    assert np.allclose(probs.sum(axis=1), 1.0) and (probs > 0).all()
    # a row never votes for itself (other folds only), so agreement is a real out-of-sample figure
    assert 0.6 < (probs.argmax(axis=1) == y).mean() < 0.99
    assert (probs.argmax(axis=1)[banking["flipped"]] != y[banking["flipped"]]).mean() > 0.7
    keep = ~banking["flipped"]
    refit = knn_probs(X, y, N_CLASSES, folds=5, seed=0, keep=keep)
    # excluded rows are voted on by kept rows only: they agree with their (wrong) given label no more often
    before = (probs.argmax(axis=1) == y)[~keep].mean()
    assert (refit.argmax(axis=1) == y)[~keep].mean() <= before


# -- features: auto ----------------------------------------------------------------------
def test_auto_rule_by_median_words():
    assert choose_features([8, 10, 12])[0] == "ensemble"
    assert choose_features([8, 10, 5000])[0] == "ensemble"  # one long outlier does not flip it
    kind, why = choose_features([AUTO_MAX_WORDS + 1] * 3)
    assert kind == "tfidf" and why["median_words"] == AUTO_MAX_WORDS + 1 and "long texts" in why["why"]
    assert word_count(None) == 0 and word_count(" a  b\nc ") == 3


def test_auto_picks_tfidf_for_long_posts(real_data: Path):
    with gzip.open(real_data / "20news_label_errors" / "20news_test_texts.head600.jsonl.gz", "rt") as f:
        rows = [json.loads(line) for line in f]
    table = canonical_table([{"id": f"n:{r['index']}", "source": "n", "messages": [{"role": "user", "content": r["text"]}],
                              "label": r["label_name"]} for r in rows])
    auto = NoiseStage(features="auto", C=100.0)
    kept, _ = _run(auto, table, batch=250)
    manual = NoiseStage(features="tfidf", C=100.0)
    kept2, _ = _run(manual, table, batch=250)
    assert kept.equals(kept2)  # same verdicts as asking for TF-IDF
    summary = auto.describe()["summary"]
    assert summary["features_auto"]["chosen"] == "tfidf" and summary["features_auto"]["median_words"] > 100
    assert summary["probabilities"].startswith("5-fold CV, tfidf")


@pytest.mark.slow  # loads MiniLM (shared with test_noise's slow test when run together)
def test_auto_picks_the_ensemble_for_short_intents(banking):
    pick = np.concatenate([np.flatnonzero(banking["noisy"] == c)[:25] for c in range(3)])
    small = banking["table"].take(pa.array(pick))
    auto = NoiseStage(features="auto", threads=1)
    kept, _ = _run(auto, small, batch=40)
    ref = NoiseStage(features="ensemble", threads=1)
    kept2, _ = _run(ref, small, batch=40)
    assert kept.equals(kept2)
    assert auto.describe()["summary"]["features_auto"]["chosen"] == "ensemble"


# -- config errors -----------------------------------------------------------------------
@pytest.mark.parametrize("kwargs, param", [
    ({"inputs": "scores"}, "inputs"),
    ({"inputs": "logits"}, "inputs"),  # logits need a probabilities column / file
    ({"temperature": 0}, "temperature"),
    ({"temperature": 2.0}, "temperature"),  # only with logits
    ({"rounds": 0}, "rounds"),
    ({"rounds": 1.5}, "rounds"),
    ({"rounds": 2, "probabilities": "p"}, "rounds"),
    ({"max_flagged": -1}, "max_flagged"),
    ({"max_flagged": 1.0}, "max_flagged"),
    ({"max_flagged": 0.0}, "max_flagged"),
    ({"max_flagged": True}, "max_flagged"),
    ({"max_flagged": "10%"}, "max_flagged"),
    ({"method": "confidence", "threshold": 1.0}, "threshold"),
    ({"features": "minhash"}, "features"),
])
def test_new_bad_params_raise_stage_config_error(kwargs, param):
    with pytest.raises(StageConfigError, match=param) as exc:
        NoiseStage(**kwargs)
    assert exc.value.param == param
