"""Semantic consistency on real Alpaca rows: real pairs vs deliberately mismatched pairs."""

from __future__ import annotations

import json
import math
import pickle
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from dataguard.io.raw import RawBatch, SourceOptions
from dataguard.records import canonical_table, empty_canonical
from dataguard.stage import StageConfigError
from dataguard.stages.consistency import (
    PROMPT_COLUMN,
    RESPONSE_COLUMN,
    ConsistencyStage,
    histogram_median_mad,
    histogram_quantile,
    score_histogram,
)
from dataguard.stages.normalize import Normalizer
from dataguard.text.embeddings import Embedder, embeddings_for, to_numpy

N_REAL = 100


def rank_auc(pos: np.ndarray, neg: np.ndarray) -> float:
    """P(score of a real pair > score of a mismatched pair)."""
    return float((pos[:, None] > neg[None, :]).mean())


@pytest.fixture(scope="module")
def real(real_data: Path) -> pa.Table:
    """100 real Alpaca rows, scored once with embeddings kept (the model runs only here)."""
    records = json.loads((real_data / "alpaca_en_demo/alpaca_en_demo.json").read_text(encoding="utf-8"))
    batch = RawBatch(source="alpaca")
    for i, rec in enumerate(records[:N_REAL]):
        batch.add(i, rec)
    kept = Normalizer().normalize(batch, SourceOptions(name="alpaca")).kept
    return ConsistencyStage(keep_embeddings=True, threads=2).score(kept)


def mismatched(real: pa.Table, shift: int = 1) -> pa.Table:
    """Each prompt paired with another row's response (text and kept embedding both moved)."""
    rows = real.select(["id", "source", "messages", "label", "meta"]).to_pylist()
    n = len(rows)
    out = []
    for i, row in enumerate(rows):
        other = rows[(i + shift) % n]["messages"][-1]["content"]
        msgs = row["messages"][:-1] + [{"role": "assistant", "content": other}]
        out.append({**row, "id": row["id"] + "#mismatch", "messages": msgs})
    table = canonical_table(out).append_column("format", real.column("format"))
    order = pa.array([(i + shift) % n for i in range(n)])
    table = table.append_column(real.schema.field(PROMPT_COLUMN), real.column(PROMPT_COLUMN))
    return table.append_column(real.schema.field(RESPONSE_COLUMN), real.column(RESPONSE_COLUMN).take(order))


def test_real_pairs_score_far_above_mismatched(real: pa.Table) -> None:
    stage = ConsistencyStage()
    bad = stage.score(mismatched(real))  # reuses the kept vectors: no model run
    pos = real.column("consistency_score").to_numpy()
    neg = bad.column("consistency_score").to_numpy()
    assert np.isfinite(pos).all() and np.isfinite(neg).all()
    assert rank_auc(pos, neg) > 0.95
    assert np.median(pos) - np.median(neg) > 0.3


def test_fit_flags_the_planted_mismatches(real: pa.Table) -> None:
    bad = ConsistencyStage().score(mismatched(real, shift=37)).slice(0, 10)
    data = pa.concat_tables([real, bad.select(real.column_names)])
    stage = ConsistencyStage(action="drop")
    batches = [data.slice(i, 40) for i in range(0, data.num_rows, 40)]
    stage.fit([stage.summarize(b) for b in batches])
    outs = [stage.apply(b) for b in batches]
    stage.absorb([o.stats for o in outs])
    rejected = pa.concat_tables([o.rejected for o in outs])
    assert sum(o.kept.num_rows for o in outs) + rejected.num_rows == data.num_rows
    flagged = set(rejected.column("id").to_pylist())
    planted = set(bad.column("id").to_pylist())
    assert len(flagged & planted) >= 8  # recall on planted mismatches
    assert len(flagged - planted) <= 0.05 * N_REAL  # few real rows lost
    assert set(rejected.column("reason").to_pylist()) == {"low_consistency"}
    assert "cut" in rejected.column("detail")[0].as_py()
    desc = stage.describe()
    json.dumps(desc)
    hist = next(b for b in desc["blocks"] if b["type"] == "histogram")
    assert sum(hist["series"]["rows"]) == data.num_rows
    assert {m["label"] for m in hist["markers"]} == {"median", "cut"}
    assert desc["summary"]["flagged"] == len(flagged)


def test_kept_embeddings_equal_a_fresh_encode(real: pa.Table) -> None:
    sub = real.slice(0, 5)
    embedder = Embedder(threads=2)
    prompts = [m[0]["content"] for m in sub.column("messages").to_pylist()]
    fresh = embedder.encode(prompts)
    stored = embeddings_for(sub, PROMPT_COLUMN, prompts, embedder)
    assert stored.dtype == np.float32 and stored.shape == (5, 384)
    np.testing.assert_allclose(stored, fresh, atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(fresh, axis=1), 1.0, atol=1e-5)
    # a sliced column reads back the right rows
    np.testing.assert_array_equal(to_numpy(real.column(PROMPT_COLUMN).slice(3, 2)), to_numpy(sub.column(PROMPT_COLUMN))[3:5])


def test_rows_without_prompt_or_response_get_nan(real: pa.Table) -> None:
    table = canonical_table([
        {"id": "intent", "source": "s", "messages": [{"role": "user", "content": "cancel my card"}], "label": "x"},
        {"id": "blank", "source": "s", "messages": [{"role": "user", "content": "hi"},
                                                    {"role": "assistant", "content": "  "}]},
    ])
    stage = ConsistencyStage(threshold=0.99, keep_embeddings=True)
    scored = stage.score(table)
    assert all(math.isnan(s) for s in scored.column("consistency_score").to_pylist())
    assert scored.column(PROMPT_COLUMN).null_count == 2
    out = stage.apply(scored)  # a fixed threshold needs no fit
    assert out.kept.column("consistency_flag").to_pylist() == [False, False]
    stage.absorb([out.stats])
    assert stage.describe()["summary"]["no_score"] == 2


def test_histogram_statistics_match_numpy() -> None:
    rng = np.random.default_rng(0)
    scores = np.clip(rng.normal(0.55, 0.12, 5000), -1, 1).astype(np.float32)
    scores[:10] = np.nan
    hist = score_histogram(scores)
    finite = scores[np.isfinite(scores)]
    med, mad = histogram_median_mad(hist)
    assert hist.sum() == len(finite)
    assert abs(med - np.median(finite)) < 2e-3
    assert abs(mad - np.median(np.abs(finite - np.median(finite)))) < 2e-3
    assert abs(histogram_quantile(hist, 0.01) - np.percentile(finite, 1)) < 3e-3
    assert math.isnan(histogram_quantile(np.zeros_like(hist), 0.5))


def test_percentile_method_and_empty_batches(real: pa.Table) -> None:
    stage = ConsistencyStage(method="percentile", percentile=5)
    empty = stage.score(empty_canonical())
    stage.fit([stage.summarize(real), stage.summarize(empty)])
    ordered = np.sort(real.column("consistency_score").to_numpy())
    assert ordered[4] - 2e-3 <= stage.cut <= ordered[5] + 2e-3  # the 5th of 100 scores, +- one bin
    out = stage.apply(empty)
    for name, typ in stage.output_columns().items():
        assert out.kept.schema.field(name).type == typ
    flagged = stage.apply(real).kept.column("consistency_flag").to_numpy(zero_copy_only=False)
    assert 3 <= flagged.sum() <= 7


def test_validation_and_pickle_drops_model(real: pa.Table) -> None:
    for kwargs, param in [({"action": "remove"}, "action"), ({"method": "zscore"}, "method"), ({"k": 0}, "k"),
                          ({"percentile": 100}, "percentile"), ({"threshold": 2.0}, "threshold"),
                          ({"batch_size": 0}, "batch_size"), ({"model": "/no/such/model"}, "model"),
                          ({"keep_embeddings": "yes"}, "keep_embeddings")]:
        with pytest.raises(StageConfigError, match=param):
            ConsistencyStage(**kwargs)
    stage = ConsistencyStage()
    stage.score(real.slice(0, 2).select(["id", "source", "messages", "label", "meta"]))
    assert stage.embedder._model is not None
    clone = pickle.loads(pickle.dumps(stage))
    assert clone.embedder._model is None and len(pickle.dumps(stage)) < 100_000


def test_pipeline_end_to_end_keeps_scores_and_embeddings(real_data: Path, tmp_path: Path) -> None:
    """Normalize -> dedup -> consistency through the real pipeline, shards read back with pyarrow."""
    from dataguard.io.readers import InputSpec
    from dataguard.pipeline import Pipeline
    from dataguard.stages.dedup import DedupStage

    records = json.loads((real_data / "alpaca_en_demo/alpaca_en_demo.json").read_text(encoding="utf-8"))[:40]
    records.append(dict(records[0]))  # a planted exact duplicate
    path = tmp_path / "slice.json"
    path.write_text(json.dumps(records), encoding="utf-8")
    stages = [DedupStage(action="drop"), ConsistencyStage(keep_embeddings=True, threads=2)]
    Pipeline(stages, workers=1, batch_rows=16).run([InputSpec(path=path, name="slice")], tmp_path / "out")
    manifest = json.loads((tmp_path / "out/manifest.json").read_text())
    assert manifest["counts"]["rows_in"] == 41 and manifest["counts"]["rows_kept"] == 40
    shards = [pa.ipc.open_stream(tmp_path / "out" / f["path"]).read_all() for f in manifest["outputs"]["data"]]
    data = pa.concat_tables(shards)
    assert data.num_rows == 40
    scores = data.column("consistency_score").to_numpy()
    assert np.isfinite(scores).all() and np.median(scores) > 0.4
    vectors = to_numpy(data.column(RESPONSE_COLUMN))
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-4)
    described = {s["name"]: s["description"] for s in manifest["stages"]}
    assert described["consistency"]["summary"]["rows"] == 40
    assert described["dedup"]["summary"]["duplicates"] == 1
