"""Class scores handed in by the user: logits -> probabilities, and a check that rows are probabilities.

A fine-tuned model's head gives logits; confident learning needs probabilities. Softmax
is computed as ``exp(z - logsumexp(z))`` with the row maximum subtracted first, so logits
of any magnitude (1e4 from an over-confident head) neither overflow nor underflow to a
zero row. ``temperature`` divides the logits first (T > 1 softens an over-confident
model, the usual post-hoc calibration).

Probabilities handed in as such are checked instead of trusted: a row with a negative
entry or a sum far from 1 is almost always logits (or log-probabilities) passed by
mistake, and cleanlab would silently produce nonsense thresholds from it.
"""

from __future__ import annotations

import numpy as np

from dataguard.stage import StageConfigError

INPUTS = ("probabilities", "logits")
SUM_TOLERANCE = 0.01  # float16 probabilities over ~100 classes sum within ~1e-3 of 1


def softmax(logits: np.ndarray, temperature: float = 1.0) -> np.ndarray:
    """Row-wise softmax of ``logits / temperature`` by a numerically stable log-sum-exp."""
    z = np.asarray(logits, dtype=np.float64) / float(temperature)
    if z.size == 0:
        return z.copy()
    shifted = z - z.max(axis=1, keepdims=True)
    log_norm = np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    return np.exp(shifted - log_norm)


def _describe_row(row: np.ndarray) -> str:
    return f"min {row.min():.4g}, sum {row.sum():.4g}"


def to_probabilities(raw: np.ndarray, inputs: str = "probabilities", temperature: float = 1.0) -> np.ndarray:
    """(n, k) probabilities from what the user gave; raises StageConfigError naming the parameter.

    ``inputs="probabilities"`` returns ``raw`` unchanged (so existing results stay
    byte-identical) after checking every row is finite, non-negative and sums to 1 within
    `SUM_TOLERANCE`. ``inputs="logits"`` returns the tempered softmax of finite logits.
    """
    raw = np.asarray(raw, dtype=np.float64)
    if raw.ndim != 2:
        raise StageConfigError(f"probabilities: expected a (rows, classes) matrix, got shape {raw.shape}",
                               param="probabilities")
    if raw.shape[0] == 0:
        return raw
    finite = np.isfinite(raw).all(axis=1)
    if not finite.all():
        row = int(np.flatnonzero(~finite)[0])
        raise StageConfigError(f"probabilities: row {row} (of the labelled rows) holds NaN or infinity",
                               param="probabilities")
    if inputs == "logits":
        return softmax(raw, temperature)
    bad = (raw.min(axis=1) < -1e-9) | (np.abs(raw.sum(axis=1) - 1.0) > SUM_TOLERANCE)
    if bad.any():
        rows = np.flatnonzero(bad)
        first = int(rows[0])
        raise StageConfigError(
            f"probabilities: {rows.size} of {raw.shape[0]} labelled rows are not probabilities (negative or "
            f"not summing to 1; row {first}: {_describe_row(raw[first])}); if they are a model's logits, "
            "set inputs: logits", param="probabilities")
    return raw
