"""NoiseStage on real data: banking77 slices with injected noise, 20 Newsgroups probabilities.

The heavy parts (5-fold CV, the embedding model) are fitted once per module on small
slices so the file stays well under a minute; the full-size figures live in
benchmarks/bench_label_noise.py.
"""

from __future__ import annotations

import csv
import gzip
import json
import pickle
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from cleanlab.filter import find_label_issues

from dataguard.records import CANONICAL_SCHEMA, canonical_table
from dataguard.stage import StageConfigError
from dataguard.stages.noise.stage import NoiseStage
from dataguard.testing.noise import inject_class_conditional_noise

N_CLASSES = 8


def _run(stage: NoiseStage, table: pa.Table, batch: int = 300):
    """summarize -> fit -> apply -> absorb over consecutive batches, like the pipeline."""
    parts = [table.slice(i, batch) for i in range(0, table.num_rows, batch)] or [table]
    stage.fit([stage.summarize(p) for p in parts])
    outs = [stage.apply(p) for p in parts]
    stage.absorb([o.stats for o in outs])
    kept = pa.concat_tables([o.kept for o in outs])
    rejected = pa.concat_tables([o.rejected for o in outs])
    return kept, rejected


@pytest.fixture(scope="module")
def banking(real_data: Path):
    """The first 8 banking77 intents (~1,000 train rows) with 10% class-conditional noise."""
    with open(real_data / "banking77" / "train.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    classes = sorted({r["category"] for r in rows})[:N_CLASSES]
    rows = [r for r in rows if r["category"] in classes]
    index = {c: i for i, c in enumerate(classes)}
    true = np.array([index[r["category"]] for r in rows])
    noisy, flipped = inject_class_conditional_noise(true, 0.10, N_CLASSES, seed=0)
    table = canonical_table([{"id": f"banking:{i}", "source": "banking",
                              "messages": [{"role": "user", "content": r["text"]}],
                              "label": classes[noisy[i]]} for i, r in enumerate(rows)])
    return {"table": table, "classes": classes, "true": true, "noisy": noisy, "flipped": flipped}


@pytest.fixture(scope="module")
def flagged(banking):
    stage = NoiseStage(features="tfidf", classifier="sgd")
    kept, rejected = _run(stage, banking["table"])
    return stage, kept, rejected


def _mask(table: pa.Table) -> np.ndarray:
    return np.asarray(table.column("is_label_issue").to_pylist(), dtype=bool)


def test_detection_finds_most_flipped_rows(banking, flagged):
    stage, kept, rejected = flagged
    assert rejected.num_rows == 0 and kept.num_rows == banking["table"].num_rows
    assert kept.column("id").to_pylist() == banking["table"].column("id").to_pylist()
    issue = _mask(kept)
    flipped = banking["flipped"]
    precision = (issue & flipped).sum() / issue.sum()
    recall = (issue & flipped).sum() / flipped.sum()
    assert recall >= 0.75, recall
    assert precision >= 0.75, precision
    # flipped rows rank below clean rows by label quality (area under the ROC curve)
    from sklearn.metrics import roc_auc_score

    quality = np.asarray(kept.column("label_quality").to_pylist())
    assert roc_auc_score(flipped, -quality) > 0.9
    # where the model disagrees with a flipped label, it mostly suggests the true class
    suggested = np.asarray(kept.column("suggested_label").to_pylist())
    true_names = np.asarray(banking["classes"])[banking["true"]]
    assert (suggested[issue & flipped] == true_names[issue & flipped]).mean() > 0.8
    assert kept.schema.field("label_quality").type == pa.float32()


@pytest.mark.parametrize("filter_by", ["prune_by_noise_rate", "prune_by_class", "both", "confident_learning"])
def test_mask_agrees_with_cleanlab_on_our_probabilities(banking, flagged, filter_by):
    stage, kept, _ = flagged
    probs = stage.oof_probs
    labels = np.asarray([stage.classes_.index(lab) for lab in kept.column("label").to_pylist()])
    # same probabilities, handed in as a column, through a stage with another filter
    with_probs = banking["table"].append_column("p", pa.array(list(probs), pa.list_(pa.float64())))
    other = NoiseStage(probabilities="p", filter_by=filter_by, min_rows_per_class=0)
    out, _ = _run(other, with_probs, batch=250)
    expected = find_label_issues(labels, probs, filter_by=filter_by)
    assert np.array_equal(_mask(out), expected)
    assert expected.sum() > 50


def test_rare_classes_are_never_emptied(real_data: Path):
    """Long tail: 8 banking77 intents in full, 4 with three rows each. Without protection
    confident learning drops rows of a 3-row class; with the default every class keeps
    min(n, 5) rows, and the rows given back are the least suspicious of those flagged."""
    with open(real_data / "banking77" / "train.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    classes = sorted({r["category"] for r in rows})[:12]
    cap = {c: (3 if i >= 8 else len(rows)) for i, c in enumerate(classes)}
    taken: dict[str, int] = {}
    picked = []
    for r in rows:
        c = r["category"]
        if c in cap and taken.get(c, 0) < cap[c]:
            taken[c] = taken.get(c, 0) + 1
            picked.append(r)
    table = canonical_table([{"id": f"b:{i}", "source": "b", "messages": [{"role": "user", "content": r["text"]}],
                              "label": r["category"]} for i, r in enumerate(picked)])
    loose = NoiseStage(features="tfidf", classifier="sgd", action="drop", min_rows_per_class=0)
    kept0, rej0 = _run(loose, table)
    guarded = NoiseStage(features="tfidf", classifier="sgd", action="drop")
    kept, rej = _run(guarded, table)
    assert kept.num_rows + rej.num_rows == table.num_rows == kept0.num_rows + rej0.num_rows
    before = {c: kept0.column("label").to_pylist().count(c) for c in classes}
    after = {c: kept.column("label").to_pylist().count(c) for c in classes}
    assert min(before[c] for c in classes[8:]) < 3          # the unprotected run thins the tail
    assert all(after[c] == 3 for c in classes[8:])          # protected: all three rows stay
    assert all(after[c] == before[c] for c in classes[:8])  # head classes untouched
    # the protected mask is the loose one minus rows of short classes, best quality first
    assert set(rej.column("id").to_pylist()) < set(rej0.column("id").to_pylist())


@pytest.fixture(scope="module")
def news(real_data: Path):
    d = real_data / "20news_label_errors"
    with gzip.open(d / "20news_test_texts.text200.jsonl.gz", "rt") as f:
        rows = [json.loads(line) for line in f]
    errors = {r["id"] for r in json.loads((d / "20news_mturk.json").read_text()) if r["mturk"]["given"] < 3}
    table = canonical_table([{"id": f"20news:{r['index']}", "source": "20news",
                              "messages": [{"role": "user", "content": r["text"][:200]}],
                              "label": r["label_name"]} for r in rows])
    return {"table": table, "labels": np.array([r["label"] for r in rows]), "errors": errors,
            "pyx": d / "20news_test_set_pyx.npy"}


def test_mask_agrees_with_cleanlab_on_published_20news_probabilities(news):
    pyx = np.load(news["pyx"])
    stage = NoiseStage(probabilities=str(news["pyx"]), min_rows_per_class=0)
    kept, _ = _run(stage, news["table"], batch=2000)
    # sorted label names are the order of cleanlab's columns (sklearn's folder order)
    assert [stage.classes_.index(n) for n in kept.column("label").to_pylist()] == news["labels"].tolist()
    expected = find_label_issues(news["labels"], pyx, filter_by="prune_by_noise_rate")
    mask = _mask(kept)
    assert np.array_equal(mask, expected)
    # the published reference point: 95 rows flagged, 55 of the 82 confirmed errors among them
    assert mask.sum() == 95
    assert len(news["errors"] & set(np.flatnonzero(mask).tolist())) == 55
    desc = stage.describe()
    matrix = next(b for b in desc["blocks"] if b["type"] == "matrix")
    assert len(matrix["row_labels"]) == 20
    assert np.allclose(np.asarray(matrix["values"]).sum(axis=0), 1.0, atol=1e-3)  # P(given | true)
    json.dumps(desc)


def test_probabilities_file_rows_align_with_unlabelled_rows(news, tmp_path):
    """A .npy file has one row per input row; unlabelled rows are skipped, not shifted."""
    table = news["table"].slice(0, 3000)
    labels = table.column("label").to_pylist()
    for i in range(0, 3000, 7):
        labels[i] = None
    table = table.set_column(3, "label", pa.array(labels, pa.string()))
    pyx = np.load(news["pyx"])[:3000]
    np.save(tmp_path / "p.npy", pyx)
    kept, _ = _run(NoiseStage(probabilities=str(tmp_path / "p.npy"), method="threshold", threshold=0.5), table)
    has = np.array([lab is not None for lab in labels])
    y = news["labels"][:3000]
    expected = pyx[np.arange(3000), y] < 0.5
    got = np.asarray(kept.column("is_label_issue").to_pylist(), dtype=object)
    assert all(v is None for v in got[~has])
    assert np.array_equal(got[has].astype(bool), expected[has])
    with pytest.raises(ValueError, match="probabilities file has shape"):
        _run(NoiseStage(probabilities=str(tmp_path / "p.npy")), news["table"].slice(0, 2999))


def test_threshold_rule_flags_low_given_label_probability(flagged, banking):
    stage, kept, _ = flagged
    probs = stage.oof_probs
    with_probs = banking["table"].append_column("p", pa.array(list(probs), pa.list_(pa.float64())))
    out, _ = _run(NoiseStage(probabilities="p", method="threshold", threshold=0.8, min_rows_per_class=0),
                  with_probs)
    labels = np.asarray([stage.classes_.index(lab) for lab in banking["table"].column("label").to_pylist()])
    assert np.array_equal(_mask(out), probs[np.arange(len(labels)), labels] < 0.8)


def test_drop_and_relabel_lose_nothing_and_pass_unlabelled_rows(banking, flagged):
    stage0, _, _ = flagged
    table = banking["table"]
    labels = table.column("label").to_pylist()
    unlabelled = set(range(0, len(labels), 11))
    labels = [None if i in unlabelled else lab for i, lab in enumerate(labels)]
    table = table.set_column(3, "label", pa.array(labels, pa.string()))
    table = table.append_column("p", pa.array(list(np.zeros((table.num_rows, N_CLASSES))), pa.list_(pa.float64())))
    # reuse the CV probabilities of the labelled rows so both actions see the same verdicts
    probs = np.zeros((table.num_rows, N_CLASSES))
    probs[[i for i in range(table.num_rows) if i not in unlabelled]] = stage0.oof_probs[
        [i for i in range(table.num_rows) if i not in unlabelled]]
    table = table.set_column(5, "p", pa.array(list(probs), pa.list_(pa.float64())))

    drop = NoiseStage(probabilities="p", action="drop")
    kept, rejected = _run(drop, table)
    assert kept.num_rows + rejected.num_rows == table.num_rows
    assert set(kept.column("id").to_pylist()).isdisjoint(rejected.column("id").to_pylist())
    assert rejected.num_rows > 50 and set(rejected.column("reason").to_pylist()) == {"label_issue"}
    assert "model suggests" in rejected.column("detail")[0].as_py()
    ids = table.column("id").to_pylist()
    kept_rows = {r["id"]: r for r in kept.select(["id", "label", "label_quality", "suggested_label",
                                                  "is_label_issue"]).to_pylist()}
    for i in unlabelled:  # unlabelled rows pass through with null scores
        row = kept_rows[ids[i]]
        assert row["label"] is None and row["label_quality"] is None and row["is_label_issue"] is None
        assert row["suggested_label"] is None
    assert drop.describe()["summary"]["dropped"] == rejected.num_rows

    relabel = NoiseStage(probabilities="p", action="relabel", relabel_min_confidence=0.5)
    out, rej = _run(relabel, table)
    assert rej.num_rows == 0 and out.num_rows == table.num_rows
    original = np.asarray(out.column("original_label").to_pylist(), dtype=object)
    changed = np.array([o is not None for o in original])
    new = np.asarray(out.column("label").to_pylist(), dtype=object)
    given = np.asarray(labels, dtype=object)
    issue = np.asarray(out.column("is_label_issue").to_pylist(), dtype=object)
    assert changed.sum() > 20
    assert all(issue[changed])  # only flagged rows change ...
    assert np.array_equal(original[changed], given[changed])
    assert np.array_equal(new[changed], np.asarray(out.column("suggested_label").to_pylist(), dtype=object)[changed])
    assert np.array_equal(new[~changed], given[~changed])
    row_probs = probs[changed]  # ... and only where the suggestion is confident
    assert (row_probs.max(axis=1) >= 0.5).all()
    confident_issues = np.array([bool(issue[i]) and probs[i].max() >= 0.5 and probs[i].argmax()
                                 != relabel.classes_.index(given[i]) for i in range(len(given))
                                 if given[i] is not None])
    assert changed.sum() == confident_issues.sum()
    true = np.asarray(banking["classes"], dtype=object)[banking["true"]]
    assert (new[changed] == true[changed]).mean() > 0.8  # most relabels restore the true class
    assert relabel.describe()["summary"]["relabelled"] == changed.sum()


def test_empty_batch_gets_same_columns(flagged):
    stage, kept, _ = flagged
    empty = CANONICAL_SCHEMA.empty_table()
    out = stage.apply(empty)
    assert out.kept.num_rows == 0
    assert out.kept.schema == kept.schema
    for name, typ in stage.output_columns().items():
        assert kept.schema.field(name).type == typ


@pytest.mark.slow  # loads MiniLM: ~10 s idle, ~45 s on a loaded 2-core box; the rest of the file uses TF-IDF
def test_default_stage_with_embeddings_describes_and_pickles(banking):
    """The defaults (features auto -> short intents -> MiniLM + TF-IDF + kNN ensemble, SGD logistic,
    C chosen by CV) on a small slice."""
    pick = np.concatenate([np.flatnonzero(banking["true"] == c)[:25] for c in range(3)])
    small = banking["table"].take(pa.array(pick))
    stage = NoiseStage(threads=1)
    kept, _ = _run(stage, small, batch=40)
    # the out-of-sample model separates these intents: it agrees with most given labels
    assert stage.describe()["summary"]["cv_accuracy_vs_given"] > 0.7
    given = np.asarray(small.column("label").to_pylist())
    assert (np.asarray(kept.column("suggested_label").to_pylist()) == given).mean() > 0.7
    blob = pickle.dumps(stage)  # a fitted stage ships to workers without the model
    assert len(blob) < 2_000_000 and pickle.loads(blob).apply(small).kept.equals(stage.apply(small).kept)
    desc = stage.describe()
    assert desc["summary"]["features_auto"]["chosen"] == "ensemble"
    assert desc["summary"]["probabilities"] == "5-fold CV, ensemble, sgd"
    kinds = [b["type"] for b in desc["blocks"]]
    assert kinds[:3] == ["bar", "matrix", "table"]
    assert desc["summary"]["label_issues"] == int(_mask(kept).sum())
    json.dumps(desc)


def test_same_input_same_output_and_worst_examples(banking):
    table = banking["table"]
    runs = []
    for _ in range(2):
        stage = pickle.loads(pickle.dumps(NoiseStage(features="tfidf", classifier="sgd", folds=3)))
        kept, _ = _run(stage, table, batch=400)
        runs.append((kept, stage.describe()))
    assert runs[0][0].equals(runs[1][0])
    assert json.dumps(runs[0][1]) == json.dumps(runs[1][1])
    examples = next(b for b in runs[0][1]["blocks"] if b["type"] == "examples")["items"]
    assert len(examples) == 20 and all(e["text"] and e["label"] for e in examples)
    quality = dict(zip(runs[0][0].column("id").to_pylist(), runs[0][0].column("label_quality").to_pylist(),
                       strict=True))
    worst = sorted(q for q, f in zip(runs[0][0].column("label_quality").to_pylist(),
                                     _mask(runs[0][0]), strict=True) if f)[:20]
    assert [quality[e["id"]] for e in examples] == worst


@pytest.mark.parametrize("kwargs, param", [
    ({"features": "bert"}, "features"),
    ({"classifier": "forest"}, "classifier"),
    ({"classifier": object()}, "classifier"),
    ({"folds": 1}, "folds"),
    ({"folds": 2.5}, "folds"),
    ({"seed": -1}, "seed"),
    ({"method": "vote"}, "method"),
    ({"filter_by": "magic"}, "filter_by"),
    ({"threshold": 0.0}, "threshold"),
    ({"threshold": 1.5}, "threshold"),
    ({"rank_by": "loss"}, "rank_by"),
    ({"probabilities": "/nonexistent/p.npy"}, "probabilities"),
    ({"probabilities": 3}, "probabilities"),
    ({"classes": ["a"]}, "classes"),
    ({"classes": ["a", "a"]}, "classes"),
    ({"action": "delete"}, "action"),
    ({"relabel_min_confidence": 0}, "relabel_min_confidence"),
    ({"label_column": ""}, "label_column"),
    ({"min_rows_per_class": -1}, "min_rows_per_class"),
    ({"min_rows_per_class": 2.5}, "min_rows_per_class"),
    ({"text": "system"}, "text"),
    ({"C": -1}, "C"),
    ({"embedding_weight": 0}, "embedding_weight"),
    ({"model": "/nonexistent/model"}, "model"),
])
def test_bad_params_raise_stage_config_error(kwargs, param):
    with pytest.raises(StageConfigError, match=param):
        NoiseStage(**kwargs)


def test_positional_args_rejected():
    with pytest.raises(TypeError):
        NoiseStage("tfidf")  # type: ignore[misc]
