"""Parquet files and saved Hugging Face datasets read by workers in row ranges: the bytes
the whole-file reader's run gives, for any worker count and any row-group layout; the
driver sends only descriptors; a damaged row group or a file changed mid-run is a clear
row or error, never a crash."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import dataguard.run.splits as splits_module
from dataguard.io.bounded import InputError
from dataguard.io.hf_split import HfSplit, hf_layout, hf_splits
from dataguard.io.parquet_split import ParquetSplit, parquet_layout, parquet_splits
from dataguard.io.readers import InputSpec, read_batches
from dataguard.pipeline import Pipeline
from dataguard.run.segment import UnitTask
from dataguard.stages.dedup import DedupStage
from dataguard.stages.length import LengthStage


def _parquet(path: Path, rows: int, row_group_size: int) -> Path:
    """Alpaca-like rows with nulls, duplicates, an empty answer and nested metadata."""
    table = pa.table({
        "instruction": [f"Explain item {i % 97} in plain words." if i % 13 else None for i in range(rows)],
        "input": ["" if i % 3 else f"context {i}" for i in range(rows)],
        "output": ["" if i % 41 == 5 else f"Item {i % 97} is " + "detail " * (i % 17) for i in range(rows)],
        "meta": [{"tags": [f"t{i % 4}"], "score": float(i % 7) if i % 5 else None} for i in range(rows)],
    })
    pq.write_table(table, path, row_group_size=row_group_size)
    return path


def _outputs(out: Path) -> dict[str, bytes]:
    return {p.relative_to(out).as_posix(): p.read_bytes() for p in sorted(out.rglob("*"))
            if p.is_file() and (p.suffix == ".arrow" or p.name == "manifest.json") and "_work" not in p.parts}


def _rows(batches: Any) -> list[tuple[Any, ...]]:
    rows: list[tuple[Any, ...]] = []
    for batch in batches:
        rows += list(zip(batch.positions, batch.records, batch.errors, batch.details, strict=True))
    return rows


@pytest.mark.parametrize(("rows", "group", "batch_rows"), [(0, 10, 7), (1, 10, 7), (100, 10, 7), (100, 7, 10),
                                                           (257, 64, 50), (257, 1000, 64), (90, 30, 30)])
def test_units_hold_the_rows_of_the_whole_file_reader(tmp_path: Path, rows: int, group: int,
                                                      batch_rows: int) -> None:
    path = _parquet(tmp_path / "in.parquet", rows, group)
    layout = parquet_layout(path, batch_rows)
    assert layout is not None and layout.rows == rows
    units = list(parquet_splits(str(path), layout, batch_rows, 1 << 20))
    whole = list(read_batches(InputSpec(path=path, name="s"), batch_rows=batch_rows))
    assert [len(u.read("s")) for u in units] == [len(b) for b in whole]
    assert _rows(u.read("s") for u in units) == _rows(whole)


def test_a_worker_reads_any_unit_order_in_small_chunks(tmp_path: Path) -> None:
    """Chunks smaller than a unit, units of one large group asked in any order (a restart
    from the group's start when a unit lies behind the worker's place)."""
    import dataclasses

    path = _parquet(tmp_path / "in.parquet", 300, 1000)
    layout = parquet_layout(path, 40)
    assert layout is not None
    units = list(parquet_splits(str(path), dataclasses.replace(layout, chunk_rows=7), 40, 1 << 20))
    whole = _rows(read_batches(InputSpec(path=path, name="s"), batch_rows=40))
    order = [3, 0, 1, 7, 2, 6, 4, 5]
    got = {k: _rows([units[k].read("s")]) for k in order}
    assert [r for k in range(len(units)) for r in got[k]] == whole


def test_values_python_cannot_hold_are_rows_of_their_own(tmp_path: Path) -> None:
    """A date past year 9999 (as pandas may write) is one rejected row, not a traceback."""
    path = tmp_path / "dates.parquet"
    pq.write_table(pa.table({"instruction": ["a", "b", "c"], "output": ["x", "y", "z"],
                             "day": pa.array([1, 2**31 - 1, 3], pa.date32())}), path)
    whole = _rows(read_batches(InputSpec(path=path, name="s"), batch_rows=10))
    assert [(p, e) for p, _, e, _ in whole] == [(0, None), (1, "wrong_type"), (2, None)]
    assert "cannot be read" in whole[1][3]
    layout = parquet_layout(path, 10)
    assert layout is not None
    assert _rows(u.read("s") for u in parquet_splits(str(path), layout, 10, 1 << 20)) == whole


def test_same_bytes_as_the_driver_read_run_for_any_worker_count(tmp_path: Path, monkeypatch) -> None:
    path = _parquet(tmp_path / "in.parquet", 600, 83)
    stages = [DedupStage(action="drop"), LengthStage(max_tokens=30)]
    runs = {}
    for name, workers in (("one", 1), ("two", 2)):
        result = Pipeline(stages, workers=workers, batch_rows=64).run([InputSpec(path=path, name="p")],
                                                                      tmp_path / name)
        assert result.manifest["counts"]["balanced"] and result.rows_in == 600
        runs[name] = _outputs(tmp_path / name)
    monkeypatch.setattr(splits_module, "parquet_layout", lambda *_: None)  # the driver reads the file itself
    Pipeline(stages, workers=1, batch_rows=64).run([InputSpec(path=path, name="p")], tmp_path / "driver")
    assert runs["one"] == runs["two"] == _outputs(tmp_path / "driver")


def test_the_driver_sends_row_ranges_not_rows(tmp_path: Path, executor_tasks: list[Any]) -> None:
    path = _parquet(tmp_path / "in.parquet", 300, 40)
    Pipeline([], workers=1, batch_rows=50).run([InputSpec(path=path)], tmp_path / "o")
    units = [t for t in executor_tasks if isinstance(t, UnitTask)]
    assert len(units) == 6
    assert all(t.raw is None and isinstance(t.split, ParquetSplit) for t in units)
    assert [(t.split.start, t.split.rows) for t in units] == [(i * 50, 50) for i in range(6)]


def test_an_unreadable_footer_falls_back_to_the_reader_row(tmp_path: Path) -> None:
    path = tmp_path / "bad.parquet"
    path.write_bytes(b"PAR1 this is not parquet at all")
    assert parquet_layout(path, 10) is None
    result = Pipeline([], workers=1).run([InputSpec(path=path, name="bad")], tmp_path / "o")
    rejected = result.rejected_table().to_pylist()
    assert [r["reason"] for r in rejected] == ["unreadable_file"] and result.manifest["counts"]["balanced"]


def test_a_damaged_row_group_costs_only_its_units(tmp_path: Path) -> None:
    path = _parquet(tmp_path / "in.parquet", 400, 100)
    meta = pq.ParquetFile(path).metadata
    column = meta.row_group(2).column(2)  # the "output" column of rows 200-299
    start = column.dictionary_page_offset or column.data_page_offset
    data = bytearray(path.read_bytes())
    data[start:start + column.total_compressed_size] = b"\xff" * column.total_compressed_size
    path.write_bytes(bytes(data))
    result = Pipeline([], workers=2, batch_rows=50).run([InputSpec(path=path, name="p")], tmp_path / "o")
    counts = result.manifest["counts"]
    assert counts["balanced"]
    rejected = result.rejected_table().to_pylist()
    broken = [r for r in rejected if r["reason"] == "unreadable_file"]
    assert len(broken) == 2 and all("rows 2" in r["detail"] for r in broken)  # the two units of group 2
    assert result.kept_table().num_rows + len(rejected) == counts["rows_in"] == 302
    assert result.kept_table().num_rows > 250  # groups 0, 1 and 3 are kept


def test_a_file_changed_after_planning_stops_the_unit(tmp_path: Path) -> None:
    path = _parquet(tmp_path / "in.parquet", 100, 10)
    layout = parquet_layout(path, 10)
    assert layout is not None
    unit = next(parquet_splits(str(path), layout, 10, 1 << 20))
    _parquet(path, 120, 10)
    os.utime(path, ns=(layout.stamp[1] + 10**9, layout.stamp[1] + 10**9))
    with pytest.raises(InputError, match="changed while it was read"):
        unit.read("s")


# -- saved Hugging Face datasets ---------------------------------------------------------------

def _saved_dataset(folder: Path, rows: int) -> Path:
    datasets = pytest.importorskip("datasets")
    table = pq.read_table(_parquet(folder.parent / f"{folder.name}.parquet", rows, 50))
    datasets.Dataset(table).save_to_disk(str(folder))
    return folder


@pytest.mark.parametrize(("rows", "batch_rows"), [(1, 10), (230, 64), (100, 100)])
def test_dataset_units_hold_the_rows_of_the_whole_reader(tmp_path: Path, rows: int, batch_rows: int) -> None:
    spec = InputSpec(path=_saved_dataset(tmp_path / "ds", rows), name="s")
    layout = hf_layout(spec, batch_rows)
    assert layout is not None and layout.rows == rows
    units = list(hf_splits(spec, layout, batch_rows, 1 << 20))
    whole = list(read_batches(spec, batch_rows=batch_rows))
    assert [len(u.read("s")) for u in units] == [len(b) for b in whole]
    assert _rows(u.read("s") for u in units) == _rows(whole)


def test_dataset_runs_give_the_driver_read_bytes_and_send_descriptors(tmp_path: Path, monkeypatch,
                                                                     executor_tasks: list[Any]) -> None:
    folder = _saved_dataset(tmp_path / "ds", 500)
    arrow_file = next(folder.glob("*.arrow"))
    for path in (folder, arrow_file):
        runs = {}
        for name, workers in (("one", 1), ("two", 2)):
            result = Pipeline([DedupStage(action="drop")], workers=workers, batch_rows=64).run(
                [InputSpec(path=path, name="d")], tmp_path / f"{path.name}-{name}")
            assert result.manifest["counts"]["balanced"] and result.rows_in == 500
            runs[name] = _outputs(tmp_path / f"{path.name}-{name}")
        units = [t for t in executor_tasks if isinstance(t, UnitTask) and t.previous is None]  # segment 0
        assert units and all(t.raw is None and isinstance(t.split, HfSplit) for t in units)
        with monkeypatch.context() as patch:
            patch.setattr(splits_module, "hf_layout", lambda *_: None)  # the driver reads the dataset itself
            Pipeline([DedupStage(action="drop")], workers=1, batch_rows=64).run([InputSpec(path=path, name="d")],
                                                                                 tmp_path / f"{path.name}-driver")
        assert runs["one"] == runs["two"] == _outputs(tmp_path / f"{path.name}-driver")
        executor_tasks.clear()


def test_a_dataset_dict_is_left_to_the_reader_and_its_one_line_error(tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets")
    # an empty saved dataset: `datasets` cannot load it, so the reader's one-line error stands
    assert hf_layout(InputSpec(path=_saved_dataset(tmp_path / "empty", 0), name="e"), 10) is None
    folder = tmp_path / "dd"
    datasets.DatasetDict({"train": datasets.Dataset.from_list([{"text": "a"}])}).save_to_disk(str(folder))
    assert hf_layout(InputSpec(path=folder, name="dd"), 10) is None
    with pytest.raises(InputError, match="is a DatasetDict with splits train; name one split"):
        Pipeline([], workers=1).run([InputSpec(path=folder, name="dd")], tmp_path / "o")


def test_a_dataset_saved_again_in_place_is_refused_not_read_stale(tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets")
    folder = _saved_dataset(tmp_path / "ds", 100)
    spec = InputSpec(path=folder, name="d")
    layout = hf_layout(spec, 10)
    assert layout is not None
    units = list(hf_splits(spec, layout, 10, 1 << 20))
    assert len(units[0].read("d")) == 10  # this worker has the dataset open now
    datasets.Dataset.from_list([{"instruction": f"other {i}", "output": "z"} for i in range(100)]) \
        .save_to_disk(str(tmp_path / "tmp-ds"))
    for p in (tmp_path / "tmp-ds").iterdir():  # the same folder, files rewritten in place
        (folder / p.name).write_bytes(p.read_bytes())
    with pytest.raises(InputError, match="changed while it was read"):
        units[1].read("d")
