"""Losses that use what the pipeline handed over: logit offsets, weights, assistant masks.

- `logit_adjusted_cross_entropy`: Menon et al. 2021 ("Long-tail learning via logit
  adjustment"), the training-time variant: cross-entropy on ``logits + tau * offsets`` where
  the manifest's ``logit_offsets`` already are ``tau_pipeline * log(prior)``. Adding the log
  prior during training makes the softmax fit the *balanced* posterior, so the model stops
  favouring head classes. ``tau`` here rescales the offsets as written (1.0 = use them as the
  pipeline computed them).
- `posthoc_adjust`: the evaluation-time variant (``logits - offsets``), for a model trained
  with the plain loss.
- `causal_lm_loss`: next-token loss on the tokens whose label is not -100.

Offsets of classes absent from the training data are NaN in the manifest (log 0). They are
replaced by the smallest finite offset (the class is treated like the rarest class seen),
which keeps every value finite; -inf would zero the class's probability and produce NaN
gradients under label smoothing.

Weighting: a per-sample weight scales that sample's loss, and the batch loss is the weighted
sum divided by the sum of the weights (times the class weight of the target when class
weights are given, which is exactly what ``F.cross_entropy(weight=..., reduction="mean")``
does). A batch whose weights sum to 0 gives a loss of 0 with zero (finite) gradients.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

IGNORE_INDEX = -100


def clean_offsets(offsets: torch.Tensor | Sequence[float | None], *, device: torch.device | None = None,
                  dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The manifest's offsets as a finite tensor: None/NaN -> the smallest finite offset
    (0 when no offset is finite)."""
    if isinstance(offsets, torch.Tensor):
        t = offsets.detach().to(device=device or offsets.device, dtype=dtype)
    else:
        t = torch.tensor([float("nan") if o is None else float(o) for o in offsets], dtype=dtype, device=device)
    finite = torch.isfinite(t)
    fill = t[finite].min() if bool(finite.any()) else torch.tensor(0.0, dtype=dtype, device=t.device)
    return torch.where(finite, t, fill)


def _weighted_mean(per_sample: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    total = weights.sum()
    if float(total) <= 0.0:
        return (per_sample * 0.0).sum()
    return (per_sample * weights).sum() / total


def _as_weights(values: torch.Tensor | Sequence[float] | None, like: torch.Tensor) -> torch.Tensor | None:
    if values is None:
        return None
    w = values if isinstance(values, torch.Tensor) else torch.tensor(list(values))
    return w.to(device=like.device, dtype=like.dtype)


def logit_adjusted_cross_entropy(logits: torch.Tensor, targets: torch.Tensor, *,
                                 offsets: torch.Tensor | Sequence[float | None] | None = None,
                                 tau: float = 1.0, label_smoothing: float = 0.0,
                                 class_weights: torch.Tensor | Sequence[float] | None = None,
                                 sample_weights: torch.Tensor | Sequence[float] | None = None) -> torch.Tensor:
    """Cross-entropy on ``logits + tau * offsets`` (offsets None: plain cross-entropy).

    logits: (batch, classes); targets: (batch,) class ids. See the module docstring for
    how class and sample weights are normalised."""
    if logits.dim() != 2:
        raise ValueError(f"logits must be (batch, classes), got shape {tuple(logits.shape)}")
    adjusted = logits.float()
    if offsets is not None:
        off = clean_offsets(offsets, device=logits.device)
        if off.numel() != logits.shape[1]:
            raise ValueError(f"{off.numel()} logit offsets for {logits.shape[1]} classes")
        adjusted = adjusted + tau * off
    cw = _as_weights(class_weights, adjusted)
    per = F.cross_entropy(adjusted, targets, weight=cw, label_smoothing=label_smoothing, reduction="none")
    sw = _as_weights(sample_weights, adjusted)
    if sw is None:
        sw = torch.ones_like(per)
    denom_w = sw * cw[targets] if cw is not None else sw
    # per already carries cw[target]; dividing by sum(sw * cw[target]) matches torch's mean
    total = denom_w.sum()
    if float(total) <= 0.0:
        return (per * 0.0).sum()
    return (per * sw).sum() / total


def posthoc_adjust(logits: torch.Tensor, offsets: torch.Tensor | Sequence[float | None]) -> torch.Tensor:
    """Evaluation-time logit adjustment: ``logits - offsets`` (argmax = balanced prediction)."""
    return logits - clean_offsets(offsets, device=logits.device, dtype=logits.dtype)


def causal_lm_loss(logits: torch.Tensor, labels: torch.Tensor,
                   sample_weights: torch.Tensor | Sequence[float] | None = None) -> torch.Tensor:
    """Next-token loss: position t predicts labels[t + 1]; labels of -100 are ignored.

    Each sample's loss is the mean over its own supervised tokens, then samples are averaged
    with ``sample_weights`` (normalised by their sum). Chosen over one mean over all tokens
    of the batch so that a row's weight means the same thing whatever its length: with a
    token mean, long answers would outweigh short ones and a weight of 2 would not double a
    row's say. Samples without supervised tokens count 0."""
    if logits.dim() != 3:
        raise ValueError(f"logits must be (batch, seq, vocab), got shape {tuple(logits.shape)}")
    shift_logits = logits[:, :-1, :].float()
    shift_labels = labels[:, 1:].to(logits.device)
    tok = F.cross_entropy(shift_logits.reshape(-1, shift_logits.shape[-1]), shift_labels.reshape(-1),
                          ignore_index=IGNORE_INDEX, reduction="none").view(shift_labels.shape)
    mask = (shift_labels != IGNORE_INDEX).to(tok.dtype)
    n_tok = mask.sum(dim=1)
    per_sample = (tok * mask).sum(dim=1) / n_tok.clamp(min=1.0)
    sw = _as_weights(sample_weights, per_sample)
    if sw is None:
        sw = torch.ones_like(per_sample)
    sw = torch.where(n_tok > 0, sw, torch.zeros_like(sw))
    return _weighted_mean(per_sample, sw)
