"""Run a segment's fused work over units, in this process or a pool of processes.

A unit's results are three files in the segment folder: the kept rows, the rejected rows
and a small pickle of counts/stats/summary. The pickle is renamed into place last, so
its presence is the completion marker: on resume, finished units are not redone.
"""

from __future__ import annotations

import os
import pickle
import time
from collections.abc import Iterable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import pyarrow as pa

from dataguard.io.raw import RawBatch, SourceOptions
from dataguard.io.writer import atomic_write_bytes, read_table, write_table
from dataguard.records import REJECTED_SCHEMA
from dataguard.stage import Stage


@dataclass
class UnitTask:
    """One unit of work: a raw input batch (segment 0) or a previous segment's unit file."""

    unit: int
    out_dir: Path
    source: str
    raw: RawBatch | None = None
    options: SourceOptions | None = None
    input_path: Path | None = None

    @property
    def meta_path(self) -> Path:
        return self.out_dir / f"unit-{self.unit:06d}.meta.pkl"


def stage_key(index: int, stages: list[Stage]) -> str:
    """Key of a stage in counts and timings: '00-normalize', '01-dedup', ... (names may repeat)."""
    return f"{index + 1:02d}-{stages[index].name}" if index >= 0 else "00-normalize"


def run_unit(state: tuple[Stage, list[Stage], list[tuple[str, int]]], task: UnitTask) -> dict[str, Any]:
    """Run the fused ops of one segment on one unit and write its results atomically."""
    normalizer, stages, ops = state
    counts: dict[str, dict[str, Any]] = {}
    stats: dict[int, Any] = {}
    seconds: dict[str, float] = {}
    rejected: list[pa.Table] = []
    summary: Any = None
    formats: dict[str, int] = {}

    def record(index: int, rows_in: int, kept: pa.Table, rej: pa.Table) -> None:
        reasons: dict[str, int] = {}
        if rej.num_rows:
            for reason in rej.column("reason").to_pylist():
                reasons[reason] = reasons.get(reason, 0) + 1
        if rows_in != kept.num_rows + rej.num_rows:
            name = "normalize" if index < 0 else stages[index].name
            raise RuntimeError(f"stage {name!r} lost rows: {rows_in} in, {kept.num_rows} kept, "
                               f"{rej.num_rows} rejected (unit {task.unit})")
        counts[stage_key(index, stages)] = {"rows_in": rows_in, "rows_kept": kept.num_rows,
                                             "rows_rejected": rej.num_rows, "reasons": reasons}
        if rej.num_rows:
            rejected.append(rej)

    if task.raw is not None:
        start = time.perf_counter()
        task.raw.parse_pending()
        outcome = normalizer.normalize(task.raw, task.options)
        seconds["00-normalize"] = time.perf_counter() - start
        record(-1, len(task.raw), outcome.kept, outcome.rejected)
        stats[-1] = outcome.stats
        table = outcome.kept
        if "format" in table.column_names:
            for fmt in table.column("format").to_pylist():
                formats[fmt] = formats.get(fmt, 0) + 1
        rows_in = len(task.raw)
    else:
        table = read_table(task.input_path)
        rows_in = table.num_rows

    for op, index in ops:
        stage = stages[index]
        key = stage_key(index, stages)
        start = time.perf_counter()
        if op == "score":
            table = stage.score(table)
        elif op == "summarize":
            summary = stage.summarize(table)
        else:
            n = table.num_rows
            outcome = stage.apply(table)
            record(index, n, outcome.kept, outcome.rejected)
            stats[index] = outcome.stats
            table = outcome.kept
        seconds[key] = seconds.get(key, 0.0) + time.perf_counter() - start

    task.out_dir.mkdir(parents=True, exist_ok=True)
    write_table(task.out_dir / f"unit-{task.unit:06d}.arrow", table)
    rejected_rows = sum(t.num_rows for t in rejected)
    if rejected_rows:
        write_table(task.out_dir / f"unit-{task.unit:06d}.rejected.arrow",
                    pa.concat_tables([t.cast(REJECTED_SCHEMA) for t in rejected]))
    meta = {
        "unit": task.unit, "source": task.source, "rows_in": rows_in, "kept": table.num_rows,
        "rejected": rejected_rows, "counts": counts, "stats": stats, "summary": summary, "seconds": seconds,
        "formats": formats,
        "schema": table.schema.serialize().to_pybytes(),
    }
    atomic_write_bytes(task.meta_path, pickle.dumps(meta))
    return meta


_WORKER_STATE: Any = None


def _init_worker(state_bytes: bytes) -> None:
    global _WORKER_STATE
    # One worker per core: keep each worker's math libraries single-threaded. Set via the
    # environment (read when torch/BLAS first load) instead of importing torch here,
    # which would cost seconds per worker in pipelines that never use it.
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ.setdefault(var, "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    _WORKER_STATE = pickle.loads(state_bytes)


def _run_in_worker(task: UnitTask) -> dict[str, Any]:
    return run_unit(_WORKER_STATE, task)


class LocalExecutor:
    """Process units inline (workers=1) or on a spawn-based process pool.

    Spawn, not fork: stages use torch and Rust tokenizers whose thread pools do not
    survive a fork. At most ``2 * workers`` units are in flight, which bounds memory
    however large the input is.
    """

    def __init__(self, workers: int | None = None, progress: bool = False) -> None:
        self.workers = max(1, workers if workers else (os.cpu_count() or 1))
        self.progress = progress

    def run(self, state_bytes: bytes, tasks: Iterable[UnitTask], desc: str = "") -> list[dict[str, Any]]:
        bar = self._bar(desc)
        metas: list[dict[str, Any]] = []
        try:
            pending = (t for t in tasks if not self._done(t, metas, bar))
            if self.workers == 1:
                state = pickle.loads(state_bytes)
                for task in pending:
                    metas.append(run_unit(state, task))
                    self._tick(bar, metas[-1])
            else:
                self._run_pool(state_bytes, pending, metas, bar)
        finally:
            if bar is not None:
                bar.close()
        return metas

    def _run_pool(self, state_bytes: bytes, pending: Iterator[UnitTask], metas: list[dict[str, Any]],
                  bar: Any) -> None:
        with ProcessPoolExecutor(max_workers=self.workers, mp_context=get_context("spawn"),
                                 initializer=_init_worker, initargs=(state_bytes,)) as pool:
            in_flight: set[Future] = set()
            for task in pending:
                in_flight.add(pool.submit(_run_in_worker, task))
                if len(in_flight) >= 2 * self.workers:
                    done, in_flight = wait(in_flight, return_when=FIRST_COMPLETED)
                    for future in done:
                        metas.append(future.result())
                        self._tick(bar, metas[-1])
            for future in in_flight:
                metas.append(future.result())
                self._tick(bar, metas[-1])

    @staticmethod
    def _done(task: UnitTask, metas: list[dict[str, Any]], bar: Any) -> bool:
        if task.meta_path.exists():
            metas.append(pickle.loads(task.meta_path.read_bytes()))
            LocalExecutor._tick(bar, metas[-1])
            return True
        return False

    def _bar(self, desc: str) -> Any:
        if not self.progress:
            return None
        from tqdm import tqdm

        return tqdm(desc=desc, unit=" rows", dynamic_ncols=True, leave=False)

    @staticmethod
    def _tick(bar: Any, meta: dict[str, Any]) -> None:
        if bar is not None:
            bar.update(meta["rows_in"])
