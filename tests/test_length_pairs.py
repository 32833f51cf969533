"""The length stage on preference pairs: the rejected response is judged against the cap too
(the 160 real pairs of the DPO sample, plus a planted pair whose rejected response is long)."""

from __future__ import annotations

import pytest
from pairs_data import dpo_records, normalised, pair
from test_length import run_stage

from dataguard.records import pair_responses, rejected_texts
from dataguard.stages.length import LengthStage
from dataguard.text.tokenizers import get_tokenizer

CAP = 1000
LONG_REJECTED = pair("Say hi to me, please.", "Hi! Nice to meet you.", "hello there " * 1500)


def _tokens(texts: list[str]) -> list[int]:
    return [int(c) for c in get_tokenizer(None).count_batch(texts)]


def test_a_pair_is_as_long_as_its_longer_side() -> None:
    table = normalised(dpo_records() + [LONG_REJECTED])
    scored = LengthStage(percentile=None, max_tokens=CAP).score(table)
    tok = get_tokenizer(None)
    rows = zip(scored.column("messages").to_pylist(), scored.column("message_tokens").to_pylist(),
               _tokens(rejected_texts(scored)), scored.column("n_tokens").to_pylist(), strict=True)
    for msgs, per_msg, r_count, n in rows:
        overhead = tok.template_overhead(tuple(m["role"] for m in msgs))
        assert n == max(sum(per_msg), sum(per_msg[:-1]) + r_count) + overhead
    assert scored.column("n_tokens")[-1].as_py() > CAP > sum(scored.column("message_tokens")[-1].as_py())


def test_a_rejected_response_over_the_cap_is_dropped_like_a_chosen_one() -> None:
    table = normalised(dpo_records() + [LONG_REJECTED])
    out = run_stage(LengthStage(percentile=None, max_tokens=CAP, action="drop"), [table])[0]
    assert out.kept.num_rows + out.rejected.num_rows == table.num_rows
    rejected = {r["id"]: r for r in out.rejected.to_pylist()}
    planted = rejected[table.column("id")[-1].as_py()]
    assert planted["reason"] == "too_long"
    assert "the rejected response is the longer side" in planted["detail"]


@pytest.mark.parametrize("cut_final", [False, True])
def test_truncation_keeps_one_prompt_and_brings_both_sides_under_the_cap(cut_final: bool) -> None:
    table = normalised(dpo_records() + [LONG_REJECTED])
    out = run_stage(LengthStage(percentile=None, max_tokens=CAP, cut_final=cut_final), [table])[0]
    assert out.kept.num_rows + out.rejected.num_rows == table.num_rows
    tok = get_tokenizer(None)
    kept_ids = out.kept.column("id").to_pylist()
    planted_id = table.column("id")[-1].as_py()
    assert (planted_id in kept_ids) == cut_final  # only a cut brings its rejected response under the cap
    assert out.kept.column("truncated").to_pylist().count(True) > 0
    rows = zip(out.kept.column("messages").to_pylist(), pair_responses(out.kept),
               out.kept.column("tokens_after").to_pylist(), strict=True)
    for msgs, responses, after in rows:
        assert responses is not None and msgs[-1]["content"] == responses[0]
        prompt = sum(_tokens([m["content"] for m in msgs[:-1]]))
        overhead = tok.template_overhead(tuple(m["role"] for m in msgs))
        sides = [prompt + n + overhead for n in _tokens(list(responses))]
        assert after == max(sides) <= CAP
    if cut_final:
        chosen, rejected = pair_responses(out.kept)[kept_ids.index(planted_id)]
        assert chosen == "Hi! Nice to meet you."  # the short chosen response is untouched
        assert rejected.startswith("hello there " * 100) and len(rejected) < len("hello there " * 1500)


def test_a_cut_that_makes_both_responses_the_same_rejects_the_pair() -> None:
    """Real pairs often share a long opening: cutting both to the cap can leave two equal
    responses, a pair that states no preference. It is rejected, not kept."""
    opening = "Here is a careful answer that walks through every step of the reasoning. " * 60
    same_start = pair("Explain it.", opening + "So the answer is yes.", opening + "So the answer is no.")
    table = normalised(dpo_records()[:5] + [same_start])
    out = run_stage(LengthStage(percentile=None, max_tokens=200, cut_final=True), [table])[0]
    assert out.kept.num_rows + out.rejected.num_rows == table.num_rows
    rejected = {r["id"]: r for r in out.rejected.to_pylist()}
    planted = rejected[table.column("id")[-1].as_py()]
    assert planted["reason"] == "too_long_untruncatable"
    assert "leaves them the same" in planted["detail"]
    assert all(c != r for c, r in (p for p in pair_responses(out.kept) if p is not None))
