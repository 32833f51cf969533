"""Validation: unweighted loss and accuracy of a model on encoded validation examples.

The sft loss is the mean over every supervised token of the validation set (not a mean of
per-batch means), so it does not depend on ``batch_size`` or on how rows fall into batches.

Under several processes each one evaluates every ``world``-th batch and the sums are added
across processes (one all-reduce of a few numbers), so evaluation takes 1/world of the time
and every process gets the same figures. The model is evaluated unwrapped: a
DistributedDataParallel forward would sync buffers once per batch, and the processes run
different numbers of batches."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from dataguard.train.data import Encoded
from dataguard.train.tasks import get_task
from dataguard.train.tasks.base import EvalTally, LossSettings


@torch.no_grad()
def evaluate(model: Any, encoded: Encoded, *, task: str, batch_size: int, pad_id: int,
             offsets: torch.Tensor | None, logit_adjustment: bool, device: torch.device,
             beta: float = 0.1) -> dict[str, float]:
    """Unweighted validation loss and accuracy, counted as the task counts them
    (`dataguard.train.tasks.base.Task.eval_batch`); ``balanced_accuracy`` where it has classes.

    Leaves the model in eval mode; the caller switches it back to training."""
    rank, world = _process_group()
    model = getattr(model, "module", model) if world > 1 else model
    model.eval()
    kind = get_task(task)
    settings = LossSettings(offsets=offsets, logit_adjustment=logit_adjustment, beta=beta)
    tally = EvalTally()
    for start in range(rank * batch_size, len(encoded), world * batch_size):
        idx = list(range(start, min(start + batch_size, len(encoded))))
        batch = {k: v.to(device) for k, v in encoded.collate(idx, pad_id).items()}
        kind.eval_batch(model, batch, tally, settings)
    if world > 1:
        tally = _across_processes(tally, encoded, device)
    out = {"loss": tally.loss_sum / max(tally.items, 1), "accuracy": tally.correct / max(tally.count, 1)}
    if tally.per_class:
        out["balanced_accuracy"] = float(np.mean([c / t for c, t in tally.per_class.values()]))
    out.update({k: v / max(tally.items, 1) for k, v in sorted(tally.sums.items())})
    return out


def _process_group() -> tuple[int, int]:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _across_processes(tally: EvalTally, encoded: Encoded, device: torch.device) -> EvalTally:
    """The sums of every process's share: loss, items, correct, count, and per class."""
    import torch.distributed as dist

    classes = int(np.max(encoded.class_ids)) + 1 if encoded.class_ids is not None and len(encoded) else 0
    keys = sorted(tally.sums)  # every process evaluates the same task, so the same keys
    vec = torch.zeros(4 + 2 * classes + len(keys), dtype=torch.float64, device=device)
    vec[:4] = torch.tensor([tally.loss_sum, tally.items, tally.correct, tally.count], dtype=torch.float64)
    for g, (c, t) in tally.per_class.items():
        vec[4 + 2 * g], vec[5 + 2 * g] = c, t
    for k, key in enumerate(keys):
        vec[4 + 2 * classes + k] = tally.sums[key]
    dist.all_reduce(vec)
    out = vec.tolist()
    merged = {g: [int(out[4 + 2 * g]), int(out[5 + 2 * g])] for g in range(classes) if out[5 + 2 * g] > 0}
    sums = {key: out[4 + 2 * classes + k] for k, key in enumerate(keys)}
    return EvalTally(out[0], int(out[1]), int(out[2]), int(out[3]), merged, sums)
