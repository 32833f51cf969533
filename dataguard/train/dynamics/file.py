"""``RUN/dynamics.arrow``: what training learned about each row, one entry per row and pass.

The file is the hand-off from the runner back to the data stages (the ``noise`` stage's
``inputs: dynamics``), so its layout is fixed and checked on read. Arrow IPC *file* format,
one record batch, sorted by (``id``, ``pass``):

=============  ========  ==================================================================
column         type      meaning
=============  ========  ==================================================================
``id``         string    the shards' row id (``source:position``)
``pass``       int32     0-based pass: the training epoch the row was drawn in, or the
                         number of the extra evaluation pass over the training rows
``step``       int64     the optimizer step of the row's last draw in that pass
``loss``       float32   classify: the row's cross-entropy (raw logits, no smoothing or
                         offsets); sft: its mean loss per assistant token (NaN: none scored)
``gold_prob``  float32   softmax probability of the row's label (null for sft)
``margin``     float32   the label's logit minus the largest other logit: the per-pass term
                         of AUM (Pleiss et al. 2020) (null for sft)
``correct``    bool      the largest logit is the label's (null for sft)
``predicted``  string    the label name of the largest logit (null for sft)
``label``      string    the label the row trained under, which ``margin`` and ``gold_prob``
                         score (null for sft; the fake class for threshold rows). A stage
                         judging a row whose label is now another does not use the entry.
=============  ========  ==================================================================

A row drawn more than once in a pass (``repeat`` > 1) gets the mean of its draws for
``loss``, ``gold_prob`` and ``margin`` and the last draw's ``correct`` / ``predicted``.
Schema metadata: ``task`` (``classify`` / ``sft``), ``labels`` (JSON list of label names,
in the model's class order), optionally ``threshold_rows`` (JSON list of the row ids a
``threshold_rows`` run trained under the fake class ``__threshold__``, the labels' last;
their ``margin`` is the fake class's), ``source`` (``train_forward``: the training step's own forward
pass, in train mode, before that step's update; ``eval_pass``: an extra no-grad pass over
the training rows at each evaluation) and ``format`` (``dataguard.dynamics/2``; a ``/1``
file, written before ``label`` existed, reads with a null ``label``: its rows are matched by
id alone).

This module needs only pyarrow (the data stages read it without importing torch).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.ipc as ipc

from dataguard.io.safe_files import LinkRefused, write_atomic
from dataguard.train.tasks import TASK_NAMES

FILE_NAME = "dynamics.arrow"
FORMAT = "dataguard.dynamics/2"
OLD_FORMATS = ("dataguard.dynamics/1",)  # no ``label`` column: read with nulls there
TASKS = TASK_NAMES
SOURCES = ("train_forward", "eval_pass")
SCHEMA = pa.schema([
    ("id", pa.string()), ("pass", pa.int32()), ("step", pa.int64()), ("loss", pa.float32()),
    ("gold_prob", pa.float32()), ("margin", pa.float32()), ("correct", pa.bool_()), ("predicted", pa.string()),
    ("label", pa.string()),
])


class DynamicsFileError(ValueError):
    """A dynamics file (or run folder) that cannot be used; the message names it."""


def metadata(task: str, labels: list[str] | None, source: str,
             threshold_ids: list[str] | None = None) -> dict[bytes, bytes]:
    meta = {b"format": FORMAT.encode(), b"task": task.encode(), b"source": source.encode(),
            b"labels": json.dumps(list(labels or []), ensure_ascii=False).encode()}
    if threshold_ids:
        meta[b"threshold_rows"] = json.dumps(sorted(threshold_ids), ensure_ascii=False).encode()
    return meta


def write_dynamics(path: str | os.PathLike, table: pa.Table, *, task: str, labels: list[str] | None,
                   source: str, threshold_ids: list[str] | None = None) -> Path:
    """Write ``table`` (`SCHEMA` columns, any order of rows; ``label`` may be left out: nulls)
    sorted by (id, pass), atomically."""
    path = Path(path)
    table = _with_label(table)
    table = table.select(SCHEMA.names).cast(SCHEMA)
    if table.num_rows:
        table = table.sort_by([("id", "ascending"), ("pass", "ascending")])
    table = table.replace_schema_metadata(metadata(task, labels, source, threshold_ids))
    sink = pa.BufferOutputStream()
    with ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table, max_chunksize=max(table.num_rows, 1))
    write_atomic(path, sink.getvalue().to_pybytes())
    return path


def dynamics_path(where: str | os.PathLike) -> Path:
    """The dynamics file of a run folder (or the file itself)."""
    p = Path(where)
    return p / FILE_NAME if p.is_dir() else p


def read_dynamics(where: str | os.PathLike) -> tuple[pa.Table, dict[str, Any]]:
    """(table, {task, labels, source}) of a run folder's ``dynamics.arrow``, checked: the
    columns and types of `SCHEMA`, a known task, ids never null. Raises `DynamicsFileError`."""
    path = dynamics_path(where)
    if Path(where).is_dir() and not path.exists():
        raise DynamicsFileError(f"{where}: no {FILE_NAME} in this run folder (train with dynamics: true)")
    if not path.exists():
        raise DynamicsFileError(f"{where}: no such run folder or dynamics file")
    if path.is_symlink():
        raise DynamicsFileError(str(LinkRefused(path)))
    try:
        with pa.memory_map(str(path)) as source:
            table = ipc.open_file(source).read_all()
    except (pa.ArrowInvalid, OSError) as exc:
        raise DynamicsFileError(f"{path}: not a readable Arrow file ({exc})") from None
    meta = {k.decode(): v.decode() for k, v in (table.schema.metadata or {}).items()}
    if meta.get("format") in OLD_FORMATS:
        table = _with_label(table)
    elif meta.get("format") != FORMAT:
        raise DynamicsFileError(f"{path}: not a dataguard dynamics file (format {meta.get('format')!r})")
    for name in SCHEMA.names:
        if name not in table.column_names:
            raise DynamicsFileError(f"{path}: column {name!r} is missing")
        if table.schema.field(name).type != SCHEMA.field(name).type:
            raise DynamicsFileError(f"{path}: column {name!r} is {table.schema.field(name).type}, "
                                    f"expected {SCHEMA.field(name).type}")
    task = meta.get("task")
    if task not in TASKS:
        raise DynamicsFileError(f"{path}: unknown task {task!r} in its metadata")
    if table.column("id").null_count:
        raise DynamicsFileError(f"{path}: {table.column('id').null_count} entries have no row id")
    labels = _string_list(path, meta, "labels")
    threshold = _string_list(path, meta, "threshold_rows")
    return table.select(SCHEMA.names), {"task": task, "labels": labels, "source": meta.get("source", ""),
                                        "threshold_rows": threshold}


def read_metadata(where: str | os.PathLike) -> dict[str, str]:
    """The schema metadata of a run's dynamics file (``format``, ``task``, ...) without its
    rows; raises `DynamicsFileError` when there is no readable file."""
    path = dynamics_path(where)
    if not path.is_file() or path.is_symlink():
        raise DynamicsFileError(f"{where}: no readable {FILE_NAME}")
    try:
        with pa.memory_map(str(path)) as source:
            schema = ipc.open_file(source).schema
    except (pa.ArrowInvalid, OSError) as exc:
        raise DynamicsFileError(f"{path}: not a readable Arrow file ({exc})") from None
    return {k.decode(): v.decode() for k, v in (schema.metadata or {}).items()}


def _with_label(table: pa.Table) -> pa.Table:
    """``table`` with a null ``label`` column where it has none (format 1, or a caller that
    does not know the labels)."""
    if "label" in table.column_names:
        return table
    return table.append_column(pa.field("label", pa.string()), pa.nulls(table.num_rows, pa.string()))


def _string_list(path: Path, meta: dict[str, str], key: str) -> list[str]:
    try:
        value = json.loads(meta.get(key) or "[]")
    except ValueError:
        value = None
    if not isinstance(value, list) or not all(isinstance(x, str) for x in value):
        raise DynamicsFileError(f"{path}: its {key} metadata is not a JSON list of names")
    return value
