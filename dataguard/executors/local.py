"""Schedule a run's tasks in this process (workers=1) or on one spawn-based process pool.

The pool lives for the whole run (`close` ends it): indexing the inputs, every segment and
writing the shards reuse the same workers instead of paying a spawn and the imports each
time. A new segment's state (the fitted steps) reaches every worker exactly once: one
``_load_state`` call per worker, each holding at a shared barrier until all have one, so
no worker can take two.
"""

from __future__ import annotations

import hashlib
import os
import pickle
from collections.abc import Iterable
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from multiprocessing import get_context
from typing import Any

from dataguard.executors.base import ExecutorError, Progress
from dataguard.executors.process import exit_with_parent
from dataguard.run.segment import SideTask, UnitTask, run_task

__all__ = ["ExecutorError", "LocalExecutor"]

_WORKER_STATE: dict[str, Any] = {}
_BARRIER: Any = None
BARRIER_SECONDS = 600  # a worker that never arrives (it died) breaks the barrier instead of hanging


def _init_worker(barrier: Any) -> None:
    global _BARRIER
    # One worker per core: keep each worker's math libraries single-threaded. Set via the
    # environment (read when torch/BLAS first load) instead of importing torch here,
    # which would cost seconds per worker in pipelines that never use it.
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ.setdefault(var, "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    exit_with_parent()
    _BARRIER = barrier


def _load_state(key: str, state_bytes: bytes) -> None:
    # The state comes from the driver's memory through the pool's pipe, never from disk.
    _WORKER_STATE.clear()  # the previous segment's steps (and any models they loaded) go
    _WORKER_STATE[key] = pickle.loads(state_bytes)
    _BARRIER.wait(BARRIER_SECONDS)


def _run_in_worker(key: str, task: UnitTask | SideTask) -> dict[str, Any]:
    return run_task(_WORKER_STATE[key], task)


class LocalExecutor:
    """Run tasks inline (workers=1) or on a spawn-based process pool.

    Spawn, not fork: stages use torch and Rust tokenizers whose thread pools do not
    survive a fork. At most ``2 * workers`` tasks are in flight, which bounds memory
    however large the input is.
    """

    def __init__(self, workers: int | None = None) -> None:
        self.workers = max(1, workers if workers else (os.cpu_count() or 1))
        self._pool: ProcessPoolExecutor | None = None
        self._state_key: str | None = None

    def run(self, state_bytes: bytes, tasks: Iterable[UnitTask | SideTask],
            progress: Progress) -> list[dict[str, Any]]:
        metas: list[dict[str, Any]] = []
        if self.workers == 1:
            state = pickle.loads(state_bytes)
            for task in tasks:
                metas.append(run_task(state, task))
                progress.tick(metas[-1])
            return metas
        try:
            pool = self._pool_with(state_bytes)
            key = self._state_key
            in_flight: set[Future] = set()
            for task in tasks:
                in_flight.add(pool.submit(_run_in_worker, key, task))
                if len(in_flight) >= 2 * self.workers:
                    done, in_flight = wait(in_flight, return_when=FIRST_COMPLETED)
                    for future in done:
                        metas.append(future.result())
                        progress.tick(metas[-1])
            for future in in_flight:
                metas.append(future.result())
                progress.tick(metas[-1])
        except BrokenProcessPool:
            self.close()
            raise ExecutorError("a worker process died (killed for memory?); finished units are kept - "
                                "run again to resume, perhaps with fewer --workers or smaller batch_rows") from None
        except BaseException:
            self.close()
            raise
        return metas

    def _pool_with(self, state_bytes: bytes) -> ProcessPoolExecutor:
        """The run's pool, every worker holding this state."""
        if self._pool is None:
            context = get_context("spawn")
            self._pool = ProcessPoolExecutor(max_workers=self.workers, mp_context=context,
                                             initializer=_init_worker, initargs=(context.Barrier(self.workers),))
            self._state_key = None
        key = hashlib.sha256(state_bytes).hexdigest()
        if key != self._state_key:
            for future in [self._pool.submit(_load_state, key, state_bytes) for _ in range(self.workers)]:
                future.result()
            self._state_key = key
        return self._pool

    def close(self) -> None:
        """End the pool (the run is over, or failed)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
            self._state_key = None
