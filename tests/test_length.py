"""Length percentile truncation: exact histogram, fit on real data, conversation-safe truncation."""

from __future__ import annotations

import json
import math
import pickle

import numpy as np
import pyarrow as pa
import pytest

from dataguard.records import REJECTED_SCHEMA, canonical_table
from dataguard.stage import StageConfigError
from dataguard.stages.length import LengthStage
from dataguard.text.histogram import IntHistogram
from dataguard.text.tokenizers import get_tokenizer


def run_stage(stage: LengthStage, tables: list[pa.Table]):
    scored = [stage.score(t) for t in tables]
    stage.fit([stage.summarize(t) for t in scored])
    outs = [stage.apply(t) for t in scored]
    stage.absorb([o.stats for o in outs])
    return outs


def alpaca_rows(real_data, limit=None):
    data = json.loads((real_data / "alpaca_en_demo" / "alpaca_en_demo.json").read_text())[:limit]
    return [
        {"id": f"alpaca:{i}", "source": "alpaca",
         "messages": [{"role": "user", "content": r["instruction"] + ("\n" + r["input"] if r["input"] else "")},
                      {"role": "assistant", "content": r["output"]}]}
        for i, r in enumerate(data)
    ]


def sharegpt_rows(real_data):
    data = json.loads((real_data / "sharegpt_fastchat_dummy" / "dummy_conversation.json").read_text())
    role = {"human": "user", "gpt": "assistant"}
    return [{"id": f"sg:{r['id']}", "source": "sharegpt",
             "messages": [{"role": role[t["from"]], "content": t["value"]} for t in r["conversations"]]}
            for r in data]


# --- histogram -------------------------------------------------------------------------
def test_histogram_is_exact_and_mergeable():
    rng = np.random.default_rng(0)
    x = rng.integers(0, 3000, size=5000)
    parts = [IntHistogram.of(x[i:i + 700]) for i in range(0, len(x), 700)]
    merged = IntHistogram.merge(parts)
    assert merged.total == len(x) and merged.sum() == int(x.sum())
    for p in (0, 1, 50, 90, 99.5, 100):
        assert merged.percentile(p) == pytest.approx(np.percentile(x, p))
    edges = np.array([0, 1000, 2000, 3000])
    assert merged.binned(edges) == np.histogram(x, edges)[0].tolist()
    assert IntHistogram.from_dict(json.loads(json.dumps(merged.to_dict()))).total == len(x)


# --- fit on real data ------------------------------------------------------------------
def test_fit_on_real_alpaca_sets_percentile_cap(real_data):
    rows = alpaca_rows(real_data)
    tables = [canonical_table(rows[i:i + 250]) for i in range(0, len(rows), 250)]
    stage = LengthStage(percentile=90, factor=1.5, action="drop")
    outs = run_stage(stage, tables)
    n_tokens = np.concatenate([stage.score(t).column("n_tokens").to_numpy() for t in tables])
    assert stage.cap == math.ceil(np.percentile(n_tokens, 90) * 1.5)
    # Record counts = content tokens + ChatML framing, checked against the real tokenizer.
    enc = get_tokenizer()._encoding()
    m = rows[0]["messages"]
    rendered = "".join(f"<|im_start|>{x['role']}\n{x['content']}<|im_end|>\n" for x in m)
    assert n_tokens[0] == len(enc.encode(rendered, allowed_special="all"))
    kept = sum(o.kept.num_rows for o in outs)
    rejected = [r for o in outs for r in o.rejected.to_pylist()]
    assert kept + len(rejected) == len(rows)
    assert {r["reason"] for r in rejected} <= {"too_long", "too_short"}
    assert sum(r["reason"] == "too_long" for r in rejected) == int((n_tokens > stage.cap).sum())
    d = stage.describe()
    json.dumps(d)
    hist = next(b for b in d["blocks"] if b["type"] == "histogram")
    assert {"label": "cap", "value": stage.cap} in hist["markers"]
    assert sum(hist["series"]["before"]) == len(rows)
    assert sum(hist["series"]["after"]) == kept
    assert d["summary"]["rows_dropped_too_long"] == len(rows) - kept - d["summary"]["rows_too_short"]


# --- truncation ------------------------------------------------------------------------
def long_conversation():
    words = "alpha beta gamma delta epsilon zeta eta theta iota kappa".split()

    def text(k: int, n: int) -> str:
        return " ".join(words[(k + j) % 10] for j in range(n))

    return {"id": "conv", "source": "t", "messages": [
        {"role": "system", "content": "You are a careful assistant. " + text(0, 20)},
        {"role": "user", "content": "first question " + text(1, 80)},
        {"role": "assistant", "content": "first answer " + text(2, 80)},
        {"role": "user", "content": "second question " + text(3, 80)},
        {"role": "assistant", "content": "second answer " + text(4, 80)},
        {"role": "user", "content": "final question " + text(5, 30)},
        {"role": "assistant", "content": "final answer " + text(6, 40)},
    ]}


def short_conversation(i: int):
    return {"id": f"s{i}", "source": "t", "messages": [
        {"role": "user", "content": f"Question number {i}: what is two plus two?"},
        {"role": "assistant", "content": "Two plus two is four."}]}


def test_truncate_drops_oldest_history_keeps_system_and_final():
    conv = long_conversation()
    table = canonical_table([conv] + [short_conversation(i) for i in range(3)])
    tok = get_tokenizer()
    _, totals = tok.count_records([conv["messages"]])
    full = int(totals[0])
    without_first = [m for k, m in enumerate(conv["messages"]) if k not in (1, 2)]
    _, t2 = tok.count_records([without_first])
    cap = int(t2[0])  # fits exactly once the oldest exchange is gone
    stage = LengthStage(percentile=None, max_tokens=cap, action="truncate")
    (out,) = run_stage(stage, [table])
    assert out.rejected.num_rows == 0 and out.kept.num_rows == 4
    row = out.kept.to_pylist()[0]
    assert row["truncated"] is True
    assert row["tokens_before"] == full and row["tokens_after"] == cap == row["n_tokens"]
    assert row["messages"] == without_first
    assert row["messages"][0]["role"] == "system" and row["messages"][-1] == conv["messages"][-1]
    assert row["message_tokens"] == tok.count_batch([m["content"] for m in without_first]).tolist()
    assert [r["truncated"] for r in out.kept.to_pylist()[1:]] == [False, False, False]
    s = stage.describe()["summary"]
    assert s["rows_truncated"] == 1
    assert s["share_tokens_removed"] == pytest.approx((full - cap) / s["tokens_in"], abs=1e-6)

    # A smaller cap removes both history exchanges but still keeps system + final exchange.
    final_only = [conv["messages"][0]] + conv["messages"][-2:]
    _, t3 = tok.count_records([final_only])
    stage = LengthStage(percentile=None, max_tokens=int(t3[0]) + 5, action="truncate")
    (out,) = run_stage(stage, [table])
    assert out.kept.to_pylist()[0]["messages"] == final_only


def test_untruncatable_and_cut_final():
    conv = long_conversation()
    tok = get_tokenizer()
    final_only = [conv["messages"][0]] + conv["messages"][-2:]
    _, t3 = tok.count_records([final_only])
    cap = int(t3[0]) - 20  # even system + final exchange do not fit
    table = canonical_table([conv, short_conversation(0)])
    (out,) = run_stage(LengthStage(percentile=None, max_tokens=cap), [table])
    rej = out.rejected.to_pylist()
    assert [r["reason"] for r in rej] == ["too_long_untruncatable"] and rej[0]["id"] == "conv"
    assert f"cap={cap}" in rej[0]["detail"]
    assert out.rejected.schema == REJECTED_SCHEMA

    # Allowed to cut the final turn: cut at a token boundary to fit exactly under the cap.
    (out,) = run_stage(LengthStage(percentile=None, max_tokens=cap, cut_final=True), [table])
    row = out.kept.to_pylist()[0]
    assert row["truncated"] and row["tokens_after"] <= cap
    assert conv["messages"][-1]["content"].startswith(row["messages"][-1]["content"])
    assert len(row["messages"][-1]["content"]) < len(conv["messages"][-1]["content"])
    assert row["messages"][0] == conv["messages"][0]

    # keep_system=False: the system prompt may go before anything is cut.
    no_sys = conv["messages"][-2:]
    _, t4 = tok.count_records([no_sys])
    (out,) = run_stage(LengthStage(percentile=None, max_tokens=int(t4[0]), keep_system=False), [table])
    assert out.kept.to_pylist()[0]["messages"] == no_sys


def test_drop_and_too_short_reasons_and_nothing_lost():
    conv = long_conversation()
    tiny = {"id": "tiny", "source": "t", "messages": [{"role": "user", "content": "Hi"},
                                                      {"role": "assistant", "content": ""}]}
    rows = [conv, tiny] + [short_conversation(i) for i in range(5)]
    stage = LengthStage(percentile=None, max_tokens=100, action="drop", min_tokens=4)
    (out,) = run_stage(stage, [canonical_table(rows)])
    reasons = {r["id"]: r["reason"] for r in out.rejected.to_pylist()}
    assert reasons == {"conv": "too_long", "tiny": "too_short"}
    kept_ids = out.kept.column("id").to_pylist()
    assert sorted(kept_ids + list(reasons)) == sorted(r["id"] for r in rows)
    assert not set(kept_ids) & set(reasons)


def test_real_multiturn_truncation_keeps_conversation_shape(real_data):
    rows = sharegpt_rows(real_data)
    stage = LengthStage(percentile=50, factor=1.0, action="truncate")
    outs = run_stage(stage, [canonical_table(rows[i:i + 200]) for i in range(0, len(rows), 200)])
    kept = [r for o in outs for r in o.kept.to_pylist()]
    rejected = [r for o in outs for r in o.rejected.to_pylist()]
    assert len(kept) + len(rejected) == len(rows)
    by_id = {r["id"]: r for r in rows}
    truncated = [r for r in kept if r["truncated"]]
    assert truncated, "a median cap must truncate some multi-turn conversations"
    for r in truncated:
        orig = by_id[r["id"]]["messages"]
        assert r["tokens_after"] <= stage.cap < r["tokens_before"]
        assert r["messages"][-1] == orig[-1]                       # final turn intact
        assert r["messages"] == orig[len(orig) - len(r["messages"]):]  # a suffix: oldest turns went first
        assert r["messages"][0]["role"] == "user"                  # exchanges removed whole
    for r in kept:
        if not r["truncated"]:
            assert r["tokens_after"] == r["tokens_before"] <= stage.cap
    assert {r["reason"] for r in rejected} <= {"too_long_untruncatable", "too_short"}


def test_schema_stable_on_empty_batch_and_pickle():
    stage = pickle.loads(pickle.dumps(LengthStage(percentile=None, max_tokens=50)))
    empty = canonical_table([])
    scored = stage.score(empty)
    stage.fit([stage.summarize(scored)])
    out = stage.apply(scored)
    full = stage.apply(stage.score(canonical_table([short_conversation(1)])))
    assert out.kept.schema == full.kept.schema
    for name, typ in stage.output_columns().items():
        assert out.kept.schema.field(name).type == typ


@pytest.mark.parametrize("kwargs, bad", [
    ({"percentile": 0}, "percentile"), ({"factor": -1}, "factor"), ({"max_tokens": 0}, "max_tokens"),
    ({"action": "cut"}, "action"), ({"min_tokens": -1}, "min_tokens"), ({"keep_system": "yes"}, "keep_system"),
])
def test_config_errors_name_the_parameter(kwargs, bad):
    with pytest.raises(StageConfigError, match=bad):
        LengthStage(**kwargs)
