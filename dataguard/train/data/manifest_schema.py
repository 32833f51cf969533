"""The part of a pipeline's ``manifest.json`` that the runner reads, as a typed schema.

Why: the runner trusts the manifest for the model's classes and their order, the logit
offsets, the curriculum and the shard list. A hand-edited or foreign manifest used to fail
deep inside training (``float('soon')``, an IndexError on a short multiplier row) or, worse,
be accepted: classes written as ints made a model with twice the classes, a NaN offset
silently turned the loss into plain cross-entropy. Every such value is checked here before
training, and a problem is one `ManifestError` naming the file, its line when it can be
found, and the key path::

    out/run/manifest.json:57: training.longtail.curriculum.boundaries: must be increasing
    fractions in (0, 1], got 'soon'

`check_manifest` checks the values against `SCHEMA` and the per-class lists against
``classes``; `check_shards` checks what only the shards can tell (row counts, every label
listed); `preflight` does both for a run folder without hashing it (`dataguard.train.config`
calls it at load time, so the CLI refuses a bad manifest like a bad config: exit 2). Keys the
runner does not read are left alone, so newer pipelines can add to the manifest.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from dataguard.train.data.typed_json import (
    Choice,
    Fields,
    Flag,
    Fractions,
    Int,
    ListOf,
    ManifestError,  # noqa: F401 - raised by the nodes; callers catch it from here
    MapOf,
    Names,
    Node,
    Num,
    Optional,
    Sha256,
    ShardPath,
    Text,
    _short,
    _Where,
)
from dataguard.train.errors import TrainDataError

MANIFEST = "manifest.json"
LABEL_COLUMN = "label"  # the column the runner's label map reads


# ------------------------------------------------------------------ the schema
CURRICULUM = Fields({
    "boundaries": Fractions(),
    "unit": Choice(("steps", "epochs")),
    "phase_multipliers": ListOf(ListOf(Num(0.0))),
    "class_phase": ListOf(Int(1)),
})
# Per-class lists of a class state (the longtail stage's), each one value per class.
PER_CLASS: dict[str, Node] = {
    "counts": Num(0.0),
    "priors": Num(0.0, 1.0),
    "logit_offsets": Optional(Num()),  # null: a class with prior 0 (log 0); never NaN or inf
    "class_weights": Num(0.0),
}
STATE = Fields({
    "label_column": Text("a column name"),
    "classes": ListOf(Text("a class name (a string)")),
    **{key: ListOf(node) for key, node in PER_CLASS.items()},
    "curriculum": Optional(CURRICULUM),
    "cap": Optional(Int(1)),
    "tokenizer": Optional(Text("a tokenizer name")),
    "splits": Fields({"validation": ListOf(Text("an input name"))}),
})
LENGTH_SUMMARY = Fields({"cap": Optional(Int(1)), "tokenizer": Optional(Text("a tokenizer name"))})
SCHEMA = Fields({
    "outputs": Fields({
        "data": ListOf(Fields({"path": ShardPath(), "sha256": Optional(Sha256()), "rows": Int(0), "bytes": Int(0)},
                              required=("path",)), min_len=1),
    }, required=("data",)),
    "counts": Optional(Fields({"balanced": Flag(), "rows_kept": Int(0)})),
    "training": Optional(MapOf(Optional(STATE))),
    "stages": Optional(ListOf(Fields({"name": Text("a stage name"),
                                      "description": Optional(Fields({"summary": Optional(Fields({}))}))}))),
    "config": Optional(Fields({"stages": Optional(ListOf(Optional(Fields({"overlap": Optional(Fields({
        "validation_sources": Optional(Names())}))}))))})),
}, required=("outputs",))


# ------------------------------------------------------------------ checks
def class_state(manifest: dict[str, Any]) -> tuple[str, dict[str, Any]] | None:
    """(name, state) of the training section that lists ``classes`` (the longtail stage's),
    the one `dataguard.train.data.labels` orders the label map by."""
    for name, state in (manifest.get("training") or {}).items():
        if isinstance(state, dict) and isinstance(state.get("classes"), list):
            return str(name), state
    return None


def check_manifest(manifest: Any, path: Path | str, text: str | None = None) -> None:
    """Raise `ManifestError` for the first value the runner cannot use. ``text`` (the file
    as read) lets the message give the value's line."""
    where = _Where(path, text)
    SCHEMA.check(manifest, (), where)
    for i, stage in enumerate(manifest.get("stages") or []):
        summary = (stage.get("description") or {}).get("summary")
        if stage.get("name") == "length" and summary is not None:  # `length_cap` reads it
            LENGTH_SUMMARY.check(summary, ("stages", i, "description", "summary"), where)
    found = class_state(manifest)
    if found is not None:
        _check_class_state(*found, where)


def _check_class_state(name: str, state: dict[str, Any], where: _Where) -> None:
    """The per-class lists line up with ``classes``: one value per class, one multiplier
    per class in every phase, one boundary between phases."""
    here = ("training", name)
    classes = state["classes"]
    seen: dict[str, int] = {}
    for i, c in enumerate(classes):
        if c in seen:
            raise where.error(here + ("classes", i), f"{c!r} is listed twice (also at [{seen[c]}])")
        seen[c] = i
    n = len(classes)
    per_class = [key for key in PER_CLASS if key in state]
    curriculum = state.get("curriculum") or {}
    for key in per_class:
        if len(state[key]) != n:
            raise where.error(here + (key,), f"must hold one value per class ({n} in training.{name}.classes), "
                                             f"got {len(state[key])}")
    if "class_phase" in curriculum and len(curriculum["class_phase"]) != n:
        raise where.error(here + ("curriculum", "class_phase"),
                          f"must hold one phase per class ({n}), got {len(curriculum['class_phase'])}")
    rows = curriculum.get("phase_multipliers")
    if rows:
        for k, row in enumerate(rows):
            if len(row) != n:
                raise where.error(here + ("curriculum", "phase_multipliers", k),
                                  f"must hold one multiplier per class ({n}), got {len(row)}")
        bounds = curriculum.get("boundaries")
        if bounds is None or len(bounds) != len(rows) - 1:
            raise where.error(here + ("curriculum", "boundaries"),
                              f"{len(rows)} phases need {len(rows) - 1} boundaries, got {_short(bounds)}")


@dataclass
class ShardFacts:
    """What the shards say, to hold the manifest to: rows per listed shard, and the labels."""

    rows: list[int | None] = field(default_factory=list)  # None: shard not readable here
    labels: set[str] | None = None


def check_shards(manifest: dict[str, Any], path: Path | str, facts: ShardFacts, text: str | None = None) -> None:
    """The manifest's row counts match the shards, and its ``classes`` list every label the
    shards hold (a label it does not list would get no offset, no curriculum phase and a
    class id after the listed ones)."""
    where = _Where(path, text)
    entries = manifest["outputs"]["data"]
    for i, (entry, rows) in enumerate(zip(entries, facts.rows, strict=True)):
        if rows is not None and "rows" in entry and entry["rows"] != rows:
            raise where.error(("outputs", "data", i, "rows"),
                              f"says {entry['rows']} rows but the shard {entry['path']} holds {rows}")
    kept = (manifest.get("counts") or {}).get("rows_kept")
    counted = [r for r in facts.rows if r is not None]
    if kept is not None and len(counted) == len(facts.rows) and kept != sum(counted):
        raise where.error(("counts", "rows_kept"), f"says {kept} rows but the shards hold {sum(counted)}")
    found = class_state(manifest)
    if found is None or facts.labels is None or found[1].get("label_column", LABEL_COLUMN) != LABEL_COLUMN:
        return
    name, state = found
    missing = sorted(facts.labels - set(state["classes"]))
    if missing:
        shown = ", ".join(repr(m) for m in missing[:5]) + (", ..." if len(missing) > 5 else "")
        raise where.error(("training", name, "classes"),
                          f"does not list {len(missing)} label{'s' if len(missing) > 1 else ''} of the shards "
                          f"({shown}); the manifest is not this run's, or was edited (rerun the pipeline)")


def table_labels(tables: Iterable[pa.Table]) -> set[str] | None:
    """The distinct non-null labels of the tables (None when none has a label column)."""
    labels: set[str] | None = None
    for table in tables:
        if LABEL_COLUMN in table.column_names:
            labels = (labels or set()) | {str(x) for x in table.column(LABEL_COLUMN).drop_null().unique().to_pylist()}
    return labels


def read_manifest(folder: Path) -> tuple[dict[str, Any], str]:
    """(manifest, its text) of a run folder; `TrainDataError` when absent or not JSON."""
    path = folder / MANIFEST
    if not path.is_file():
        raise TrainDataError(f"{folder}: no {MANIFEST}; not a finished pipeline run (an interrupted run writes none)")
    try:
        text = path.read_text(encoding="utf-8")
        manifest = json.loads(text)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise TrainDataError(f"{path}: unreadable manifest: {exc}") from None
    except RecursionError:  # nested deeper than any manifest: a hostile or broken file
        raise TrainDataError(f"{path}: unreadable manifest: nested too deeply") from None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("outputs"), dict):
        raise TrainDataError(f"{path}: not a dataguard manifest (no outputs section)")
    return manifest, text


def preflight(folder: str | Path) -> None:
    """Check a run folder's manifest, before anything is trained, without hashing its
    shards: the schema, the row counts, the labels. A folder without a manifest is left to
    `RunShards.open` (it says what is missing). Shards are memory-mapped, not copied."""
    from dataguard.io.writer import read_table

    folder = Path(folder)
    if not (folder / MANIFEST).is_file():
        return
    manifest, text = read_manifest(folder)
    path = folder / MANIFEST
    check_manifest(manifest, path, text)
    facts = ShardFacts()
    labels = []
    for entry in manifest["outputs"]["data"]:
        try:
            table = read_table(folder / entry["path"])
        except (OSError, pa.ArrowInvalid):
            facts.rows.append(None)  # missing or unreadable: RunShards.open says so
            continue
        facts.rows.append(table.num_rows)
        labels.append(table.select([c for c in table.column_names if c == LABEL_COLUMN]))
    facts.labels = table_labels(labels) if class_state(manifest) is not None else None
    check_shards(manifest, path, facts, text)
