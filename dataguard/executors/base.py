"""What every executor shares: the progress bar and the one error a scheduler raises.

An executor only schedules: it gets the pickled `dataguard.run.segment.SegmentWork` and
the units still to do, runs `dataguard.run.segment.run_task` on each (in this process, a
process pool or Ray) and returns their metas. What a unit does, and which units a
previous run already finished, are not its business.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from dataguard.run.segment import SideTask, UnitTask


class ExecutorError(RuntimeError):
    """Units could not run (a worker process died, e.g. killed for memory)."""


class Progress:
    """A rows-per-second bar over one segment (nothing at all when disabled)."""

    def __init__(self, desc: str, enabled: bool) -> None:
        self._bar: Any = None
        if enabled:
            from tqdm import tqdm

            self._bar = tqdm(desc=desc, unit=" rows", dynamic_ncols=True, leave=False)

    def tick(self, meta: dict[str, Any]) -> None:
        if self._bar is not None:
            self._bar.update(meta["rows_in"])

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None


class Executor(Protocol):
    """Runs `dataguard.run.segment.run_task` on every task; returns the metas (any order)."""

    workers: int  # reported in run.json

    def run(self, state_bytes: bytes, tasks: Iterable[UnitTask | SideTask],
            progress: Progress) -> list[dict[str, Any]]: ...

    def close(self) -> None:
        """Release the workers (called once, when the run ends or fails)."""
