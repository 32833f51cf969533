"""The overlap scan on preference pairs: a benchmark copied into the rejected response
contaminates the pair (the 160 real pairs of the DPO sample, plus a planted pair)."""

from __future__ import annotations

import pytest
from pairs_data import dpo_records, normalised, pair

from dataguard.records import pair_responses, rejected_texts
from dataguard.references import ReferenceSpec, parse_spec
from dataguard.stages.overlap import OverlapStage

CHOSEN = "Let me work through it step by step and check each number before giving the answer."


def _gsm8k_item() -> str:
    items = ReferenceSpec("gsm8k_test", None, parse_spec("gsm8k_test").fields).load().items
    return max((t for _, t in items[:50]), key=len)


def _table():
    item = _gsm8k_item()
    records = dpo_records() + [pair("Can you solve a word problem for me?", CHOSEN, "Sure, here is one: " + item)]
    return normalised(records), item


def _stage(action: str, roles: tuple[str, ...] = ("system", "user", "assistant", "tool")) -> OverlapStage:
    stage = OverlapStage(references=["gsm8k_test"], action=action, roles=list(roles))
    stage.fit([])
    return stage


def test_a_benchmark_copy_only_in_the_rejected_response_is_found() -> None:
    table, _ = _table()
    out = _stage("flag").apply(table)
    flagged = [i for i, c in zip(out.kept.column("id").to_pylist(), out.kept.column("contaminated").to_pylist(),
                                 strict=True) if c]
    assert flagged == [table.column("id")[-1].as_py()]  # the 160 real pairs are clean
    assert out.kept.column("overlap_ref_set")[-1].as_py() == "gsm8k_test"


def test_scanning_only_the_prompt_side_leaves_the_responses_alone() -> None:
    table, _ = _table()
    out = _stage("flag", roles=("system", "user")).apply(table)
    assert not any(out.kept.column("contaminated").to_pylist())


def test_drop_rejects_the_pair() -> None:
    table, _ = _table()
    out = _stage("drop").apply(table)
    assert out.kept.num_rows + out.rejected.num_rows == table.num_rows
    assert out.rejected.column("id").to_pylist() == [table.column("id")[-1].as_py()]
    assert out.rejected.column("reason").to_pylist() == ["contamination"]


@pytest.mark.parametrize("whole", [False, True])
def test_mask_cuts_the_copy_out_of_the_rejected_response(whole: bool) -> None:
    table, item = _table()
    if whole:  # the rejected response is nothing but the copy: the pair is left with no rejected text
        table = normalised(dpo_records()[:3] + [pair("Can you solve a word problem for me?", CHOSEN, item)])
    stage = _stage("mask")
    out = stage.apply(table)
    assert out.kept.num_rows + out.rejected.num_rows == table.num_rows
    planted = table.column("id")[-1].as_py()
    if whole:
        assert out.rejected.column("id").to_pylist() == [planted]
        assert rejected_texts(table)[-1] == item  # the reject keeps the text as it came in
        return
    kept = dict(zip(out.kept.column("id").to_pylist(), pair_responses(out.kept), strict=True))
    chosen, rejected = kept[planted]
    assert chosen == CHOSEN and rejected.startswith("Sure, here is one") and item[:60] not in rejected
    again = stage.apply(out.kept.select(["id", "source", "messages", "label", "meta"]))
    assert not any(again.kept.column("contaminated").to_pylist())


@pytest.mark.parametrize(("chosen", "rejected", "why"), [
    ("{item}", "I am not sure, sorry.", "the final answer was entirely the copied text"),
    ("Robins are songbirds. {item}", "Robins are songbirds.", "the chosen and rejected responses are the same"),
])
def test_mask_drops_a_pair_it_leaves_without_a_preference(chosen: str, rejected: str, why: str) -> None:
    """Cutting the copy must not leave a pair that teaches an empty answer, or states no
    preference: such a pair is dropped as contaminated, with the reason in its detail."""
    item = _gsm8k_item()
    table = normalised(dpo_records()[:3] + [pair("Tell me something.", chosen.format(item=item), rejected)])
    out = _stage("mask").apply(table)
    assert out.kept.num_rows + out.rejected.num_rows == table.num_rows
    assert out.rejected.column("id").to_pylist() == [table.column("id")[-1].as_py()]
    assert out.rejected.column("reason").to_pylist() == ["contamination"]
    assert out.rejected.column("detail")[0].as_py().endswith(why)


def test_mask_drops_a_plain_row_whose_answer_was_the_copy() -> None:
    item = _gsm8k_item()
    records = [{"instruction": "Solve this for me.", "input": "", "output": item},
               {"instruction": "Say hi.", "input": "", "output": "Hi! " + item}]
    table = normalised(records)
    out = _stage("mask").apply(table)
    assert out.rejected.column("id").to_pylist() == [table.column("id")[0].as_py()]
    assert out.kept.column("messages")[0].as_py()[-1]["content"].strip() == "Hi!"
