"""Template normalization on the real data slices in tests/data and on crafted bad records."""

from __future__ import annotations

import csv
import json
import pickle
import re
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from dataguard import formats
from dataguard.formats import checks
from dataguard.io.raw import RawBatch, SourceOptions
from dataguard.records import CANONICAL_SCHEMA, REJECTED_SCHEMA
from dataguard.stage import StageConfigError
from dataguard.stages.normalize import Normalizer, find_placeholders
from dataguard.stages.normalize_stats import totals


def load_records(path: Path) -> list[Any]:
    if path.suffix == ".jsonl":
        return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return json.loads(path.read_text(encoding="utf-8"))


def raw_batch(source: str, records: list[Any], start: int = 0) -> RawBatch:
    batch = RawBatch(source=source)
    for i, rec in enumerate(records):
        batch.add(start + i, rec)
    return batch


def run(records: list[Any], source: str = "src", normalizer: Normalizer | None = None, **options: Any):
    norm = normalizer or Normalizer()
    return norm.normalize(raw_batch(source, records), SourceOptions(name=source, **options))


def roles(row: dict[str, Any]) -> list[str]:
    return [m["role"] for m in row["messages"]]


REAL_FILES = [
    "alpaca_en_demo/alpaca_en_demo.json",
    "alpaca_en_demo/identity.json",
    "alpaca_seed_tasks/seed_tasks.jsonl",
    "sharegpt_glaive_toolcall/glaive_toolcall_en_demo.json",
    "sharegpt_dpo_demo/dpo_en_demo.head160.json",
    "sharegpt_fastchat_dummy/dummy_conversation.json",
    "messages_kto_demo/kto_en_demo.head100.json",
    "messages_kto_demo/v1_sft_demo.jsonl",
    "gpteacher_toolformer/toolformer-similarity-0.6-dataset.head300.json",
]


@pytest.mark.parametrize("rel", REAL_FILES)
def test_every_real_row_is_accounted_for(real_data: Path, rel: str) -> None:
    records = load_records(real_data / rel)
    out = run(records, source=Path(rel).stem)
    kept, rejected = out.kept, out.rejected
    assert kept.num_rows + rejected.num_rows == len(records)
    assert kept.schema == CANONICAL_SCHEMA.append(pa.field("format", pa.string()))
    assert rejected.schema == REJECTED_SCHEMA
    ids = kept.column("id").to_pylist() + rejected.column("id").to_pylist()
    assert len(set(ids)) == len(ids)
    assert all(i.startswith(Path(rel).stem) for i in ids)
    assert totals(out.stats)["rows_in"] == len(records) and totals(out.stats)["kept"] == kept.num_rows
    # Independent oracle for what must be rejected: the unrendered {{name}}/{{author}} slots
    # (identity.json, v1_sft_demo) and the nested Self-Instruct records; nothing else.
    text = [json.dumps(r, ensure_ascii=False) for r in records]
    if rel.endswith("seed_tasks.jsonl"):
        expected = {"unknown_format": len(records)}
    else:
        n_slots = sum(("{{name}}" in t or "{{author}}" in t) for t in text)
        expected = {"unfilled_placeholder": n_slots} if n_slots else {}
    assert dict(Counter(rejected.column("reason").to_pylist())) == expected


def test_alpaca_mapping_matches_source(real_data: Path) -> None:
    records = load_records(real_data / "alpaca_en_demo/alpaca_en_demo.json")
    kept = run(records).kept.to_pylist()
    assert {r["format"] for r in kept} == {"alpaca"}
    for rec, row in zip(records, kept, strict=True):
        user = rec["instruction"] + ("\n" + rec["input"] if rec["input"] else "")
        assert row["messages"] == [{"role": "user", "content": user}, {"role": "assistant", "content": rec["output"]}]
        assert row["label"] is None and row["meta"] is None


def test_glaive_toolcall_roles_and_tools(real_data: Path) -> None:
    records = load_records(real_data / "sharegpt_glaive_toolcall/glaive_toolcall_en_demo.json")
    kept = run(records, source="glaive").kept.to_pylist()
    expected_role = {"human": "user", "gpt": "assistant", "function_call": "assistant", "observation": "tool"}
    n_calls = 0
    for rec, row in zip(records, kept, strict=True):
        conv = rec["conversations"]
        assert roles(row) == [expected_role[t["from"]] for t in conv]
        assert [m["content"] for m in row["messages"]] == [t["value"] for t in conv]
        meta = json.loads(row["meta"]) if row["meta"] else {}
        calls = [i for i, t in enumerate(conv) if t["from"] == "function_call"]
        assert meta.get("call_turns", []) == calls
        n_calls += len(calls)
        if rec["tools"]:
            assert meta["tools"] == rec["tools"]
        for i in calls:  # the call is JSON naming a function, answered by a tool turn
            assert "name" in json.loads(row["messages"][i]["content"])
            assert row["messages"][i + 1]["role"] == "tool"
    assert n_calls == 211  # SOURCE.md: 211 function_call turns


def test_dpo_keeps_chosen_and_rejected(real_data: Path) -> None:
    records = load_records(real_data / "sharegpt_dpo_demo/dpo_en_demo.head160.json")
    kept = run(records).kept.to_pylist()
    n_system = 0
    for rec, row in zip(records, kept, strict=True):
        assert row["messages"][-1] == {"role": "assistant", "content": rec["chosen"]["value"]}
        assert len(row["messages"]) == len(rec["conversations"]) + 1
        assert json.loads(row["meta"])["rejected"] == rec["rejected"]["value"]
        n_system += roles(row).count("system")
    assert n_system == 43  # in the first 160 rows of dpo_en_demo (80 in all 300 rows)


def test_content_parts_and_turn_fields(real_data: Path) -> None:
    records = load_records(real_data / "messages_kto_demo/v1_sft_demo.jsonl")
    out = run(records, normalizer=Normalizer(check_placeholders=False))
    kept = out.kept.to_pylist()
    assert len(kept) == len(records)
    for rec, row in zip(records, kept, strict=True):
        assert roles(row) == [m["role"] for m in rec["messages"]]
        assert [m["content"] for m in row["messages"]] == [m["content"][0]["value"] for m in rec["messages"]]
        weights = json.loads(row["meta"])["turn_fields"]
        assert [weights[str(i)]["loss_weight"] for i in range(len(rec["messages"]))] == \
            [m["loss_weight"] for m in rec["messages"]]


def test_kto_labels_and_fastchat_ids(real_data: Path) -> None:
    kto = run(load_records(real_data / "messages_kto_demo/kto_en_demo.head100.json")).kept
    assert Counter(kto.column("label").to_pylist()) == {"true": 54, "false": 46}  # first 100 of 300 rows
    fc_records = load_records(real_data / "sharegpt_fastchat_dummy/dummy_conversation.json")
    fc = run(fc_records, source="fastchat").kept
    assert fc.column("id").to_pylist() == [f"fastchat:{i}" for i in range(len(fc_records))]
    assert [json.loads(m)["source_id"] for m in fc.column("meta").to_pylist()] == [r["id"] for r in fc_records]


def test_banking77_csv_is_labelled_text(real_data: Path) -> None:
    with open(real_data / "banking77/test.csv", newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))[:300]
    kept = run(rows, source="banking77").kept.to_pylist()
    assert len(kept) == 300
    for src, row in zip(rows, kept, strict=True):
        assert row["format"] == "labelled_text"
        assert row["messages"] == [{"role": "user", "content": src["text"]}]
        assert row["label"] == src["category"]


def test_clinc150_list_rows_need_forced_format(real_data: Path) -> None:
    pairs = json.loads((real_data / "clinc150/data_imbalanced.train200.json").read_text())["train"][:200]
    forced = run(pairs, format="labelled_text").kept.to_pylist()
    assert [(r["messages"][0]["content"], r["label"]) for r in forced] == [tuple(p) for p in pairs]
    auto = run(pairs)
    assert set(auto.rejected.column("reason").to_pylist()) == {"not_an_object"}


def test_aliases_map_fields_before_detection() -> None:
    records = [{"question": "What is 2+2?", "answer": "4", "intent": "math"},
               {"question": "Name a colour.", "answer": "Blue."}]
    out = run(records, aliases={"question": "instruction", "answer": "output", "intent": "label"})
    kept = out.kept.to_pylist()
    assert [r["format"] for r in kept] == ["alpaca", "alpaca"]
    assert kept[0]["messages"][0]["content"] == "What is 2+2?" and kept[0]["label"] == "math"
    assert totals(out.stats)["aliases"] == {"question->instruction": 2, "answer->output": 2, "intent->label": 1}
    labelled = run([{"utterance": "hi there", "intent": "greet"}], aliases={"utterance": "text"}).kept.to_pylist()
    assert labelled[0]["format"] == "labelled_text" and labelled[0]["label"] == "greet"


def test_forced_format_and_other_templates() -> None:
    sharegpt_rec = {"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello"}]}
    assert run([sharegpt_rec], format="alpaca").rejected.column("reason").to_pylist() == ["missing_field"]
    dolly = {"instruction": "Summarise.", "context": "Long text.", "response": "Short.", "category": "summarization"}
    row = run([dolly]).kept.to_pylist()[0]
    assert row["format"] == "dolly" and row["label"] == "summarization"
    assert row["messages"][0]["content"] == "Summarise.\nLong text."
    pc_row = run([{"prompt": "Q?", "completion": "A.", "system": "Be brief."}]).kept.to_pylist()[0]
    assert pc_row["format"] == "prompt_completion" and roles(pc_row) == ["system", "user", "assistant"]
    hist = {"instruction": "and now?", "input": "", "output": "done", "history": [["first?", "yes"]], "system": "S"}
    assert roles(run([hist]).kept.to_pylist()[0]) == ["system", "user", "assistant", "user", "assistant"]
    tools = {"messages": [{"role": "user", "content": "weather?"},
                          {"role": "assistant", "content": None,
                           "tool_calls": [{"type": "function", "function": {"name": "w", "arguments": "{}"}}]},
                          {"role": "tool", "content": "sunny"}, {"role": "assistant", "content": "Sunny."}]}
    tool_row = run([tools]).kept.to_pylist()[0]
    assert roles(tool_row) == ["user", "assistant", "tool", "assistant"]
    assert json.loads(tool_row["messages"][1]["content"])[0]["function"]["name"] == "w"


OK_USER = {"role": "user", "content": "hi"}
OK_ASSISTANT = {"role": "assistant", "content": "hello"}

CRAFTED = [
    ("unknown_format", {"foo": 1, "bar": 2}),
    ("unknown_format", {"text": "pretraining text only"}),
    ("not_an_object", [1, 2, 3]),
    ("not_an_object", 42),
    ("wrong_type", {"instruction": 5, "output": "x"}),
    ("wrong_type", {"messages": "hi"}),
    ("wrong_type", {"messages": [OK_USER, {"role": "assistant", "content": 7}]}),
    ("wrong_type", {"messages": [OK_USER, "hello"]}),
    ("missing_assistant", {"instruction": "Do it", "input": ""}),
    ("missing_assistant", {"messages": [OK_USER]}),
    ("missing_assistant", {"messages": [OK_USER, OK_ASSISTANT, {"role": "user", "content": "and?"}]}),
    ("empty_assistant", {"instruction": "Do it", "output": "   "}),
    ("empty_assistant", {"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": ""}]}),
    ("empty_prompt", {"instruction": "", "input": "", "output": "something"}),
    ("bad_role_order", {"messages": [OK_ASSISTANT, OK_USER, OK_ASSISTANT]}),
    ("bad_role_order", {"messages": [OK_USER, {"role": "tool", "content": "42"}, OK_ASSISTANT]}),
    ("bad_role_order", {"messages": [OK_USER, OK_ASSISTANT, {"role": "system", "content": "late"}, OK_USER,
                                     OK_ASSISTANT]}),
    ("unknown_role", {"conversations": [{"from": "narrator", "value": "once"}, {"from": "gpt", "value": "x"}]}),
    ("non_text_content", {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": "u"}]},
                                       OK_ASSISTANT]}),
    ("unfilled_placeholder", {"instruction": "Who are you?", "output": "I am {{name}}."}),
    ("unfilled_placeholder", {"prompt": "Write to <<customer_name>>", "completion": "Dear x"}),
]


@pytest.mark.parametrize(("reason", "record"), CRAFTED)
def test_crafted_records_rejected_with_reason(reason: str, record: Any) -> None:
    out = run([record])
    assert out.kept.num_rows == 0
    rej = out.rejected.to_pylist()
    assert [r["reason"] for r in rej] == [reason], rej
    assert rej[0]["stage"] == "normalize" and rej[0]["detail"]
    assert json.loads(rej[0]["record"]) == record


def test_allowed_roles_and_consecutive_turns() -> None:
    record = {"messages": [OK_USER, {"role": "assistant", "content": "call"}, {"role": "tool", "content": "r"},
                           OK_ASSISTANT]}
    assert run([record]).kept.num_rows == 1
    no_tools = Normalizer(allowed_roles=["system", "user", "assistant"])
    assert run([record], normalizer=no_tools).rejected.column("reason").to_pylist() == ["disallowed_role"]
    two_users = {"messages": [OK_USER, {"role": "user", "content": "also"}, OK_ASSISTANT, OK_ASSISTANT]}
    assert run([two_users]).kept.num_rows == 1  # documented: consecutive same-role turns are allowed


def test_reader_errors_pass_through() -> None:
    batch = RawBatch(source="f.jsonl")
    batch.add(0, {"instruction": "a", "output": "b"})
    batch.add_error(1, "invalid_json", "line 2: Expecting value at column 1", "{not json")
    batch.add_error(2, "invalid_utf8", "line 3: bad byte", "caf\\xe9")
    out = Normalizer().normalize(batch, SourceOptions(name="f.jsonl"))
    assert out.kept.num_rows == 1
    rej = out.rejected.to_pylist()
    assert [(r["id"], r["reason"], r["record"]) for r in rej] == [
        ("f.jsonl:1", "invalid_json", "{not json"), ("f.jsonl:2", "invalid_utf8", "caf\\xe9")]
    assert totals(out.stats)["reasons"] == {"invalid_json": 1, "invalid_utf8": 1}


def test_malformed_lines_from_the_reader(tmp_path: Path) -> None:
    from dataguard.io.readers import InputSpec, read_batches

    path = tmp_path / "mixed.jsonl"
    path.write_bytes(b'{"instruction": "Say hi", "output": "hi"}\n{"instruction": "x", "output": \n'
                     b'{"text": "caf\xe9 au lait", "label": "drink"}\n[1, 2]\n'
                     b'{"messages": [{"role": "user", "content": 3}]}\n')
    spec = InputSpec(path=path, name="mixed")
    outs = [Normalizer().normalize(b, spec.options()) for b in read_batches(spec)]
    kept = pa.concat_tables([o.kept for o in outs])
    rejected = pa.concat_tables([o.rejected for o in outs])
    assert kept.column("id").to_pylist() == ["mixed:0"]
    assert rejected.column("reason").to_pylist() == ["invalid_json", "invalid_utf8", "not_an_object", "wrong_type"]
    assert rejected.column("record")[0].as_py().startswith('{"instruction": "x"')
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    spec = InputSpec(path=empty, name="empty")
    reasons = [r for b in read_batches(spec) for r in Normalizer().normalize(b, spec.options()).rejected
               .column("reason").to_pylist()]
    assert reasons == ["empty_file"]


def test_duplicate_own_ids_stay_unique() -> None:
    recs = [{"id": "a", "prompt": "p", "completion": "c"}, {"id": "a", "prompt": "q", "completion": "d"},
            {"id": 7, "prompt": "r", "completion": "e"}]
    kept = run(recs, source="s").kept.to_pylist()
    assert [r["id"] for r in kept] == ["s:0", "s:1", "s:2"]
    assert [json.loads(r["meta"])["source_id"] for r in kept] == ["a", "a", "7"]


@pytest.mark.parametrize(("text", "found"), [
    ("Hello, I am {{name}} by {{ author }}.", True),
    ("Dear <<customer_name>>,", True),
    ("{{ user.name | upper }}", True),
    ("A dict: {name}, a set {1, 2}", False),
    ("Use `{{ title }}` in the Vue template.", False),
    ("```html\n<h1>{{ title }}</h1>\n```\nThat renders the title.", False),
    ("url: https://ghcr.io/${{ github.repository }}", False),
    ("$\\frac{{a}}{b}$", False),
    ("Natalia sold 48/2 = <<48/2=24>>24 clips", False),
])
def test_placeholder_heuristic(text: str, found: bool) -> None:
    assert bool(find_placeholders(text)) is found


def test_config_validation_and_pickle() -> None:
    with pytest.raises(StageConfigError, match="allowed_roles"):
        Normalizer(allowed_roles=["user", "robot"])
    with pytest.raises(StageConfigError, match="allowed_roles"):
        Normalizer(allowed_roles="user")
    with pytest.raises(StageConfigError, match="check_placeholders"):
        Normalizer(check_placeholders="yes")  # type: ignore[arg-type]
    with pytest.raises(StageConfigError, match="format"):
        run([{"prompt": "a", "completion": "b"}], format="csv")
    clone = pickle.loads(pickle.dumps(Normalizer(check_placeholders=False)))
    assert clone.check_placeholders is False


def test_empty_batch_and_determinism(real_data: Path) -> None:
    empty = run([])
    assert empty.kept.num_rows == 0 and empty.kept.schema == Normalizer().schema
    records = load_records(real_data / "sharegpt_dpo_demo/dpo_en_demo.head160.json")[:50]
    a, b = run(records), run(records)
    assert a.kept.equals(b.kept) and a.rejected.equals(b.rejected)


def test_stats_absorb_and_describe(real_data: Path) -> None:
    norm = Normalizer()
    records = load_records(real_data / "alpaca_en_demo/identity.json")
    outs = [norm.normalize(raw_batch("identity", records[i:i + 30], start=i), SourceOptions(name="identity"))
            for i in range(0, len(records), 30)]
    norm.absorb([o.stats for o in outs])
    desc = norm.describe()
    json.dumps(desc)
    assert desc["summary"]["rows_in"] == len(records)
    assert desc["summary"]["kept"] + desc["summary"]["rejected"] == len(records)
    reasons = next(b for b in desc["blocks"] if b["title"] == "Rejected rows by reason")
    assert reasons["labels"] == ["unfilled_placeholder"]
    examples = next(b for b in desc["blocks"] if b["type"] == "examples")
    assert 0 < len(examples["items"]) <= 20


def test_null_fields_are_absent_and_empty_labels_are_no_labels() -> None:
    rows = [
        {"messages": None, "conversations": None, "instruction": "q", "input": None, "output": "a", "label": ""},
        {"messages": [OK_USER, OK_ASSISTANT], "instruction": None, "output": None, "label": "  "},
        {"prompt": None, "text": "hello", "label": "greet"},
        {"text": "hello", "label": ""},
        {"text": "hello", "intent": 0},
    ]
    out = run(rows)
    assert out.kept.column("format").to_pylist() == ["alpaca", "messages", "labelled_text", "labelled_text"]
    assert out.kept.column("label").to_pylist() == [None, None, "greet", "0"]
    assert out.rejected.column("reason").to_pylist() == ["missing_field"]
    assert "empty" in out.rejected.column("detail")[0].as_py()
    forced = run([["text", ""], ["text", "x"]], format="labelled_text")
    assert forced.kept.column("label").to_pylist() == ["x"]


def test_every_reason_code_of_the_formats_is_declared() -> None:
    """Each ``Reject("code", ...)`` in dataguard/formats is in ``formats.REASONS``, and each
    check names the codes it raises."""
    raised = set()
    for path in Path(formats.__file__).parent.glob("*.py"):
        raised |= set(re.findall(r'Reject\(\s*"(\w+)"', path.read_text(encoding="utf-8")))
    assert raised and raised <= set(formats.REASONS)
    for check in checks.RECORD_CHECKS:
        assert set(check.reasons) <= set(checks.CHECK_REASONS), check.name
    assert {code for check in checks.RECORD_CHECKS for code in check.reasons} == set(checks.CHECK_REASONS)


def test_one_module_per_format_and_the_config_knows_them_all() -> None:
    from dataguard.config import FORMATS as CONFIG_FORMATS

    assert set(formats.FORMATS) == set(formats.BY_NAME) and len(formats.TEMPLATES) == len(formats.FORMATS)
    assert set(CONFIG_FORMATS) == {"auto", *formats.FORMATS}
