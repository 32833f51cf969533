"""A segment's units: which ones it runs, and which a previous run already finished.

Kept apart from `dataguard.pipeline.Pipeline` so the pipeline only orders segments and fits;
the resume bookkeeping lives here. Segment 0 reads the inputs (a JSON-lines unit is a byte
range its worker reads, other inputs are read in the driver, lazily, one raw batch per
unit); a later segment reads the previous segment's units. A unit whose results are in the
work folder is not run again: its meta is taken from there, so a killed run resumes.
"""

from __future__ import annotations

import pickle
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from dataguard.executors.base import Executor, Progress
from dataguard.io.readers import RawBatch
from dataguard.run.segment import SegmentWork, SideTask, UnitTask
from dataguard.run.splits import InputPlan
from dataguard.run.workdir import WorkDir


def unit_tasks(plan: InputPlan, work: WorkDir, segment: int,
               previous: Sequence[dict[str, Any]]) -> Iterator[UnitTask]:
    """The units of segment ``segment``; ``previous``: the metas of the segment before it."""
    if segment > 0:
        for meta in previous:
            yield UnitTask(unit=meta["unit"], source=meta["source"], out=work.unit(segment, meta["unit"]),
                           previous=work.unit(segment - 1, meta["unit"]), marks=meta["marks"])
        return
    options = {}
    for unit, (spec, what) in enumerate(plan.units()):
        opts = options.setdefault(spec.name, spec.options())
        if isinstance(what, RawBatch):
            yield UnitTask(unit=unit, source=opts.name, out=work.unit(0, unit), raw=what, options=opts)
        else:
            yield UnitTask(unit=unit, source=opts.name, out=work.unit(0, unit), split=what, options=opts)


def run_units(executor: Executor, segment_work: SegmentWork, tasks: Iterable[UnitTask], desc: str,
              show: bool) -> list[dict[str, Any]]:
    """The metas of all ``tasks``: finished ones from the work folder, the rest run on ``executor``."""
    progress = Progress(desc, show)
    finished: list[dict[str, Any]] = []

    def pending() -> Iterator[UnitTask]:
        for task in tasks:
            meta = task.out.load_finished()
            if meta is None:
                yield task
            else:
                finished.append(meta)
                progress.tick(meta)

    try:
        ran = executor.run(pickle.dumps(segment_work), pending(), progress)
    finally:
        progress.close()
    return finished + ran


def run_side_tasks(executor: Executor, tasks: Iterable[SideTask], desc: str, show: bool) -> list[dict[str, Any]]:
    """Index input ranges or write shards on the executor's workers (results in any order)."""
    progress = Progress(desc, show)
    try:
        return executor.run(pickle.dumps(None), tasks, progress)
    finally:
        progress.close()
