"""Near-duplicate (MinHash LSH) dedup on real Alpaca rows with planted near copies, through
the real Pipeline: edits, reorderings, a ShareGPT rewrite in another source, a validation copy."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from dataguard.config import ConfigError, load_config
from dataguard.io.readers import InputSpec
from dataguard.pipeline import Pipeline
from dataguard.stage import StageConfigError
from dataguard.stages import stage_class
from dataguard.stages.near_dedup import NearDedupStage
from dataguard.stats.clusters import connected_components, pick_kept
from dataguard.text import minhash


def edit_words(text: str, n: int, seed: int) -> str:
    """Replace `n` words (deterministic positions) with other words."""
    words = text.split(" ")
    rng = random.Random(seed)
    for pos in rng.sample(range(len(words)), n):
        words[pos] = rng.choice(["really", "very", "quite", "rather", "truly"])
    return " ".join(words)


def swap_sentences(text: str) -> str:
    """The text with its first two sentences swapped."""
    parts = re.split(r"(?<=[.!?]) ", text)
    parts[0], parts[1] = parts[1], parts[0]
    return " ".join(parts)


@pytest.fixture(scope="module")
def planted(real_data: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """train.json: 200 distinct real rows + 3 edited + 3 reordered copies; chat.json: 3 rows
    rewritten as ShareGPT; val.json: an edited copy of one training row (after train in input order)."""
    rows = json.loads((real_data / "alpaca_en_demo/alpaca_en_demo.json").read_text(encoding="utf-8"))
    seen: set[str] = set()
    base = []
    for r in rows:
        key = json.dumps(r, sort_keys=True)
        if key not in seen:
            seen.add(key)
            base.append(r)
        if len(base) == 200:
            break
    long_rows = [i for i, r in enumerate(base) if len(r["output"].split()) >= 120
                 and len(re.split(r"(?<=[.!?]) ", r["output"])) >= 3]
    assert len(long_rows) >= 10
    edited, swapped, chat, val = long_rows[0:3], long_rows[3:6], long_rows[6:9], long_rows[9]
    train = list(base)
    expected: dict[str, str] = {}  # planted copy id -> original id
    for i in edited:
        expected[f"train:{len(train)}"] = f"train:{i}"
        train.append({**base[i], "output": edit_words(base[i]["output"], 3, seed=i)})
    for i in swapped:
        expected[f"train:{len(train)}"] = f"train:{i}"
        train.append({**base[i], "output": swap_sentences(base[i]["output"])})
    sharegpt = []
    for j, i in enumerate(chat):
        user = base[i]["instruction"] + ("\n" + base[i]["input"] if base[i]["input"] else "")
        sharegpt.append({"conversations": [{"from": "human", "value": user},
                                           {"from": "gpt", "value": base[i]["output"]}]})
        expected[f"chat:{j}"] = f"train:{i}"
    root = tmp_path_factory.mktemp("near_dedup_data")
    (root / "train.json").write_text(json.dumps(train), encoding="utf-8")
    (root / "chat.json").write_text(json.dumps(sharegpt), encoding="utf-8")
    (root / "val.json").write_text(json.dumps([{**base[val], "output": edit_words(base[val]["output"], 2, 7)}]),
                                   encoding="utf-8")
    inputs = [InputSpec(path=root / "train.json", name="train"), InputSpec(path=root / "chat.json", name="chat"),
              InputSpec(path=root / "val.json", name="val")]
    expected[f"train:{val}"] = "val:0"  # the validation row wins although it comes last
    return {"inputs": inputs, "expected": expected, "rows": len(train) + len(sharegpt) + 1}


def run(inputs: list[InputSpec], out: Path, workers: int = 1, **params: Any) -> tuple[Any, NearDedupStage]:
    stage = NearDedupStage(validation_sources=["val"], **params)
    result = Pipeline([stage], workers=workers, batch_rows=64).run(inputs, out)
    return result, stage


def test_planted_copies_are_rejected_and_originals_kept(planted: dict[str, Any], tmp_path: Path) -> None:
    result, stage = run(planted["inputs"], tmp_path / "out")
    counts = result.manifest["counts"]
    assert counts["rows_in"] == planted["rows"] == counts["rows_kept"] + counts["rows_rejected"]
    rejected = result.rejected_table().to_pylist()
    assert {r["id"] for r in rejected} == set(planted["expected"])
    kept_ids = set(result.kept_table().column("id").to_pylist())
    for r in rejected:
        kept = planted["expected"][r["id"]]
        assert r["stage"] == "near_dedup" and r["reason"] == "near_duplicate"
        assert r["detail"].startswith(f"near duplicate of {kept} (exact Jaccard ")
        assert kept in kept_ids
        assert json.loads(r["record"])["near_dup_of"] == kept
    jaccards = {r["id"]: float(re.search(r"Jaccard (\d\.\d+)", r["detail"]).group(1)) for r in rejected}
    assert all(0.7 <= j < 1.0 for k, j in jaccards.items() if k.startswith("train:"))
    assert all(jaccards[k] == 1.0 for k in jaccards if k.startswith("chat:"))  # same text, other template
    info = stage.describe()
    assert info["summary"]["near_duplicates"] == len(planted["expected"])
    assert info["summary"]["clusters"] == len(planted["expected"])
    examples = next(b for b in info["blocks"] if b["type"] == "examples")["items"]
    assert len(examples) == len(planted["expected"]) and all(e["text"] and e["reference"] for e in examples)


def test_output_is_identical_with_two_workers(planted: dict[str, Any], tmp_path: Path) -> None:
    one, _ = run(planted["inputs"], tmp_path / "w1")
    two, _ = run(planted["inputs"], tmp_path / "w2", workers=2)
    assert one.kept_table().equals(two.kept_table())
    assert one.rejected_table().equals(two.rejected_table())


def test_flag_mode_keeps_everything_with_columns(planted: dict[str, Any], tmp_path: Path) -> None:
    result, _ = run(planted["inputs"], tmp_path / "flag", action="flag", keep="longest", shingle="char",
                    shingle_size=7, verify=False)
    table = result.kept_table()
    assert table.num_rows == planted["rows"] and result.rejected_table().num_rows == 0
    flagged = {r["id"]: r for r in table.to_pylist() if r["near_dup_of"] is not None}
    assert set(flagged) | {r["near_dup_of"] for r in flagged.values()} == \
        set(planted["expected"]) | set(planted["expected"].values())
    assert "val:0" not in flagged  # the validation row is never the one flagged
    assert all(r["near_dup_cluster"] is not None and r["near_dup_jaccard"] >= 0.5 for r in flagged.values())
    assert table.schema.field("near_dup_cluster").type == pa.int64()


def test_exact_jaccard_and_signatures_match_a_brute_force(real_data: Path) -> None:
    rows = json.loads((real_data / "alpaca_en_demo/alpaca_en_demo.json").read_text(encoding="utf-8"))[:60]
    texts = [r["instruction"] + "\n" + r["output"] for r in rows]
    texts += [edit_words(t, 2, i) for i, t in enumerate(texts[:20])]

    def shingles(text: str) -> set[tuple[str, ...]]:
        words = re.findall(r"\w+", text.lower())
        return {tuple(words[i:i + 3]) for i in range(len(words) - 2)} if len(words) >= 3 else {tuple(words)}

    values, offsets = minhash.shingle_sets(texts, "word", 3)
    pairs = np.array([[i, 60 + i] for i in range(20)] + [[i, i + 1] for i in range(30)])
    got = minhash.exact_jaccard(values, offsets, pairs)
    want = [len(shingles(texts[a]) & shingles(texts[b])) / len(shingles(texts[a]) | shingles(texts[b]))
            for a, b in pairs.tolist()]
    np.testing.assert_allclose(got, want)
    est = minhash.estimated_jaccard(minhash.signatures(values, offsets, 256), pairs)
    assert np.abs(est - got).max() < 0.12  # 256 permutations: sd <= 0.032


def test_lsh_params_and_union_find() -> None:
    assert minhash.lsh_params(0.7, 128) == (14, 9)
    bands, rows = minhash.lsh_params(0.9, 128)
    assert bands * rows <= 128 and (1 / bands) ** (1 / rows) > 0.8
    edges = np.array([[5, 3], [3, 1], [7, 8], [8, 9], [9, 7]])
    labels = connected_components(10, edges)
    assert labels.tolist() == [0, 1, 2, 1, 4, 1, 6, 7, 7, 7]
    length = np.array([1, 1, 1, 5, 1, 5, 1, 1, 1, 1])
    preferred = np.zeros(10, bool)
    assert pick_kept(labels, preferred).tolist() == [0, 1, 2, 1, 4, 1, 6, 7, 7, 7]
    assert pick_kept(labels, preferred, length).tolist()[1] == 3  # longest, ties to the first
    preferred[9] = True
    assert pick_kept(labels, preferred, length).tolist()[7:] == [9, 9, 9]


@pytest.mark.parametrize(("params", "param"), [
    ({"threshold": 1.5}, "threshold"), ({"threshold": True}, "threshold"), ({"shingle": "byte"}, "shingle"),
    ({"shingle_size": 0}, "shingle_size"), ({"num_perm": 0}, "num_perm"), ({"bands": 4}, "rows"),
    ({"bands": 20, "rows": 10}, "bands"), ({"verify": "yes"}, "verify"), ({"keep": "last"}, "keep"),
    ({"scope": "answer"}, "scope"), ({"action": "delete"}, "action"), ({"validation_sources": [3]},
                                                                       "validation_sources"),
])
def test_config_errors_name_the_parameter(params: dict[str, Any], param: str, tmp_path: Path) -> None:
    with pytest.raises(StageConfigError) as err:
        NearDedupStage(**params)
    assert param in str(err.value) and err.value.param == param
    config = {"inputs": [{"path": str(tmp_path / "x.jsonl")}], "stages": [{"near_dedup": params}]}
    (tmp_path / "x.jsonl").write_text('{"instruction": "a", "output": "b"}\n', encoding="utf-8")
    with pytest.raises(ConfigError, match=param):
        load_config(config)


def test_texts_without_tokens_get_no_shingles() -> None:
    for kind in minhash.SHINGLE_KINDS:
        for texts in ([], [""], ["", "  \n"], ["...", "a b"]):
            values, offsets = minhash.shingle_sets(texts, kind, 3)
            assert len(offsets) == len(texts) + 1 and offsets[0] == 0
            sig = minhash.signatures(values, offsets, 16)
            assert sig.shape == (len(texts), 16)
    values, offsets = minhash.shingle_sets(["...", "a b", "ünï 😀 ok"], "word", 3)
    assert np.diff(offsets).tolist() == [0, 1, 1]  # punctuation only: no word; short text: one shingle


def test_registered_and_empty_input(tmp_path: Path) -> None:
    assert stage_class("near_dedup") is NearDedupStage
    stage = NearDedupStage()
    stage.fit([])
    assert stage.describe()["summary"]["clusters"] == 0


def test_rows_offering_other_tools_are_not_merged(real_data: Path, tmp_path: Path) -> None:
    """Real glaive tool-call rows: the same conversation with another tool list is another
    training example (as in the exact dedup stage); with the same tools it is a duplicate."""
    rows = json.loads((real_data / "sharegpt_glaive_toolcall/glaive_toolcall_en_demo.json").read_text())
    with_tools = [r for r in rows if r.get("tools") and len(" ".join(m["value"] for m in r["conversations"]).split())
                  >= 40]
    a, b = with_tools[0], next(r for r in with_tools[1:] if r["tools"] != with_tools[0]["tools"])
    other_tools = dict(a, tools=b["tools"])  # a's conversation, b's tools
    same_tools = json.loads(json.dumps(a))
    src = tmp_path / "tools.json"
    src.write_text(json.dumps([a, other_tools, same_tools]))
    out = tmp_path / "out"
    Pipeline([NearDedupStage()], workers=1).run([InputSpec(path=str(src))], out)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["counts"]["rows_rejected"] == 1
    rejected = pa.ipc.open_stream((out / "rejected" / "rejected-00000.arrow").read_bytes()).read_all()
    assert rejected.column("id").to_pylist() == ["tools.json:2"]
    assert "near duplicate of tools.json:0" in rejected.column("detail")[0].as_py()
