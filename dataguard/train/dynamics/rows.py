"""Rows a training run named: the ones its guard quarantined, and their stage scores from the shards.

When the guard calls a step anomalous, the step's micro-batches are known, so their row ids
go into ``events.jsonl`` (`dataguard.train.stability.respond`). This module turns such ids back into
data: `RowScores` looks each row up in the pipeline's kept shards and returns the score
columns the stages wrote beside it (``consistency_score``, ``label_quality``,
``n_tokens``, ...), so an event says *which* rows and *what the data side thought of them*;
`quarantined` lists the rows a run's anomaly and stop events named, which
``dataguard run CONFIG --exclude RUN`` drops with reason ``training_anomaly``.

Plain pyarrow and JSON: the data stages import this without torch, and the runner imports
nothing from the stages.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from dataguard.train.report.jsonl_log import read_records

# Canonical record columns and bookkeeping columns: not scores.
NOT_SCORES = frozenset({"id", "source", "messages", "label", "meta", "format", "repeat", "content_hash",
                        "duplicate_of", "near_dup_of", "semantic_dup_of", "overlap_ref_set", "overlap_ref_item",
                        "message_tokens", "original_label"})
QUARANTINE_KINDS = ("anomaly", "stop")
MAX_SCORES = 24  # score columns kept per row (the first, in shard order)


def read_events(run_dir: str | Path) -> list[dict[str, Any]]:
    """``events.jsonl`` of a run folder (a torn or foreign line is skipped, not fatal)."""
    path = Path(run_dir) / "events.jsonl"
    if not path.is_file() or path.is_symlink():
        return []
    return read_records(path)


def quarantined(run_dir: str | Path) -> dict[str, dict[str, Any]]:
    """Row id -> {step, cause} for every row an anomaly or stop event of the run named (first
    naming wins), in the order the events name them."""
    out: dict[str, dict[str, Any]] = {}
    for event in read_events(run_dir):
        if event.get("kind") not in QUARANTINE_KINDS or not isinstance(event.get("rows"), list):
            continue
        for row in event["rows"]:
            out.setdefault(str(row), {"step": event.get("step"), "cause": str(event.get("cause") or "")})
    return out


def _plain(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, float):
        return round(value, 6)
    return value


def score_columns(schema: pa.Schema) -> list[str]:
    """The stage score columns of a shard schema: scalar numbers, booleans and short strings
    that are not record or bookkeeping columns."""
    keep = []
    for field in schema:
        t = field.type
        scalar = pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t) or pa.types.is_string(t)
        if scalar and field.name not in NOT_SCORES and not field.name.endswith("_embedding"):
            keep.append(field.name)
    return keep[:MAX_SCORES]


class RowScores:
    """Stage scores of rows by id, read from a pipeline output's kept shards on first use
    (only the id and score columns; nothing is read when no anomaly names a row)."""

    def __init__(self, data_dir: str | Path) -> None:
        self.data_dir = Path(data_dir)
        self._table: pa.Table | None = None
        self.error: str | None = None

    def _load(self) -> pa.Table | None:
        if self._table is not None or self.error is not None:
            return self._table
        try:
            manifest = json.loads((self.data_dir / "manifest.json").read_text(encoding="utf-8"))
            from dataguard.io.writer import read_table

            tables = [read_table(self.data_dir / e["path"]) for e in manifest["outputs"]["data"]]
            table = pa.concat_tables(tables, promote_options="default")
            self._table = table.select(["id", *score_columns(table.schema)])
        except (OSError, ValueError, KeyError, TypeError, pa.ArrowInvalid) as exc:
            self.error = f"{self.data_dir}: stage scores not readable ({exc})"
        return self._table

    def lookup(self, ids: list[str]) -> dict[str, dict[str, Any]]:
        """{id: {column: value}} for the ids found in the shards (missing ids are left out)."""
        table = self._load()
        if table is None or not ids:
            return {}
        wanted = pa.array(list(dict.fromkeys(ids)), pa.string())
        picked = table.filter(pc.is_in(table.column("id"), value_set=wanted))
        out: dict[str, dict[str, Any]] = {}
        for row in picked.to_pylist():
            rid = str(row.pop("id"))
            out[rid] = {k: _plain(v) for k, v in row.items() if v is not None}
        return {i: out[i] for i in dict.fromkeys(ids) if i in out}
