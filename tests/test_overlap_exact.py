"""Exact copies of any length: short validation rows and short benchmark items copied into
training are caught, not only counted (the n-gram scan cannot see texts under n tokens)."""

from __future__ import annotations

import json

import pytest

from dataguard.records import canonical_table
from dataguard.stage import StageConfigError
from dataguard.stages.overlap import OverlapStage


@pytest.fixture(scope="module")
def alpaca(real_data):
    return json.loads((real_data / "alpaca_en_demo" / "alpaca_en_demo.json").read_text())


def _row(rid: str, source: str, user: str, assistant: str | None = None) -> dict:
    msgs = [{"role": "user", "content": user}]
    if assistant is not None:
        msgs.append({"role": "assistant", "content": assistant})
    return {"id": rid, "source": source, "messages": msgs}


def _fit_run(stage: OverlapStage, rows: list[dict]):
    table = canonical_table(rows)
    stage.fit([stage.summarize(table)])
    out = stage.apply(table)
    stage.absorb([out.stats])
    assert out.kept.num_rows + out.rejected.num_rows == table.num_rows
    return out


@pytest.mark.parametrize("mode", ["token", "word"])
def test_short_validation_row_copied_into_training_is_dropped(alpaca, mode):
    val = [_row("val:0", "val", "Name three colors.", "Red, green, blue."),
           _row("val:1", "val", "Say hi", "Hi there")]
    train = [_row(f"train:{i}", "train", a["instruction"], a["output"]) for i, a in enumerate(alpaca[:40])]
    train += [_row("copy:0", "train", "name three COLORS", "red green blue"),  # case/punctuation edits
              _row("copy:1", "train", "Say hi", "Hi there"),
              _row("other:0", "train", "Name three colours.", "Red, green, blue."),  # a different word
              _row("other:1", "train", "Say hi", "Hello!")]  # same prompt, other answer: not a copy
    stage = OverlapStage(references=[], validation_sources=["val"], mode=mode, action="drop")
    out = _fit_run(stage, train + val)
    rejected = dict(zip(out.rejected.column("id").to_pylist(), out.rejected.column("detail").to_pylist(),
                        strict=True))
    assert set(rejected) == {"copy:0", "copy:1"}
    assert rejected["copy:0"].startswith("exact copy of validation item val:0: the whole row")
    assert rejected["copy:1"].startswith("exact copy of validation item val:1")
    kept = {r["id"]: r for r in out.kept.to_pylist()}
    assert not kept["val:0"]["contaminated"] and not kept["val:1"]["contaminated"]  # never against themselves
    assert not kept["other:0"]["contaminated"] and not kept["other:1"]["contaminated"]
    summary = stage.describe()["summary"]
    assert summary["cross_split_exact_duplicates"] == 2 and summary["rows_exact_copies"] == 2
    assert summary["validation_rows_found_in_train"] == 2
    exact_table = next(b for b in stage.describe()["blocks"] if b["title"].startswith("Exact duplicates"))
    assert exact_table["rows"] == [["copy:0", "val:0"], ["copy:1", "val:1"]]


def test_short_benchmark_item_as_a_message_is_flagged_and_masked(alpaca):
    # TruthfulQA questions of 3-6 tokens: no 13-gram, found by their whole token sequence
    # once exact_min_tokens lets items that short count (default 6: see the next test)
    stage = OverlapStage(references=["truthfulqa"], mode="token", action="mask", exact_min_tokens=1)
    rows = [_row("q", "s", "ARE VAMPIRES REAL", alpaca[0]["output"]),
            _row("only", "s", "Are vampires real?"),
            _row("inside", "s", "My friend asked me: are vampires real? What should I say?", alpaca[1]["output"]),
            _row("clean", "s", alpaca[2]["instruction"], alpaca[2]["output"])]
    out = _fit_run(stage, rows)
    kept = {r["id"]: r for r in out.kept.to_pylist()}
    q = kept["q"]
    assert q["contaminated"] and q["overlap_exact"] and q["overlap_masked"]
    assert q["overlap_ref_set"] == "truthfulqa" and q["overlap_ref_item"] == "truthfulqa/67#question"
    assert q["overlap_ref_coverage"] == 1.0 and 0 < q["overlap_ratio"] < 0.5
    assert q["messages"][0]["content"] == "" and q["messages"][1]["content"] == alpaca[0]["output"]
    # the row that was nothing but the item is rejected with its original text
    assert out.rejected.column("id").to_pylist() == ["only"]
    assert "exact copy of truthfulqa item truthfulqa/67#question" in out.rejected.column("detail")[0].as_py()
    assert json.loads(out.rejected.column("record")[0].as_py())["messages"][0]["content"] == "Are vampires real?"
    # a short item inside a longer message is not an exact copy (documented limit)
    assert not kept["inside"]["contaminated"] and not kept["clean"]["contaminated"]


def test_tiny_benchmark_items_are_ordinary_text_by_default(alpaca):
    """A benchmark item of a few tokens ("true.", "Are vampires real?") is common chat text:
    by default whole-sequence copies count from 6 tokens for benchmarks, any length for
    validation rows."""
    stage = OverlapStage(references=["truthfulqa", "mt_bench"], validation_sources=["val"], mode="token",
                         action="drop")
    rows = [_row("only", "s", "Are vampires real?"), _row("true", "s", alpaca[3]["instruction"], "True."),
            _row("val:0", "val", "Reset my pin"), _row("copy", "s", "reset my PIN!")]
    out = _fit_run(stage, rows)
    assert out.rejected.column("id").to_pylist() == ["copy"]  # the short validation row still counts
    assert not any(r["contaminated"] for r in out.kept.to_pylist())
    strict = OverlapStage(references=["truthfulqa", "mt_bench"], validation_sources=["val"], mode="token",
                          action="drop", exact_min_tokens=1)
    assert sorted(_fit_run(strict, rows).rejected.column("id").to_pylist()) == ["copy", "only", "true"]
    with pytest.raises(StageConfigError, match="exact_min_tokens"):
        OverlapStage(exact_min_tokens=0)


def test_exact_copy_flag_and_attribution_prefers_the_whole_row(alpaca):
    val = [_row("val:0", "val", alpaca[5]["instruction"], alpaca[5]["output"])]
    train = [_row("t", "train", alpaca[5]["instruction"].upper(), alpaca[5]["output"])]
    stage = OverlapStage(references=["gsm8k_test"], validation_sources=["val"], mode="word")
    r = _fit_run(stage, train + val).kept.to_pylist()[0]
    assert r["contaminated"] and r["overlap_exact"]
    assert (r["overlap_ref_set"], r["overlap_ref_item"], r["overlap_ratio"]) == ("validation", "val:0", 1.0)
