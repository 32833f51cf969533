"""Run a segment's fused work over units, in this process or a pool of processes.

A unit's results are up to three files in the segment folder: the kept rows, the rejected
rows, and a JSON meta file (counts, stats, fit summary, and the size and sha256 of the
two Arrow files). The Arrow files are fsynced before the meta file is renamed into place,
so the meta file is the completion marker: on resume a unit is skipped only if its meta
file decodes and the files it names are there with the recorded size and hash.
Resume state is data (``dataguard.io.state_codec``), never pickle: anyone who can write
to the output folder must not be able to run code in the next run.
"""

from __future__ import annotations

import os
import pickle
import time
from collections.abc import Iterable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import pyarrow as pa

from dataguard.executors.process import exit_with_parent, one_math_thread
from dataguard.io import state_codec
from dataguard.io.raw import RawBatch, SourceOptions
from dataguard.io.readers import file_sha256
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
        return self.out_dir / f"unit-{self.unit:06d}.meta.json"


class ExecutorError(RuntimeError):
    """Units could not run (a worker process died, e.g. killed for memory)."""


def stage_key(index: int, stages: list[Stage]) -> str:
    """Key of a stage in counts and timings: '00-normalize', '01-dedup', ... (names may repeat)."""
    return f"{index + 1:02d}-{stages[index].name}" if index >= 0 else "00-normalize"


def run_unit(state: tuple[Stage, list[Stage], list[tuple[str, int]]], task: UnitTask) -> dict[str, Any]:
    """Run the fused ops of one segment on one unit and write its results atomically.

    Returns the meta exactly as a resumed run would read it back from disk, so a fresh
    run and a resumed one build the manifest from the same values.
    """
    with one_math_thread():
        return _run_unit(state, task)


def _run_unit(state: tuple[Stage, list[Stage], list[tuple[str, int]]], task: UnitTask) -> dict[str, Any]:
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
    files = {}
    kept_path = task.out_dir / f"unit-{task.unit:06d}.arrow"
    write_table(kept_path, table)
    files[kept_path.name] = _file_fact(kept_path)
    rejected_rows = sum(t.num_rows for t in rejected)
    if rejected_rows:
        rejected_path = task.out_dir / f"unit-{task.unit:06d}.rejected.arrow"
        write_table(rejected_path, pa.concat_tables([t.cast(REJECTED_SCHEMA) for t in rejected]))
        files[rejected_path.name] = _file_fact(rejected_path)
    meta = {
        "unit": task.unit, "source": task.source, "rows_in": rows_in, "kept": table.num_rows,
        "rejected": rejected_rows, "counts": counts, "stats": stats, "summary": summary, "seconds": seconds,
        "formats": formats, "files": files,
        "schema": table.schema.serialize().to_pybytes(),
    }
    encoded = state_codec.dumps(meta)
    atomic_write_bytes(task.meta_path, encoded)
    return state_codec.loads(encoded)


def _file_fact(path: Path) -> dict[str, Any]:
    return {"bytes": path.stat().st_size, "sha256": file_sha256(path)}


def load_finished(task: UnitTask) -> dict[str, Any] | None:
    """The meta of a unit a previous run finished, or None if it must be (re)done.

    A meta file that does not decode, or names files that are missing or whose size or
    hash differ (a crash between writes, a disk that lost data, a hand edit), means the
    unit is redone rather than trusted.
    """
    path = task.meta_path
    if not path.is_file():
        return None
    try:
        meta = state_codec.loads(path.read_bytes())
        files = meta["files"]
        for name, fact in files.items():
            unit_file = task.out_dir / name
            if (Path(name).name != name or not unit_file.is_file()
                    or unit_file.stat().st_size != fact["bytes"] or file_sha256(unit_file) != fact["sha256"]):
                return None
        if meta["unit"] != task.unit:
            return None
    except (state_codec.StateFormatError, KeyError, TypeError, AttributeError, OSError):
        return None
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
    exit_with_parent()
    # The state comes from the driver's memory through the pool's pipe, never from disk.
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
        try:
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
        except BrokenProcessPool:
            raise ExecutorError("a worker process died (killed for memory?); finished units are kept - "
                                "run again to resume, perhaps with fewer --workers or smaller batch_rows") from None

    @staticmethod
    def _done(task: UnitTask, metas: list[dict[str, Any]], bar: Any) -> bool:
        meta = load_finished(task)
        if meta is None:
            return False
        metas.append(meta)
        LocalExecutor._tick(bar, meta)
        return True

    def _bar(self, desc: str) -> Any:
        if not self.progress:
            return None
        from tqdm import tqdm

        return tqdm(desc=desc, unit=" rows", dynamic_ncols=True, leave=False)

    @staticmethod
    def _tick(bar: Any, meta: dict[str, Any]) -> None:
        if bar is not None:
            bar.update(meta["rows_in"])
