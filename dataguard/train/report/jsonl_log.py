"""Append-only JSONL logs of a run folder that survive a kill, a full disk and a planted link.

``metrics.jsonl``, ``events.jsonl`` and ``histograms.jsonl`` are appended one object per line.
A process killed mid-write, or a disk that filled, leaves a torn last line: a resumed run
drops it (and any line it cannot read) instead of failing on it, and cuts the log back to the
step of the checkpoint it resumed from, so the log describes exactly the run that continues.
The cut is written atomically, and appends open the file with ``O_NOFOLLOW``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dataguard.io.safe_files import open_nofollow, write_atomic


def read_records(path: Path) -> list[dict[str, Any]]:
    """The readable objects of a JSONL file, in order; torn or foreign lines are skipped."""
    records = []
    with open(path, encoding="utf-8", errors="replace") as fh:
        for line in fh:
            try:
                value = json.loads(line)
            except ValueError:
                continue
            if isinstance(value, dict):
                records.append(value)
    return records


def trim_jsonl(path: Path, resume_step: int | None) -> list[str]:
    """Keep the readable lines of ``path`` up to ``resume_step`` (none for a fresh run), write
    them back atomically and return them."""
    if not path.exists() and not path.is_symlink():
        return []
    kept: list[str] = []
    if resume_step is not None:
        kept = [json.dumps(r) for r in read_records(path) if _step(r) <= resume_step]
    write_atomic(path, "".join(line + "\n" for line in kept))
    return kept


def _step(record: dict[str, Any]) -> float:
    step = record.get("step", 0)
    return step if isinstance(step, int | float) else float("inf")


class JsonlLog:
    """An append-only JSONL file of the main process (None: write nothing)."""

    def __init__(self, path: Path | None, resume_step: int | None = None) -> None:
        self.path = path
        self.lines = trim_jsonl(path, resume_step) if path is not None else []

    def write(self, record: dict[str, Any]) -> None:
        if self.path is not None:
            with open_nofollow(self.path, "a") as fh:
                fh.write(json.dumps(record) + "\n")
