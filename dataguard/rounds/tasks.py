"""Round tasks: their files, their completion markers, and running a round with resume.

Names (under ``OUTPUT/_work``; `dataguard.io.work_names.WORK_FILE` knows them all)::

    segNN/unit-NNNNNN.sSS.KIND.arrow   what step SS's summarize wrote for a unit (checked by its meta)
    fitSS/rR-NNNNN.KIND.arrow          what task NNNNN of round R of step SS wrote
    fitSS/rR-NNNNN.done.json           its completion marker: result + the files' size and sha256
    fitSS/unit-NNNNNN.KIND.arrow       a per-unit answer (keep decisions) read back by ``apply``
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import pyarrow as pa

from dataguard.io import state_codec
from dataguard.io.readers import file_sha256
from dataguard.io.safe_files import write_atomic
from dataguard.io.writer import atomic_write_bytes


@dataclass(frozen=True)
class UnitFitFiles:
    """Where one unit's summarize writes its fit material (next to the unit's own files, so
    the unit's meta checks them on resume like its rows)."""

    folder: Path
    unit: int
    step: int

    def path(self, kind: str) -> Path:
        return self.folder / f"unit-{self.unit:06d}.s{self.step:02d}.{kind}.arrow"


class RoundTask(Protocol):
    """One task of a round: ``run`` writes its files and marker and returns its result."""

    marker: Path

    def run(self) -> dict[str, Any]: ...


def range_bounds(entries: int, per_task: int) -> list[int]:
    """Bucket-value bounds of the round-1 tasks: ``ceil(entries / per_task)`` equal ranges
    of the 64-bit hash space (at least one); depends on the data and config, never on workers."""
    parts = max(1, -(-entries // max(1, per_task)))
    return [(r << 64) // parts for r in range(parts + 1)]


def task_marker(folder: Path, round_no: int, task: int) -> Path:
    return folder / f"r{round_no}-{task:05d}.done.json"


def task_file(folder: Path, round_no: int, task: int, kind: str) -> Path:
    return folder / f"r{round_no}-{task:05d}.{kind}.arrow"


def unit_answer(folder: Path, unit: int, kind: str) -> Path:
    return folder / f"unit-{unit:06d}.{kind}.arrow"


def write_arrow(path: Path, table: pa.Table, written: list[Path] | None = None) -> None:
    """Write ``table`` as one record batch of an Arrow IPC file, atomically (a reader maps it
    and searches or slices its columns without copying them); remember it in ``written``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table.combine_chunks(), max_chunksize=max(1, table.num_rows))
    write_atomic(path, sink.getvalue().to_pybytes())
    if written is not None:
        written.append(path)


def open_arrow(path: Path) -> pa.Table:
    """A table `write_arrow` wrote, memory-mapped: only the pages a task touches are read."""
    with pa.memory_map(str(path), "r") as source:
        return pa.ipc.open_file(source).read_all()


def column(table: pa.Table, name: str) -> np.ndarray:
    """A numeric column as NumPy, without a copy when it is one chunk (what `write_arrow` writes)."""
    col = table.column(name)
    if col.num_chunks == 1:
        return col.chunk(0).to_numpy(zero_copy_only=False)
    return col.to_numpy()


def task_key(task: RoundTask) -> str:
    """What a task is (its type and every field: ranges, inputs, parameters), so a marker
    left by a task planned differently (other ranges) is never taken for this one."""
    return hashlib.sha256(f"{type(task).__name__}{task!r}".encode()).hexdigest()


def finish_task(task: RoundTask, result: dict[str, Any], written: Sequence[Path]) -> dict[str, Any]:
    """Write the task's completion marker (after every file is durable); returns the result
    as a resumed run reads it back, so fresh and resumed runs continue from the same values."""
    marker = task.marker
    facts = {p.name: {"bytes": p.stat().st_size, "sha256": file_sha256(p)} for p in written}
    encoded = state_codec.dumps({"task": task_key(task), "result": result, "files": facts})
    atomic_write_bytes(marker, encoded)
    return {"rows_in": 0, "marker": str(marker), **state_codec.loads(encoded)["result"]}


def load_done(task: RoundTask) -> dict[str, Any] | None:
    """A finished task's result, or None when the task must run (no marker, a marker that
    does not decode or was left by another task, or a file it names missing or changed)."""
    marker = task.marker
    if not marker.is_file():
        return None
    try:
        doc = state_codec.loads(marker.read_bytes())
        if doc["task"] != task_key(task):
            return None
        for name, fact in doc["files"].items():
            path = marker.parent / name
            if Path(name).name != name or not path.is_file() or path.stat().st_size != fact["bytes"] \
                    or file_sha256(path) != fact["sha256"]:
                return None
        return {"rows_in": 0, "marker": str(marker), **doc["result"]}
    except (state_codec.StateFormatError, KeyError, TypeError, AttributeError, OSError):
        return None


ANSWER = "keep"


def write_answers(folder: Path, nodes: np.ndarray, ids: Sequence[str], cluster_no: np.ndarray,
                  kept: np.ndarray, score: np.ndarray, written: list[Path]) -> list[int]:
    """Per unit, the keep decisions of its rows in clusters (``nodes``: sorted row keys
    ``unit << 32 | row``; ``kept``: local index of each node's kept row; ``score``: its
    similarity to it, 1.0 for kept rows); returns the units that got a file."""
    units = (nodes >> np.uint64(32)).astype(np.int64)
    answered = np.unique(units).tolist()
    for unit in answered:
        at = np.flatnonzero(units == unit).tolist()
        write_arrow(unit_answer(folder, unit, ANSWER), pa.table({
            "id": pa.array([ids[i] for i in at], pa.string()),
            "cluster": pa.array(cluster_no[at].astype(np.int64), pa.int64()),
            "of": pa.array([ids[int(kept[i])] if kept[i] != i else None for i in at], pa.string()),
            "score": pa.array(score[at], pa.float64())}), written)
    return answered


def read_answer(folder: Path, unit: int) -> dict[str, tuple[int, str | None, float]]:
    """A unit's keep decisions: id -> (cluster, kept row's id or None, similarity)."""
    table = open_arrow(unit_answer(folder, unit, ANSWER))
    return {i: (c, o, s) for i, c, o, s in zip(table.column("id").to_pylist(), table.column("cluster").to_pylist(),
                                                table.column("of").to_pylist(), table.column("score").to_pylist(),
                                                strict=True)}


@dataclass(frozen=True)
class Answers:
    """Where a fitted-in-rounds clustering stage finds a unit's keep decisions: the fit
    folder and the units that have a file (the others have no row in a cluster)."""

    folder: Path
    units: frozenset[int]

    def for_unit(self, unit: int) -> dict[str, tuple[int, str | None, float]]:
        return read_answer(self.folder, unit) if unit in self.units else {}


def example_index(examples: Sequence[Sequence[Any]]) -> dict[str, int]:
    """Row id -> number of the first (dropped id, kept id, score) example it appears in."""
    out: dict[str, int] = {}
    for e, (i, k, _) in enumerate(examples):
        out.setdefault(i, e)
        out.setdefault(k, e)
    return out


RunTasks = Callable[[Sequence[RoundTask], str], list[dict[str, Any]]]


@dataclass
class RoundContext:
    """What ``Stage.fit_rounds`` gets from the pipeline: its own work folder, each unit's fit
    files (input order) and ``run`` (runs a round's tasks on the executor, skipping those a
    previous run finished; results in task order)."""

    folder: Path
    units: list[UnitFitFiles]
    run: RunTasks
    extra: dict[str, Any] = field(default_factory=dict)


def run_round(tasks: Sequence[RoundTask], submit: Callable[[Iterator[RoundTask]], list[dict[str, Any]]]
              ) -> list[dict[str, Any]]:
    """Results of every task in order: a finished task's from its marker, the others from
    ``submit`` (the executor; any order). Each result names its task (``task``)."""
    results: dict[int, dict[str, Any]] = {}

    def pending() -> Iterator[RoundTask]:
        for i, task in enumerate(tasks):
            done = load_done(task)
            if done is None:
                yield task
            else:
                results[i] = done
    index = {task.marker: i for i, task in enumerate(tasks)}
    for result in submit(pending()):
        results[index[Path(result["marker"])]] = result
    missing = [i for i in range(len(tasks)) if i not in results]
    if missing:
        raise RuntimeError(f"round tasks {missing[:5]} returned no result")
    return [results[i] for i in range(len(tasks))]


