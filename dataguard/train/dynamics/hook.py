"""Where the training loop meets the dynamics recorder (`dataguard.train.dynamics.recorder`).

The loop calls this in five places, each a line: `DynamicsHook.start` after setup (resume
loads the checkpoint's sums), `record` after each micro-batch's forward, `at_eval` at each
evaluation point (the extra pass, when that is the source), `checkpoint_files` before a save
(collective: the ranks' sums meet on rank 0, which writes ``dynamics.arrow`` so far) and
`finish` at the end or a stop. The source is decided once per run (``dynamics_pass``):

- ``train``: the training step's own forward (no extra cost; one pass = one epoch);
- ``eval``: an extra no-grad pass over all training rows at every evaluation point (every
  ``eval_every`` steps and the last step), whatever the run's length;
- ``auto`` (default): ``train``. A run shorter than one epoch then records only the rows it
  drew (the noise stage leaves the others unjudged), and a note says what ``eval`` would
  cost: one pass over every training row costs at least a third of such a run's compute
  per evaluation point (bench_sft: 36 steps of 8 rows over 3,178 rows, +370%: the pass took
  longer than the training), so it is never chosen for the user.

Packed sft rows share one loss per pack, so a packed run records nothing (a note says so).
The row scores that anomaly events carry are looked up here too (`RowScores`).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dataguard.train.data.sampler import steps_per_epoch
from dataguard.train.dynamics.recorder import STATE_FILE, DynamicsRecorder, eval_pass
from dataguard.train.dynamics.rows import RowScores
from dataguard.train.tasks import get_task


class DynamicsHook:
    """The run's recorder and how it is fed (``source``: ``train_forward`` or ``eval_pass``)."""

    def __init__(self, recorder: DynamicsRecorder, *, eval_every: int, total: int, batch_size: int) -> None:
        self.recorder = recorder
        self.eval_every, self.total, self.batch_size = eval_every, total, batch_size

    @property
    def from_training(self) -> bool:
        return self.recorder.source == "train_forward"

    @classmethod
    def start(cls, cfg: Any, run: Any, run_dir: Path, resume: bool,
              note: Callable[[str], None]) -> DynamicsHook | None:
        """The hook for this run (None when ``dynamics: false`` or rows are packed)."""
        if not getattr(cfg, "dynamics", True):
            return None
        enc = run.enc
        if enc.packed_rows is not None:
            note("dynamics: not recorded for packed sft rows (one loss per pack, not per row)")
            return None
        per_epoch = steps_per_epoch(int(enc.repeat.sum()), cfg.batch_size, cfg.grad_accum)
        mode = getattr(cfg, "dynamics_pass", "auto")
        if mode == "auto":
            mode = "train"
            if run.total < per_epoch:  # say what every row would cost: a forward per row per evaluation point
                points = -(-run.total // cfg.eval_every)  # every eval_every steps and the last one
                drawn = run.total * cfg.batch_size * cfg.grad_accum
                note(f"dynamics: the run draws {drawn:,} rows, under one epoch of {len(enc):,}: recorded for the rows "
                     f"drawn; dynamics_pass: eval scores every row at each of its {points} evaluation point(s) "
                     f"(about {points * len(enc) / max(3 * drawn, 1):.0%} more compute)")
        labels = run.label_map.classes if run.label_map is not None else None
        threshold: list[str] = []
        if getattr(cfg, "threshold_rows", 0) and labels and enc.class_ids is not None:
            # the rows setup relabelled to the fake class (the label map's last)
            threshold = [enc.row_ids[int(i)] for i in np.flatnonzero(enc.class_ids == len(labels) - 1)]
        row_labels = ([labels[int(c)] if 0 <= int(c) < len(labels) else None for c in enc.class_ids]
                      if labels and enc.class_ids is not None else None)
        recorder = DynamicsRecorder(run_dir, task=cfg.task, row_ids=enc.row_ids, labels=labels,
                                    source="eval_pass" if mode == "eval" else "train_forward",
                                    rank=run.rank, world=run.world, threshold_ids=threshold, row_labels=row_labels)
        if resume and run.latest is not None:
            recorder.load(run.latest)
        return cls(recorder, eval_every=cfg.eval_every, total=run.total, batch_size=cfg.batch_size)

    def record(self, step: int, passes: list[int], idx: list[int], out: Any, batch: dict[str, torch.Tensor]) -> None:
        """One micro-batch of the training step (only when the training forward is the source)."""
        if self.from_training:
            self.recorder.record(step, passes, idx, out.row_loss, out.logits,
                                 get_task(self.recorder.task).dynamics_targets(batch))

    def at_eval(self, step: int, model: Any, enc: Any, *, pad_id: int, device: Any,
                forward: Callable[[Any, dict[str, torch.Tensor]], Any]) -> None:
        """At an evaluation point of an ``eval_pass`` run: one pass over the training rows,
        numbered by the evaluation point (the same numbers after a resume)."""
        if self.from_training or not (step % self.eval_every == 0 or step == self.total):
            return
        pass_no = step // self.eval_every - (1 if step % self.eval_every == 0 else 0)
        eval_pass(self.recorder, model, enc, pass_no=pass_no, step=step, pad_id=pad_id,
                  batch_size=self.batch_size, device=device, forward=forward)

    def checkpoint_files(self, accelerator: Any, main: bool) -> dict[str, dict[str, torch.Tensor]]:
        """Collective at a checkpoint: the sums meet on rank 0, which writes the file so far
        and returns the state to save with the checkpoint."""
        self.recorder.gather(accelerator)
        if not main:
            return {}
        self.recorder.write_local()
        return {STATE_FILE: self.recorder.state_tensors()}

    def finish(self, accelerator: Any) -> Path | None:
        """Write ``dynamics.arrow`` (every rank calls it: each writes its rows, rank 0 merges)."""
        return self.recorder.write(accelerator)


def row_scores(cfg: Any) -> RowScores:
    """The stage scores of named rows, from the pipeline output the run trains on."""
    return RowScores(cfg.data)
