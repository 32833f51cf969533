"""Readers stream every format and turn bad input into error rows, never exceptions."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dataguard.io.readers import InputError, InputSpec, read_batches


def _rows(spec: InputSpec, batch_rows: int = 1000):
    out = []
    for batch in read_batches(spec, batch_rows=batch_rows):
        for i in range(len(batch)):
            out.append((batch.positions[i], batch.records[i], batch.errors[i], batch.details[i], batch.raw[i]))
    return out


@pytest.mark.parametrize("rel,expected", [
    ("alpaca_en_demo/alpaca_en_demo.json", 999),
    ("sharegpt_glaive_toolcall/glaive_toolcall_en_demo.json", 300),
    ("messages_kto_demo/v1_sft_demo.jsonl", 500),
    ("humaneval/HumanEval.jsonl.gz", 164),
    ("banking77/test.csv", 3080),
    ("truthfulqa/TruthfulQA.head200.csv", 200),
])
def test_real_files_every_row_read(real_data: Path, rel: str, expected: int) -> None:
    rows = _rows(InputSpec(path=real_data / rel), batch_rows=128)
    assert len(rows) == expected
    assert all(err is None for _, _, err, _, _ in rows)
    assert [p for p, *_ in rows] == list(range(expected))


def test_batches_are_bounded(real_data: Path) -> None:
    sizes = [len(b) for b in read_batches(InputSpec(path=real_data / "alpaca_en_demo/alpaca_en_demo.json"),
                                          batch_rows=100)]
    assert max(sizes) == 100 and sum(sizes) == 999


def test_json_key_reads_array_inside_object(real_data: Path) -> None:
    rows = _rows(InputSpec(path=real_data / "clinc150/data_full.test.json", json_key="test", format="labelled_text"))
    assert len(rows) == 4500
    assert rows[0][1] == ["how would you say fly in italian", "translate"]


def test_jsonl_bad_lines_become_error_rows(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    good = json.dumps({"instruction": "hi", "output": "hello"}).encode()
    path.write_bytes(b"\n".join([good, b'{"instruction": "unterminated', b"\xff\xfe not utf8", b"", b"[1, 2]", good]))
    rows = _rows(InputSpec(path=path))
    assert [r[2] for r in rows] == [None, "invalid_json", "invalid_utf8", None, None]
    assert rows[1][4] == '{"instruction": "unterminated'  # raw text kept
    assert "\\xff" in rows[2][4]
    assert rows[3][1] == [1, 2]  # wrong type passes through for normalization to reject


def test_empty_file_is_one_rejected_row(tmp_path: Path) -> None:
    for name in ("empty.jsonl", "empty.json", "empty.csv"):
        path = tmp_path / name
        path.write_bytes(b"")
        rows = _rows(InputSpec(path=path, reader="json" if name.endswith(".json") else "auto"))
        assert [r[2] for r in rows] == ["empty_file"], name


def test_broken_json_array_keeps_items_before_the_error(tmp_path: Path) -> None:
    """A syntax error stays in its own item; a truncated array is one more row at the end."""
    path = tmp_path / "broken.json"
    path.write_text('[{"instruction": "a", "output": "b"}, {"instruction": "c", "output": "d"}, {"instr": oops},\n'
                    ' {"instruction": "e", "output": "f"}, {"instruction": "g", "out')
    rows = _rows(InputSpec(path=path))
    assert [r[2] for r in rows] == [None, None, "invalid_json", None, "invalid_json"]
    assert rows[2][3] == "item 2: Expecting value at column 11" and rows[2][4] == '{"instr": oops}'
    assert rows[3][1] == {"instruction": "e", "output": "f"}
    assert "ends inside the JSON array after 4 items" in rows[4][3] and rows[4][4] == '{"instruction": "g", "out'


def test_huge_record_rejected(tmp_path: Path) -> None:
    path = tmp_path / "huge.jsonl"
    path.write_text(json.dumps({"instruction": "x" * 5000, "output": "y"}) + "\n" + '{"instruction": "a", "output": "b"}\n')
    batches = list(read_batches(InputSpec(path=path), max_record_bytes=1000))
    assert batches[0].errors == ["record_too_large", None]
    assert len(batches[0].raw[0]) <= 70_000


def test_csv_wrong_field_count_and_bad_utf8(tmp_path: Path) -> None:
    path = tmp_path / "intents.csv"
    path.write_bytes(b"text,category\nhello there,greet\ntoo,many,fields\n\xff\xfebroken,x\nbye,farewell\n")
    rows = _rows(InputSpec(path=path))
    assert [r[2] for r in rows] == [None, "malformed_csv", "invalid_utf8", None]
    assert rows[0][1] == {"text": "hello there", "category": "greet"}


def test_gzip_jsonl(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl.gz"
    with gzip.open(path, "wt") as f:
        for i in range(7):
            f.write(json.dumps({"prompt": f"p{i}", "completion": f"c{i}"}) + "\n")
    assert len(_rows(InputSpec(path=path))) == 7


def test_parquet_and_hf_dataset(tmp_path: Path) -> None:
    import datasets

    table = pa.table({"instruction": ["a", "b", "c"], "output": ["x", "y", "z"]})
    pq.write_table(table, tmp_path / "a.parquet", row_group_size=2)
    rows = _rows(InputSpec(path=tmp_path / "a.parquet"), batch_rows=2)
    assert [r[1]["instruction"] for r in rows] == ["a", "b", "c"]

    ds = datasets.Dataset.from_dict({"instruction": ["q1", "q2"], "output": ["r1", "r2"]})
    assert [r[1]["output"] for r in _rows(InputSpec(dataset=ds, name="mem"))] == ["r1", "r2"]
    ds.save_to_disk(str(tmp_path / "saved"))
    assert [r[1]["instruction"] for r in _rows(InputSpec(path=tmp_path / "saved"))] == ["q1", "q2"]


def test_missing_file_and_unknown_extension(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="no such file"):
        list(read_batches(InputSpec(path=tmp_path / "nope.jsonl")))
    (tmp_path / "data.xyz").write_text("hi")
    with pytest.raises(InputError, match="cannot tell the format"):
        list(read_batches(InputSpec(path=tmp_path / "data.xyz")))


def test_deferred_jsonl_parses_to_the_same_rows(tmp_path: Path) -> None:
    """The pipeline defers JSON parsing to workers; the result must not change."""
    path = tmp_path / "mixed.jsonl"
    good = json.dumps({"instruction": "hi", "output": "hello"}).encode()
    path.write_bytes(b"\n".join([good, b"{broken", b"\xff\xfe", b"", b'{"x": ' + b"1" * 3000 + b"}", good]))
    spec = InputSpec(path=path)
    eager = [r for b in read_batches(spec, batch_rows=2, max_record_bytes=1000) for r in zip(
        b.positions, b.records, b.errors, b.details, b.raw, strict=True)]
    deferred_batches = list(read_batches(spec, batch_rows=2, max_record_bytes=1000, defer_parse=True))
    assert [len(b) for b in deferred_batches] == [2, 2, 1]
    assert all(b.pending and not b.positions for b in deferred_batches)
    deferred = [r for b in deferred_batches for r in zip(
        *(lambda p: (p.positions, p.records, p.errors, p.details, p.raw))(b.parse_pending()), strict=True)]
    assert deferred == eager
    assert [r[2] for r in deferred] == [None, "invalid_json", "invalid_utf8", "record_too_large", None]
    (tmp_path / "empty.jsonl").write_bytes(b"\n\n")
    empty = list(read_batches(InputSpec(path=tmp_path / "empty.jsonl"), defer_parse=True))
    assert [b.parse_pending().errors for b in empty] == [["empty_file"]]
