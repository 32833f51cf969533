"""Rows flagged from a training run's dynamics (the noise stage's ``inputs: dynamics``).

The runner writes ``RUN/dynamics.arrow`` (`dataguard.train.dynamics.file`): per row and pass,
the gold-label probability, the margin (gold logit minus the largest other) and the loss.
Two per-row scores come from it, averaged over the passes:

- ``aum``: the area under the margin (Pleiss et al. 2020). A mislabelled row keeps pulling
  towards its true class, so its margin stays negative while correct rows' margins grow.
- ``cartography``: the confidence of dataset cartography (Swayamdipta et al. 2020), the
  mean gold probability; its region "hard to learn" (low confidence, low variability) is
  where their mislabelled rows sit. Variability (the std over passes) is reported too.

The cut (``dynamics_cut: auto``) is learned, not guessed. A run trained with ``threshold_rows``
(Pleiss et al.: a random 1/(c+1) of the rows under an extra, fake class, which the model can
only memorise, as it memorises a wrong label; `dataguard.train.data.threshold_rows`) gives
the 99th percentile of those rows' score as the cut; the run does not judge them, so
``dynamics: [RUN_1, RUN_2]`` (threshold sets 1 and 2) judges every row: its score is the mean
over the runs where it kept its label, each measured from that run's own cut. A run without
threshold rows learns the cut from a two-component Gaussian mixture on the score, flagging
the rows the lower component owns (posterior > 0.5, below the upper component's mean). A
number is taken as the cut itself. ``max_flagged`` keeps the worst rows by the score, and
``min_rows_per_class`` gives back the least suspicious rows of a class that would fall below
it, exactly as for cross-validated probabilities (`dataguard.stages.noise.confident`).

For ``sft`` runs each row gets its mean assistant-token loss over the last half of the
passes (a row the model fits late is not an outlier), and a row whose loss stays above the
median + 3.5 robust standard deviations (1.4826 MAD) is flagged ``hard_to_fit``: the
candidates for swapped responses, garbage and wrong-language rows other stages missed.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from dataguard.stage import StageDataError
from dataguard.stages.noise.confident import NoiseEstimate, budget_count, limit_flags, protect_rare_classes
from dataguard.train.dynamics.file import DynamicsFileError, dynamics_path, read_dynamics

SCORES = ("aum", "cartography")
SCORE_NAMES = {"aum": "AUM", "cartography": "confidence"}  # how rules and reports name each score
HARD_TO_FIT_Z = 3.5
THRESHOLD_PERCENTILE = 99.0  # Pleiss et al.: the threshold rows' 99th percentile AUM


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
    label: list[str | None]      # the label it trained under (the last pass's; None: not recorded)


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
    trained = table.column("label").to_pylist()
    out: dict[str, list[Any]] = {k: [] for k in ("ids", "passes", "aum", "confidence", "variability",
                                                 "correctness", "late_loss", "predicted", "share", "label")}
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
        out["label"].append(trained[b - 1])
    return RowDynamics(out["ids"], np.asarray(out["passes"], np.int64), np.asarray(out["aum"]),
                       np.asarray(out["confidence"]), np.asarray(out["variability"]),
                       np.asarray(out["correctness"]), np.asarray(out["late_loss"]), out["predicted"],
                       np.asarray(out["share"]), out["label"])


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


@dataclasses.dataclass
class RunView:
    """One run's verdict inputs, lined up with the labelled rows being judged."""

    quality: np.ndarray          # the score; NaN where this run does not judge the row
    predicted: list[str | None]  # its most frequent prediction (None: not judged)
    share: np.ndarray            # the share of passes that predicted it
    cut: float                   # the cut this run learned (or was given)
    cut_kind: str                # "threshold rows", "mixture" or "given"
    threshold_rows: int          # rows it trained under the fake class
    other_label: int = 0         # rows it drew under another label than theirs now: not judged


def run_view(rows: RowDynamics, threshold: set[str], ids: list[str], *, score: str, cut: float | str,
             seed: int = 0, given: Sequence[str] | None = None) -> RunView:
    """``rows`` lined up with ``ids``. A row the run never drew, or trained under the fake
    class (``threshold``), is not judged by this run; nor is one whose ``given`` label is not
    the label the run recorded for it (its margin scores another label: the row was edited or
    relabelled since, or the run trained on another file with the same name). With ``cut:
    auto`` the cut is the 99th percentile of the threshold rows' score when the run has them
    (Pleiss et al.), else the two-component mixture's."""
    index = {r: i for i, r in enumerate(rows.ids)}
    at = np.array([-1 if r in threshold else index.get(r, -1) for r in ids], dtype=np.int64)
    other = np.zeros(len(ids), dtype=bool)
    if given is not None:
        for j in np.flatnonzero(at >= 0):
            trained = rows.label[at[j]]
            other[j] = trained is not None and trained != given[j]
        at[other] = -1
    judged = at >= 0
    values = rows.aum if score == "aum" else rows.confidence
    safe = np.clip(at, 0, None)
    quality = np.where(judged, values[safe] if len(rows.ids) else np.nan, np.nan)
    fake = np.array([r in threshold for r in rows.ids], dtype=bool)
    if cut != "auto":
        value, kind = float(cut), "given"
    elif fake.any():
        value, kind = float(np.percentile(values[fake], THRESHOLD_PERCENTILE)), "threshold rows"
    else:
        value, kind = mixture_cut(quality[judged], seed), "mixture"
    predicted = [rows.predicted[a] if a >= 0 else None for a in at]
    share = np.where(judged, rows.predicted_share[safe] if len(rows.ids) else 0.0, 0.0)
    return RunView(quality, predicted, share, value, kind, int(fake.sum()), int(other.sum()))


def classify_estimate(views: list[RunView], y: np.ndarray, classes: list[str], *, min_rows_per_class: int,
                      max_flagged: int | float | None) -> tuple[NoiseEstimate, np.ndarray, dict[str, Any]]:
    """(estimate, which labelled rows some run judged, log) for the labelled rows (label ids
    ``y``) the views are lined up with. A row's score is the mean, over the runs that judge it,
    of its score minus that run's cut, plus the runs' mean cut (the cut it is flagged below);
    a row no run judges is not flagged (quality NaN)."""
    # a run whose mixture found one cluster (cut -inf) judges nothing, unless no run has a cut
    usable = [v for v in views if math.isfinite(v.cut)] or views[:1]
    cut_value = float(np.mean([v.cut for v in usable]))
    # each run's score measured from its own cut, then put on the mean cut's scale: one run
    # gives its score and cut unchanged; several judge a row by how far it sits below theirs
    stack = np.vstack([v.quality - (v.cut - cut_value if math.isfinite(v.cut) else 0.0) for v in usable])
    judged_by = np.isfinite(stack).sum(axis=0)
    seen = judged_by > 0
    quality = np.where(seen, np.where(np.isfinite(stack), stack, 0.0).sum(axis=0) / np.maximum(judged_by, 1), np.nan)
    issue = seen & (quality < cut_value)
    issue = protect_rare_classes(y, issue, np.nan_to_num(quality, nan=np.inf), min_rows_per_class)
    before = int(issue.sum())
    issue = limit_flags(issue, np.nan_to_num(quality, nan=np.inf), budget_count(max_flagged, len(y)))
    cls = {c: i for i, c in enumerate(classes)}
    suggested = y.copy()
    share = np.zeros(len(y))
    for v in reversed(usable):  # the first run that judges a row has the last word
        for j in np.flatnonzero(np.isfinite(v.quality)):
            p = v.predicted[j]
            known = p is not None and p in cls  # not the fake class
            suggested[j] = cls[p] if known else y[j]
            share[j] = v.share[j] if known else 0.0
    k = len(classes)
    joint = np.zeros((k, k), dtype=np.int64)
    np.add.at(joint, (y[seen], suggested[seen]), 1)
    cols = joint.sum(axis=0, keepdims=True)
    noise = np.divide(joint, cols, out=np.zeros((k, k)), where=cols > 0)
    est = NoiseEstimate(is_issue=issue, quality=quality.astype(np.float32), suggested=suggested,
                        suggested_prob=share.astype(np.float64), thresholds=np.full(k, cut_value),
                        confident_joint=joint, noise_matrix=noise)
    kinds = sorted({v.cut_kind for v in usable})
    log = {"cut": " + ".join(kinds) if kinds else "none", "cut_value": round(cut_value, 6)
           if math.isfinite(cut_value) else None, "runs": len(views),
           "rows_other_label": sum(v.other_label for v in views),
           "threshold_rows": sum(v.threshold_rows for v in views), "rows_seen": int(seen.sum()),
           "rows_unseen": int((~seen).sum()), "below_cut": int((seen & (quality < cut_value)).sum()),
           "issues_before_budget": before}
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
           "loss_median": median_or_none(loss)}
    return loss, flag, log


def median_or_none(values: np.ndarray) -> float | None:
    v = values[np.isfinite(values)]
    return round(float(np.median(v)), 6) if v.size else None


def require_judged(scores: np.ndarray, run: str, other_label: int = 0, chance: float = 0.0) -> None:
    """Refuse a run that judged none of the rows (``scores``: one per row, NaN where the run
    did not judge it): its row ids are not these shards' (a run of other data, or shards
    rebuilt with different ids), and flagging nothing would read as clean data in the audit.

    Refuse it too when the rows it shares ids with agree with the label it trained them under
    no better than halfway between chance (``chance``: the share two random rows of these
    labels agree, the sum of the squared class shares) and full agreement: ids are
    ``file:position``, so a run of another file of the same name matches every id, and agrees
    only by chance, while a relabelling stage or a hand edit changes a few labels
    (``other_label``: the rows trained under another label). Each run is checked alone: one
    wrong run in a list would otherwise go unnoticed beside a right one."""
    judged = int(np.isfinite(scores).sum())
    if len(scores) and not judged and not other_label:
        raise StageDataError(f"the training run {run} judged none of the {len(scores)} rows (no row id matches); "
                             "was it trained on these shards?")
    shared = judged + other_label
    if other_label and judged / shared < (1.0 + chance) / 2.0:
        raise StageDataError(f"the training run {run} trained {other_label} of the {shared} rows whose ids it "
                             f"shares under another label than theirs now ({judged / shared:.0%} agree, "
                             f"{chance:.0%} by chance); was it trained on these shards (row ids are file:position, "
                             "so another file of the same name matches)?")


def chance_agreement(labels: Sequence[str]) -> float:
    """The share of agreeing labels between two rows drawn at random from ``labels``."""
    if not len(labels):
        return 0.0
    _, counts = np.unique(np.asarray(labels, dtype=object).astype(str), return_counts=True)
    share = counts / counts.sum()
    return float(np.sum(share ** 2))


def labels_recorded(run: str) -> bool:
    """Whether a run's dynamics name the label each row trained under (a classify run of
    ``dataguard.dynamics/2``), so the rows themselves tell another file of the same name apart."""
    from dataguard.train.dynamics.file import FORMAT, read_metadata

    try:
        meta = read_metadata(run)
    except DynamicsFileError:
        return False
    return meta.get("task") == "classify" and meta.get("format") == FORMAT


def run_list(dynamics: Any) -> list[str]:
    """``dynamics: RUN`` or ``dynamics: [RUN, ...]`` as a list of paths."""
    if dynamics is None:
        return []
    return [str(dynamics)] if isinstance(dynamics, str | os.PathLike) else [str(d) for d in dynamics]


def check_run(dynamics: Any) -> dict[str, Any]:
    """The first run's dynamics metadata, after checking every run's file and that they agree
    (one task; several runs only for classify); a ValueError naming what is wrong."""
    metas, files = [], {}
    for run in run_list(dynamics):
        try:
            metas.append(read_dynamics(run)[1])
        except DynamicsFileError as exc:
            raise ValueError(str(exc)) from None
        same = files.setdefault(dynamics_path(run).resolve(), run)
        if same != run:
            raise ValueError(f"{run} and {same} are the same run; give each run once")
    for i, a in enumerate(metas):
        for b in metas[i + 1:]:
            shared = set(a["threshold_rows"]) & set(b["threshold_rows"])
            if shared:
                raise ValueError(f"two runs trained {len(shared)} of the same rows under the fake class, which "
                                 "neither can judge; train threshold_rows 1 and 2 with one seed")
    tasks = {m["task"] for m in metas}
    if len(tasks) > 1:
        raise ValueError(f"the runs are of different tasks ({', '.join(sorted(tasks))}); give runs of one task")
    if len(metas) > 1 and "classify" not in tasks:
        raise ValueError("several runs apply to classify runs (e.g. threshold_rows 1 and 2); give one sft run")
    return metas[0]
