"""Atomic Arrow shard writing.

Shards are Arrow IPC *stream* files - the format `datasets.Dataset.from_file` and
`datasets.load_dataset("arrow", ...)` read, and which pyarrow opens with
`pa.ipc.open_stream`. Every file is written to a temporary name in the same folder and
renamed into place, so a reader never sees a half-written shard and a killed run never
leaves one behind.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa

from dataguard.io.readers import file_sha256 as sha256_file
from dataguard.io.safe_files import write_atomic

# Record batches inside a shard are cut at this many rows so that shards are laid out
# the same way whatever batch sizes the pipeline used upstream (byte-identical output).
IPC_CHUNK_ROWS = 1000


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Temp file + rename; a link at ``path`` is refused (`dataguard.io.safe_files`)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, data)


def atomic_write_json(path: Path, value: Any) -> None:
    text = json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False, default=str) + "\n"
    atomic_write_bytes(path, text.encode("utf-8"))


def write_table(path: Path, table: pa.Table) -> None:
    """Write one table as an Arrow IPC stream file, atomically."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with pa.OSFile(str(tmp), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
            for batch in table.to_batches(max_chunksize=IPC_CHUNK_ROWS):
                writer.write_batch(batch)
        _fsync_file(tmp)  # durable before it is renamed into place (and before any marker)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read_table(path: Path) -> pa.Table:
    with pa.memory_map(str(path), "r") as source:
        return pa.ipc.open_stream(source).read_all()


def conform(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """Give `table` exactly `schema`'s columns (missing ones become nulls), in order."""
    if table.schema.equals(schema):
        return table
    columns = []
    for field in schema:
        if field.name in table.column_names:
            column = table.column(field.name)
            columns.append(column if column.type == field.type else column.cast(field.type))
        else:
            columns.append(pa.nulls(table.num_rows, field.type))
    return pa.Table.from_arrays(columns, schema=schema)


class ShardWriter:
    """Cut a stream of tables into shards of at most `max_rows` rows / `max_bytes` bytes.

    Row-sized shard boundaries depend only on the rows, never on how they arrived; byte
    sizing estimates bytes per row from each incoming unit, so it depends on `batch_rows`
    (part of the config) but not on the number of workers. Either way a single-process
    and a parallel run give byte-identical shards.
    """

    def __init__(self, folder: Path, prefix: str, schema: pa.Schema,
                 max_rows: int = 100_000, max_bytes: int | None = None,
                 before_write: Callable[[Path], None] | None = None) -> None:
        self.folder = folder
        self.before_write = before_write  # e.g. register the shard as dataguard's before it exists
        self.prefix = prefix
        self.schema = schema
        self.max_rows = max_rows
        self.max_bytes = max_bytes
        self._pending: list[pa.Table] = []
        self._pending_rows = 0
        self._pending_bytes = 0
        self.written: list[dict[str, Any]] = []

    def write(self, table: pa.Table) -> None:
        table = conform(table, self.schema)
        offset = 0
        while offset < table.num_rows:
            room = self.max_rows - self._pending_rows
            piece = table.slice(offset, room)
            if self.max_bytes is not None and piece.num_rows:
                per_row = max(1, piece.nbytes // piece.num_rows)
                room_bytes = self.max_bytes - self._pending_bytes
                fit = max(1, room_bytes // per_row) if self._pending_rows == 0 else room_bytes // per_row
                piece = table.slice(offset, min(piece.num_rows, fit))
            if piece.num_rows:
                self._pending.append(piece)
                self._pending_rows += piece.num_rows
                self._pending_bytes += piece.nbytes
                offset += piece.num_rows
            full = self._pending_rows >= self.max_rows or (
                self.max_bytes is not None and (piece.num_rows == 0 or self._pending_bytes >= self.max_bytes))
            if full:
                self._flush()

    def _flush(self) -> None:
        if not self._pending_rows:
            return
        self._write_shard(pa.concat_tables(self._pending))
        self._pending, self._pending_rows, self._pending_bytes = [], 0, 0

    def _write_shard(self, table: pa.Table) -> None:
        path = self.folder / f"{self.prefix}-{len(self.written):05d}.arrow"
        if self.before_write is not None:
            self.before_write(path)
        write_table(path, table)
        self.written.append({"path": str(path), "rows": table.num_rows, "bytes": path.stat().st_size,
                             "sha256": sha256_file(path)})

    def close(self) -> list[dict[str, Any]]:
        self._flush()
        if not self.written:
            # An empty result is still a valid, typed dataset a user can open.
            self._write_shard(self.schema.empty_table())
        return self.written
