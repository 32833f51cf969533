"""JSON array inputs read by workers in item ranges: one worker indexes the array, each unit
frames and parses its own bytes, and the rows, positions, problem wording and batches are
those of the whole-file reader, wherever units start and however the file is read; what the
index cannot vouch for falls back to the whole-file reader; output bytes do not depend on
the worker count or on which path read the file."""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path
from typing import Any

import pytest

from dataguard.io import array_split, bounded
from dataguard.io.array_split import ArraySplit, array_splits, index_array
from dataguard.io.readers import DEFAULT_MAX_RECORD_BYTES, InputError, InputSpec, read_batches
from dataguard.pipeline import Pipeline
from dataguard.run.segment import UnitTask
from dataguard.run.splits import ArrayIndexTask
from dataguard.stages.dedup import DedupStage


def _rows(batch: Any) -> list[tuple[Any, ...]]:
    return list(zip(batch.positions, batch.records, batch.errors, batch.details, batch.raw, strict=True))


def _whole(path: Path, batch_rows: int, json_key: str | None, max_bytes: int) -> list[list[tuple[Any, ...]]]:
    """The whole-file reader's batches (what the driver read before)."""
    spec = InputSpec(path=path, name="s", reader="json", json_key=json_key)
    return [_rows(b) for b in read_batches(spec, batch_rows=batch_rows, max_record_bytes=max_bytes)]


def _split(path: Path, batch_rows: int, json_key: str | None, max_bytes: int) -> list[list[tuple[Any, ...]]] | None:
    index = index_array(path, json_key, max_bytes, batch_rows)
    if not index.splittable:
        return None
    return [_rows(unit.read("s")) for unit in array_splits(str(path), json_key, index, batch_rows, max_bytes)]


DEEP = b"[" * 120 + b"]" * 120
CASES: dict[str, bytes] = {
    "plain": b'[{"a": 1}, {"b": 2}, {"c": 3}, {"d": 4}, {"e": 5}]',
    "empty array": b"[ ]",
    "empty array, trailing comma": b"[,]",
    "one item": b'[{"a": "x"}]\n',
    "bom and whitespace": b'\xef\xbb\xbf \n [ {"a": 1} ,\n\t{"b": 2} , {"c":3}]  \n',
    "strings with structure": b'[{"s": "a,b]c[d{e}f:g"}, {"s": "\\\\"}, {"s": "\\",["}, "x,y", {"s": "\\\\\\","}]',
    "stray and trailing commas": b'[{"a": 1},, {"b": 2}, ,{"c": 3},]',
    "syntax errors inside items": b'[{"a": 1}, {"b": }, {"c": 3}, {bad}, 7, "s", null, [1, 2]]',
    "bad utf-8": b'[{"a": "\xff\xfe"}, {"b": "\xc3\xa9"}, {"c": "\xed\xa0\x80"}]',
    "too deep": b'[{"a": 1}, ' + DEEP + b', {"c": 3}, {"d": 4}]',
    "oversize items": b'[{"a": "' + b"x" * 150 + b'"}, {"b": 2}, {"c": "' + b"y" * 400 + b'"}, {"d": 4}]',
    "truncated": b'[{"a": 1}, {"b": 2}, {"c": 3}, {"d": ',
    "truncated after a comma": b'[{"a": 1}, {"b": 2},',
    "trailing data": b'[{"a": 1}, {"b": 2}, {"c": 3}] {"d": 4}',
    "trailing data after a full unit": b'[{"a": 1}, {"b": 2}] garbage',
    "stray close": b'[{"a": 1}, {"b": 2}, {"c": 3} } , {"d": 4}]',
    "stray close after an oversize item": b'[1,  {"a": "' + b"x" * 300 + b'"}   }  ]',
    "not an array": b'"hello"',
    "nothing": b"",
    "whitespace only": b"  \n ",
}
KEYED: dict[str, bytes] = {
    "under a key": b'{"meta": {"n": 3}, "data": [{"a": 1}, {"b": 2}, {"c": 3}, {"d": 4}], "tail": [1, 2]}',
    "nested key": b'{"x": {"rows": [{"a": 1}, {"b": "]"}, {"c": 3}]}, "y": 1}',
    "key missing": b'{"other": [1, 2]}',
    "key truncated": b'{"data": [{"a": 1}, {"b": 2}, {"c"',
}
KEYS = {"under a key": "data", "nested key": "x.rows", "key missing": "data", "key truncated": "data"}
# what the index cannot vouch for: read whole (with batch_rows 1, the damaged end is a unit's first row)
FALLS_BACK = {"not an array", "nothing", "whitespace only", "key missing"}


@pytest.mark.parametrize("name", [*CASES, *KEYED])
@pytest.mark.parametrize("chunk", [1, 5, 1 << 20])
def test_units_give_the_batches_of_the_whole_file_reader(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          name: str, chunk: int) -> None:
    monkeypatch.setattr(bounded, "READ_CHUNK_BYTES", chunk)
    data = CASES.get(name, KEYED.get(name, b""))
    path = tmp_path / "in.json"
    path.write_bytes(data)
    key = KEYS.get(name)
    for batch_rows in (1, 2, 3, 10):
        try:
            whole = _whole(path, batch_rows, key, 200)
        except InputError:
            whole = None
        split = _split(path, batch_rows, key, 200)
        if split is None:
            assert name in FALLS_BACK or _damaged_end_opens_a_batch(whole), (name, batch_rows)
            continue
        assert split == whole, (name, batch_rows)


def _damaged_end_opens_a_batch(batches: list[list[tuple[Any, ...]]] | None) -> bool:
    """The one case where no item starts a unit: the last batch is only the row for data
    after the array (a row with no item behind it)."""
    last = batches[-1] if batches else []
    return len(last) == 1 and "after the end of" in (last[0][3] or "")


def _random_array(rng: random.Random) -> bytes:
    """Items of every kind, whitespace anywhere, sometimes a BOM or a damaged end."""
    parts = []
    for _ in range(rng.randint(0, 40)):
        kind = rng.random()
        if kind < 0.5:
            rec = {"k": "".join(rng.choice('ab,[]{}:"\\ é\n') for _ in range(rng.randint(0, 12))),
                   "n": rng.randint(-5, 5), "l": [1, {"z": None}]}
            parts.append(json.dumps(rec, ensure_ascii=rng.random() < 0.5).encode())
        elif kind < 0.6:
            parts.append(b"")  # an empty item
        elif kind < 0.7:
            parts.append(b'{"big": "' + b"q" * rng.randint(100, 500) + b'"}')
        elif kind < 0.8:
            parts.append(b"[" * 110 + b"]" * 110)
        elif kind < 0.9:
            parts.append(b'{"broken": ' + rng.choice([b"}", b"tru", b'"\xff"', b"[1,}"]))
        else:
            parts.append(rng.choice([b"1", b'"s"', b"null", b"[]", b"{}"]))
    ws = [b"", b" ", b"\n", b"\r\n\t "]
    body = b",".join(rng.choice(ws) + p + rng.choice(ws) for p in parts)
    data = (bounded.BOM if rng.random() < 0.2 else b"") + rng.choice(ws) + b"[" + body + b"]" + rng.choice(ws)
    tail = rng.random()
    if tail < 0.1:
        data = data[:rng.randint(1, len(data))]  # truncated anywhere
    elif tail < 0.15:
        data += b" extra"
    return data


def test_random_arrays_agree_with_the_whole_file_reader(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(20261201)
    path = tmp_path / "in.json"
    split_files = 0
    for trial in range(300):
        monkeypatch.setattr(bounded, "READ_CHUNK_BYTES", rng.choice([1, 2, 7, 64, 1 << 20]))
        path.write_bytes(_random_array(rng))
        batch_rows = rng.choice([1, 2, 3, 5, 50])
        split = _split(path, batch_rows, None, 300)
        if split is not None:
            split_files += 1
            assert split == _whole(path, batch_rows, None, 300), trial
    assert split_files > 250  # the fallback stays the exception


def _alpaca(path: Path, n: int, broken_every: int = 0) -> Path:
    rows = []
    for i in range(n):
        if broken_every and i % broken_every == 7:
            rows.append(b'{"instruction": "broken ' + str(i).encode() + b'" "output": 1}')  # a syntax error
        else:
            rows.append(json.dumps({"instruction": f"Say {i} [twice], please", "input": "",
                                    "output": f"{i}, {i}"}).encode())
    path.write_bytes(b"[\n" + b",\n".join(rows) + b"\n]\n")
    return path


def _outputs(folder: Path) -> dict[str, str]:
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file() and "_work" not in p.parts and p.name != "run.json"}


def test_same_bytes_for_any_worker_count_and_as_the_whole_file_reader(tmp_path: Path, executor_tasks: list[Any],
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    data = _alpaca(tmp_path / "in.json", 900, broken_every=50)
    spec = InputSpec(path=data, name="a")
    runs = {}
    for workers in (1, 2):
        out = tmp_path / f"w{workers}"
        result = Pipeline([DedupStage(action="drop")], workers=workers, batch_rows=64).run([spec], out)
        assert result.manifest["counts"]["balanced"] and result.rows_in == 900
        runs[workers] = _outputs(out)
    assert any(isinstance(t, UnitTask) and isinstance(t.split, ArraySplit) for t in executor_tasks)
    executor_tasks.clear()
    from dataguard.run import splits

    monkeypatch.setattr(splits, "index_array", lambda *a, **k: array_split.ArrayIndex(splittable=False))
    out = tmp_path / "whole"
    Pipeline([DedupStage(action="drop")], workers=1, batch_rows=64).run([spec], out)  # in-process: patched
    first = [t for t in executor_tasks if isinstance(t, UnitTask) and t.previous is None]
    assert len(first) == 15 and all(t.raw is not None and t.split is None for t in first)  # the driver read it
    assert runs[1] == runs[2] == _outputs(out)
    assert result.rows_kept == 882  # 18 broken items rejected, with their reasons, on every path


def test_the_driver_sends_item_ranges_not_rows(tmp_path: Path, executor_tasks: list[Any]) -> None:
    data = _alpaca(tmp_path / "in.json", 300)
    Pipeline([], workers=1, batch_rows=50).run([InputSpec(path=data)], tmp_path / "o")
    assert len([t for t in executor_tasks if isinstance(t, ArrayIndexTask)]) == 1
    units = [t for t in executor_tasks if isinstance(t, UnitTask)]
    assert len(units) == 6
    for k, task in enumerate(units):
        assert task.raw is None and isinstance(task.split, ArraySplit)
        assert (task.split.position, task.split.records) == (50 * k, 50)
        assert (task.split.end is None) == (k == 5)


def test_a_json_key_array_and_its_fallback(tmp_path: Path, executor_tasks: list[Any]) -> None:
    path = tmp_path / "wrapped.json"
    rows = [{"instruction": f"q{i}", "output": f"a{i}"} for i in range(120)]
    path.write_text(json.dumps({"version": 2, "data": rows, "after": {"x": "]"}}))
    result = Pipeline([], workers=1, batch_rows=50).run([InputSpec(path=path, json_key="data")], tmp_path / "o")
    assert result.manifest["counts"]["balanced"] and result.rows_in == result.rows_kept == 120
    assert [t.split.records for t in executor_tasks if isinstance(t, UnitTask)] == [50, 50, 20]
    with pytest.raises(InputError, match="no key 'rows'"):
        Pipeline([], workers=1, batch_rows=50).run([InputSpec(path=path, json_key="rows")], tmp_path / "o2")


def test_a_file_changed_after_indexing_is_refused(tmp_path: Path) -> None:
    path = _alpaca(tmp_path / "in.json", 10)
    index = index_array(path, None, DEFAULT_MAX_RECORD_BYTES, 4)
    units = array_splits(str(path), None, index, 4, DEFAULT_MAX_RECORD_BYTES)
    assert [u.read("s").positions for u in units] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    _alpaca(path, 11)
    with pytest.raises(InputError, match="changed while it was read"):
        units[-1].read("s")


@pytest.mark.parametrize("name", ["stray close after an oversize item", "trailing data", "oversize items", "truncated"])
def test_previews_do_not_depend_on_where_reads_end(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                   name: str) -> None:
    """The whole-file reader gives the same rows (previews included) for any read size, which
    is what lets a unit that starts its reads elsewhere give them too."""
    path = tmp_path / "in.json"
    path.write_bytes(CASES[name])
    seen = []
    for chunk in (1, 3, 5, 7, 64, 1 << 20):
        monkeypatch.setattr(bounded, "READ_CHUNK_BYTES", chunk)
        seen.append(_whole(path, 10, None, 200))
    assert all(rows == seen[0] for rows in seen)


def test_trailing_data_before_a_damaged_gzip_end_is_still_that_row(tmp_path: Path) -> None:
    import gzip

    data = gzip.compress(b'[{"a": 1}, {"b": 2}] {"oops": "trailing object"}' + b" " * 5000)
    path = tmp_path / "in.json.gz"
    path.write_bytes(data[:-12])  # the stream breaks inside the whitespace after the object
    rows = [r for batch in _whole(path, 10, None, DEFAULT_MAX_RECORD_BYTES) for r in batch]
    assert [r[0] for r in rows] == [0, 1, 2]
    assert rows[2][2] == "invalid_json" and rows[2][4] == '{"oops": "trailing object"}'
    assert rows[2][3].startswith("item 2: data after the end of the JSON array (after 2 items); then ")
    assert "damaged or truncated" in rows[2][3]  # the broken stream is reported too
