"""Reading a run for training: the manifest, the kept rows (sha256 checked), the row weights.

`RunShards.open(folder)` reads ``manifest.json`` (checked against its typed schema,
`dataguard.train.data.manifest_schema`) and the data shards it lists;
`row_weights` / `row_repeat` apply and check THE WEIGHT RULE (see `dataguard.train.data.split`);
`length_cap` finds the length stage's cap and `tokenizer_mismatch` warns when another
tokenizer counted it.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from dataguard.io.readers import file_sha256
from dataguard.io.writer import read_table
from dataguard.train.data.manifest_schema import (
    MANIFEST,
    ShardFacts,
    check_manifest,
    check_shards,
    read_manifest,
    table_labels,
)
from dataguard.train.errors import TrainDataError
from dataguard.train.tasks import get_task

WEIGHT_COLUMNS = ("sample_weight", "drift_weight")
REPEAT_COLUMN = "repeat"


@dataclass
class RunShards:
    """A pipeline's output folder, loaded: its manifest and the kept rows as one table."""

    folder: Path
    manifest: dict[str, Any]
    table: pa.Table

    @property
    def training(self) -> dict[str, Any]:
        """The manifest's ``training`` section (per stage: priors, offsets, curriculum...)."""
        return self.manifest.get("training") or {}

    @property
    def ids(self) -> list[str]:
        return [str(i) for i in self.table.column("id").to_pylist()]

    @property
    def fingerprint(self) -> str:
        """What the run trains on: a hash of the shards' names and sha256 and of what the
        runner reads from the manifest beside them (`shards_fingerprint`). A checkpoint records
        it, so a resume on other data is refused, not mixed. It is byte identity: outputs are
        deterministic, so the same config and inputs give the same value, but a changed score
        column (another dataguard version) counts as other shards too."""
        return shards_fingerprint(self.manifest)

    @classmethod
    def open(cls, folder: str | Path, task: str | None = None) -> RunShards:
        """Load and check a run folder. ``task`` ("sft" / "classify") adds the task's column
        checks (messages with an assistant turn / labels)."""
        folder = Path(folder)
        if not folder.is_dir():
            raise TrainDataError(f"{folder}: no such run folder (run the pipeline first: dataguard run CONFIG)")
        manifest, text = read_manifest(folder)
        path = folder / MANIFEST
        check_manifest(manifest, path, text)  # typed: a bad value is one error naming its key path
        if (manifest.get("counts") or {}).get("balanced") is False:
            raise TrainDataError(f"{path}: the run is unbalanced (rows in != kept + rejected); "
                                 "its outputs are not trustworthy, rerun the pipeline")
        shards = manifest["outputs"]["data"]
        tables = []
        for entry in shards:
            shard = folder / entry["path"]
            if not shard.is_file():
                raise TrainDataError(f"{shard}: data shard listed in the manifest is missing")
            if entry.get("sha256") and file_sha256(shard) != entry["sha256"]:
                raise TrainDataError(f"{shard}: sha256 does not match the manifest (file changed or corrupt)")
            try:
                tables.append(read_table(shard))
            except (OSError, pa.ArrowInvalid) as exc:
                raise TrainDataError(f"{shard}: unreadable Arrow shard: {exc}") from None
        try:
            table = pa.concat_tables(tables, promote_options="default")
        except pa.ArrowInvalid as exc:
            raise TrainDataError(f"{folder}: shards have incompatible schemas: {exc}") from None
        if table.num_rows == 0:
            raise TrainDataError(f"{folder}: the run kept no rows; nothing to train on")
        for column in ("id", "messages"):
            if column not in table.column_names:
                raise TrainDataError(f"{folder}: the shards have no {column!r} column")
        check_shards(manifest, path, ShardFacts([t.num_rows for t in tables], table_labels(tables)), text)
        run = cls(folder=folder, manifest=manifest, table=table)
        row_weights(table)  # the weight rule's checks, at load
        row_repeat(table)
        if task is not None:
            try:
                kind = get_task(task)
            except ValueError as exc:
                raise TrainDataError(str(exc)) from None
            kind.check_table(table, folder)
        return run


def _ids(table: pa.Table) -> list[str]:
    return [str(i) for i in table.column("id").to_pylist()]


def row_weights(table: pa.Table) -> np.ndarray:
    """Base weight per row = sample_weight x drift_weight (null -> 1). See THE WEIGHT RULE."""
    w = np.ones(table.num_rows, dtype=np.float64)
    for name in WEIGHT_COLUMNS:
        if name not in table.column_names:
            continue
        col = np.asarray(table.column(name).cast(pa.float64()).fill_null(1.0).to_numpy(), dtype=np.float64)
        bad = ~np.isfinite(col) | (col < 0)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise TrainDataError(f"row {_ids(table)[i]!r}: {name} = {col[i]} (must be a finite number >= 0; "
                                 f"{int(bad.sum())} such rows)")
        w *= col
    return w


def row_repeat(table: pa.Table) -> np.ndarray:
    """Draws per epoch per row (``repeat``; null -> 1). See THE WEIGHT RULE."""
    if REPEAT_COLUMN not in table.column_names:
        return np.ones(table.num_rows, dtype=np.int64)
    col = np.asarray(table.column(REPEAT_COLUMN).cast(pa.float64()).fill_null(1.0).to_numpy(), dtype=np.float64)
    bad = ~np.isfinite(col) | (col < 0) | (col != np.round(col))
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise TrainDataError(f"row {_ids(table)[i]!r}: repeat = {col[i]} (must be an integer >= 0)")
    return col.astype(np.int64)


def length_cap(manifest: dict[str, Any]) -> tuple[int | None, str | None]:
    """(cap, tokenizer that counted it) of the run's length stage, or (None, None).

    Read from ``training.length`` when the pipeline writes one, else from the length stage's
    description summary (the last length stage wins: it is the cap the rows were cut to)."""
    section = (manifest.get("training") or {}).get("length")
    if isinstance(section, dict) and section.get("cap") is not None:
        return int(section["cap"]), section.get("tokenizer")
    found: tuple[int | None, str | None] = (None, None)
    for stage in manifest.get("stages") or []:
        if stage.get("name") != "length":
            continue
        summary = (stage.get("description") or {}).get("summary") or {}
        if summary.get("cap") is not None:
            found = (int(summary["cap"]), summary.get("tokenizer"))
    return found


def tokenizer_mismatch(counted_by: str | None, tokenizer: Any) -> str | None:
    """A warning when the tokenizer that counted the length cap is not the model's (the cap
    is then only approximate), else None."""
    if not counted_by:
        return None
    name = str(getattr(tokenizer, "name_or_path", "") or "")
    a, b = counted_by.lower().rstrip("/"), name.lower().rstrip("/")
    same = bool(b) and (a == b or Path(a).name == Path(b).name or (not Path(a).exists() and a in b))
    if same:
        return None
    return (f"the length cap was counted with tokenizer {counted_by!r} but the model's tokenizer is "
            f"{name or type(tokenizer).__name__!r}; max_length is approximate (set max_length, or run the "
            "length stage with this model's tokenizer)")


FINGERPRINT_KEY = "data_fingerprint"  # where a checkpoint's state.json ("extra") records it
LEGACY_FINGERPRINT_KEY = "data_sha256"  # checkpoints before it covered the manifest: shards only


def data_changed(state: dict[str, Any], manifest: dict[str, Any]) -> bool | None:
    """Whether the data a checkpoint's ``state.json`` recorded differs from ``manifest``'s
    (None: saved before any was recorded, so nothing can be compared). A checkpoint of the
    shards-only fingerprint is compared by that formula, so an upgrade alone refuses no resume."""
    extra = state.get("extra") or {}
    if extra.get(FINGERPRINT_KEY):
        return bool(extra[FINGERPRINT_KEY] != shards_fingerprint(manifest))
    if extra.get(LEGACY_FINGERPRINT_KEY):
        return bool(extra[LEGACY_FINGERPRINT_KEY] != _shards_only(manifest))
    return None


def _shards_only(manifest: dict[str, Any]) -> str:
    listed = [[str(f.get("path")), str(f.get("sha256"))] for f in (manifest.get("outputs") or {}).get("data") or []]
    return hashlib.sha256(json.dumps(listed).encode()).hexdigest()


def shards_fingerprint(manifest: dict[str, Any]) -> str:
    """`RunShards.fingerprint` of a manifest (also read without opening the rows): the data
    shards (name, sha256) and the manifest's parts the runner trains by, so byte-identical
    shards with other class priors, logit offsets or curriculum (a ``longtail`` stage's
    ``tau`` edited), another length cap or other validation sources are other data too."""
    read_by_runner = {"shards": _shards_only(manifest), "training": manifest.get("training") or {},
                      "length_cap": list(length_cap(manifest)), "validation_sources": validation_sources(manifest)}
    return hashlib.sha256(json.dumps(read_by_runner, sort_keys=True, default=str).encode()).hexdigest()


def validation_sources(manifest: dict[str, Any]) -> list[str]:
    """Input (source) names the pipeline set aside for validation: a ``splits.validation``
    list in any training section, or an overlap stage's ``validation_sources``."""
    names: list[str] = []
    for state in (manifest.get("training") or {}).values():
        splits = state.get("splits") if isinstance(state, dict) else None
        if isinstance(splits, dict) and isinstance(splits.get("validation"), list):
            names += [str(s) for s in splits["validation"]]
    for stage in (manifest.get("config") or {}).get("stages") or []:
        params = stage.get("overlap") if isinstance(stage, dict) else None
        if isinstance(params, dict):
            vs = params.get("validation_sources") or []
            names += [vs] if isinstance(vs, str) else [str(s) for s in vs]
    return sorted(set(names))
