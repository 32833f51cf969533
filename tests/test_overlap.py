"""OverlapStage on real benchmark items planted into real training rows (alpaca_en_demo)."""

from __future__ import annotations

import gzip
import json
import pickle
from collections import Counter

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dataguard.records import canonical_table
from dataguard.references import ReferenceSpec, parse_spec
from dataguard.stage import StageConfigError
from dataguard.stages.overlap import OverlapStage
from dataguard.testing.plant import POSITIVE_KINDS, plant
from dataguard.text.normalize_text import NormalizeConfig, normalize_batch

REFS = ["gsm8k_test", "humaneval", "truthfulqa", "mt_bench"]
COLUMNS = {"overlap_ratio": pa.float64(), "overlap_longest": pa.int64(), "overlap_ngrams": pa.int64(),
           "overlap_ref_set": pa.string(), "overlap_ref_item": pa.string(), "overlap_ref_coverage": pa.float64(),
           "overlap_exact": pa.bool_(), "contaminated": pa.bool_()}


@pytest.fixture(scope="module")
def alpaca(real_data):
    return json.loads((real_data / "alpaca_en_demo" / "alpaca_en_demo.json").read_text())


@pytest.fixture(scope="module")
def items():
    out = []
    for name in REFS:
        out += [(name, i, t) for i, t in ReferenceSpec(name, None, parse_spec(name).fields).load().items]
    return out


def count_tokens(text: str) -> int:
    """Qwen tokens of a normalised text, as the token-mode scan sees it."""
    from dataguard.text.tokenizers import get_tokenizer

    return len(get_tokenizer().encode_batch([" " + text])[0])


@pytest.fixture(scope="module")
def planted(alpaca, items):
    return plant(alpaca, items, per_kind=40, seed=7, count_tokens=count_tokens)


@pytest.fixture(scope="module", params=["token", "word"])
def fitted(request):
    stage = OverlapStage(references=REFS, mode=request.param)
    stage.fit([])
    return stage


def _run(stage, table):
    out = stage.apply(table)
    stage.absorb([out.stats])
    return out


def _kind(row):
    return json.loads(row["meta"])["kind"]


def test_planted_copies_found_and_near_misses_short_and_clean_rows_not(fitted, planted):
    table = canonical_table(planted)
    out = _run(fitted, table)
    assert out.rejected.num_rows == 0 and out.kept.num_rows == table.num_rows
    for name, dtype in COLUMNS.items():
        assert out.kept.schema.field(name).type == dtype
    rows = out.kept.to_pylist()
    by_kind: dict[str, list[dict]] = {}
    for row in rows:
        by_kind.setdefault(_kind(row), []).append(row)
    for kind in POSITIVE_KINDS:
        got = by_kind[kind]
        missed = [r for r in got if not r["contaminated"]]
        if fitted.mode == "word" and kind == "partial":
            # intra-word punctuation is deleted (``int(a)`` -> ``inta``), so a 60 % window of a
            # short code solution can hold fewer than 13 words: the only misses allowed
            for r in missed:
                window = r["messages"][1]["content"].rsplit("\n\n", 1)[1]
                words = normalize_batch([window], fitted.norm)[0].split()
                assert json.loads(r["meta"])["set"] == "humaneval" and len(words) < fitted.n, r["id"]
            got = [r for r in got if r not in missed]
        else:
            assert not missed, (fitted.mode, kind, [r["id"] for r in missed])
        # attributed to the planted example (a field of it that is fully inside, e.g. the
        # TruthfulQA question of a planted question+answer, counts as the same example)
        for r in got:
            meta = json.loads(r["meta"])
            assert r["overlap_ref_set"] == meta["set"]
            assert r["overlap_ref_item"].split("#")[0] == meta["item"].split("#")[0]
    for r in by_kind["verbatim"] + by_kind["edited"] + by_kind["embedded"]:
        assert r["overlap_ref_coverage"] == 1.0
    for r in [r for r in by_kind["partial"] if r["contaminated"]]:  # the misses were checked above
        assert r["overlap_ref_coverage"] >= 0.5 and r["overlap_ratio"] < 1.0
    # near misses share fewer than n consecutive tokens: not a single matching n-gram
    assert all(r["overlap_ngrams"] == 0 and not r["contaminated"] for r in by_kind["near_miss"])
    assert all(not r["contaminated"] and r["overlap_ratio"] == 0.0 for r in by_kind["short"])
    assert not any(r["contaminated"] for r in by_kind["clean"])


def test_whole_alpaca_file_is_clean_but_row_share_and_longest_span_are_measured(fitted, alpaca, items):
    rows = [{"id": f"a{i}", "source": "alpaca",
             "messages": [{"role": "user", "content": a["instruction"] + "\n" + a["input"]},
                          {"role": "assistant", "content": a["output"]}]} for i, a in enumerate(alpaca)]
    out = fitted.apply(canonical_table(rows))
    assert sum(out.kept.column("contaminated").to_pylist()) == 0
    # a planted verbatim copy as the whole row: the row is all reference text
    q = next(t for s, i, t in items if i == "gsm8k_test/5#question")
    one = fitted.apply(canonical_table([{"id": "x", "source": "s", "messages": [{"role": "user", "content": q}]}]))
    r = one.kept.to_pylist()[0]
    n_tokens = len(normalize_batch([q], NormalizeConfig())[0].split()) if fitted.mode == "word" else None
    assert r["overlap_ratio"] == 1.0 and r["overlap_ngrams"] > 0
    if n_tokens is not None:
        assert r["overlap_longest"] == n_tokens and r["overlap_ngrams"] == n_tokens - 12


def test_examples_mark_the_copied_span(fitted, planted):
    embedded = [r for r in planted if _kind(r) == "embedded"][:3]
    stage = pickle.loads(pickle.dumps(fitted))  # as a worker would see it
    out = stage.apply(canonical_table(embedded))
    fitted.absorb([out.stats])
    desc = fitted.describe()
    json.dumps(desc)
    ex_block = next(b for b in desc["blocks"] if b["type"] == "examples")
    assert len(ex_block["items"]) == 3
    by_id = {r["id"]: r for r in embedded}
    for ex in ex_block["items"]:
        row = by_id[ex["id"]]
        (s, e), = ex["spans"]
        marked = ex["text"][s:e]
        # the marked text is the planted item, up to the punctuation that normalisation folds
        assert normalize_batch([marked], NormalizeConfig()) == normalize_batch([ex["reference"]], NormalizeConfig())
        assert ex["label"] == json.loads(row["meta"])["set"]
    assert desc["summary"]["rows_contaminated"] == 3


def test_drop_rejects_with_reason_and_detail(planted):
    stage = OverlapStage(references=["gsm8k_test", "humaneval"], mode="word", action="drop")
    stage.fit([])
    table = canonical_table(planted)
    out = _run(stage, table)
    assert out.kept.num_rows + out.rejected.num_rows == table.num_rows
    assert set(out.kept.column("id").to_pylist()).isdisjoint(out.rejected.column("id").to_pylist())
    assert set(out.rejected.column("reason").to_pylist()) == {"contamination"}
    assert not any(out.kept.column("contaminated").to_pylist())
    details = out.rejected.column("detail").to_pylist()
    ngram = [d for d in details if not d.startswith("exact copy")]
    assert ngram and all("item" in d and "%" in d and "threshold" in d for d in ngram)
    exact = [d for d in details if d.startswith("exact copy")]  # verbatim copies: the item is named
    assert exact and all("gsm8k_test item gsm8k_test/" in d or "humaneval item HumanEval/" in d for d in exact)
    kinds = Counter(_kind(json.loads(r)) for r in out.rejected.column("record").to_pylist())
    assert set(kinds) <= set(POSITIVE_KINDS)


def test_mask_removes_the_copy_and_keeps_the_rest(planted):
    stage = OverlapStage(references=["gsm8k_test", "humaneval", "truthfulqa", "mt_bench"], mode="token", action="mask")
    stage.fit([])
    rows = [r for r in planted if _kind(r) in ("embedded", "verbatim", "clean")]
    table = canonical_table(rows)
    out = _run(stage, table)
    assert out.kept.num_rows + out.rejected.num_rows == table.num_rows
    kept = {r["id"]: r for r in out.kept.to_pylist()}
    for row in rows:
        k = kept[row["id"]]
        if _kind(row) == "clean":
            assert not k["overlap_masked"] and k["messages"] == row["messages"]
            continue
        assert k["overlap_masked"] and k["contaminated"]
        if _kind(row) == "embedded":  # the answer around the copy survives
            before = row["messages"][1]["content"].split("\n\nFor example:")[0]
            assert k["messages"][1]["content"].startswith(before[:40])
    # rescanning the masked rows finds no copy left
    again = stage.apply(out.kept.select(["id", "source", "messages", "label", "meta"]))
    assert not any(again.kept.column("contaminated").to_pylist())
    # a row that is nothing but the copy: masked to nothing -> rejected, original text kept
    item = json.loads(rows[0]["meta"]) if _kind(rows[0]) == "verbatim" else None
    only = [{"id": "only", "source": "s", "messages": [{"role": "user", "content": rows[0]["messages"][0]["content"]}]}]
    res = stage.apply(canonical_table(only))
    assert res.kept.num_rows == 0 and res.rejected.num_rows == 1
    rec = json.loads(res.rejected.column("record")[0].as_py())
    assert rec["messages"][0]["content"] == only[0]["messages"][0]["content"]
    assert "nothing left after masking" in res.rejected.column("detail")[0].as_py()
    assert item is not None


def test_validation_leakage_both_directions(alpaca):
    def row(i, src, a):
        return {"id": f"{src}:{i}", "source": src, "messages": [
            {"role": "user", "content": a["instruction"] + "\n" + a["input"]},
            {"role": "assistant", "content": a["output"]}]}

    train = [row(i, "train", a) for i, a in enumerate(alpaca[:300])]
    val = [row(i, "val", a) for i, a in enumerate(alpaca[300:400])]
    # leak: 5 validation rows copied into train exactly, 5 with edits, 3 embedded in longer
    # answers (validation rows long enough to hold n-grams; a 10-token row cannot be matched)
    long_val = [300 + j for j in range(100) if len(alpaca[300 + j]["output"].split()) >= 15][:13]
    for j in long_val[:5]:
        train.append(row(1000 + j, "train", alpaca[j]))
    for j in long_val[5:10]:
        a = dict(alpaca[j])
        a["output"] = a["output"].upper().replace(",", "")
        train.append(row(1000 + j, "train", a))
    for k, j in enumerate(long_val[10:13]):
        a = dict(alpaca[k])
        v = alpaca[j]
        a["output"] = a["output"] + "\n\nQ: " + v["instruction"] + "\n" + v["input"] + "\nA: " + v["output"]
        train.append(row(1000 + j, "train", a))
    stage = OverlapStage(references=[], validation_sources=["val"], mode="token")
    batches = [canonical_table(train[:150]), canonical_table(train[150:] + val)]
    stage.fit([stage.summarize(b) for b in batches])
    outs = [stage.apply(b) for b in batches]
    stage.absorb([o.stats for o in outs])
    kept = [r for o in outs for r in o.kept.to_pylist()]
    flagged = {r["id"] for r in kept if r["contaminated"]}
    assert len(long_val) == 13
    leaked = {f"train:{1000 + j}" for j in long_val}
    assert leaked <= flagged
    # alpaca_en_demo has 14 exact duplicate rows: those that straddle our split leak too
    assert all(r["overlap_ref_set"] == "validation" for r in kept if r["id"] in flagged)
    # validation rows are never matched against themselves
    assert not any(r["contaminated"] for r in kept if r["source"] == "val")
    s = stage.describe()["summary"]
    assert s["validation_rows"] == 100
    assert s["cross_split_exact_duplicates"] >= 5
    assert s["cross_split_near_duplicates"] >= 10
    assert s["validation_rows_found_in_train"] >= 13
    table = next(b for b in stage.describe()["blocks"] if b["title"].startswith("Validation rows found"))
    assert {f"val:{j - 300}" for j in long_val} <= {r[0] for r in table["rows"]}
    assert {f"train:{1000 + j}" for j in long_val[:3]} <= {r[1] for r in table["rows"]}


def test_user_reference_files_with_field_mapping(tmp_path, alpaca, real_data):
    mmlu = [json.loads(line) for line in (real_data / "mmlu" / "mmlu_validation.head200.jsonl").open()][:200]
    jl = tmp_path / "bench.jsonl.gz"
    with gzip.open(jl, "wt") as f:
        for k, r in enumerate(mmlu):
            f.write(json.dumps({"qid": f"q{k}", "q": {"text": r["question"]}, "choices": r["choices"]}) + "\n")
    csvp = tmp_path / "bench.csv"
    csvp.write_text("id,prompt\n" + "\n".join(f'c{k},"{r["question"]}"' for k, r in enumerate(mmlu[:50])
                                              if '"' not in r["question"]))
    pqp = tmp_path / "bench.parquet"
    pq.write_table(pa.table({"question": [r["question"] for r in mmlu]}), pqp)
    refs = [{"name": "mmlu_val", "path": str(jl), "fields": ["q.text+choices"], "id_field": "qid"},
            {"name": "csvbench", "path": str(csvp), "fields": ["prompt"], "id_field": "id"},
            {"name": "pqbench", "path": str(pqp), "fields": ["question"]}]
    stage = OverlapStage(references=refs, mode="word")
    stage.fit([])
    long_q = next(k for k, r in enumerate(mmlu) if len(r["question"].split()) > 30)
    text = mmlu[long_q]["question"] + "\n" + "\n".join(mmlu[long_q]["choices"])
    rows = [{"id": "p", "source": "s", "messages": [{"role": "user", "content": alpaca[0]["instruction"]},
                                                    {"role": "assistant", "content": text}]}]
    r = stage.apply(canonical_table(rows)).kept.to_pylist()[0]
    assert r["contaminated"] and r["overlap_ref_set"] == "mmlu_val" and r["overlap_ref_item"] == f"q{long_q}"
    info = {i["set"]: i for i in stage.fitted().set_info}
    assert info["pqbench"]["items"] == 200 and info["csvbench"]["items"] > 40


def test_mmlu_planted_with_reformatted_choices(real_data, alpaca):
    stage = OverlapStage(references=["mmlu_test"], mode="token")
    stage.fit([])
    mmlu = [json.loads(line) for line in (real_data / "mmlu" / "mmlu_test.head45.jsonl").open()]
    picks = [r for r in mmlu if len(r["question"].split()) > 25][:20]
    rows = [{"id": f"m{k}", "source": "s", "messages": [
        {"role": "user", "content": "Answer the question.\n" + r["question"] + "\n" +
         "\n".join(f"({'abcd'[j]}) {c}" for j, c in enumerate(r["choices"]))},
        {"role": "assistant", "content": alpaca[k]["output"]}]} for k, r in enumerate(picks)]
    out = stage.apply(canonical_table(rows)).kept.to_pylist()
    assert all(r["contaminated"] and r["overlap_ref_set"] == "mmlu_test" for r in out)


def test_empty_batch_and_deterministic_output(fitted, planted):
    empty = canonical_table([])
    out = fitted.apply(empty)
    assert out.kept.num_rows == 0
    for name, dtype in COLUMNS.items():
        assert out.kept.schema.field(name).type == dtype
    table = canonical_table(planted[:60])
    a = fitted.apply(table).kept
    b = pickle.loads(pickle.dumps(fitted)).apply(table).kept
    assert a.equals(b)
    assert list(fitted.output_columns()) == list(COLUMNS)


def test_rows_without_messages_or_content():
    stage = OverlapStage(references=["gsm8k_test"], mode="word")
    stage.fit([])
    table = pa.Table.from_pylist(
        [{"id": "a", "source": "s", "messages": None, "label": None, "meta": None},
         {"id": "b", "source": "s", "messages": [{"role": "user", "content": None}], "label": None, "meta": None},
         {"id": "c", "source": "s", "messages": [], "label": None, "meta": None}],
        schema=canonical_table([]).schema)
    out = stage.apply(table)
    assert out.kept.num_rows == 3
    assert out.kept.column("overlap_ratio").to_pylist() == [0.0, 0.0, 0.0]


@pytest.mark.parametrize("kwargs, param", [
    ({"n": 7}, "n"), ({"n": 51}, "n"), ({"mode": "char"}, "mode"), ({"action": "delete"}, "action"),
    ({"threshold": 0}, "threshold"), ({"ref_threshold": 1.5}, "ref_threshold"),
    ({"references": ["nope"]}, "references"), ({"references": [{"name": "x", "path": "/no/such.jsonl",
                                                                "fields": ["a"]}]}, "references"),
    ({"normalize": {"lower": True}}, "normalize"), ({"normalize": {"intraword": "yes"}}, "normalize"),
    ({"roles": ["robot"]}, "roles"),
    ({"references": [], "validation_sources": []}, "references"), ({"validation_sources": [3]}, "validation_sources"),
])
def test_config_errors_name_the_parameter(kwargs, param):
    with pytest.raises(StageConfigError, match=param):
        OverlapStage(**kwargs)


def test_shipped_references_are_small_and_complete():
    from dataguard.references import BUILTIN, HERE

    total = sum((HERE / b.file).stat().st_size for b in BUILTIN.values())
    assert total < 4 * 2**20
    counts = {name: sum(1 for _ in gzip.open(HERE / b.file, "rt")) for name, b in BUILTIN.items()}
    assert counts == {"gsm8k_test": 1319, "mmlu_test": 14042, "humaneval": 164, "truthfulqa": 817, "mt_bench": 80}
    assert (HERE / "SOURCE.md").is_file()


def test_ratio_counts_row_tokens_not_item_tokens(fitted, items):
    q = next(t for s, i, t in items if i == "gsm8k_test/3#question")
    filler = " ".join(["lorem ipsum dolor sit amet"] * 40)
    r = fitted.apply(canonical_table([{"id": "x", "source": "s", "messages": [
        {"role": "user", "content": q}, {"role": "assistant", "content": filler}]}])).kept.to_pylist()[0]
    assert r["overlap_ref_coverage"] == 1.0
    assert 0.05 < r["overlap_ratio"] < 0.5
    assert np.isclose(r["overlap_ratio"], r["overlap_longest"] / (r["overlap_longest"] / r["overlap_ratio"]))


def test_pipeline_end_to_end_with_validation_split(tmp_path, alpaca, items):
    from dataguard.io.readers import InputSpec
    from dataguard.pipeline import Pipeline

    q = next(t for s, i, t in items if i == "gsm8k_test/10#question")
    train = [dict(a) for a in alpaca[:200]]
    train[5]["output"] = train[5]["output"] + "\n\nPractice problem: " + q
    val = alpaca[200:260]
    long_val = [a for a in val if len(a["output"].split()) > 40][:3]
    train += [dict(a) for a in long_val]
    (tmp_path / "train.json").write_text(json.dumps(train))
    (tmp_path / "val.json").write_text(json.dumps(val))
    stage = OverlapStage(references=["gsm8k_test", "humaneval"], validation_sources=["val"], mode="word",
                         action="drop")
    result = Pipeline([stage], workers=1, batch_rows=64).run(
        [InputSpec(path=tmp_path / "train.json", name="train"), InputSpec(path=tmp_path / "val.json", name="val")],
        tmp_path / "out")
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["counts"]["balanced"] and manifest["counts"]["rows_in"] == 263
    desc = next(s for s in manifest["stages"] if s["name"] == "overlap")["description"]
    summary = desc["summary"]
    assert summary["rows_dropped"] >= 4  # the planted question + three copied validation rows
    assert summary["validation_rows"] == 60
    assert summary["cross_split_exact_duplicates"] >= 3
    assert summary["validation_rows_found_in_train"] >= 3
    assert result.manifest["stages"][-1]["reasons"].get("contamination", 0) == summary["rows_dropped"]


def test_token_ids_reused_from_an_earlier_tokenizing_stage(planted):
    """With normalisation off the scan tokenizes exactly the message texts, so ids an
    earlier stage put in the per-process cache are reused instead of recomputed."""
    from dataguard.text import tokenizers as tk

    stage = OverlapStage(references=["gsm8k_test", "humaneval"], mode="token", normalize=False)
    stage.fit([])
    rows = [r for r in planted if _kind(r) in ("verbatim", "clean")]
    contents = [m["content"] for r in rows for m in r["messages"]]
    tok = tk.get_tokenizer()
    tk.clear_token_cache(4_000_000)
    tok.encode_batch(contents)  # the earlier stage
    before = tk.token_cache_info()[tok.name]
    out = stage.apply(canonical_table(rows)).kept.to_pylist()
    after = tk.token_cache_info()[tok.name]
    assert after["misses"] == before["misses"] and after["hits"] - before["hits"] >= len(contents)
    verbatim = [r for r in out if _kind(r) == "verbatim" and json.loads(r["meta"])["set"] in ("gsm8k_test", "humaneval")]
    assert verbatim and all(r["contaminated"] for r in verbatim)
    assert not any(r["contaminated"] for r in out if _kind(r) == "clean")
