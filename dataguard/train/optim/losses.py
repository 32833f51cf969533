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

Weighting follows THE WEIGHT RULE (`dataguard.train.data.split`): a loss is
``sum(w * loss) / denominator`` where the loop passes the step-wide weight mass as
``denominator`` (`cross_entropy_weight_mass` per row, `causal_lm_weight_mass` per supervised
token, summed over the step), so each micro-batch's loss is its share of the step's weighted
mean. Without ``denominator`` the batch is its own step.
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


def _as_weights(values: torch.Tensor | Sequence[float] | None, like: torch.Tensor) -> torch.Tensor | None:
    if values is None:
        return None
    w = values if isinstance(values, torch.Tensor) else torch.tensor(list(values))
    return w.to(device=like.device, dtype=like.dtype)


def normalised_share(weighted_sum: torch.Tensor, mass: torch.Tensor | float) -> torch.Tensor:
    """``weighted_sum / mass`` in the loss's dtype; a mass of 0 (every weight 0) gives 0 with
    zero gradients."""
    total = float(mass)
    if total <= 0.0:
        return weighted_sum * 0.0
    return weighted_sum / total


def cross_entropy_weight_mass(targets: torch.Tensor, sample_weights: torch.Tensor | Sequence[float] | None = None,
                              class_weights: torch.Tensor | Sequence[float] | None = None) -> torch.Tensor:
    """A classify batch's share of the denominator: sum of row weight x class weight of the
    target (float64, so that summing many micro-batches loses nothing)."""
    like = torch.empty(0, dtype=torch.float64, device=targets.device)
    sw = _as_weights(sample_weights, like)
    sw = torch.ones(targets.shape[0], dtype=torch.float64, device=targets.device) if sw is None else sw
    cw = _as_weights(class_weights, like)
    return (sw * cw[targets] if cw is not None else sw).sum()


def causal_lm_weight_mass(labels: torch.Tensor,
                          sample_weights: torch.Tensor | Sequence[float] | None = None) -> torch.Tensor:
    """An SFT batch's share of the denominator: sum over supervised tokens (labels[:, 1:]
    not -100, the positions `causal_lm_loss` scores) of the row's weight (float64)."""
    n_tok = (labels[:, 1:] != IGNORE_INDEX).sum(dim=1).to(torch.float64)
    sw = _as_weights(sample_weights, n_tok)
    return n_tok.sum() if sw is None else (n_tok * sw).sum()


def logit_adjusted_cross_entropy(logits: torch.Tensor, targets: torch.Tensor, *,
                                 offsets: torch.Tensor | Sequence[float | None] | None = None,
                                 tau: float = 1.0, label_smoothing: float = 0.0,
                                 class_weights: torch.Tensor | Sequence[float] | None = None,
                                 sample_weights: torch.Tensor | Sequence[float] | None = None,
                                 denominator: torch.Tensor | float | None = None) -> torch.Tensor:
    """Cross-entropy on ``logits + tau * offsets`` (offsets None: plain cross-entropy).

    logits: (batch, classes); targets: (batch,) class ids. ``denominator``: the step's
    weight mass (None: this batch's own, `cross_entropy_weight_mass`); see the module
    docstring for how class and sample weights are normalised."""
    if logits.dim() != 2:
        raise ValueError(f"logits must be (batch, classes), got shape {tuple(logits.shape)}")
    adjusted = logits.float()
    if offsets is not None:
        off = clean_offsets(offsets, device=logits.device)
        if off.numel() != logits.shape[1]:
            raise ValueError(f"{off.numel()} logit offsets for {logits.shape[1]} classes")
        adjusted = adjusted + tau * off
    cw = _as_weights(class_weights, adjusted)
    # per already carries cw[target]: dividing by sum(sw * cw[target]) matches torch's mean
    per = F.cross_entropy(adjusted, targets, weight=cw, label_smoothing=label_smoothing, reduction="none")
    sw = _as_weights(sample_weights, adjusted)
    weighted = (per * sw).sum() if sw is not None else per.sum()
    if denominator is None:
        denominator = cross_entropy_weight_mass(targets, sample_weights, class_weights)
    return normalised_share(weighted, denominator)


def posthoc_adjust(logits: torch.Tensor, offsets: torch.Tensor | Sequence[float | None]) -> torch.Tensor:
    """Evaluation-time logit adjustment: ``logits - offsets`` (argmax = balanced prediction)."""
    return logits - clean_offsets(offsets, device=logits.device, dtype=logits.dtype)


def causal_lm_loss(logits: torch.Tensor, labels: torch.Tensor,
                   sample_weights: torch.Tensor | Sequence[float] | None = None,
                   denominator: torch.Tensor | float | None = None) -> torch.Tensor:
    """Next-token loss: position t predicts labels[t + 1]; labels of -100 are ignored.

    Every supervised token carries its row's weight: ``sum(w * token loss) / denominator``,
    the step's weight mass (None: this batch's own, `causal_lm_weight_mass`), so that
    splitting a step into micro-batches or processes never changes the loss (the
    ``num_items_in_batch`` fix of gradient accumulation). Rows without supervised tokens
    add nothing."""
    if logits.dim() != 3:
        raise ValueError(f"logits must be (batch, seq, vocab), got shape {tuple(logits.shape)}")
    tok, _ = causal_lm_loss_per_row(logits, labels)
    per_row = tok.sum(dim=1)  # ignored positions score exactly 0
    sw = _as_weights(sample_weights, per_row)
    weighted = (per_row * sw).sum() if sw is not None else per_row.sum()
    if denominator is None:
        denominator = causal_lm_weight_mass(labels, sample_weights)
    return normalised_share(weighted, denominator)


def causal_lm_loss_per_row(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(token losses, scored mask), both (batch, seq): position t scores labels[t + 1];
    unscored positions hold exactly 0."""
    # Shift the labels, not the logits: position t scores labels[t + 1] and the last position
    # scores nothing. Slicing the logits made a full copy of the (batch, seq, vocab) tensor
    # (reshape of a non-contiguous view), 200 MB for a 49k vocabulary at batch 4 x 256.
    shift_labels = F.pad(labels[:, 1:].to(logits.device), (0, 1), value=IGNORE_INDEX)
    flat = logits.reshape(-1, logits.shape[-1])
    tok = F.cross_entropy(flat if flat.dtype == torch.float32 else flat.float(), shift_labels.reshape(-1),
                          ignore_index=IGNORE_INDEX, reduction="none").view(shift_labels.shape)
    return tok, shift_labels != IGNORE_INDEX
