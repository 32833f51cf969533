"""Semantic (embedding) dedup on real Alpaca rows with the same instructions planted in other
prompt templates and another source, through the real Pipeline, with all-MiniLM-L6-v2."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from dataguard.config import ConfigError, load_config
from dataguard.io.readers import InputSpec
from dataguard.pipeline import Pipeline
from dataguard.records import canonical_table
from dataguard.stage import StageConfigError
from dataguard.stages import stage_class
from dataguard.stages.consistency import ConsistencyStage
from dataguard.stages.semantic_dedup import SemanticDedupStage
from dataguard.stats.neighbours import exact_pairs, partitioned_pairs
from dataguard.text.embeddings import Embedder
from dataguard.text.templates import strip_template

TEMPLATES = [
    lambda ins, inp: "Below is an instruction that describes a task. Write a response that appropriately "
                     f"completes the request.\n\n### Instruction:\n{ins}" + (f"\n\n### Input:\n{inp}" if inp else "")
                     + "\n\n### Response:",
    lambda ins, inp: f"Question: {ins}" + (f"\n{inp}" if inp else "") + "\nAnswer:",
    lambda ins, inp: f"[INST] {ins}" + (f"\n{inp}" if inp else "") + " [/INST]",
]


@pytest.fixture(scope="module")
def embedder() -> Embedder:
    """One loaded MiniLM for the module (stages built later share the process-wide copy)."""
    emb = Embedder()
    emb.encode(["warm up"])
    return emb


@pytest.fixture(scope="module")
def planted(real_data: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """train.json: 120 distinct real rows; templated.jsonl: 6 of them as prompt/completion in
    another template; val.json: one of them in a template (after train in input order)."""
    rows = json.loads((real_data / "alpaca_en_demo/alpaca_en_demo.json").read_text(encoding="utf-8"))
    seen: set[str] = set()
    base = []
    for r in rows:
        if r["instruction"] not in seen:
            seen.add(r["instruction"])
            base.append(r)
        if len(base) == 120:
            break
    picks = [3, 17, 29, 44, 58, 71]
    root = tmp_path_factory.mktemp("semantic_data")
    (root / "train.json").write_text(json.dumps(base), encoding="utf-8")
    lines = [json.dumps({"prompt": TEMPLATES[j % 3](base[i]["instruction"], base[i]["input"]),
                         "completion": base[i]["output"]}) for j, i in enumerate(picks)]
    (root / "templated.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    v = 90
    (root / "val.json").write_text(json.dumps([{"instruction": TEMPLATES[1](base[v]["instruction"], base[v]["input"]),
                                                "input": "", "output": "see above"}]), encoding="utf-8")
    expected = {f"templated:{j}": f"train:{i}" for j, i in enumerate(picks)}
    expected[f"train:{v}"] = "val:0"
    inputs = [InputSpec(path=root / "train.json", name="train"), InputSpec(path=root / "templated.jsonl",
                                                                         name="templated"),
              InputSpec(path=root / "val.json", name="val")]
    return {"inputs": inputs, "expected": expected, "rows": len(base) + len(picks) + 1}


def run(planted: dict[str, Any], out: Path, workers: int = 1, **params: Any) -> tuple[Any, SemanticDedupStage]:
    stage = SemanticDedupStage(validation_sources=["val"], **params)
    return Pipeline([stage], workers=workers, batch_rows=40).run(planted["inputs"], out), stage


def test_template_rewrites_are_dropped(planted: dict[str, Any], embedder: Embedder, tmp_path: Path) -> None:
    result, stage = run(planted, tmp_path / "out", action="drop")
    counts = result.manifest["counts"]
    assert counts["rows_in"] == planted["rows"] == counts["rows_kept"] + counts["rows_rejected"]
    rejected = result.rejected_table().to_pylist()
    assert {r["id"] for r in rejected} == set(planted["expected"])
    kept_ids = set(result.kept_table().column("id").to_pylist())
    for r in rejected:
        kept = planted["expected"][r["id"]]
        assert r["reason"] == "semantic_duplicate" and r["stage"] == "semantic_dedup"
        assert r["detail"].startswith(f"semantic duplicate of {kept} (cosine ")
        assert float(r["detail"].split("cosine ")[1][:5]) >= 0.9
        assert kept in kept_ids
    info = stage.describe()
    assert info["summary"]["semantic_duplicates"] == len(planted["expected"])
    assert info["summary"]["method"] == "exact"
    items = next(b for b in info["blocks"] if b["type"] == "examples")["items"]
    assert all(i["text"] and i["reference"] and i["note"].startswith("kept: ") for i in items)


def test_without_stripping_templates_most_rewrites_are_missed(planted: dict[str, Any], embedder: Embedder,
                                                               tmp_path: Path) -> None:
    result, _ = run(planted, tmp_path / "raw", strip_templates=False)
    flagged = [r["id"] for r in result.kept_table().to_pylist() if r["semantic_dup_of"] is not None]
    assert len(flagged) < len(planted["expected"])  # why stripping is on by default


def test_kmeans_partitions_and_two_workers_give_the_same_output(planted: dict[str, Any], embedder: Embedder,
                                                                 tmp_path: Path) -> None:
    one, stage = run(planted, tmp_path / "w1", exact_max_rows=50, partitions=4, threads=1)
    assert stage.describe()["summary"]["method"] == "k-means partitions"
    kept = one.kept_table()
    assert kept.num_rows == planted["rows"]  # flag (default) keeps every row
    flagged = {r["id"]: r["semantic_dup_of"] for r in kept.to_pylist() if r["semantic_dup_of"] is not None}
    assert flagged == planted["expected"]
    two, _ = run(planted, tmp_path / "w2", workers=2, exact_max_rows=50, partitions=4, threads=1)
    assert kept.equals(two.kept_table())


def test_reuses_the_consistency_stage_embeddings(real_data: Path, embedder: Embedder) -> None:
    rows = json.loads((real_data / "alpaca_en_demo/alpaca_en_demo.json").read_text(encoding="utf-8"))[:6]
    table = canonical_table([{"id": str(i), "source": "s", "messages": [
        {"role": "user", "content": r["instruction"] + ("\n" + r["input"] if r["input"] else "")},
        {"role": "assistant", "content": r["output"]}]} for i, r in enumerate(rows)])
    scored = ConsistencyStage(keep_embeddings=True).score(table)
    # a planted marker: the stored vectors are reversed, so a reuse is visible
    col = scored.column("prompt_embedding").combine_chunks()
    flipped = np.ascontiguousarray(col.values.to_numpy().reshape(len(col), -1)[:, ::-1])
    marked = scored.set_column(scored.column_names.index("prompt_embedding"),
                               scored.schema.field("prompt_embedding"),
                               pa.FixedSizeListArray.from_arrays(pa.array(flipped.ravel()), flipped.shape[1]))
    summary = SemanticDedupStage(strip_templates=False).summarize(marked)
    np.testing.assert_array_equal(summary.vectors, flipped)
    fresh = SemanticDedupStage(strip_templates=False).summarize(table)
    np.testing.assert_allclose(fresh.vectors, flipped[:, ::-1], atol=1e-5)


def test_exact_and_partitioned_search_agree_on_clear_pairs() -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(400, 32)).astype(np.float32)
    x[200:220] = x[:20] + 0.05 * rng.normal(size=(20, 32)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    pairs, sims = exact_pairs(x, 0.95, 5)
    assert {tuple(p) for p in pairs.tolist()} == {(i, 200 + i) for i in range(20)}
    assert np.all(sims >= 0.95)
    part, _ = partitioned_pairs(x, 0.95, 5, partitions=4, seed=0)
    assert {tuple(p) for p in part.tolist()} <= {(i, 200 + i) for i in range(20)}
    assert len(part) >= 18  # a pair split across partitions is the price of not going quadratic


def test_strip_template() -> None:
    assert strip_template(TEMPLATES[0]("Name three fruits.", "")) == "Name three fruits."
    assert strip_template("[INST] Hi there [/INST]") == "Hi there"
    assert strip_template("Question: Why?\nAnswer:") == "Why?"
    assert strip_template("The answer: 42") == "The answer: 42"  # a label only at a line start


@pytest.mark.parametrize(("params", "param"), [
    ({"threshold": 2}, "threshold"), ({"scope": "assistant"}, "scope"), ({"action": "delete"}, "action"),
    ({"keep": "random"}, "keep"), ({"top_k": 0}, "top_k"), ({"exact_max_rows": 1}, "exact_max_rows"),
    ({"partitions": 0}, "partitions"), ({"strip_templates": 1}, "strip_templates"),
    ({"validation_sources": "" }, "validation_sources"), ({"batch_size": 0}, "batch_size"),
])
def test_config_errors_name_the_parameter(params: dict[str, Any], param: str, tmp_path: Path) -> None:
    with pytest.raises(StageConfigError) as err:
        SemanticDedupStage(**params)
    assert param in str(err.value)
    (tmp_path / "x.jsonl").write_text('{"instruction": "a", "output": "b"}\n', encoding="utf-8")
    with pytest.raises(ConfigError, match=param):
        load_config({"inputs": [{"path": str(tmp_path / "x.jsonl")}], "stages": [{"semantic_dedup": params}]})


def test_registered() -> None:
    assert stage_class("semantic_dedup") is SemanticDedupStage
