"""Rows flagged from a training run's dynamics (the noise stage's ``inputs: dynamics``).

The runner writes ``RUN/dynamics.arrow`` (`dataguard.train.dynamics.file`): per row and pass,
the gold-label probability, the margin (gold logit minus the largest other) and the loss.
Two per-row scores come from it, averaged over the passes:

- ``aum``: the area under the margin (Pleiss et al. 2020). A mislabelled row keeps pulling
  towards its true class, so its margin stays negative while correct rows' margins grow.
- ``cartography``: the confidence of dataset cartography (Swayamdipta et al. 2020), the
  mean gold probability; its region "hard to learn" (low confidence, low variability) is
  where their mislabelled rows sit. Variability (the std over passes) is reported too.

The cut (``dynamics_cut: auto``) is learned, not guessed: a two-component Gaussian mixture on
the score, flagging the rows the lower component owns (posterior > 0.5, below the upper
component's mean). Pleiss et al. learn the cut from *threshold rows* (a random 1/(c+1) of
the rows trained under an extra, fake class; the 99th percentile of their AUM); that needs
one more output in the model's head, which the runner does not add yet, so the mixture
stands in. A number is taken as the cut itself. ``max_flagged`` keeps the worst rows by the
score, and ``min_rows_per_class`` gives back the least suspicious rows of a class that would
fall below it, exactly as for cross-validated probabilities (`dataguard.stages.noise.confident`).

For ``sft`` runs each row gets its mean assistant-token loss over the last half of the
passes (a row the model fits late is not an outlier), and a row whose loss stays above the
median + 3.5 robust standard deviations (1.4826 MAD) is flagged ``hard_to_fit``: the
candidates for swapped responses, garbage and wrong-language rows other stages missed.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np
import pyarrow as pa

from dataguard.stages.noise.confident import NoiseEstimate, budget_count, limit_flags, protect_rare_classes
from dataguard.train.dynamics.file import DynamicsFileError, read_dynamics

SCORES = ("aum", "cartography")
HARD_TO_FIT_Z = 3.5


@dataclasses.dataclass
class RowDynamics:
    """One entry per row id (sorted by id): the scores the flags are decided on."""

    ids: list[str]
    passes: np.ndarray          # int64, passes seen
    aum: np.ndarray             # float64, mean margin (NaN for sft)
    confidence: np.ndarray      # float64, mean gold probability (NaN for sft)
    variability: np.ndarray     # float64, std of the gold probability over passes
    correctness: np.ndarray     # float64, share of passes predicted right
    late_loss: np.ndarray       # float64, mean loss over the last half of the passes
    predicted: list[str | None]  # the most frequent prediction (ties: the later pass)
    predicted_share: np.ndarray  # float64, share of passes that predicted it


def load(run: str, label_names: list[str] | None = None) -> tuple[RowDynamics, dict[str, Any]]:
    """Per-row scores from ``run`` (a run folder or its dynamics file)."""
    table, meta = read_dynamics(run)
    return aggregate(table), meta


def aggregate(table: pa.Table) -> RowDynamics:
    """Average each row's passes (the file is sorted by id, pass)."""
    ids = table.column("id").to_pylist()
    n = len(ids)
    starts = [i for i in range(n) if i == 0 or ids[i] != ids[i - 1]] + [n]
    margin = table.column("margin").to_numpy(zero_copy_only=False).astype(np.float64)
    gold = table.column("gold_prob").to_numpy(zero_copy_only=False).astype(np.float64)
    loss = table.column("loss").to_numpy(zero_copy_only=False).astype(np.float64)
    correct = np.asarray(table.column("correct").fill_null(False).to_pylist(), dtype=np.float64)
    pred = table.column("predicted").to_pylist()
    out: dict[str, list[Any]] = {k: [] for k in ("ids", "passes", "aum", "confidence", "variability",
                                                 "correctness", "late_loss", "predicted", "share")}
    for a, b in zip(starts[:-1], starts[1:], strict=True):
        k = b - a
        out["ids"].append(ids[a])
        out["passes"].append(k)
        out["aum"].append(float(np.mean(margin[a:b])))
        out["confidence"].append(float(np.mean(gold[a:b])))
        out["variability"].append(float(np.std(gold[a:b])))
        out["correctness"].append(float(np.mean(correct[a:b])))
        late = loss[a + k // 2:b]
        late = late[np.isfinite(late)]
        out["late_loss"].append(float(np.mean(late)) if late.size else math.nan)
        counts: dict[str, list[int]] = {}
        for j, p in enumerate(pred[a:b]):
            if p is not None:
                counts.setdefault(p, [0, 0])
                counts[p][0] += 1
                counts[p][1] = j
        best = max(counts.items(), key=lambda kv: (kv[1][0], kv[1][1]))[0] if counts else None
        out["predicted"].append(best)
        out["share"].append(counts[best][0] / k if best is not None else 0.0)
    return RowDynamics(out["ids"], np.asarray(out["passes"], np.int64), np.asarray(out["aum"]),
                       np.asarray(out["confidence"]), np.asarray(out["variability"]),
                       np.asarray(out["correctness"]), np.asarray(out["late_loss"]), out["predicted"],
                       np.asarray(out["share"]))


def mixture_cut(score: np.ndarray, seed: int = 0) -> float:
    """The score below which a two-component Gaussian mixture gives the lower component
    posterior > 0.5 (between the two means); -inf when the scores are one cluster."""
    x = score[np.isfinite(score)].reshape(-1, 1)
    if len(x) < 10 or float(np.std(x)) == 0.0:
        return -math.inf
    from sklearn.mixture import GaussianMixture

    gm = GaussianMixture(2, random_state=seed, n_init=2).fit(x)
    lo, hi = np.argsort(gm.means_.ravel())
    grid = np.linspace(float(gm.means_[lo, 0]), float(gm.means_[hi, 0]), 2001).reshape(-1, 1)
    post = gm.predict_proba(grid)[:, lo]
    above = np.flatnonzero(post <= 0.5)
    return float(grid[above[0], 0]) if above.size else float(grid[-1, 0])


def robust_cut(values: np.ndarray, z: float = HARD_TO_FIT_Z) -> float:
    """median + z robust standard deviations (1.4826 MAD; floored at 1% of the median)."""
    v = values[np.isfinite(values)]
    if not v.size:
        return math.inf
    med = float(np.median(v))
    scale = max(1.4826 * float(np.median(np.abs(v - med))), 0.01 * abs(med), 1e-12)
    return med + z * scale


def classify_estimate(rows: RowDynamics, ids: list[str], y: np.ndarray, classes: list[str], *, score: str,
                      cut: float | str, min_rows_per_class: int, max_flagged: int | float | None,
                      seed: int = 0) -> tuple[NoiseEstimate, np.ndarray, dict[str, Any]]:
    """(estimate, which labelled rows the run saw, log) for the labelled rows ``ids`` with
    label ids ``y``. Rows the run never drew are not judged (quality NaN, never flagged)."""
    index = {r: i for i, r in enumerate(rows.ids)}
    at = np.array([index.get(r, -1) for r in ids], dtype=np.int64)
    seen = at >= 0
    values = rows.aum if score == "aum" else rows.confidence
    quality = np.where(seen, values[np.clip(at, 0, None)] if len(rows.ids) else np.nan, np.nan)
    learned = cut == "auto"
    cut_value = mixture_cut(quality[seen], seed) if learned else float(cut)
    issue = seen & (quality < cut_value)
    issue = protect_rare_classes(y, issue, np.nan_to_num(quality, nan=np.inf), min_rows_per_class)
    before = int(issue.sum())
    issue = limit_flags(issue, np.nan_to_num(quality, nan=np.inf), budget_count(max_flagged, len(y)))
    cls = {c: i for i, c in enumerate(classes)}
    suggested = np.array([cls.get(rows.predicted[a], yy) if a >= 0 and rows.predicted[a] is not None else yy
                          for a, yy in zip(at, y, strict=True)], dtype=np.int64)
    share = np.where(seen, rows.predicted_share[np.clip(at, 0, None)] if len(rows.ids) else 0.0, 0.0)
    k = len(classes)
    joint = np.zeros((k, k), dtype=np.int64)
    np.add.at(joint, (y[seen], suggested[seen]), 1)
    cols = joint.sum(axis=0, keepdims=True)
    noise = np.divide(joint, cols, out=np.zeros((k, k)), where=cols > 0)
    est = NoiseEstimate(is_issue=issue, quality=quality.astype(np.float32), suggested=suggested,
                        suggested_prob=share.astype(np.float64), thresholds=np.full(k, cut_value),
                        confident_joint=joint, noise_matrix=noise)
    log = {"score": score, "cut": "mixture" if learned else "given", "cut_value": round(cut_value, 6)
           if math.isfinite(cut_value) else None, "rows_seen": int(seen.sum()), "rows_unseen": int((~seen).sum()),
           "below_cut": int((seen & (quality < cut_value)).sum()), "issues_before_budget": before,
           "variability_median": _median(rows.variability)}
    return est, seen, log


def sft_flags(rows: RowDynamics, ids: list[str], *, cut: float | str,
              max_flagged: int | float | None) -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:
    """(late loss per row id in ``ids`` (NaN: not seen), hard_to_fit mask, log)."""
    index = {r: i for i, r in enumerate(rows.ids)}
    at = np.array([index.get(r, -1) for r in ids], dtype=np.int64)
    loss = np.where(at >= 0, rows.late_loss[np.clip(at, 0, None)] if len(rows.ids) else np.nan, np.nan)
    cut_value = robust_cut(loss) if cut == "auto" else float(cut)
    flag = np.isfinite(loss) & (loss > cut_value)
    budget = budget_count(max_flagged, int(np.isfinite(loss).sum()))
    flag = limit_flags(flag, -np.nan_to_num(loss, nan=-np.inf), budget)
    log = {"score": "late_loss", "cut": f"median + {HARD_TO_FIT_Z:g} robust SD" if cut == "auto" else "given",
           "cut_value": round(cut_value, 6) if math.isfinite(cut_value) else None,
           "rows_seen": int(np.isfinite(loss).sum()), "hard_to_fit": int(flag.sum()),
           "loss_median": _median(loss)}
    return loss, flag, log


def _median(values: np.ndarray) -> float | None:
    v = values[np.isfinite(values)]
    return round(float(np.median(v)), 6) if v.size else None


def check_run(run: str) -> dict[str, Any]:
    """The run's dynamics metadata, or a ValueError naming what is wrong (for the config check)."""
    try:
        return read_dynamics(run)[1]
    except DynamicsFileError as exc:
        raise ValueError(str(exc)) from None
