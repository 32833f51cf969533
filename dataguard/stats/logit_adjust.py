"""Logit adjustment for long-tailed classification (Menon et al., ICLR 2021).

Two ways to use the class priors ``pi`` that `LongTailStage` writes to the manifest:

- *Post-hoc*: a model trained normally on the long-tailed data learns roughly
  ``log p(y|x) = f_y(x)`` which carries ``log pi_y``; predicting ``argmax_y f_y(x) - tau *
  log pi_y`` approximately minimises the *balanced* error. `posthoc_adjust` does that.
- *Loss*: train with the softmax cross-entropy of ``f(x) + tau * log pi`` (the
  logit-adjusted loss) and predict with plain ``argmax f(x)``. `logit_adjusted_loss`
  (numpy) and `logit_adjusted_loss_torch` implement it.

tau = 1 is the Fisher-consistent choice for the balanced error.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np


def logit_offsets(priors: Sequence[float] | np.ndarray, tau: float = 1.0) -> np.ndarray:
    """Per-class offsets ``tau * log(pi)``; priors must be > 0."""
    pi = np.asarray(priors, dtype=np.float64)
    if (pi <= 0).any():
        raise ValueError("priors must all be > 0 for logit adjustment")
    return tau * np.log(pi)


def posthoc_adjust(logits: np.ndarray, priors: Sequence[float] | np.ndarray, tau: float = 1.0) -> np.ndarray:
    """Subtract ``tau * log(pi)`` from the logits (last axis = classes) of a trained model."""
    z = np.asarray(logits, dtype=np.float64)
    return z - logit_offsets(priors, tau)


def _log_softmax(z: np.ndarray) -> np.ndarray:
    m = z.max(axis=-1, keepdims=True)
    s = z - m
    return s - np.log(np.exp(s).sum(axis=-1, keepdims=True))


def logit_adjusted_loss(logits: np.ndarray, labels: np.ndarray, priors: Sequence[float] | np.ndarray,
                        tau: float = 1.0, sample_weight: np.ndarray | None = None) -> float:
    """Mean (optionally weighted) cross-entropy of ``logits + tau * log(pi)`` (numpy).

    tau = 0 gives the ordinary softmax cross-entropy. With sample weights the result is
    ``sum_i w_i * loss_i / sum_i w_i``.
    """
    z = np.asarray(logits, dtype=np.float64) + logit_offsets(priors, tau)
    y = np.asarray(labels, dtype=np.int64)
    nll = -_log_softmax(z)[np.arange(y.size), y]
    if sample_weight is None:
        return float(nll.mean())
    w = np.asarray(sample_weight, dtype=np.float64)
    return float((w * nll).sum() / w.sum())


def logit_adjusted_loss_torch(logits: Any, labels: Any, priors: Any, tau: float = 1.0,
                              sample_weight: Any | None = None) -> Any:
    """Torch version of `logit_adjusted_loss` (differentiable; same reduction)."""
    import torch
    import torch.nn.functional as F

    pi = torch.as_tensor(priors, dtype=logits.dtype, device=logits.device)
    nll = F.cross_entropy(logits + tau * torch.log(pi), labels, reduction="none")
    if sample_weight is None:
        return nll.mean()
    w = torch.as_tensor(sample_weight, dtype=logits.dtype, device=logits.device)
    return (w * nll).sum() / w.sum()
