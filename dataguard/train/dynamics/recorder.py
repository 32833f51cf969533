"""Recording training dynamics per row: the runner side of ``RUN/dynamics.arrow``.

What is recorded, and why it costs almost nothing: the training step already computes every
row's loss and (classify) logits in its forward pass (`dataguard.train.optim.forward.ForwardOut`);
`DynamicsRecorder.record` only reads those detached tensors, so the default source
(``train_forward``) adds no forward pass. A run shorter than one epoch never sees some rows,
so ``dynamics_pass: auto`` then records an extra no-grad pass over the training rows at
each evaluation instead (``eval_pass``; `eval_pass`), which costs one forward per row per
evaluation and is counted in the overhead benchmark. The file layout is in
`dataguard.train.dynamics.file`.

The state is a sum per (row, pass): loss, gold probability, margin and draw count, plus the
last draw's step, correctness and prediction. Sums merge by addition, which makes three
things simple and exact:

- *several processes*: each rank records the rows of its slice; at a checkpoint the ranks'
  sums are gathered onto rank 0 (which then holds them all, the others start empty again);
  at the end each rank writes its rows to ``dynamics.rank<R>.arrow``, and rank 0 merges them
  into ``dynamics.arrow`` and removes the rank files;
- *resume*: the sums ride in every checkpoint (``dynamics_state.safetensors``, checksummed
  with it, rotated with it); a resumed run loads the sums of the checkpoint it resumes from,
  so it writes the same file as an uninterrupted run (float64 sums in the same order);
- *the guard*: a skipped step's rows are still recorded (their forward pass happened; a
  garbage batch is exactly what the data side wants to see); rows of batches a rollback
  discards keep their entries too.

The file is written atomically at every checkpoint (what is known so far) and at the end.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import torch

from dataguard.train.dynamics.file import FILE_NAME, read_dynamics, write_dynamics
from dataguard.train.tasks import get_task

STATE_FILE = "dynamics_state.safetensors"
_FIELDS = ("row", "pass", "step", "loss", "gold_prob", "margin", "n", "correct", "predicted")


class DynamicsRecorder:
    """Per-(row, pass) sums of one process; ``row`` indexes ``row_ids`` (the encoded training
    rows) and ``row_labels`` (the label each trains under, written beside its entries so a
    stage never reads a verdict about one label as a verdict about another)."""

    def __init__(self, run_dir: Path, *, task: str, row_ids: Sequence[str], labels: Sequence[str] | None,
                 source: str = "train_forward", rank: int = 0, world: int = 1,
                 threshold_ids: Sequence[str] = (), row_labels: Sequence[str | None] | None = None) -> None:
        self.run_dir = Path(run_dir)
        self.task = task
        self.row_ids = list(row_ids)
        self.row_labels = list(row_labels) if row_labels is not None else [None] * len(self.row_ids)
        if len(self.row_labels) != len(self.row_ids):
            raise ValueError(f"{len(self.row_labels)} row labels for {len(self.row_ids)} rows")
        self.labels = list(labels or [])
        self.source = source
        self.rank, self.world = rank, world
        self.threshold_ids = sorted(threshold_ids)  # rows trained under the fake class (threshold_rows)
        self.sums: dict[tuple[int, int], list[Any]] = {}

    # -- recording -------------------------------------------------------------------------
    def record(self, step: int, passes: Sequence[int], rows: Sequence[int], row_loss: torch.Tensor,
               logits: torch.Tensor | None = None, targets: torch.Tensor | None = None) -> None:
        """One micro-batch: ``rows`` (encoded row indices) drawn in ``passes``, their detached
        per-row loss and, for classify, raw logits and label ids."""
        loss = row_loss.detach().float().cpu().numpy().astype(np.float64)
        n = len(rows)
        gold = margin = np.full(n, np.nan)
        correct = np.zeros(n, dtype=bool)
        predicted = np.full(n, -1, dtype=np.int64)
        if logits is not None and targets is not None:
            z = logits.detach().float().cpu()
            y = targets.detach().cpu().long()
            ok = (y >= 0) & (y < z.shape[1])
            ys = y.clamp(0, z.shape[1] - 1)
            r = torch.arange(n)
            gold = torch.softmax(z, dim=1)[r, ys].double().numpy()
            others = z.clone()
            others[r, ys] = -torch.inf
            margin = (z[r, ys] - others.max(dim=1).values).double().numpy() if z.shape[1] > 1 else np.zeros(n)
            predicted = z.argmax(dim=1).numpy().astype(np.int64)
            correct = predicted == ys.numpy()
            valid = ok.numpy()
        else:
            valid = np.ones(n, dtype=bool)
        for j in range(n):
            if not valid[j]:
                continue
            key = (int(rows[j]), int(passes[j]))
            entry = self.sums.get(key)
            if entry is None:
                self.sums[key] = [step, loss[j], gold[j], margin[j], 1, bool(correct[j]), int(predicted[j])]
            else:
                entry[0] = step
                entry[1] += loss[j]
                entry[2] += gold[j]
                entry[3] += margin[j]
                entry[4] += 1
                entry[5], entry[6] = bool(correct[j]), int(predicted[j])

    # -- state: checkpoints and resume -----------------------------------------------------
    def _arrays(self, sums: dict[tuple[int, int], list[Any]] | None = None) -> dict[str, np.ndarray]:
        items = sorted((sums if sums is not None else self.sums).items())
        cols = list(zip(*[(k[0], k[1], *v) for k, v in items], strict=True)) if items else [[]] * len(_FIELDS)
        dtypes = (np.int64, np.int32, np.int64, np.float64, np.float64, np.float64, np.int64, np.uint8, np.int64)
        return {name: np.asarray(c, dtype=t) for name, c, t in zip(_FIELDS, cols, dtypes, strict=True)}

    def _merge(self, arrays: dict[str, np.ndarray]) -> None:
        for i in range(len(arrays["row"])):
            key = (int(arrays["row"][i]), int(arrays["pass"][i]))
            new = [int(arrays["step"][i]), float(arrays["loss"][i]), float(arrays["gold_prob"][i]),
                   float(arrays["margin"][i]), int(arrays["n"][i]), bool(arrays["correct"][i]),
                   int(arrays["predicted"][i])]
            old = self.sums.get(key)
            if old is None:
                self.sums[key] = new
                continue
            later = new if new[0] > old[0] else old  # the last draw's verdict
            self.sums[key] = [later[0], old[1] + new[1], old[2] + new[2], old[3] + new[3], old[4] + new[4],
                              later[5], later[6]]

    def gather(self, accelerator: Any) -> None:
        """Move every rank's sums onto rank 0 (collective: every rank calls it at a checkpoint)."""
        if self.world <= 1:
            return
        from accelerate.utils import gather_object

        parts = gather_object([(self.rank, self._arrays())])
        if self.rank == 0:
            for rank, arrays in sorted(parts, key=lambda p: p[0]):
                if rank != 0:
                    self._merge(arrays)
        else:
            self.sums = {}

    def state_tensors(self) -> dict[str, torch.Tensor]:
        """The sums as tensors for the checkpoint (``STATE_FILE``)."""
        return {name: torch.from_numpy(np.ascontiguousarray(a)) for name, a in self._arrays().items()}

    def load(self, checkpoint: Path) -> bool:
        """Put back the sums a checkpoint holds (rank 0 only); False when it holds none."""
        path = Path(checkpoint) / STATE_FILE
        if self.rank != 0 or not path.is_file():
            return False
        from safetensors.torch import load_file

        tensors = load_file(str(path))
        self.sums = {}
        self._merge({k: v.numpy() for k, v in tensors.items()})
        return True

    # -- the file ------------------------------------------------------------------------
    def table(self) -> pa.Table:
        a = self._arrays()
        n = np.maximum(a["n"], 1).astype(np.float64)
        classify = get_task(self.task).has_classes
        names = np.asarray(self.labels + [None], dtype=object)
        pred = a["predicted"]
        return pa.table({
            "id": pa.array([self.row_ids[int(r)] for r in a["row"]], pa.string()),
            "pass": pa.array(a["pass"], pa.int32()), "step": pa.array(a["step"], pa.int64()),
            "loss": pa.array((a["loss"] / n).astype(np.float32), pa.float32()),
            "gold_prob": pa.array((a["gold_prob"] / n).astype(np.float32), pa.float32(), mask=~np.full(len(n), classify)),
            "margin": pa.array((a["margin"] / n).astype(np.float32), pa.float32(), mask=~np.full(len(n), classify)),
            "correct": pa.array(a["correct"].astype(bool), pa.bool_(), mask=~np.full(len(n), classify)),
            "predicted": pa.array(names[np.where((pred >= 0) & (pred < len(self.labels)), pred, -1)]
                                  if classify else [None] * len(n), pa.string()),
            "label": pa.array([self.row_labels[int(r)] for r in a["row"]] if classify else [None] * len(n),
                              pa.string()),
        })

    def write_local(self) -> Path:
        """Write this process's sums as ``dynamics.arrow`` (rank 0 after `gather`, or one process)."""
        return write_dynamics(self.run_dir / FILE_NAME, self.table(), **self._file_meta())

    def _file_meta(self) -> dict[str, Any]:
        return {"task": self.task, "labels": self.labels, "source": self.source, "threshold_ids": self.threshold_ids}

    def write(self, accelerator: Any = None) -> Path | None:
        """Write ``dynamics.arrow`` (collective under several processes: each rank writes its
        rows, rank 0 merges them); returns the path on rank 0."""
        target = self.run_dir / FILE_NAME
        if self.world > 1:
            mine = self.run_dir / f"dynamics.rank{self.rank}.arrow"
            write_dynamics(mine, self.table(), **self._file_meta())
            accelerator.wait_for_everyone()
            if self.rank != 0:
                return None
            parts = [self.table()] + [read_dynamics(self.run_dir / f"dynamics.rank{r}.arrow")[0]
                                      for r in range(1, self.world)]
            merged = merge_tables(parts)
            write_dynamics(target, merged, **self._file_meta())
            for r in range(self.world):
                (self.run_dir / f"dynamics.rank{r}.arrow").unlink(missing_ok=True)
            return target
        return self.write_local()


def merge_tables(parts: list[pa.Table]) -> pa.Table:
    """Rank files into one: an (id, pass) drawn on several ranks is averaged by its draws'
    share (each rank's entry is already a mean; equal weights are exact for repeat 1)."""
    table = pa.concat_tables(parts)
    if table.num_rows == 0:
        return table
    keys = list(zip(table.column("id").to_pylist(), table.column("pass").to_pylist(), strict=True))
    if len(set(keys)) == len(keys):
        return table
    grouped = table.group_by(["id", "pass"], use_threads=False).aggregate(
        [("step", "max"), ("loss", "mean"), ("gold_prob", "mean"), ("margin", "mean"), ("correct", "max"),
         ("predicted", "max"), ("label", "max")])
    return grouped.rename_columns([c.replace("_max", "").replace("_mean", "") for c in grouped.column_names])


def pass_of_rows(epoch_before: int, epoch_after: int, offset_after: int, n: int, exact: bool) -> list[int]:
    """The epoch each of a micro-batch's ``n`` rows was drawn in. A batch that ran across
    an epoch boundary took its last ``offset_after`` rows from the new epoch (exact without a
    curriculum, whose skipped rows also advance the offset; then it is a bound)."""
    if epoch_after == epoch_before or not exact:
        return [epoch_before] * n
    new = min(offset_after, n)
    return [epoch_before] * (n - new) + [epoch_after] * new


@torch.no_grad()
def eval_pass(recorder: DynamicsRecorder, model: Any, enc: Any, *, pass_no: int, step: int, pad_id: int,
              batch_size: int, device: Any, forward: Any) -> None:
    """An extra pass over this process's training rows (eval mode, no gradient): every row
    once, recorded as pass ``pass_no``. ``forward(model, batch)`` is the step's forward."""
    was_training = model.training
    model.eval()
    rows = list(range(recorder.rank, len(enc), recorder.world))
    for start in range(0, len(rows), batch_size):
        idx = rows[start:start + batch_size]
        batch = {k: v.to(device) for k, v in enc.collate(idx, pad_id).items()}
        out = forward(model, batch)
        recorder.record(step, [pass_no] * len(idx), idx, out.row_loss, out.logits,
                        get_task(recorder.task).dynamics_targets(batch))
    if was_training:
        model.train()
