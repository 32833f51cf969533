"""Damaged, changed and mis-encoded inputs (issue #22, "Inputs"): every row ends kept or
rejected with a reason, the output bytes do not depend on the worker count, and a file
the run cannot trust is refused in one ``dataguard:`` line. Each test runs the CLI."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.parquet as pq
import pytest

from dataguard import cli


def _config(tmp_path: Path, data: Path, batch_rows: int = 5000, stages: str = "[]") -> Path:
    config = tmp_path / f"{data.stem}-{batch_rows}.yaml"
    config.write_text(f"inputs:\n  - {{path: {data}, name: d}}\nbatch_rows: {batch_rows}\nstages: {stages}\n"
                      "report: false\n")
    return config


def _run(tmp_path: Path, data: Path, out: str, workers: int = 1, batch_rows: int = 5000) -> int:
    return cli.main(["run", str(_config(tmp_path, data, batch_rows)), "--output", str(tmp_path / out),
                     "--workers", str(workers), "--no-report", "--quiet"])


def _outputs(out: Path) -> dict[str, bytes]:
    """The manifest and every data and rejected shard, as bytes."""
    return {p.relative_to(out).as_posix(): p.read_bytes() for p in sorted(out.rglob("*"))
            if p.is_file() and "_work" not in p.parts and (p.suffix == ".arrow" or p.name == "manifest.json")}


def _rejected(out: Path) -> list[dict]:
    tables = [ipc.open_stream(p.read_bytes()).read_all() for p in sorted((out / "rejected").glob("*.arrow"))]
    return [row for table in tables for row in table.to_pylist()]


def _kept_rows(out: Path) -> list[dict]:
    tables = [ipc.open_stream(p.read_bytes()).read_all() for p in sorted((out / "data").glob("*.arrow"))]
    return [row for table in tables for row in table.to_pylist()]


# ------------------------------------------------------------------ 1. damaged Parquet row group
def _damaged_parquet(path: Path) -> Path:
    """400 rows in four row groups; the "output" pages of group 2 overwritten with 0xff."""
    table = pa.table({"instruction": [f"Explain item {i} in plain words." for i in range(400)],
                      "output": [f"Item {i} is " + "detail " * (i % 7) for i in range(400)]})
    pq.write_table(table, path, row_group_size=100)
    column = pq.ParquetFile(path).metadata.row_group(2).column(1)
    start = column.dictionary_page_offset or column.data_page_offset
    data = bytearray(path.read_bytes())
    data[start:start + column.total_compressed_size] = b"\xff" * column.total_compressed_size
    path.write_bytes(bytes(data))
    return path


def test_a_damaged_row_group_gives_the_same_bytes_for_any_worker_count(tmp_path: Path) -> None:
    data = _damaged_parquet(tmp_path / "in.parquet")
    runs = []
    for k, workers in enumerate((1, 2, 2)):
        assert _run(tmp_path, data, f"o{k}", workers=workers, batch_rows=30) == 0
        runs.append(_outputs(tmp_path / f"o{k}"))
    assert runs[0] == runs[1] == runs[2]
    rejected = _rejected(tmp_path / "o0")
    assert [r["reason"] for r in rejected] == ["unreadable_file"] * 4  # the units touching rows 200-299
    assert all("row group 2 (rows 200-299) is damaged" in r["detail"] and "StopIteration" not in r["detail"]
               for r in rejected)
    assert len(_kept_rows(tmp_path / "o0")) == 300


# ------------------------------------------------------------------ 2. an input rewritten mid-run
def _rewrite_after_planning(monkeypatch: pytest.MonkeyPatch, path: Path, new: bytes, keep_mtime: bool) -> None:
    """Rewrite ``path`` in place (same size) once the plan is made, before any unit reads it;
    ``keep_mtime``: and put its old mtime back, as a coarse clock may leave it."""
    from dataguard.run import splits

    units = splits.InputPlan.units

    def rewritten(self: splits.InputPlan):  # type: ignore[no-untyped-def]
        before = path.stat()
        assert len(new) == before.st_size
        with open(path, "r+b") as f:  # in place: the same inode
            f.write(new)
        if keep_mtime:
            os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
        return units(self)

    monkeypatch.setattr(splits.InputPlan, "units", rewritten)


def _alpaca(n: int, answer: str) -> list[dict]:
    return [{"instruction": f"Say {i} twice.", "output": f"{i} {answer}"} for i in range(n)]


@pytest.mark.parametrize("keep_mtime", [True, False], ids=["same-mtime", "new-mtime"])
@pytest.mark.parametrize("kind", ["jsonl", "json"])
def test_an_input_rewritten_in_place_mid_run_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                        monkeypatch: pytest.MonkeyPatch, kind: str,
                                                        keep_mtime: bool) -> None:
    def dump(rows: list[dict]) -> bytes:
        if kind == "json":
            return json.dumps(rows).encode()
        return b"".join(json.dumps(row).encode() + b"\n" for row in rows)

    path = tmp_path / f"in.{kind}"
    path.write_bytes(dump(_alpaca(60, "good")))
    new = dump(_alpaca(60, "evil"))
    _rewrite_after_planning(monkeypatch, path, new, keep_mtime)
    # the plan and the rewrite happen in the driver; with 2 workers the refusal comes from a worker
    assert _run(tmp_path, path, "o", workers=1 if keep_mtime else 2, batch_rows=25) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("dataguard: run failed: input 'd': ") and str(path) in err[0]
    assert "changed while it was read" in err[0]
    assert not (tmp_path / "o" / "manifest.json").exists()


# ------------------------------------------------------------------ 3. a stray quote in CSV
@pytest.mark.parametrize("closed_later", [True, False], ids=["closed-later", "never-closed"])
def test_a_stray_csv_quote_costs_only_its_own_row(tmp_path: Path, closed_later: bool) -> None:
    rows = [f"Question {i}?,Answer {i}." for i in range(8)]
    if closed_later:  # a later valid row's quoted field closes the stray quote
        rows[6] = 'Question 6?,"Answer 6, with a comma."'
    lines = ["instruction,output", *rows[:4], 'Question 99?,"a broken answer', *rows[4:]]
    path = tmp_path / "in.csv"
    path.write_text("\n".join(lines) + "\n")
    assert _run(tmp_path, path, "o") == 0
    rejected = _rejected(tmp_path / "o")
    assert [(r["reason"], r["detail"].split(":")[0]) for r in rejected] == [("malformed_csv", "line 6")]
    assert rejected[0]["record"] == 'Question 99?,"a broken answer'
    assert [row["messages"][0]["content"] for row in _kept_rows(tmp_path / "o")] == [f"Question {i}?" for i in range(8)]


# ------------------------------------------------------------------ 4. other encodings, Arrow IPC files
def _records(n: int) -> list[dict]:
    return [{"instruction": f"Say {i} — twice, é 😀", "output": f"{i} {i}"} for i in range(n)]


def _text(kind: str, rows: list[dict]) -> str:
    if kind == "json":
        return json.dumps(rows, ensure_ascii=False, indent=1)
    if kind == "jsonl":
        return "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
    return "instruction,output\n" + "".join(f'"{row["instruction"]}",{row["output"]}\n' for row in rows)


@pytest.mark.parametrize(("kind", "encoding"), [("json", "utf-16"), ("jsonl", "utf-16"), ("json", "utf-16-le"),
                                                ("jsonl", "utf-16-be"), ("json", "utf-32"), ("csv", "utf-16")])
def test_utf16_and_utf32_text_reads_as_the_utf8_file(tmp_path: Path, kind: str, encoding: str) -> None:
    """"utf-16" and "utf-32" write a BOM; "-le"/"-be" none: the zero bytes tell."""
    rows = _records(120)
    (tmp_path / "utf8").mkdir()
    (tmp_path / encoding).mkdir()
    plain, other = tmp_path / "utf8" / f"in.{kind}", tmp_path / encoding / f"in.{kind}"
    plain.write_text(_text(kind, rows), encoding="utf-8")
    other.write_bytes(_text(kind, rows).encode(encoding))
    assert _run(tmp_path / "utf8", plain, "o", batch_rows=50) == 0
    assert _run(tmp_path / encoding, other, "o", workers=2, batch_rows=50) == 0
    assert _rejected(tmp_path / encoding / "o") == []
    assert [row["messages"][0]["content"] for row in _kept_rows(tmp_path / encoding / "o")] == \
        [row["instruction"] for row in rows]
    data = {name: out for name, out in _outputs(tmp_path / encoding / "o").items() if name.startswith("data/")}
    assert data and data == {name: out for name, out in _outputs(tmp_path / "utf8" / "o").items()
                             if name.startswith("data/")}


def test_an_arrow_ipc_file_is_read(tmp_path: Path) -> None:
    """Feather v2 (``write_feather``: the IPC *file* format, lz4-compressed) beside the IPC
    stream format that ``datasets`` writes: the same rows, for 1 and 2 workers."""
    import pyarrow.feather as feather

    table = pa.Table.from_pylist(_records(130))
    feather.write_feather(table, tmp_path / "in.arrow")
    (tmp_path / "stream").mkdir()
    with ipc.new_stream(tmp_path / "stream" / "in.arrow", table.schema) as writer:
        writer.write_table(table)
    assert _run(tmp_path / "stream", tmp_path / "stream" / "in.arrow", "o", batch_rows=50) == 0
    runs = []
    for workers in (1, 2):
        assert _run(tmp_path, tmp_path / "in.arrow", f"o{workers}", workers=workers, batch_rows=50) == 0
        runs.append({name: out for name, out in _outputs(tmp_path / f"o{workers}").items()
                     if name.startswith("data/")})
    assert runs[0] == runs[1] == {name: out for name, out in _outputs(tmp_path / "stream" / "o").items()
                                  if name.startswith("data/")}
    assert len(_kept_rows(tmp_path / "o1")) == 130 and _rejected(tmp_path / "o1") == []
