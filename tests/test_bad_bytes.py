"""Bad input bytes become rejected rows with a reason (or one InputError), never a crash.

One test (or a few) per defect of issue 10's "Bytes that crash a run"; each builds its
adversarial file in ``tmp_path``. The property-based sweep over random bytes lives in
``test_fuzz_inputs.py``.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import tracemalloc
import zlib
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dataguard.io import bounded
from dataguard.io.raw import RawBatch, SourceOptions
from dataguard.io.readers import (
    MAX_DEPTH,
    RAW_KEEP_BYTES,
    InputError,
    InputSpec,
    describe_input,
    read_batches,
)
from dataguard.records import json_dumps, rejected_table
from dataguard.stages.normalize import Normalizer


def _rows(spec: InputSpec, **kw: Any) -> list[tuple[int, Any, str | None, str | None, str | None]]:
    out = []
    for b in read_batches(spec, **kw):
        b.parse_pending()
        out += list(zip(b.positions, b.records, b.errors, b.details, b.raw, strict=True))
    return out


def _run(spec: InputSpec, **kw: Any) -> tuple[pa.Table, pa.Table]:
    """Read (deferred, as the pipeline does) and normalize; returns (kept, rejected)."""
    norm = Normalizer()
    kept, rejected, n_in = [], [], 0
    for b in read_batches(spec, defer_parse=True, **kw):
        n_in += len(b)
        out = norm.normalize(b.parse_pending(), spec.options())
        kept.append(out.kept)
        rejected.append(out.rejected)
    k, r = pa.concat_tables(kept), pa.concat_tables(rejected)
    assert k.num_rows + r.num_rows == n_in
    return k, r


def _reasons(rows: list[tuple]) -> list[str | None]:
    return [r[2] for r in rows]


ALPACA = b'{"instruction": "q%d", "output": "a%d"}'


def _alpaca_line(i: int) -> bytes:
    return ALPACA % (i, i)


# ------------------------------------------------------------------ 1. lone surrogates
SURROGATE_LINES = [
    _alpaca_line(0),
    b'{"instruction": "bad \\ud800 escape", "output": "a"}',
    b'{"instruction": "emoji \\ud83d\\ude00 pair", "output": "a"}',
    b'{"\\udc00key": 1, "instruction": "x", "output": "y"}',
    b'{"instruction": "escaped backslash \\\\ud800 is text", "output": "a"}',
    b'{"instruction": "low after escaped \\\\ud800\\udc00", "output": "a"}',
]
SURROGATE_REASONS = [None, "invalid_unicode", None, "invalid_unicode", None, "invalid_unicode"]


@pytest.mark.parametrize("defer", [False, True])
def test_lone_surrogate_jsonl_rejected(tmp_path: Path, defer: bool) -> None:
    path = tmp_path / "s.jsonl"
    path.write_bytes(b"\n".join(SURROGATE_LINES) + b"\n")
    rows = _rows(InputSpec(path=path), defer_parse=defer)
    assert _reasons(rows) == SURROGATE_REASONS
    assert "\\ud800" in rows[1][4]  # the escaped raw text is kept
    assert rows[2][1]["instruction"] == "emoji \U0001F600 pair"
    kept, rejected = _run(InputSpec(path=path))
    assert kept.num_rows == 3 and rejected.column("reason").to_pylist() == ["invalid_unicode"] * 3


def test_lone_surrogate_json_array_rejected(tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    path.write_bytes(b"[" + b",\n".join(SURROGATE_LINES) + b"]")
    assert _reasons(_rows(InputSpec(path=path))) == SURROGATE_REASONS
    kept, rejected = _run(InputSpec(path=path))
    assert (kept.num_rows, rejected.num_rows) == (3, 3)


def test_normalizer_survives_surrogates_from_any_source() -> None:
    """Records handed over by the Python API may hold surrogates: fast path, slow path,
    labels and meta keys are all rejected as invalid_unicode, never an exception."""
    batch = RawBatch(source="api")
    records: list[Any] = [
        {"instruction": "fast \ud800", "input": "", "output": "a"},
        {"instruction": "ok", "input": "", "output": "b"},
        {"instruction": "slow", "output": "c", "label": "l\udcff"},
        {"instruction": "meta", "output": "d", "extra\ud800": 1},
        {"messages": [{"role": "user", "content": "u"}, {"role": "assistant", "content": "\udfff"}]},
        {"\ud800": "unknown format with a surrogate key"},
    ]
    for i, rec in enumerate(records):
        batch.add(i, rec)
    batch.add_error(len(records), "invalid_json", "detail \ud800", "raw \ud800")
    out = Normalizer().normalize(batch, SourceOptions(name="api"))
    assert out.kept.column("id").to_pylist() == ["api:1"]
    reasons = dict(zip(out.rejected.column("id").to_pylist(), out.rejected.column("reason").to_pylist(), strict=True))
    assert reasons == {"api:0": "invalid_unicode", "api:2": "invalid_unicode", "api:3": "invalid_unicode",
                       "api:4": "invalid_unicode", "api:5": "unknown_format", "api:6": "invalid_json"}
    for text in out.rejected.column("record").to_pylist() + out.rejected.column("detail").to_pylist():
        text.encode("utf-8")


def test_rejected_record_builders_escape_surrogates() -> None:
    text = json_dumps({"a\ud800": "b\udcff", "c": "\U0001F600"})
    assert json.loads(text) == {"a\ud800": "b\udcff", "c": "\U0001F600"}  # round-trips exactly
    text.encode("utf-8")
    table = rejected_table([{"id": "x", "source": "s", "stage": "t", "reason": "r", "detail": "d\ud800",
                             "record": "r\udcff"}])
    assert table.num_rows == 1 and "\\ud800" in table.column("detail")[0].as_py()


def test_surrogates_in_source_name_do_not_crash(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl"
    path.write_bytes(_alpaca_line(1) + b"\n")
    spec = InputSpec(path=path, name="name\udcff")
    kept, _ = _run(spec)
    assert kept.num_rows == 1


# ------------------------------------------------------------------ 2. nesting depth
def _deep(depth: int, inner: bytes = b"1") -> bytes:
    return b"[" * depth + inner + b"]" * depth


@pytest.mark.parametrize("defer", [False, True])
def test_deep_jsonl_line_is_too_deep(tmp_path: Path, defer: bool) -> None:
    path = tmp_path / "deep.jsonl"
    ok = b'{"instruction": "a", "output": "b", "extra": ' + _deep(MAX_DEPTH - 2) + b"}"
    brackets_in_text = b'{"instruction": "' + b"[{" * 5000 + b'", "output": "b"}'
    path.write_bytes(b"\n".join([_deep(1000), _deep(200_000), ok, brackets_in_text, b'{"a": ' * 3000]))
    rows = _rows(InputSpec(path=path), defer_parse=defer)
    assert _reasons(rows) == ["too_deep", "too_deep", None, None, "too_deep"]
    assert f"limit {MAX_DEPTH}" in rows[0][3]
    kept, rejected = _run(InputSpec(path=path))  # a deep-but-allowed record normalizes fine
    assert kept.num_rows == 2 and sorted(set(rejected.column("reason").to_pylist())) == ["too_deep"]


def test_deep_json_array_item_is_too_deep_and_bounded(tmp_path: Path) -> None:
    path = tmp_path / "deep.json"
    path.write_bytes(b"[" + _alpaca_line(0) + b"," + _deep(5000) + b"," + _alpaca_line(2) + b","
                     + b"{\"x\": " * 300_000 + b"]")
    tracemalloc.start()
    try:
        rows = _rows(InputSpec(path=path))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert _reasons(rows) == [None, "too_deep", None, "invalid_json"]
    assert peak < 64 << 20


# ------------------------------------------------------------------ 3. damaged gzip
def _gz_lines(n: int) -> bytes:
    return gzip.compress(b"".join(_alpaca_line(i) + b"\n" for i in range(n)), mtime=0)


@pytest.mark.parametrize("suffix", [".jsonl.gz", ".json.gz", ".csv.gz"])
@pytest.mark.parametrize("damage", ["truncated", "not_gzip", "flipped", "trailing_garbage"])
def test_damaged_gzip_is_one_rejected_row(tmp_path: Path, suffix: str, damage: str) -> None:
    n = 3000
    if suffix == ".csv.gz":
        plain = b"instruction,output\n" + b"".join(b"q%d,a%d\n" % (i, i) for i in range(n))
    elif suffix == ".json.gz":
        plain = b"[" + b",\n".join(_alpaca_line(i) for i in range(n)) + b"]"
    else:
        plain = b"".join(_alpaca_line(i) + b"\n" for i in range(n))
    blob = gzip.compress(plain, mtime=0)
    if damage == "truncated":
        blob = blob[: len(blob) // 2]
    elif damage == "not_gzip":
        blob = plain[:5000]
    elif damage == "flipped":
        blob = blob[: len(blob) // 2] + bytes([blob[len(blob) // 2] ^ 0xFF]) + blob[len(blob) // 2 + 1:]
    else:
        blob = blob + b"garbage!"
    path = tmp_path / f"d{suffix}"
    path.write_bytes(blob)
    spec = InputSpec(path=path)
    spec.resolved_reader()
    describe_input(spec)
    rows = _rows(spec)
    reasons = _reasons(rows)
    assert reasons.count("corrupt_compressed_file") == 1 and reasons[-1] == "corrupt_compressed_file"
    assert [p for p, *_ in rows] == list(range(len(rows)))
    good = [r for r in rows if r[2] is None]
    if damage != "flipped":  # a flipped bit can decode to garbage until the checksum at the end
        assert [r[1]["instruction"] for r in good] == [f"q{i}" for i in range(len(good))]
    if damage == "not_gzip":
        assert len(rows) == 1
    if damage == "trailing_garbage":
        assert len(good) == n
    _run(spec)


# ------------------------------------------------------------------ 4. binary CSV
def test_binary_garbage_csv_is_rejected_cleanly(tmp_path: Path) -> None:
    path = tmp_path / "garbage.csv"
    path.write_bytes(b"\xff\xfe\x00h\x80,\xc3(,x\n" + bytes(range(256)) * 40 + b"\nq,a,\xe9\n")
    kept, rejected = _run(InputSpec(path=path))
    assert kept.num_rows == 0 and rejected.num_rows > 0
    for text in rejected.column("record").to_pylist() + rejected.column("detail").to_pylist():
        text.encode("utf-8")


# ------------------------------------------------------------------ 5. bounded reads
def _peak(fn: Any) -> tuple[Any, int]:
    tracemalloc.start()
    try:
        result = fn()
        return result, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def _assert_clipped(raw: str, detail: str, full: bytes) -> None:
    assert len(raw.encode()) <= RAW_KEEP_BYTES + 300
    digest = hashlib.sha256(full).hexdigest()
    assert digest in raw and digest in detail
    assert f"{len(full):,}" in detail


@pytest.mark.parametrize("defer", [False, True])
def test_huge_gzip_line_is_read_with_bounded_memory(tmp_path: Path, defer: bool) -> None:
    big = b'{"instruction": "' + b"x" * (48 << 20) + b'", "output": "y"}'
    path = tmp_path / "bomb.jsonl.gz"
    comp = zlib.compressobj(1, zlib.DEFLATED, 31)
    path.write_bytes(comp.compress(_alpaca_line(0) + b"\n" + big + b"\n" + _alpaca_line(2) + b"\n") + comp.flush())
    rows, peak = _peak(lambda: _rows(InputSpec(path=path), defer_parse=defer))
    assert _reasons(rows) == [None, "record_too_large", None]
    _assert_clipped(rows[1][4], rows[1][3], big)
    assert peak < 40 << 20


def test_huge_json_array_item_and_csv_field(tmp_path: Path) -> None:
    big = b'{"instruction": "' + b"x" * (24 << 20) + b'", "output": "y"}'
    path = tmp_path / "big.json"
    path.write_bytes(b"[" + _alpaca_line(0) + b"," + big + b"," + _alpaca_line(2) + b"]")
    rows, peak = _peak(lambda: _rows(InputSpec(path=path)))
    assert _reasons(rows) == [None, "record_too_large", None] and peak < 40 << 20
    _assert_clipped(rows[1][4], rows[1][3], big)

    csv_path = tmp_path / "big.csv"
    field = b"y" * (24 << 20)
    csv_path.write_bytes(b"instruction,output\nq0,a0\nq1," + field + b"\nq2,a2\n")
    rows, peak = _peak(lambda: _rows(InputSpec(path=csv_path)))
    assert _reasons(rows) == [None, "record_too_large", None] and peak < 40 << 20
    _assert_clipped(rows[1][4], rows[1][3], b"q1," + field)


def test_huge_parquet_and_hf_rows_are_rejected(tmp_path: Path) -> None:
    import datasets

    big = "z" * (3 << 20)
    table = pa.table({"instruction": ["a", "b", "c"], "output": ["x", big, "y"]})
    pq.write_table(table, tmp_path / "big.parquet")
    for spec in (InputSpec(path=tmp_path / "big.parquet"),
                 InputSpec(dataset=datasets.Dataset(table), name="mem")):
        rows = _rows(spec, max_record_bytes=1 << 20)
        assert _reasons(rows) == [None, "record_too_large", None]
        assert len(rows[1][4].encode()) <= RAW_KEEP_BYTES + 300 and "sha256" in rows[1][3]
        assert rows[2][1] == {"instruction": "c", "output": "y"}


# ------------------------------------------------------------------ 6. byte order mark
def test_bom_is_stripped_at_file_start(tmp_path: Path) -> None:
    bom = b"\xef\xbb\xbf"
    (tmp_path / "a.jsonl").write_bytes(bom + _alpaca_line(0) + b"\n" + _alpaca_line(1))
    (tmp_path / "a.json").write_bytes(bom + b"[" + _alpaca_line(0) + b"," + _alpaca_line(1) + b"]")
    (tmp_path / "a.csv").write_bytes(bom + b"instruction,output\nq0,a0\nq1,a1\n")
    for name in ("a.jsonl", "a.json", "a.csv"):
        rows = _rows(InputSpec(path=tmp_path / name))
        assert _reasons(rows) == [None, None], name
        assert rows[0][1]["instruction"] == "q0", name
    (tmp_path / "mid.jsonl").write_bytes(_alpaca_line(0) + b"\n" + bom + _alpaca_line(1))
    assert _reasons(_rows(InputSpec(path=tmp_path / "mid.jsonl"))) == [None, "invalid_json"]


# ------------------------------------------------------------------ 7. unclosed CSV quote
@pytest.mark.parametrize("body", [
    b'"m1 open,l1\nm2,l2\nm3,l3\n',  # quote runs to the end of the file
    b'"m1 open,l1\nm2,l2\nm3 close",l3\nm4,l4\n',  # a stray closing quote: right field count
    b'm0,l0\n"m1 open,l1\nm2,l2\n"m3",l3\nm4,l4\n',  # strict: text after a closing quote
])
def test_unclosed_csv_quote_never_keeps_a_merged_row(tmp_path: Path, body: bytes) -> None:
    path = tmp_path / "q.csv"
    path.write_bytes(b"text,label\n" + body)
    rows = _rows(InputSpec(path=path))
    n_lines = body.count(b"\n")
    assert len(rows) == n_lines and [p for p, *_ in rows] == list(range(n_lines))
    for _, record, error, _, raw in rows:
        text = record["text"] if error is None else raw
        assert sum(f"m{i}" in text for i in range(5)) == 1, rows
    assert "malformed_csv" in _reasons(rows)


def test_legit_multiline_csv_fields_are_kept(tmp_path: Path) -> None:
    path = tmp_path / "ml.csv"
    path.write_bytes(b'text,label\n"para one\npara two",a\nsingle,b\n"x\r\ny, z",c\n')
    rows = _rows(InputSpec(path=path))
    assert _reasons(rows) == [None, None, None]
    assert rows[0][1]["text"] == "para one\npara two"


# ------------------------------------------------------------------ 8. null columns
def test_null_messages_beside_alpaca_fields(tmp_path: Path) -> None:
    import datasets

    rows = [{"messages": None, "instruction": "q", "input": "", "output": "a"},
            {"messages": [{"role": "user", "content": "u"}, {"role": "assistant", "content": "v"}],
             "instruction": None, "input": None, "output": None}]
    table = pa.Table.from_pylist(rows)
    pq.write_table(table, tmp_path / "mixed.parquet")
    for spec in (InputSpec(path=tmp_path / "mixed.parquet"),
                 InputSpec(dataset=datasets.Dataset(table), name="mem")):
        kept, rejected = _run(spec)
        assert rejected.num_rows == 0 and kept.column("format").to_pylist() == ["alpaca", "messages"]


# ------------------------------------------------------------------ 9. line endings
@pytest.mark.parametrize("sep", [b"\r", b"\r\n", b"\n"])
@pytest.mark.parametrize("defer", [False, True])
def test_line_endings(tmp_path: Path, sep: bytes, defer: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bounded, "READ_CHUNK_BYTES", 7)  # line ends split across reads
    path = tmp_path / "cr.jsonl"
    path.write_bytes(sep.join(_alpaca_line(i) for i in range(10)) + sep)
    rows = _rows(InputSpec(path=path), defer_parse=defer)
    assert [r[1]["instruction"] for r in rows] == [f"q{i}" for i in range(10)]
    csv_path = tmp_path / "cr.csv"
    csv_path.write_bytes(sep.join([b"instruction,output"] + [b"q%d,a%d" % (i, i) for i in range(10)]))
    assert [r[1]["output"] for r in _rows(InputSpec(path=csv_path))] == [f"a{i}" for i in range(10)]


# ------------------------------------------------------------------ 10. empty labels
def test_empty_label_is_a_missing_label(tmp_path: Path) -> None:
    path = tmp_path / "labels.csv"
    path.write_bytes(b'text,label\nhello,greet\nhi,""\nyo,   \n')
    kept, rejected = _run(InputSpec(path=path))
    assert kept.column("label").to_pylist() == ["greet"]
    assert rejected.column("reason").to_pylist() == ["missing_field", "missing_field"]
    batch = RawBatch(source="s")
    batch.add(0, {"instruction": "q", "output": "a", "label": " "})
    batch.add(1, {"instruction": "q", "context": "", "response": "a", "category": ""})
    out = Normalizer().normalize(batch, SourceOptions(name="s"))
    assert out.kept.column("label").to_pylist() == [None, None]


# ------------------------------------------------------------------ 11. one clear error
def test_top_level_object_json_is_one_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "wrapped.json"
    path.write_text(json.dumps({"data": [{"instruction": "q", "output": "a"}] * 3, "version": 2}, indent=2))
    for call in (lambda s: s.resolved_reader(), describe_input, lambda s: list(read_batches(s))):
        with pytest.raises(InputError, match=r"JSON object.*json_key.*found keys: data, version"):
            call(InputSpec(path=path))
    with pytest.raises(InputError, match="found keys: data, version"):
        list(read_batches(InputSpec(path=path, reader="json")))
    with pytest.raises(InputError, match="no key 'nope'"):
        list(read_batches(InputSpec(path=path, json_key="nope")))
    rows = _rows(InputSpec(path=path, json_key="data"))
    assert _reasons(rows) == [None, None, None]
    (tmp_path / "lines.json").write_text('{"instruction": "q", "output": "a"}\n{"instruction": "r", "output": "b"}\n')
    assert InputSpec(path=tmp_path / "lines.json").resolved_reader() == "jsonl"


def test_nested_json_key_path(tmp_path: Path) -> None:
    path = tmp_path / "nested.json"
    path.write_text(json.dumps({"skip": {"rows": [[["x"]]]}, "a": {"b": [[1, 2], "x", {"k": "v"}]}}))
    assert [r[1] for r in _rows(InputSpec(path=path, json_key="a.b"))] == [[1, 2], "x", {"k": "v"}]


def test_folder_that_is_not_a_dataset(tmp_path: Path) -> None:
    folder = tmp_path / "notes"
    folder.mkdir()
    (folder / "readme.txt").write_text("hello")
    spec = InputSpec(path=folder)
    describe_input(spec)
    with pytest.raises(InputError, match="not a saved Hugging Face dataset"):
        list(read_batches(spec))
    (tmp_path / "bad.arrow").write_bytes(b"not arrow at all")
    with pytest.raises(InputError, match="bad.arrow"):
        list(read_batches(InputSpec(path=tmp_path / "bad.arrow")))


def test_unreadable_file_is_an_input_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from dataguard.io import readers

    path = tmp_path / "locked.json"
    path.write_text("[]")

    def denied(*args: Any, **kwargs: Any) -> Any:
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(readers, "file_sha256", denied)  # (chmod does not stop root)
    with pytest.raises(InputError, match="locked.json: Permission denied"):
        describe_input(InputSpec(path=path))
    monkeypatch.setattr(bounded, "open", denied, raising=False)
    with pytest.raises(InputError, match="Permission denied"):
        InputSpec(path=path).resolved_reader()
    with pytest.raises(InputError, match="Permission denied"):
        list(read_batches(InputSpec(path=path)))


# ------------------------------------------------------------------ 12. positions
def test_invalid_utf8_keeps_every_row_in_place(tmp_path: Path) -> None:
    lines = [_alpaca_line(0), b'{"instruction": "\xff\xfe", "output": "a"}', _alpaca_line(2), b"\xc3",
             _alpaca_line(4)]
    (tmp_path / "u.jsonl").write_bytes(b"\n".join(lines))
    (tmp_path / "u.json").write_bytes(b"[" + b",".join(lines[:3] + [b'"\xc3"'] + lines[4:]) + b"]")
    (tmp_path / "u.csv").write_bytes(b"instruction,output\nq0,a0\nq1,\xff\nq2,a2\n\xc3,x\nq4,a4\n")
    for name in ("u.jsonl", "u.json", "u.csv"):
        rows = _rows(InputSpec(path=tmp_path / name))
        assert [p for p, *_ in rows] == [0, 1, 2, 3, 4], name
        assert _reasons(rows) == [None, "invalid_utf8", None, "invalid_utf8", None], name
        assert [r[1]["instruction"] for r in rows if r[2] is None] == ["q0", "q2", "q4"], name


def test_parquet_invalid_utf8_and_deep_schema(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A string column with bytes that are not UTF-8 costs only its own row; a schema nested
    past MAX_DEPTH rejects every row as too_deep (nothing recurses into it)."""
    from dataguard.io import arrow_reader

    binary = pa.array([b"ok", b"\xff\xfe", b"fine"], pa.binary())
    bad_text = pa.Array.from_buffers(pa.string(), 3, binary.buffers())  # unchecked: as a writer may leave it
    pq.write_table(pa.table({"instruction": bad_text, "output": ["a", "b", "c"]}), tmp_path / "u.parquet")
    rows = _rows(InputSpec(path=tmp_path / "u.parquet"))
    assert _reasons(rows) == [None, "invalid_utf8", None] and "\\xff" in rows[1][4]
    typ: pa.DataType = pa.int64()
    value: Any = 1
    for _ in range(15):
        typ, value = pa.list_(typ), [value]
    table = pa.table({"deep": pa.array([value, value], typ)})
    pq.write_table(table, tmp_path / "deep.parquet")
    monkeypatch.setattr(arrow_reader, "MAX_DEPTH", 10)  # (pyarrow itself refuses Parquet nested past 100)
    assert _reasons(_rows(InputSpec(path=tmp_path / "deep.parquet"))) == ["too_deep", "too_deep"]
    import datasets

    assert _reasons(_rows(InputSpec(dataset=datasets.Dataset(table), name="mem"))) == ["too_deep", "too_deep"]


def test_json_array_edge_shapes(tmp_path: Path) -> None:
    cases = {
        b"[]": [],
        b"  [ ]  ": [],
        b"[1,,2]": [None, "invalid_json", None],
        b"[1,2,]": [None, None, "invalid_json"],
        b'[{"a": "]"}, "}", "\\\\"]': [None, None, None],
        b"[1, 2] trailing": [None, None, "invalid_json"],
        b"[1, 2}": [None, "invalid_json"],
        b'"just a string"': ["invalid_json"],
        b"[1, 2": [None, "invalid_json"],
    }
    for data, expected in cases.items():
        path = tmp_path / "edge.json"
        path.write_bytes(data)
        rows = _rows(InputSpec(path=path, reader="json"))
        assert _reasons(rows) == (expected or ["empty_file"]), data


def test_csv_duplicate_header_names_keep_every_column(tmp_path: Path) -> None:
    path = tmp_path / "dup.csv"
    path.write_bytes(b"text,label,text,text_2\nhello,greet,again,x\n")
    assert _rows(InputSpec(path=path))[0][1] == {"text": "hello", "label": "greet", "text_2": "again",
                                                 "text_2_2": "x"}
