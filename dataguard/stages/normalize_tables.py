"""Arrow tables of normalization: kept rows of both paths in input order, rejected rows.

The per-record path yields ``Mapped`` rows; the batch path yields ``TwoTurnRows`` groups,
whose messages column is built from flat buffers (the text is copied into Arrow once,
already interleaved). Both become one table in input order.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from dataguard.formats import Mapped, TwoTurnRows
from dataguard.io.raw import RawBatch
from dataguard.records import MESSAGE_TYPE, MESSAGES_TYPE, REJECTED_SCHEMA, has_surrogates, json_dumps

MappedRow = tuple[int, Mapped, str | None]  # (batch index, mapped record, the record's own id)


def messages_array(turns_per_row: Sequence[list[tuple[str, str]]]) -> pa.Array:
    """Build the list<struct<role, content>> column from flat buffers (no per-row dicts)."""
    offsets = [0]
    roles: list[str] = []
    contents: list[str] = []
    for turns in turns_per_row:
        for role, content in turns:
            roles.append(role)
            contents.append(content)
        offsets.append(len(roles))
    values = pa.StructArray.from_arrays(
        [pa.array(roles, pa.string()), pa.array(contents, pa.string())], fields=list(MESSAGE_TYPE)
    )
    return pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), values).cast(MESSAGES_TYPE)


def two_turn_messages(users: list[str], assistants: list[str]) -> pa.Array:
    """The messages column [{user}, {assistant}] per row, built from flat buffers."""
    n = len(users)
    contents: list[str | None] = [None] * (2 * n)
    contents[0::2] = users
    contents[1::2] = assistants
    roles = pa.array(["user", "assistant"], pa.string()).take(pa.array(np.tile(np.array([0, 1]), n)))
    values = pa.StructArray.from_arrays([roles, pa.array(contents, pa.string())], fields=list(MESSAGE_TYPE))
    offsets = pa.array(np.arange(0, 2 * n + 1, 2, dtype=np.int32))
    return pa.ListArray.from_arrays(offsets, values).cast(MESSAGES_TYPE)


def kept_table(batch: RawBatch, mapped_rows: list[MappedRow], groups: list[TwoTurnRows],
               schema: pa.Schema) -> pa.Table:
    """Kept rows of both paths, in input order (raises UnicodeEncodeError when a batch-path
    text holds a lone surrogate: see ``unwritable``)."""
    n = len(mapped_rows)
    if not n and len(groups) == 1:
        return _two_turn_table(batch, groups[0], schema)
    source = batch.source
    slow = pa.Table.from_arrays(
        [
            pa.array([batch.row_id(i) for i, _, _ in mapped_rows], pa.string()),
            pa.array([source] * n, pa.string()),
            messages_array([m.turns for _, m, _ in mapped_rows]),
            pa.array([m.label for _, m, _ in mapped_rows], pa.string()),
            pa.array([(m.meta_json or json_dumps(m.meta)) if m.meta else None for _, m, _ in mapped_rows],
                     pa.string()),
            pa.array([m.fmt for _, m, _ in mapped_rows], pa.string()),
        ],
        schema=schema,
    )
    if not groups:
        return slow
    index = [i for i, _, _ in mapped_rows] + [i for g in groups for i in g.index]
    order = sorted(range(len(index)), key=index.__getitem__)
    tables = [slow] + [_two_turn_table(batch, g, schema) for g in groups]
    return pa.concat_tables(tables).take(order).combine_chunks()


def _two_turn_table(batch: RawBatch, rows: TwoTurnRows, schema: pa.Schema) -> pa.Table:
    source = batch.source
    k = len(rows.index)
    positions = pa.array(batch.positions if k == len(batch.positions) else
                         [batch.positions[i] for i in rows.index], pa.int64())
    return pa.Table.from_arrays(
        [
            pc.binary_join_element_wise(pa.scalar(f"{source}:"), positions.cast(pa.string()), ""),
            pa.repeat(source, k),
            two_turn_messages(rows.user, rows.assistant),
            pa.nulls(k, pa.string()),
            pa.nulls(k, pa.string()),
            pa.repeat(rows.fmt, k),
        ],
        schema=schema,
    )


def unwritable(rows: TwoTurnRows) -> list[int]:
    """Batch indices of rows whose text holds a lone surrogate (no UTF-8 writer accepts it).
    Called only after Arrow refused the batch, so it may look row by row."""
    return [i for i, u, a in zip(rows.index, rows.user, rows.assistant, strict=True)
            if has_surrogates(u) or has_surrogates(a)]


def rejected_table(source: str, stage: str, rejects: list[dict[str, Any]]) -> pa.Table:
    """Rejected rows (dicts with id, reason, detail, record) of one batch."""
    if not rejects:
        return REJECTED_SCHEMA.empty_table()
    return pa.Table.from_arrays(
        [
            pa.array([r["id"] for r in rejects], pa.string()),
            pa.array([source] * len(rejects), pa.string()),
            pa.array([stage] * len(rejects), pa.string()),
            pa.array([r["reason"] for r in rejects], pa.string()),
            pa.array([r["detail"] for r in rejects], pa.string()),
            pa.array([r["record"] for r in rejects], pa.string()),
        ],
        schema=REJECTED_SCHEMA,
    )
