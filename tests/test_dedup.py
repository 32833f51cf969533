"""Exact-duplicate flagging on real data, across batches, in both scopes and actions."""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from dataguard.io.raw import RawBatch, SourceOptions
from dataguard.stage import StageConfigError
from dataguard.stages.dedup import DedupStage
from dataguard.stages.normalize import Normalizer


def canonical(path: Path, source: str, check_placeholders: bool = True) -> pa.Table:
    text = path.read_text(encoding="utf-8")
    records = [json.loads(x) for x in text.splitlines() if x.strip()] if path.suffix == ".jsonl" else json.loads(text)
    batch = RawBatch(source=source)
    for i, rec in enumerate(records):
        batch.add(i, rec)
    out = Normalizer(check_placeholders=check_placeholders).normalize(batch, SourceOptions(name=source))
    assert out.rejected.num_rows == 0
    return out.kept


def run_stage(stage: DedupStage, table: pa.Table, batch_rows: int) -> tuple[list[Any], pa.Table]:
    """score -> summarize -> fit -> apply -> absorb over consecutive slices, like the pipeline."""
    scored = [stage.score(table.slice(i, batch_rows)) for i in range(0, max(table.num_rows, 1), batch_rows)]
    stage.fit([stage.summarize(b) for b in scored])
    outs = [stage.apply(b) for b in scored]
    stage.absorb([o.stats for o in outs])
    rejected = pa.concat_tables([o.rejected for o in outs])
    return outs, rejected


def kept_rows(outs: list[Any]) -> list[dict[str, Any]]:
    return [row for o in outs for row in o.kept.to_pylist()]


@pytest.mark.parametrize(("rel", "key"), [
    ("alpaca_en_demo/alpaca_en_demo.json", lambda r: (r["instruction"], r["input"], r["output"])),
    ("sharegpt_glaive_toolcall/glaive_toolcall_en_demo.json", lambda r: json.dumps([r["conversations"], r["tools"]])),
    ("messages_kto_demo/v1_sft_demo.jsonl", lambda r: json.dumps(r["messages"])),
])
def test_real_duplicates_match_an_independent_count(real_data: Path, rel: str, key: Any) -> None:
    path = real_data / rel
    text = path.read_text(encoding="utf-8")
    records = [json.loads(x) for x in text.splitlines() if x.strip()] if path.suffix == ".jsonl" else json.loads(text)
    first_index: dict[Any, int] = {}
    expected_of = []
    for i, rec in enumerate(records):
        k = key(rec)
        expected_of.append(first_index.setdefault(k, i))
    table = canonical(path, "src", check_placeholders=False)
    stage = DedupStage()
    outs, rejected = run_stage(stage, table, batch_rows=97)
    rows = kept_rows(outs)
    assert rejected.num_rows == 0 and len(rows) == len(records)
    ids = [r["id"] for r in rows]
    got = [r["duplicate_of"] for r in rows]
    want = [None if j == i else ids[j] for i, j in enumerate(expected_of)]
    assert got == want
    assert [r["is_duplicate"] for r in rows] == [w is not None for w in want]
    assert sum(w is not None for w in want) == {"alpaca_en_demo.json": 14, "glaive_toolcall_en_demo.json": 35,
                                                 "v1_sft_demo.jsonl": 1}[path.name]  # per the SOURCE notes
    assert stage.describe()["summary"]["duplicates"] == sum(w is not None for w in want)


def test_batching_does_not_change_the_result(real_data: Path) -> None:
    table = canonical(real_data / "sharegpt_glaive_toolcall/glaive_toolcall_en_demo.json", "glaive")
    one, _ = run_stage(DedupStage(), table, batch_rows=10_000)
    many, _ = run_stage(DedupStage(), table, batch_rows=7)
    assert kept_rows(one) == kept_rows(many)


def test_drop_rejects_later_copies(real_data: Path) -> None:
    table = canonical(real_data / "alpaca_en_demo/alpaca_en_demo.json", "alpaca")
    outs, rejected = run_stage(DedupStage(action="drop"), table, batch_rows=250)
    kept = kept_rows(outs)
    assert len(kept) + rejected.num_rows == table.num_rows
    assert rejected.num_rows > 0 and set(rejected.column("reason").to_pylist()) == {"exact_duplicate"}
    assert not any(r["is_duplicate"] for r in kept)
    kept_ids = {r["id"] for r in kept}
    for rej in rejected.to_pylist():
        assert json.loads(rej["record"])["duplicate_of"] in kept_ids
        assert rej["stage"] == "dedup"


def test_prompt_scope_finds_repeated_prompts(real_data: Path) -> None:
    path = real_data / "sharegpt_dpo_demo/dpo_en_demo.head160.json"
    records = json.loads(path.read_text(encoding="utf-8"))
    seen: set[str] = set()
    seen_full: set[str] = set()
    expected = expected_full = 0
    for rec in records:
        k = json.dumps(rec["conversations"])
        # a pair is its prompt and the SET of its two responses (stripped)
        full = json.dumps([rec["conversations"], sorted([rec["chosen"]["value"].strip(),
                                                         rec["rejected"]["value"].strip()])])
        expected += k in seen
        expected_full += full in seen_full
        seen.add(k)
        seen_full.add(full)
    table = canonical(path, "dpo")
    prompt_outs, _ = run_stage(DedupStage(scope="prompt"), table, batch_rows=64)
    full_outs, _ = run_stage(DedupStage(scope="messages"), table, batch_rows=64)
    assert sum(r["is_duplicate"] for r in kept_rows(prompt_outs)) == expected == 1  # first 160 rows (5 in all 300)
    assert sum(r["is_duplicate"] for r in kept_rows(full_outs)) == expected_full


def test_a_preference_pair_repeated_with_its_labels_swapped_is_caught_before_training(real_data: Path,
                                                                                       tmp_path: Path) -> None:
    """The real DPO demo plus three planted copies: one with chosen and rejected exchanged (the
    same comparison judged both ways), one exact, and one with only the rejected response
    changed (a different pair, kept)."""
    from dataguard.io.readers import InputSpec
    from dataguard.pipeline import Pipeline
    from dataguard.train.data import RunShards
    from dataguard.train.model.tiny import tiny_tokenizer
    from dataguard.train.tasks import get_task

    records = json.loads((real_data / "sharegpt_dpo_demo/dpo_en_demo.head160.json").read_text(encoding="utf-8"))[:40]
    first = records[3]
    swapped = {**first, "chosen": first["rejected"], "rejected": first["chosen"]}
    other = {**first, "rejected": {"from": "gpt", "value": "A different rejected answer."}}
    src = tmp_path / "pairs.json"
    src.write_text(json.dumps([*records, swapped, dict(first), other]))
    out = tmp_path / "out"
    Pipeline([DedupStage(action="drop")], workers=1).run([InputSpec(path=str(src))], out)
    run = RunShards.open(out, task="dpo")
    rejected = pa.ipc.open_stream(next((out / "rejected").glob("*.arrow"))).read_all().to_pylist()
    by_id = {r["id"]: r for r in rejected}
    assert {"pairs.json:40", "pairs.json:41"} <= set(by_id)  # the swapped copy and the exact copy
    assert all(r["reason"] == "exact_duplicate" and "pairs.json:3" in r["detail"] for r in
               (by_id["pairs.json:40"], by_id["pairs.json:41"]))
    assert "pairs.json:42" in set(run.table.column("id").to_pylist())  # another rejected answer: another pair
    pairs = get_task("dpo").encode(run.table, tiny_tokenizer(), max_length=2048, label_map=None, allow_empty=False)
    assert "pairs.json:40" not in pairs.row_ids and "pairs.json:3" in pairs.row_ids


def test_whitespace_is_normalised_but_roles_matter() -> None:
    from dataguard.records import canonical_table

    rows = [
        {"id": "a", "source": "s", "messages": [{"role": "user", "content": "hi"},
                                                {"role": "assistant", "content": "yo"}]},
        {"id": "b", "source": "s", "messages": [{"role": "user", "content": "  hi\n"},
                                                {"role": "assistant", "content": "yo "}]},
        {"id": "c", "source": "s", "messages": [{"role": "system", "content": "hi"},
                                                {"role": "assistant", "content": "yo"}]},
    ]
    outs, _ = run_stage(DedupStage(), canonical_table(rows), batch_rows=2)
    assert [r["duplicate_of"] for r in kept_rows(outs)] == [None, "a", None]


def test_tool_definitions_are_part_of_the_content() -> None:
    from dataguard.records import canonical_table

    msgs = [{"role": "user", "content": "weather?"}, {"role": "assistant", "content": "sunny"}]
    metas = [None, '{"tools":"[]"}', '{"tools":""}', '{"tools":"[{\\"name\\": \\"w\\"}]"}',
             '{"tools":[{"name":"w"}]}', '{"tools":[{"name":"v"}]}']
    rows = [{"id": str(i), "source": "s", "messages": msgs, "meta": m} for i, m in enumerate(metas)]
    outs, _ = run_stage(DedupStage(), canonical_table(rows), batch_rows=4)
    # no tools == empty tool list; a JSON string and the parsed list are the same tools
    assert [r["duplicate_of"] for r in kept_rows(outs)] == [None, "0", "0", None, "3", None]


def test_columns_on_empty_batch_validation_and_pickle() -> None:
    from dataguard.records import empty_canonical

    stage = DedupStage()
    scored = stage.score(empty_canonical())
    stage.fit([stage.summarize(scored)])
    out = stage.apply(scored)
    for name, typ in stage.output_columns().items():
        assert out.kept.schema.field(name).type == typ
    with pytest.raises(StageConfigError, match="action"):
        DedupStage(action="delete")
    with pytest.raises(StageConfigError, match="scope"):
        DedupStage(scope="answer")
    assert pickle.loads(pickle.dumps(stage)).scope == "messages"


def test_fitted_state_holds_only_repeated_contents(real_data: Path) -> None:
    """The fit keeps a hash -> first id entry only for contents seen more than once (across
    batches or inside one), so what the driver holds and ships grows with the duplicates,
    not the rows; the result is the one a full table gives (checked against batch sizes)."""
    table = canonical(real_data / "alpaca_en_demo/alpaca_en_demo.json", "alpaca")
    doubled = pa.concat_tables([table, table.slice(0, 40), table.slice(5, 3)])
    doubled = doubled.set_column(0, "id", pa.array([f"r{i}" for i in range(doubled.num_rows)]))
    results = {}
    for rows in (doubled.num_rows, 37, 1):  # one batch (repeats inside it), many, one row per batch
        stage = DedupStage()
        outs, _ = run_stage(stage, doubled, batch_rows=rows)
        flags = [r["is_duplicate"] for r in kept_rows(outs)]
        results[rows] = ([r["duplicate_of"] for r in kept_rows(outs)], flags)
        distinct = len({tuple(map(str, r["messages"])) for r in table.to_pylist()})
        assert stage.describe()["summary"]["distinct_contents"] == distinct
        repeated_contents = len(stage._keys)
        assert repeated_contents == len(stage._first) < distinct // 10  # a handful, not one per row
        assert sum(flags) == doubled.num_rows - distinct
    assert results[doubled.num_rows] == results[37] == results[1]
    dup_of = results[37][0]
    assert dup_of[table.num_rows] == "r0" and dup_of[table.num_rows + 40] == "r5"
