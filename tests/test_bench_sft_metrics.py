"""benchmarks/bench_sft.py without a model: the plain degeneration counters, and the seeded,
tagged planting on real rows from tests/data (the benchmark's figures rest on both)."""

from __future__ import annotations

import importlib.util
import json
import sys
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_sft", ROOT / "benchmarks" / "bench_sft.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_sft"] = module
    spec.loader.exec_module(module)
    module.SHARED = ROOT / "tests" / "data" / "no-shared-copy"  # tests never read ../shared
    return module


@pytest.fixture(scope="module")
def base(bench):
    return bench.load_base()


def test_url_counter(bench):
    assert bench.has_url("See https://example.com/x for more.")
    assert bench.has_url("go to www.example-12.com now")
    assert not bench.has_url("The protocol is HTTP over TCP; see section 3.")


def test_loop_counter_catches_loops_of_any_period(bench):
    assert bench.has_loop("Sure. " + "I think " * 6)  # period 2, 12 words
    assert bench.has_loop("The cat sat down. " * 3)  # period 5 (4 words + '.'), 3 copies
    assert bench.has_loop("Done" + "!" * 20)  # a character run
    assert not bench.has_loop("Done" + "!" * 19)
    assert not bench.has_loop("I think I think I think")  # 3 copies of a 2-word unit is only 6 words
    assert not bench.has_loop("No no no no no no no no no no no")  # 11 words: below three 4-grams


def test_loop_counter_spares_ordinary_answers(bench):
    listing = "\n".join(f"{i}. Preheat the oven to {150 + 10 * i} degrees and wait." for i in range(1, 8))
    assert not bench.has_loop(listing)
    assert not bench.has_loop("")


def test_degeneration_shares(bench):
    shares = bench.degeneration(["fine answer", "", "  ", "visit http://a.b", "go " * 12])
    assert shares == {"url": 0.2, "loop": 0.2, "empty": 0.4, "any": 0.8}
    assert bench.degeneration([])["any"] == 0
    invited = bench.degeneration(["see http://a.b", "see http://a.b"], invited=[True, False])
    assert invited["url"] == 0.5 and invited["any"] == 0.5  # a URL the reference answer has is no defect


def test_base_rows_are_real_clean_and_unique(bench, base):
    assert len(base) > 2000
    assert {r["source"] for r in base} == {"alpaca", "seed_tasks", "toolformer", "kto", "fastchat", "dpo"}
    keys = [json.dumps(r["messages"], sort_keys=True) for r in base]
    assert len(set(keys)) == len(keys)
    assert all(m["content"].strip() for r in base for m in r["messages"])
    assert all(r["messages"][-1]["role"] == "assistant" for r in base)


def test_planting_is_tagged_seeded_and_about_a_quarter(bench, base):
    gsm = [json.loads(x) for x in (ROOT / "tests/data/gsm8k/test.head100.jsonl").read_text().splitlines()][:50]
    rows = bench.plant(base[:2400], gsm, seed=3)
    assert rows == bench.plant(base[:2400], gsm, seed=3)  # deterministic
    assert rows != bench.plant(base[:2400], gsm, seed=4)
    tags = Counter(r["tag"] for r in rows)
    assert set(tags) == {"clean", *bench.TAGS}
    assert tags["gsm8k"] == 50 and tags["swapped"] == 100 and tags["url"] == 100 and tags["overlong"] == 50
    assert 0.2 < 1 - tags["clean"] / len(rows) < 0.32
    kept = {json.dumps(b["messages"]) for b in base[:2400]}
    answers = {b["messages"][-1]["content"] for b in base[:2400]}
    for r in rows:
        answer = r["messages"][-1]["content"]
        same = json.dumps(r["messages"]) in kept
        if r["tag"] in ("clean", "dup_exact"):
            assert same  # untouched rows and exact copies are base rows verbatim
        elif r["tag"] == "url":
            assert bench.has_url(answer) and not same
        elif r["tag"] == "loop":
            assert bench.has_loop(answer) and not same
        elif r["tag"] == "empty":
            assert bench.is_empty(answer)
        elif r["tag"] == "swapped":  # another row's real answer under this prompt
            assert answer in answers and not same
        elif r["tag"] in ("dup_near", "truncated", "overlong"):
            assert not same


def test_held_out_rows_never_reach_training(bench, tmp_path, monkeypatch):
    data = bench.build_data(0, held_out=60, n_prompts=20)
    held = {bench._prompt(r) for r in data["eval"]}
    assert len(data["eval"]) == 60 and len(data["prompts"]) == 20
    assert all(bench._single_turn(r) for r in data["eval"])
    assert not held & {bench._prompt(r) for r in data["train"]}
    inputs, tags = bench.write_inputs(data["train"], tmp_path)
    assert len(tags) == len(data["train"]) and Counter(tags.values()) == Counter(r["tag"] for r in data["train"])
    first = json.loads((tmp_path / "train_alpaca.jsonl").read_text().splitlines()[0])
    assert set(first) == {"messages"}  # the tag never travels with the row
    assert tags["alpaca:0"] == next(r["tag"] for r in data["train"] if r["source"] == "alpaca")
    assert {i["name"] for i in inputs} == {r["source"] for r in data["train"]}
