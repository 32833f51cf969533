"""JSON-lines inputs read by workers in byte ranges: the same rows as the whole-file reader
wherever a range is cut, the same output bytes for any worker count, range size and resume,
and a driver that sends split descriptors, never rows."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from dataguard.io import bounded
from dataguard.io.json_readers import LineSplit, deferred_jsonl
from dataguard.io.line_index import index_lines, next_line_start, plan_line_ranges
from dataguard.io.readers import DEFAULT_MAX_RECORD_BYTES, InputSpec
from dataguard.pipeline import Pipeline
from dataguard.run.segment import UnitTask
from dataguard.run.splits import IndexTask, line_splits
from dataguard.stages.dedup import DedupStage
from dataguard.stages.length import LengthStage

REPO = Path(__file__).resolve().parent.parent


def _whole(path: Path, max_bytes: int = DEFAULT_MAX_RECORD_BYTES) -> list[tuple[Any, ...]]:
    """What the whole-file reader gives: (position, line number, bytes or error) per row."""
    rows: list[tuple[Any, ...]] = []
    for batch in deferred_jsonl(path, "s", 3, max_bytes):
        rows += [(p, n, line) for p, n, line in batch.pending]
        rows += [(p, e, d) for p, e, d in zip(batch.positions, batch.errors, batch.details, strict=True)]
    return rows


def _split(path: Path, split_bytes: int, batch_rows: int = 3,
           max_bytes: int = DEFAULT_MAX_RECORD_BYTES) -> tuple[list[tuple[Any, ...]], list[LineSplit]]:
    indexes = [index_lines(path, start, end, max_bytes, batch_rows) for start, end in
               plan_line_ranges(path, split_bytes)]
    units = list(line_splits(str(path), indexes, batch_rows, max_bytes))
    rows: list[tuple[Any, ...]] = []
    for unit in units:
        batch = unit.read("s")
        assert len(batch) == unit.records or unit.records == 0
        assert len(batch) <= batch_rows
        rows += [(p, n, line) for p, n, line in batch.pending]
        rows += [(p, e, d) for p, e, d in zip(batch.positions, batch.errors, batch.details, strict=True)]
    return rows, units


NASTY = [
    b"",
    b"\n\n  \n",
    b'{"a": 1}',
    b'\xef\xbb\xbf{"a": 1}\n{"b": 2}\n',
    b'{"a": 1}\r\n{"b": 2}\r\n\r\n{"c": "\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80"}\r{"d": 4}',
    b'{"a": "\xff\xfe"}\n{broken\n\n   \n{"ok": true}\n',
    b'{"x": "' + b"\xe2\x82\xac" * 40 + b'"}\n' * 7,
    b"\r\r\n\n\r" + b'{"y": 2}\r' * 5,
    b'{"big": "' + b"z" * 300 + b'"}\n{"small": 1}\n   ' + b" " * 200 + b"\n{\"t\": 3}",
]


@pytest.mark.parametrize("data", NASTY)
def test_every_cut_gives_the_rows_of_the_whole_file(tmp_path: Path, data: bytes) -> None:
    path = tmp_path / "in.jsonl"
    path.write_bytes(data)
    whole = _whole(path)
    for split_bytes in range(1, len(data) + 2):
        rows, _ = _split(path, split_bytes)
        assert rows == whole, split_bytes


def test_cuts_inside_huge_lines_at_line_ends_and_inside_utf8_chars(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(bounded, "READ_CHUNK_BYTES", 7)  # lines cross reads everywhere
    euro = "€".encode()
    huge = b'{"h": "' + b"q" * 500 + b'"}'
    lines = [b'{"a": "' + euro * 3 + b'"}', huge, b'{"b": 1}', b"", b'{"c": "' + euro + b'"}', huge + b" "]
    data = b"\n".join(lines) + b"\n"
    path = tmp_path / "in.jsonl"
    path.write_bytes(data)
    # an exact line end, the middle of a 3-byte character, inside the huge line
    line_end = len(lines[0]) + 1
    in_char = lines[0].index(euro) + 1
    in_huge = line_end + 250
    assert next_line_start(open(path, "rb"), line_end, len(data)) == line_end
    assert next_line_start(open(path, "rb"), in_char, len(data)) == line_end
    assert next_line_start(open(path, "rb"), in_huge, len(data)) == line_end + len(huge) + 1
    whole = _whole(path, max_bytes=400)  # the huge lines are record_too_large rows
    assert sum(1 for row in whole if getattr(row[2], "reason", None) == "record_too_large") == 2
    for split_bytes in (1, 2, 3, in_char, line_end, in_huge, 100, 1000):
        rows, units = _split(path, split_bytes, batch_rows=2, max_bytes=400)
        assert rows == whole, split_bytes
        assert all(u.start < u.end for u in units)


def test_random_files_and_cuts_agree_with_the_whole_file_reader(tmp_path: Path) -> None:
    rng = random.Random(7)
    pieces = [b'{"k": 1}', b'{"k": "\xc3\xa9"}', b"", b"  ", b"{oops", b"\xff", b'"s"', b"[1, 2]", b"\t"]
    ends = [b"\n", b"\r\n", b"\r"]
    for trial in range(40):
        data = b"".join(rng.choice(pieces) + rng.choice(ends) for _ in range(rng.randint(0, 30)))
        if rng.random() < 0.3:
            data = bounded.BOM + data
        if rng.random() < 0.3:
            data += rng.choice(pieces)
        path = tmp_path / f"r{trial}.jsonl"
        path.write_bytes(data)
        whole = _whole(path, max_bytes=12)
        for split_bytes in (1, 5, 13, 64):
            assert _split(path, split_bytes, batch_rows=rng.randint(1, 4), max_bytes=12)[0] == whole


@pytest.mark.parametrize("chunk", [5, 64, 1 << 20])
def test_plain_newline_files_take_the_fast_index_path_to_the_same_rows(tmp_path: Path, monkeypatch,
                                                                        chunk: int) -> None:
    monkeypatch.setattr(bounded, "READ_CHUNK_BYTES", chunk)
    rng = random.Random(chunk)
    pieces = [b'{"k": 1}', b'{"kk": "\xc3\xa9"}', b"", b"  ", b'{"x": "' + b"x" * 30 + b'"}']
    for trial in range(30):
        data = b"".join(rng.choice(pieces) + b"\n" for _ in range(rng.randint(0, 120)))
        if rng.random() < 0.5:
            data += rng.choice(pieces)
        path = tmp_path / f"n{trial}.jsonl"
        path.write_bytes(data)
        whole = _whole(path, max_bytes=20)
        for split_bytes in (1, 50, 333, 1 << 20):
            assert _split(path, split_bytes, batch_rows=rng.randint(1, 9), max_bytes=20)[0] == whole


def _jsonl(path: Path, n: int) -> Path:
    rows = [{"instruction": f"question {i % 97} {'é' * (i % 5)}", "output": f"answer {i}"} for i in range(n)]
    text = "\n".join(__import__("json").dumps(r, ensure_ascii=False) for r in rows)
    path.write_text(text + '\n{not json\n\n{"instruction": "x"}\n', encoding="utf-8")
    return path


def _outputs(out: Path) -> dict[str, bytes]:
    return {p.relative_to(out).as_posix(): p.read_bytes() for p in sorted(out.rglob("*"))
            if p.is_file() and (p.suffix == ".arrow" or p.name == "manifest.json") and "_work" not in p.parts}


def test_same_bytes_for_any_worker_count_and_rows_for_any_range_size(tmp_path: Path) -> None:
    import pyarrow as pa

    data = _jsonl(tmp_path / "in.jsonl", 900)
    runs, tables = {}, {}
    for name, workers, split_bytes in (("one", 1, 5000), ("two", 2, 5000), ("one-b", 1, 777), ("two-b", 2, 777),
                                       ("whole", 1, 1 << 30)):
        result = Pipeline([DedupStage(action="drop"), LengthStage(max_tokens=40)], workers=workers, batch_rows=64,
                          split_bytes=split_bytes).run([InputSpec(path=data, name="d")], tmp_path / name)
        assert result.manifest["counts"]["balanced"]
        assert result.rows_in == 902
        runs[name] = _outputs(tmp_path / name)
        tables[name] = (result.kept_table(), result.rejected_table())
    assert runs["one"] == runs["two"]
    assert runs["one-b"] == runs["two-b"]
    # Unit boundaries move with the range size (so do the shards' record batches), the rows do not.
    for name in ("one", "one-b"):
        for got, want in zip(tables[name], tables["whole"], strict=True):
            assert pa.Table.from_batches(got.to_batches()).equals(want)


def test_the_driver_sends_split_descriptors_not_rows(tmp_path: Path, executor_tasks: list[Any]) -> None:
    data = _jsonl(tmp_path / "in.jsonl", 300)
    Pipeline([], workers=1, batch_rows=50, split_bytes=4000).run([InputSpec(path=data)], tmp_path / "o")
    index = [t for t in executor_tasks if isinstance(t, IndexTask)]
    units = [t for t in executor_tasks if isinstance(t, UnitTask)]
    assert len(index) > 1 and len(units) > len(index)
    for task in units:
        assert task.raw is None and isinstance(task.split, LineSplit)
        assert task.split.end - task.split.start < 4000  # a range, not its contents


KILLABLE = textwrap.dedent("""
    import sys
    from dataguard.io.readers import InputSpec
    from dataguard.pipeline import Pipeline
    from dataguard.stages.dedup import DedupStage
    if __name__ == "__main__":
        Pipeline([DedupStage(action="drop")], workers=int(sys.argv[3]), batch_rows=20, split_bytes=3000).run(
            [InputSpec(path=sys.argv[1], name="d")], sys.argv[2])
""")


def test_killed_and_resumed_split_run_gives_identical_bytes(tmp_path: Path) -> None:
    data = _jsonl(tmp_path / "in.jsonl", 3000)
    script = tmp_path / "run.py"
    script.write_text(KILLABLE)
    clean = subprocess.run([sys.executable, str(script), str(data), str(tmp_path / "clean"), "1"], cwd=REPO,
                           capture_output=True, text=True, timeout=300)
    assert clean.returncode == 0, clean.stderr
    out = tmp_path / "killed"
    proc = subprocess.Popen([sys.executable, str(script), str(data), str(out), "2"], cwd=REPO,
                            start_new_session=True)
    deadline = time.time() + 120
    while time.time() < deadline and len(list((out / "_work").glob("seg0*/*.meta.json"))) < 10:
        time.sleep(0.005)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not (out / "manifest.json").exists(), "run finished before it could be killed"
    resumed = subprocess.run([sys.executable, str(script), str(data), str(out), "1"], cwd=REPO,
                             capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    assert _outputs(out) == _outputs(tmp_path / "clean")


def test_workers_write_the_shards_the_driver_would(tmp_path: Path, monkeypatch) -> None:
    """Row-sized shards are planned from the units' counts and written by workers, with
    the bytes the driver's ShardWriter writes (shards cut inside units, rejects of two segments)."""
    import dataguard.pipeline as pipeline_module

    data = _jsonl(tmp_path / "in.jsonl", 700)

    def run(name: str, workers: int) -> dict[str, bytes]:
        Pipeline([DedupStage(action="drop"), LengthStage(max_tokens=20, action="drop")], workers=workers,
                 batch_rows=37, shard_rows=101, split_bytes=9000).run([InputSpec(path=data, name="d")], tmp_path / name)
        return _outputs(tmp_path / name)

    by_workers = run("workers", 2)
    real = pipeline_module.write_shards
    monkeypatch.setattr(pipeline_module, "write_shards", lambda *args: real(*args[:-1], None))
    by_driver = run("driver", 1)
    assert len([k for k in by_driver if k.startswith("data/")]) > 2
    assert len([k for k in by_driver if k.startswith("rejected/")]) > 2
    assert by_workers == by_driver
