"""Schedule a segment's units as Ray tasks, for datasets that outgrow one machine.

Each task runs `dataguard.run.segment.run_task` on one unit and writes its files under the
run's ``_work`` folder (or indexes a range of an input, or writes a final shard), so the
inputs and the output folder must be on storage every Ray node can reach (NFS, a mounted
bucket): workers read JSON-lines inputs themselves. Results, resume markers and output
bytes are the same as with the local executor; only *where* units run changes.
"""

from __future__ import annotations

import hashlib
import os
import pickle
from collections.abc import Iterable
from typing import Any

from dataguard.executors.base import Progress
from dataguard.run.segment import SideTask, UnitTask, run_task

_STATE_CACHE: dict[str, Any] = {}


def _run_remote(state_key: str, state_bytes: bytes, task: UnitTask | SideTask) -> dict[str, Any]:
    # Unpickle the stages once per worker process, not once per unit: fitted stages can
    # carry large state (an n-gram index, a classifier).
    state = _STATE_CACHE.get(state_key)
    if state is None:
        _STATE_CACHE.clear()
        state = _STATE_CACHE[state_key] = pickle.loads(state_bytes)
    return run_task(state, task)


class RayExecutor:
    """Ray-backed executor with at most ``max_in_flight`` units scheduled at once."""

    def __init__(self, address: str | None = None, num_cpus: int | None = None,
                 max_in_flight: int | None = None) -> None:
        self.address = address
        self.num_cpus = num_cpus
        self._max_in_flight = max_in_flight
        self.workers = num_cpus or 0

    def close(self) -> None:
        """Nothing to release: the Ray cluster outlives the run (ray.shutdown() is the caller's)."""

    def _ensure_ray(self) -> Any:
        import ray

        if not ray.is_initialized():
            os.environ.setdefault("RAY_TMPDIR", os.path.join(os.path.expanduser("~"), ".cache", "dataguard-ray"))
            os.makedirs(os.environ["RAY_TMPDIR"], exist_ok=True)
            ray.init(address=self.address, num_cpus=self.num_cpus if self.address is None else None,
                     include_dashboard=False, log_to_driver=False, ignore_reinit_error=True,
                     _temp_dir=os.environ["RAY_TMPDIR"])
        self.workers = int(ray.cluster_resources().get("CPU", 1))
        return ray

    def run(self, state_bytes: bytes, tasks: Iterable[UnitTask | SideTask],
            progress: Progress) -> list[dict[str, Any]]:
        ray = self._ensure_ray()
        remote = ray.remote(num_cpus=1)(_run_remote)
        state_key = hashlib.sha256(state_bytes).hexdigest()
        state_ref = ray.put(state_bytes)
        limit = self._max_in_flight or 2 * self.workers
        metas: list[dict[str, Any]] = []
        in_flight: list[Any] = []
        for task in tasks:
            in_flight.append(remote.remote(state_key, state_ref, task))
            if len(in_flight) >= limit:
                done, in_flight = ray.wait(in_flight, num_returns=1)
                for meta in ray.get(done):
                    metas.append(meta)
                    progress.tick(meta)
        for meta in ray.get(in_flight):
            metas.append(meta)
            progress.tick(meta)
        return metas
