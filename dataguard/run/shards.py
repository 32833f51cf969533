"""Cut the finished units into the final ``data/`` and ``rejected/`` shards, in unit order.

With row-sized shards (no ``shard_bytes``) every shard's rows are known from the units'
counts alone, so the driver only plans: each shard is a `ShardTask` (which slices of which
unit files, in order) that a worker writes, with the bytes the driver's `ShardWriter` would
write. Byte-sized shards need each piece's size, so the driver cuts those itself.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import pyarrow as pa

from dataguard.io.output import OutputFolder
from dataguard.io.readers import file_sha256
from dataguard.io.writer import ShardWriter, conform, read_table, write_table
from dataguard.records import CANONICAL_SCHEMA, REJECTED_SCHEMA
from dataguard.run.manifest import ShardEntry
from dataguard.run.workdir import WorkDir


@dataclass
class Shards:
    """What was written: the shard entries (paths relative to the output) and the kept schema."""

    data: list[ShardEntry]
    rejected: list[ShardEntry]
    schema: pa.Schema


@dataclass(frozen=True)
class ShardTask:
    """One final shard, written by a worker: (unit file, first row, rows) pieces in order."""

    path: str
    pieces: tuple[tuple[str, int, int], ...]
    schema: bytes

    def run(self) -> dict[str, Any]:
        schema = pa.ipc.read_schema(pa.py_buffer(self.schema))
        tables = [conform(read_table(Path(unit)).slice(offset, rows), schema) for unit, offset, rows in self.pieces]
        table = pa.concat_tables(tables) if tables else schema.empty_table()
        path = Path(self.path)
        write_table(path, table)
        return {"rows_in": 0, "key": self.path, "entry": {"path": self.path, "rows": table.num_rows,
                                                          "bytes": path.stat().st_size, "sha256": file_sha256(path)}}


def plan_shards(folder: Path, prefix: str, units: Sequence[tuple[Path, int]], schema: pa.Schema,
                shard_rows: int) -> list[ShardTask]:
    """Shards of ``shard_rows`` rows over the units' rows in order (one empty shard if none):
    the cuts `ShardWriter` makes without ``max_bytes``."""
    schema_bytes = schema.serialize().to_pybytes()
    shards: list[ShardTask] = []
    pieces: list[tuple[str, int, int]] = []
    filled = 0
    for unit, rows in units:
        offset = 0
        while offset < rows:
            take = min(rows - offset, shard_rows - filled)
            pieces.append((str(unit), offset, take))
            offset += take
            filled += take
            if filled >= shard_rows:
                shards.append(ShardTask(str(folder / f"{prefix}-{len(shards):05d}.arrow"), tuple(pieces),
                                        schema_bytes))
                pieces, filled = [], 0
    if pieces or not shards:
        shards.append(ShardTask(str(folder / f"{prefix}-{len(shards):05d}.arrow"), tuple(pieces), schema_bytes))
    return shards


def write_shards(output: Path, folder: OutputFolder, work: WorkDir, metas_by_segment: Sequence[Sequence[dict]],
                 shard_rows: int, shard_bytes: int | None,
                 run_tasks: Callable[[list[ShardTask]], list[dict[str, Any]]] | None = None) -> Shards:
    """Kept rows: the last segment's units. Rejected rows: every segment's, segment by
    segment. Every shard is registered in the folder's marker before it is written, and
    shards an earlier attempt left beyond the new ones are removed. With ``run_tasks``
    (and row-sized shards) workers write the shards."""
    last = len(metas_by_segment) - 1
    schema = output_schema([m["schema"] for m in metas_by_segment[last]])
    if run_tasks is not None and shard_bytes is None:
        data_files, rejected_files = _shards_by_workers(output, folder, work, metas_by_segment, schema, shard_rows,
                                                        run_tasks)
        return _finish(output, folder, data_files, rejected_files, schema)

    def register(path: Path) -> None:
        folder.own(path.relative_to(output))

    data_writer = ShardWriter(output / "data", "data", schema, shard_rows, shard_bytes, before_write=register)
    for meta in metas_by_segment[last]:
        data_writer.write(work.unit(last, meta["unit"]).read_kept())
    data_files = data_writer.close()

    rejected_writer = ShardWriter(output / "rejected", "rejected", REJECTED_SCHEMA, shard_rows, shard_bytes,
                                  before_write=register)
    for segment, metas in enumerate(metas_by_segment):
        for meta in metas:
            if meta["rejected"]:
                rejected_writer.write(work.unit(segment, meta["unit"]).read_rejected())
    rejected_files = rejected_writer.close()
    return _finish(output, folder, data_files, rejected_files, schema)


def _shards_by_workers(output: Path, folder: OutputFolder, work: WorkDir, metas_by_segment: Sequence[Sequence[dict]],
                       schema: pa.Schema, shard_rows: int,
                       run_tasks: Callable[[list[ShardTask]], list[dict[str, Any]]]) -> tuple[list, list]:
    last = len(metas_by_segment) - 1
    data = plan_shards(output / "data", "data", [(work.unit(last, m["unit"]).kept, m["kept"])
                                                 for m in metas_by_segment[last]], schema, shard_rows)
    rejected = plan_shards(output / "rejected", "rejected",
                           [(work.unit(segment, m["unit"]).rejected, m["rejected"])
                            for segment, metas in enumerate(metas_by_segment) for m in metas if m["rejected"]],
                           REJECTED_SCHEMA, shard_rows)
    folder.own(*(Path(task.path).relative_to(output) for task in data + rejected))
    for sub in ("data", "rejected"):
        (output / sub).mkdir(parents=True, exist_ok=True)
    tasks = data + rejected
    # one shard is written here: starting workers for it would cost more than it saves
    results = [task.run() for task in tasks] if len(tasks) <= 2 else run_tasks(tasks)
    entries = {result["key"]: result["entry"] for result in results}
    return [entries[task.path] for task in data], [entries[task.path] for task in rejected]


def _finish(output: Path, folder: OutputFolder, data_files: list, rejected_files: list, schema: pa.Schema) -> Shards:
    for entry in data_files + rejected_files:
        entry["path"] = Path(entry["path"]).relative_to(output).as_posix()
    folder.remove_stale(("data", "rejected"), {e["path"] for e in data_files + rejected_files})
    return Shards(data=cast(list[ShardEntry], data_files), rejected=cast(list[ShardEntry], rejected_files),
                  schema=schema)


def output_schema(schemas: list[bytes]) -> pa.Schema:
    """One schema for all kept shards: canonical columns first, then score columns."""
    fields: dict[str, pa.Field] = {f.name: f for f in CANONICAL_SCHEMA}
    for raw in dict.fromkeys(schemas):  # units mostly share one schema: parse each distinct one once
        schema = pa.ipc.read_schema(pa.py_buffer(raw))
        for f in schema:
            if f.name not in fields or pa.types.is_null(fields[f.name].type):
                fields[f.name] = f
    return pa.schema(list(fields.values()))
