"""The quality stage on preference pairs: both responses judged (the 160 real pairs of the
DPO sample, plus planted pairs whose chosen or rejected response loops or is URL-stuffed)."""

from __future__ import annotations

from pairs_data import dpo_records, normalised, pair

from dataguard.stages.quality import QualityStage

PROMPT = "How do I boil an egg?"
GOOD = ("Place the egg in a pot of cold water, bring it to a boil, then simmer it for nine minutes "
        "and cool it in ice water before peeling.")
LOOP = "I think so. " * 80
URLS = " ".join(f"See https://example{i}.com/page for more." for i in range(6))


def _run(records: list) -> tuple[QualityStage, dict[str, dict]]:
    table = normalised(records)
    stage = QualityStage()
    out = stage.apply(stage.score(table))
    stage.absorb([out.stats])
    assert out.kept.num_rows + out.rejected.num_rows == table.num_rows
    rows = {r["id"]: {**r, "kept": False} for r in out.rejected.to_pylist()}
    rows.update({i: {"id": i, "kept": True} for i in out.kept.column("id").to_pylist()})
    return stage, rows


def test_a_chosen_response_that_alone_fails_is_chosen_fails_quality() -> None:
    base = dpo_records()
    stage, rows = _run(base + [pair(PROMPT, LOOP, GOOD), pair(PROMPT, URLS, GOOD)])
    loop, urls = rows[f"dpo_demo:{len(base)}"], rows[f"dpo_demo:{len(base) + 1}"]
    assert loop["reason"] == urls["reason"] == "chosen_fails_quality"
    assert "response word_rep_ratio=1.000" in loop["detail"]
    assert "response url_count=6 >= 3" in urls["detail"]


def test_a_pair_whose_responses_both_fail_keeps_the_rule_reason() -> None:
    base = dpo_records()
    _, rows = _run(base + [pair(PROMPT, LOOP, URLS)])
    both = rows[f"dpo_demo:{len(base)}"]
    assert both["reason"] == "word_ngram_repetition"
    assert "rejected url_count=6" in both["detail"]


def test_a_pair_whose_rejected_response_alone_fails_is_kept_and_counted() -> None:
    base = dpo_records()
    stage, rows = _run(base + [pair(PROMPT, GOOD, LOOP)])
    assert rows[f"dpo_demo:{len(base)}"]["kept"]
    desc = stage.describe()
    pairs = desc["pairs"]
    assert pairs["summary"]["pairs"] == len(base) + 1
    assert pairs["summary"]["pairs_rejected_fails_kept"] >= 1
    assert desc["summary"]["rejected_chosen_fails_quality"] == pairs["summary"]["rejected_chosen_fails_quality"]


def test_the_real_pairs() -> None:
    """On the 160 real pairs some chosen responses repeat themselves where the rejected one does
    not (Gopher's duplicated n-grams): those pairs go, the others keep their reasons."""
    stage, rows = _run(dpo_records())
    reasons = [r.get("reason") for r in rows.values() if not r["kept"]]
    assert reasons.count("chosen_fails_quality") == 6
    outcomes = stage.describe()["pairs"]["blocks"][0]
    assert sum(outcomes["series"]["pairs"]) == 160
    assert all(not c.startswith("rejected_") for c in stage.output_columns())  # declared columns unchanged


def test_rows_without_pairs_get_no_rejected_columns() -> None:
    table = normalised(dpo_records()[:10]).drop_columns(["meta"])
    stage = QualityStage()
    assert not [c for c in stage.score(table).column_names if c.startswith("rejected_")]
    assert "pairs" not in (stage.absorb([stage.apply(stage.score(table)).stats]) or stage.describe())
