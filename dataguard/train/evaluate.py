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
from dataguard.train.losses import IGNORE_INDEX, causal_lm_loss, logit_adjusted_cross_entropy, posthoc_adjust


@torch.no_grad()
def evaluate(model: Any, encoded: Encoded, *, task: str, batch_size: int, pad_id: int,
             offsets: torch.Tensor | None, logit_adjustment: bool, device: torch.device) -> dict[str, float]:
    """Unweighted validation loss and accuracy (classify: accuracy of the balanced
    prediction, post-hoc adjusted when the model was trained without the offsets).

    Leaves the model in eval mode; the caller switches it back to training."""
    rank, world = _process_group()
    model = getattr(model, "module", model) if world > 1 else model
    model.eval()
    losses, correct, count = [], 0, 0
    per_class: dict[int, list[int]] = {}
    for start in range(rank * batch_size, len(encoded), world * batch_size):
        idx = list(range(start, min(start + batch_size, len(encoded))))
        batch = {k: v.to(device) for k, v in encoded.collate(idx, pad_id).items()}
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits.float()
        if task == "sft":
            pred, gold = logits[:, :-1].argmax(-1), batch["labels"][:, 1:]
            mask = gold != IGNORE_INDEX
            # the sum of this batch's token losses, weighted by its token count below: the eval
            # loss is the mean over every supervised token, as the training loss is
            losses.append((float(causal_lm_loss(logits, batch["labels"], denominator=1.0)), 1))
            correct += int((pred[mask] == gold[mask]).sum())
            count += int(mask.sum())
            continue
        losses.append((float(logit_adjusted_cross_entropy(logits, batch["labels"])), len(idx)))
        scored = logits
        if offsets is not None and not logit_adjustment:
            scored = posthoc_adjust(logits, offsets)
        pred = scored.argmax(-1)
        for p, g in zip(pred.tolist(), batch["labels"].tolist(), strict=True):
            per_class.setdefault(g, [0, 0])
            per_class[g][0] += int(p == g)
            per_class[g][1] += 1
            correct += int(p == g)
            count += 1
    n = count if task == "sft" else sum(k for _, k in losses)  # sft: supervised tokens; classify: rows
    loss_sum = sum(v * k for v, k in losses)
    if world > 1:
        loss_sum, n, correct, count, per_class = _across_processes(loss_sum, n, correct, count, per_class,
                                                                   encoded, device)
    out = {"loss": loss_sum / max(n, 1), "accuracy": correct / max(count, 1)}
    if per_class:
        out["balanced_accuracy"] = float(np.mean([c / t for c, t in per_class.values()]))
    return out


def _process_group() -> tuple[int, int]:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _across_processes(loss_sum: float, n: int, correct: int, count: int, per_class: dict[int, list[int]],
                      encoded: Encoded, device: torch.device) -> tuple[float, int, int, int, dict[int, list[int]]]:
    """The sums of every process's share: loss, items, correct, count, and per class."""
    import torch.distributed as dist

    classes = int(np.max(encoded.class_ids)) + 1 if encoded.class_ids is not None and len(encoded) else 0
    vec = torch.zeros(4 + 2 * classes, dtype=torch.float64, device=device)
    vec[:4] = torch.tensor([loss_sum, n, correct, count], dtype=torch.float64)
    for g, (c, t) in per_class.items():
        vec[4 + 2 * g], vec[5 + 2 * g] = c, t
    dist.all_reduce(vec)
    out = vec.tolist()
    merged = {g: [int(out[4 + 2 * g]), int(out[5 + 2 * g])] for g in range(classes) if out[5 + 2 * g] > 0}
    return out[0], int(out[1]), int(out[2]), int(out[3]), merged
