"""Drop the rows a training run quarantined (``dataguard run CONFIG --exclude RUN``).

When the training guard calls a step anomalous (a loss or gradient spike, a non-finite loss)
it names the step's rows in ``RUN/events.jsonl``; this stage rejects those rows in the next
data run with reason ``training_anomaly`` and a detail naming the run, the step and the cause,
so the next training run never sees them and every row stays accounted for (rows in = kept +
rejected). The CLI puts it first, right after normalize, when ``--exclude`` is given; it can
also be listed in a config as ``exclude: {runs: [RUN, ...]}``.

Row ids are ``source:position``, so the same inputs give the same ids in the next run. The
quarantine list is read once, in the driver, when the stage is built (`dataguard.train.
dynamics_rows.quarantined`); a run folder without events is refused in one line.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from dataguard.params import ListOf, Satisfies
from dataguard.records import reject_rows
from dataguard.stage import Outcome, Stage, StageConfigError
from dataguard.tally import Tally
from dataguard.train.dynamics.rows import quarantined

REASON = "training_anomaly"
MAX_EXAMPLES = 20


def _run_folder(value: Any) -> bool:
    return isinstance(value, str) and bool(value)


class ExcludeStage(Stage):
    """Rejects rows a training run's guard named (anomaly and stop events)."""

    name = "exclude"
    reasons = {REASON: "a training run's guard named the row in an anomalous step (--exclude RUN)"}
    constraints = {"runs": [ListOf(Satisfies(_run_folder, "a training run folder"), min_len=1)]}

    def __init__(self, *, runs: Sequence[str]) -> None:
        self.runs = [str(r) for r in runs]
        self.rows: dict[str, str] = {}
        for run in self.runs:
            folder = Path(run)
            if not folder.is_dir():
                raise StageConfigError(f"runs: {run}: no such training run folder", param="runs")
            if not (folder / "events.jsonl").is_file():
                raise StageConfigError(f"runs: {run}: no events.jsonl (not a dataguard training run folder)",
                                       param="runs")
            for rid, why in quarantined(folder).items():
                self.rows.setdefault(rid, f"named by the guard of training run {run} at step {why['step']} "
                                          f"({why['cause']})")
        self._ids = pa.array(sorted(self.rows), pa.string())

    def runs_read(self) -> list[str]:
        return list(self.runs)

    def output_columns(self) -> dict[str, pa.DataType]:
        return {}

    def apply_adds(self) -> frozenset[str] | None:
        return None

    def apply(self, batch: pa.Table) -> Outcome:
        n = batch.num_rows
        hit = (pc.is_in(batch.column("id"), value_set=self._ids).to_numpy(zero_copy_only=False).astype(bool)
               if n and len(self._ids) else np.zeros(n, dtype=bool))
        stats = Tally(counts=Counter(rows_in=n, excluded=int(hit.sum())))
        if not hit.any():
            return Outcome(kept=batch, stats=stats)
        ids = [str(i) for i in batch.column("id").filter(pa.array(hit)).to_pylist()]
        stats.keep("examples", [{"id": i, "note": self.rows[i]} for i in ids[:MAX_EXAMPLES]], MAX_EXAMPLES,
                   rank=("id",))
        return Outcome(kept=batch.filter(pa.array(~hit)), stats=stats,
                       rejected=reject_rows(batch, hit, self.name, REASON, [self.rows[i] for i in ids]))

    def describe(self) -> dict[str, Any]:
        items = [{"id": e["id"], "text": "", "note": e["note"]} for e in self.tally.items("examples")]
        blocks = [{"type": "examples", "title": "Rows excluded (named by a training run)", "items": items}] \
            if items else []
        return {"title": "Rows quarantined by training", "blocks": blocks,
                "summary": {"runs": ", ".join(self.runs), "rows_quarantined": len(self.rows),
                            "rows_excluded": self.tally.get("excluded")}}
