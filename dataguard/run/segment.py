"""Plan fused segments, and run one segment's ops on one unit: the only place that knows the ops.

A run is a list of *steps*: step 0 is the source adapter (the normalizer), which turns a
raw input batch into canonical rows; the stages follow. Consecutive row-local work is
fused into one segment that a worker runs on one unit (a batch of input rows) without
touching disk in between. A stage that needs global statistics ends a segment: its
``score`` and ``summarize`` run at the end of one segment, the driver calls ``fit`` on all
summaries, and its ``apply`` opens the next segment.

Consecutive fit stages share one boundary where the earlier one's ``apply`` cannot change
what the later one measures (`can_share`, from the stages' declarations
``Stage.apply_adds`` and ``Stage.columns_read``): ``score A, summarize A, score B,
summarize B | fit A, fit B | apply A, apply B``. The columns A's apply adds are then moved
to where the sequential plan puts them (before B's score columns), so the output is the same.

The ops, in the order a segment lists them:

* ``source`` - the source adapter's ``normalize(raw_batch, options) -> Outcome``;
* ``score`` - ``Stage.score(table)``: adds columns;
* ``summarize`` - ``Stage.summarize(table)``: the unit's fit summary for that step;
* ``apply`` - ``Stage.apply(table) -> Outcome``: kept and rejected rows, batch stats;
* ``mark`` - (shared boundary) before a later member's ``score``: remember the column count;
* ``place`` - (shared boundary) after an earlier member's ``apply``: move the columns it
  added to the position the step's mark remembered (shifted by those placed before).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, cast

import pyarrow as pa

from dataguard.executors.process import one_math_thread
from dataguard.io.raw import RawBatch, SourceOptions
from dataguard.rounds.tasks import UnitFitFiles
from dataguard.run.splits import InputSplit
from dataguard.run.workdir import UnitFiles
from dataguard.stage import Outcome, Stage

SOURCE, SCORE, SUMMARIZE, APPLY = "source", "score", "summarize", "apply"
MARK, PLACE = "mark", "place"
Op = tuple[str, int]  # (op, step index)


class SourceAdapter(Protocol):
    """What step 0 of a run provides: raw input records -> canonical rows and rejects."""

    name: str

    def normalize(self, batch: RawBatch, options: SourceOptions) -> Outcome: ...


@dataclass
class Segment:
    """Fused row-local work; ``ops`` are (op, step index); ``fit_steps`` are fitted after it,
    in order (several where consecutive fit stages share the boundary)."""

    index: int
    ops: list[Op]
    fit_steps: tuple[int, ...] = ()

    @property
    def fit_step(self) -> int | None:
        """The last step fitted after this segment (None: the final segment)."""
        return self.fit_steps[-1] if self.fit_steps else None


def can_share(group: Sequence[Stage], later: Stage) -> bool:
    """Whether fit stage ``later``, directly after the fit stages ``group`` (each directly
    after the one before), may be scored and summarized before their applies run: every
    member's apply keeps every row and only adds declared columns (``apply_adds``), and
    ``later`` neither reads nor writes those columns, nor adds a column a member reads."""
    later_reads = later.columns_read()
    if later_reads is None:
        return False
    later_writes = set(later.output_columns())
    for stage in group:
        adds, reads = stage.apply_adds(), stage.columns_read()
        if adds is None or reads is None:
            return False
        if set(adds) & (set(later_reads) | later_writes) or set(reads) & later_writes:
            return False
    return True


def plan_segments(steps: Sequence[Stage]) -> list[Segment]:
    """Split the steps (source adapter first, then the stages) at each stage that needs a
    fit; a fit stage directly after one joins its boundary where `can_share` allows."""
    segments: list[Segment] = []
    ops: list[Op] = [(SOURCE, 0)]
    group: list[int] = []  # the fit steps of the boundary being built (their applies wait)

    def close() -> None:
        nonlocal ops
        segments.append(Segment(index=len(segments), ops=ops, fit_steps=tuple(group)))
        ops = [(APPLY, group[0])]
        for j in group[1:]:
            ops += [(PLACE, j), (APPLY, j)]
        group.clear()

    for i, stage in enumerate(steps[1:], start=1):
        if group and not (stage.needs_fit and can_share([steps[j] for j in group], stage)):
            close()
        if group:
            ops.append((MARK, i))
        ops.append((SCORE, i))
        if stage.needs_fit:
            ops.append((SUMMARIZE, i))
            group.append(i)
        else:
            ops.append((APPLY, i))
    if group:
        close()
    segments.append(Segment(index=len(segments), ops=ops))
    return segments


def step_key(index: int, steps: Sequence[Stage]) -> str:
    """Key of a step in counts and timings: '00-normalize', '01-dedup', ... (names may repeat)."""
    return f"{index:02d}-{steps[index].name}"


@dataclass
class SegmentWork:
    """What a worker needs to run a segment: every step (fitted so far) and the ops."""

    steps: list[Stage]
    ops: list[Op]


@dataclass
class UnitTask:
    """One unit of one segment, and where this segment's results go. What it reads: when
    the segment starts with ``source``, an input split the worker reads itself (a byte range
    of JSON lines or of a JSON array's items, Parquet row groups, a saved dataset's rows) or a
    raw batch the driver read; else the previous segment's files."""

    unit: int
    source: str
    out: UnitFiles
    raw: RawBatch | None = None
    options: SourceOptions | None = None
    previous: UnitFiles | None = None
    split: InputSplit | None = None
    marks: dict[int, int] | None = None  # the previous segment's marks (shared boundary)


class SideTask(Protocol):
    """Work an executor runs that is not a unit (e.g. `dataguard.run.splits.IndexTask`)."""

    def run(self) -> dict[str, Any]: ...


def run_task(work: SegmentWork | None, task: UnitTask | SideTask) -> dict[str, Any]:
    """What executors call: a unit of the segment ``work``, or a side task on its own."""
    if isinstance(task, UnitTask):
        if work is None:
            raise ValueError("a unit task needs the segment's work")
        return run_unit(work, task)
    return task.run()


def run_unit(work: SegmentWork, task: UnitTask) -> dict[str, Any]:
    """Run the segment's ops on one unit, with one math thread (same floats wherever it
    runs), and write its results; returns the unit's meta as the work folder stores it."""
    with one_math_thread():
        return _UnitRun(work, task).run()


class _UnitRun:
    """The bookkeeping of one unit: per-step counts, stats and seconds, rejected rows."""

    def __init__(self, work: SegmentWork, task: UnitTask) -> None:
        self.steps, self.ops, self.task = work.steps, work.ops, task
        self.counts: dict[str, dict[str, Any]] = {}
        self.stats: dict[int, Any] = {}
        self.seconds: dict[str, float] = {}
        self.rejected: list[pa.Table] = []
        self.formats: dict[str, int] = {}
        self.raw = task.raw
        self.marks: dict[int, int] = {}  # step -> column count before its score (MARK)
        self.placed = 0  # columns PLACE moved so far: later marks shift by these
        self.before_apply: list[str] = []  # the last apply's input: its columns, rows and step
        self.rows_before_apply = self.applied = 0
        self.fit_files: list[Path] = []  # what summarize_unit wrote (stages fitted in rounds)

    def run(self) -> dict[str, Any]:
        task = self.task
        table: pa.Table | None = None
        summaries: dict[int, Any] = {}
        if task.split is not None:  # read here, in the worker: the driver never holds these rows
            start = time.perf_counter()
            self.raw = task.split.read(task.source)
            self.seconds[step_key(0, self.steps)] = time.perf_counter() - start
        if self.raw is not None:
            rows_in = len(self.raw)
        elif task.previous is not None:
            table = task.previous.read_kept()
            rows_in = table.num_rows
        else:
            raise ValueError(f"unit {task.unit} has neither raw input nor a previous segment's rows")
        for op, index in self.ops:
            stage = self.steps[index]
            key = step_key(index, self.steps)
            start = time.perf_counter()
            if op == SOURCE:
                table = self._source(cast(SourceAdapter, stage), index)
            elif op == SCORE:
                table = stage.score(table)
            elif op == SUMMARIZE:
                summaries[index] = self._summarize(stage, index, table)
            elif op == APPLY:
                self.before_apply, self.rows_before_apply, self.applied = table.column_names, table.num_rows, index
                table = self._decide(index, table.num_rows, stage.apply_unit(table, task.unit))
            elif op == MARK:
                self.marks[index] = table.num_columns
            elif op == PLACE:
                table = self._place(index, table)
            else:
                raise ValueError(f"unknown op {op!r}")
            self.seconds[key] = self.seconds.get(key, 0.0) + time.perf_counter() - start
        assert table is not None, "a segment reads either raw input or a previous unit"
        meta = {
            "unit": task.unit, "source": task.source, "rows_in": rows_in, "kept": table.num_rows,
            "rejected": sum(t.num_rows for t in self.rejected), "counts": self.counts, "stats": self.stats,
            "summaries": summaries, "marks": self.marks, "seconds": self.seconds, "formats": self.formats,
        }
        return task.out.write(table, self.rejected, meta, self.fit_files)

    def _summarize(self, stage: Stage, index: int, table: pa.Table) -> Any:
        """The step's summary; a stage fitted in rounds writes its material next to the
        unit's files (listed in the unit's meta, so a resume checks them too)."""
        if not stage.fits_in_rounds():
            return stage.summarize(table)
        files = UnitFitFiles(self.task.out.folder, self.task.unit, index)
        summary = stage.summarize_unit(table, files)
        self.fit_files += sorted(p for p in self.task.out.folder.glob(f"unit-{self.task.unit:06d}.s{index:02d}.*.arrow"))
        return summary

    def _place(self, index: int, table: pa.Table) -> pa.Table:
        """Move the columns the last apply added to where the sequential plan has them:
        before the columns step ``index``'s score added (its mark, shifted by earlier moves).
        Checks what it can of that apply's declaration (`Stage.apply_adds`) on the way."""
        if self.task.marks is None or index not in self.task.marks:
            raise ValueError(f"unit {self.task.unit}: no column mark for step {index} from the previous segment")
        stage = self.steps[self.applied]
        n_before, names = len(self.before_apply), table.column_names
        declared = stage.apply_adds() or frozenset()
        if (table.num_rows != self.rows_before_apply or names[:n_before] != self.before_apply
                or not set(names[n_before:]) <= declared):
            raise RuntimeError(f"stage {stage.name!r} shares a fit boundary, but its apply did not keep every row "
                               f"and only add {sorted(declared)} (added {names[n_before:]}): fix its apply_adds()")
        at = self.task.marks[index] + self.placed
        self.placed += len(names) - n_before
        order = [*range(at), *range(n_before, len(names)), *range(at, n_before)]
        return table if order == list(range(len(names))) else table.select(order)

    def _source(self, adapter: SourceAdapter, index: int) -> pa.Table:
        raw = self.raw
        if raw is None or self.task.options is None:
            raise ValueError(f"step {adapter.name!r} reads raw input, but unit {self.task.unit} has none")
        raw.parse_pending()
        table = self._decide(index, len(raw), adapter.normalize(raw, self.task.options))
        if "format" in table.column_names:  # the template each kept row was read as, per input
            for fmt in table.column("format").to_pylist():
                self.formats[fmt] = self.formats.get(fmt, 0) + 1
        return table

    def _decide(self, index: int, rows_in: int, outcome: Outcome) -> pa.Table:
        """Count a step's decision (rows in = kept + rejected, or the unit fails)."""
        kept, rej = outcome.kept, outcome.rejected
        if rows_in != kept.num_rows + rej.num_rows:
            raise RuntimeError(f"stage {self.steps[index].name!r} lost rows: {rows_in} in, {kept.num_rows} kept, "
                               f"{rej.num_rows} rejected (unit {self.task.unit})")
        reasons: dict[str, int] = {}
        if rej.num_rows:
            for reason in rej.column("reason").to_pylist():
                reasons[reason] = reasons.get(reason, 0) + 1
            self.steps[index].check_reasons(reasons)
            self.rejected.append(rej)
        self.counts[step_key(index, self.steps)] = {"rows_in": rows_in, "rows_kept": kept.num_rows,
                                                    "rows_rejected": rej.num_rows, "reasons": reasons}
        self.stats[index] = outcome.stats
        return kept
