"""Validation: unweighted loss and accuracy of a model on encoded validation examples.

The sft loss is the mean over every supervised token of the validation set (not a mean of
per-batch means), so it does not depend on ``batch_size`` or on how rows fall into batches."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from dataguard.train.data import Encoded
from dataguard.train.losses import causal_lm_loss, logit_adjusted_cross_entropy, posthoc_adjust

IGNORE_INDEX = -100


@torch.no_grad()
def evaluate(model: Any, encoded: Encoded, *, task: str, batch_size: int, pad_id: int,
             offsets: torch.Tensor | None, logit_adjustment: bool, device: torch.device) -> dict[str, float]:
    """Unweighted validation loss and accuracy (classify: accuracy of the balanced
    prediction, post-hoc adjusted when the model was trained without the offsets).

    Leaves the model in eval mode; the caller switches it back to training."""
    model.eval()
    losses, correct, count = [], 0, 0
    per_class: dict[int, list[int]] = {}
    for start in range(0, len(encoded), batch_size):
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
    out = {"loss": sum(v * k for v, k in losses) / max(n, 1), "accuracy": correct / max(count, 1)}
    if per_class:
        out["balanced_accuracy"] = float(np.mean([c / t for c, t in per_class.values()]))
    return out
