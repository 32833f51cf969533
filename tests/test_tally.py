"""The shared tally: merging is order-preserving and does not depend on batch boundaries."""

from __future__ import annotations

import pickle
from collections import Counter

import numpy as np
import pyarrow as pa
import pytest

from dataguard.records import reject_rows
from dataguard.stage import Outcome, Stage, UndeclaredReasonError
from dataguard.tally import Best, Tally

ROWS = [{"id": f"r{i}", "score": float((i * 37) % 11), "lang": "en" if i % 3 else "de"} for i in range(40)]


def _tally(rows: list[dict], cap: int = 5) -> Tally:
    t = Tally(counts=Counter(rows=len(rows)))
    t.count("lang", (r["lang"] for r in rows))
    t.hist("score", np.histogram([r["score"] for r in rows], bins=np.arange(12))[0])
    t.keep("first", rows, cap)
    t.keep("lowest", rows, cap, rank=("score", "id"))
    for r in rows:
        t.note("ids", r["id"], r["score"])
    return t


@pytest.mark.parametrize("size", [1, 3, 7, 40])
def test_merge_does_not_depend_on_batching(size: int) -> None:
    whole = _tally(ROWS)
    merged = Tally.merge([_tally(ROWS[i:i + size]) for i in range(0, len(ROWS), size)])
    assert merged.counts == whole.counts == Counter(rows=40)
    assert merged.counters["lang"] == whole.counters["lang"] == Counter(en=26, de=14)
    np.testing.assert_array_equal(merged.hists["score"], whole.hists["score"])
    assert merged.items("first") == ROWS[:5]
    assert merged.items("lowest") == sorted(ROWS, key=lambda r: (r["score"], r["id"]))[:5] == whole.items("lowest")
    assert merged.lookup["ids"] == whole.lookup["ids"]


def test_none_is_skipped_and_an_empty_merge_reads_as_zero() -> None:
    empty = Tally.merge([None, None])
    assert empty.get("rows") == 0 and empty.items("first") == [] and empty.counters == {}
    assert Tally.merge([None, _tally(ROWS[:2]), None]).get("rows") == 2


def test_weighted_histograms_stay_float_and_tally_pickles() -> None:
    t = Tally()
    t.hist("w", np.array([0.5, 1.5]))
    t.hist("w", np.array([1.0, 0.25]))
    assert t.hists["w"].dtype == np.float64 and t.hists["w"].tolist() == [1.5, 1.75]
    assert pickle.loads(pickle.dumps(t)).hists["w"].tolist() == [1.5, 1.75]


class _Rejecting(Stage):
    name = "rejecting"
    reasons = {"declared": "a test reason"}

    def apply(self, batch: pa.Table) -> Outcome:
        mask = pa.array([True] * batch.num_rows)
        return Outcome(kept=batch.slice(0, 0), rejected=reject_rows(batch, mask, self.name, "undeclared",
                                                                      ["x"] * batch.num_rows))


def test_undeclared_reason_is_refused() -> None:
    batch = pa.table({"id": ["a", "b"]})
    out = _Rejecting().apply(batch)
    with pytest.raises(UndeclaredReasonError, match=r"reason\(s\) \['undeclared'\].*declared: \['declared'\]"):
        _Rejecting().check_reasons(out.rejected.column("reason").to_pylist())
    ok = reject_rows(batch, pa.array([True, False]), "rejecting", "declared", ["x"])
    _Rejecting().check_reasons(ok.column("reason").to_pylist())


def test_base_absorb_merges_into_the_stage_tally() -> None:
    stage = Stage()
    assert stage.tally.get("rows") == 0
    stage.absorb([_tally(ROWS[:10]), None, _tally(ROWS[10:])])
    assert stage.tally.get("rows") == 40 and stage.tally.items("first") == ROWS[:5]


@pytest.mark.parametrize("size", [1, 4, 40])
def test_per_key_cap_keeps_the_first_items_of_each_key_whatever_the_batching(size: int) -> None:
    def tally(rows: list[dict]) -> Tally:
        t = Tally()
        t.keep("ex", rows, 5, per=("lang", 2))
        return t

    merged = Tally.merge([tally(ROWS[i:i + size]) for i in range(0, len(ROWS), size)])
    assert [r["id"] for r in merged.items("ex")] == ["r0", "r1", "r2", "r3"]  # 2 "de" (r0, r3), 2 "en"


def _best(rows: list[dict]) -> Tally:
    """Per language, the row with the highest score (the first one on ties)."""
    best = Best()
    for r in rows:
        best.offer(r["lang"], r["score"], r["id"])
    t = Tally()
    t.put("top", best)
    return t


@pytest.mark.parametrize("size", [1, 3, 7, 40])
def test_best_part_keeps_the_first_maximum_per_key_whatever_the_batching(size: int) -> None:
    merged = Tally.merge([_best(ROWS[i:i + size]) for i in range(0, len(ROWS), size)])
    entries = merged.parts["top"].entries
    assert list(entries) == ["de", "en"]  # the order in which keys were first offered
    for lang in ("de", "en"):
        rows = [r for r in ROWS if r["lang"] == lang]
        top = max(r["score"] for r in rows)
        assert entries[lang] == (top, next(r["id"] for r in rows if r["score"] == top))


def test_best_part_survives_the_resume_state_codec_and_put_merges_in_order() -> None:
    from dataguard.io import state_codec

    t = _best(ROWS[:10])
    t.put("top", _best(ROWS[10:]).parts["top"])
    back = state_codec.loads(state_codec.dumps(t))
    assert back.parts["top"] == t.parts["top"] == _best(ROWS).parts["top"]
    assert Best.merge([]).entries == {}
