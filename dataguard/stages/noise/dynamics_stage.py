"""The noise stage's ``inputs: dynamics`` path: fit, apply (sft) and describe from a run's dynamics.

Kept apart from `dataguard.stages.noise.stage` so the stage keeps one job per method; the scores
and cuts live in `dataguard.stages.noise.dynamics`. Classify runs produce the stage's usual columns
(``label_quality`` is the chosen score: AUM or confidence), so ``drop`` / ``relabel`` /
``max_flagged`` / ``min_rows_per_class`` behave as with cross-validated probabilities. Sft runs
produce ``dynamics_loss`` (the late mean assistant-token loss) and ``hard_to_fit``; ``drop``
rejects with reason ``hard_to_fit``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from dataguard.records import reject_rows, set_column
from dataguard.stage import Outcome
from dataguard.stages.noise import dynamics as D
from dataguard.stages.noise import report
from dataguard.stages.noise.given import class_list
from dataguard.stages.noise.verdicts import Verdicts
from dataguard.tally import Tally

HARD_TO_FIT = "hard_to_fit"
SFT_COLUMNS = {"dynamics_loss": pa.float32(), HARD_TO_FIT: pa.bool_()}


def fit(stage: Any, summaries: Sequence[Any]) -> None:
    """Set the stage's fitted verdicts from the run's dynamics (classify or sft)."""
    ids = [i for s in summaries for i in s.ids]
    if len(set(ids)) != len(ids):
        raise ValueError("noise stage: row ids are not unique; cannot look rows up in apply")
    runs = [D.load(run) for run in D.run_list(stage.dynamics)]
    if stage.dyn_task == "sft":
        rows = runs[0][0]  # check_together allows one sft run
        stage._ids = pa.array(ids, pa.string())
        loss, flag, stage.dynamics_log = D.sft_flags(rows, ids, cut=stage.dynamics_cut, max_flagged=stage.max_flagged)
        D.require_judged(loss, D.run_list(stage.dynamics)[0])
        stage._loss = pa.array(loss.astype(np.float32), pa.float32(), mask=~np.isfinite(loss))
        stage._issue = pa.array(flag, pa.bool_())
        stage._loss_np = loss
        stage.report = {"n": len(ids), "n_issues": int(flag.sum())}
        stage.fitted = True
        return
    labels = [lab for s in summaries for lab in s.labels]
    classes = class_list(labels, stage.classes, None)
    index = {c: i for i, c in enumerate(classes)}
    y = np.fromiter((index[lab] for lab in labels), dtype=np.int64, count=len(labels))
    views = [D.run_view(rows, set(meta["threshold_rows"]), ids, score=stage.dynamics_score, cut=stage.dynamics_cut,
                        seed=stage.seed, given=labels) for rows, meta in runs]
    chance = D.chance_agreement(labels)
    for run, view in zip(D.run_list(stage.dynamics), views, strict=True):
        D.require_judged(view.quality, run, view.other_label, chance)
    est, seen, log = D.classify_estimate(views, y, classes, min_rows_per_class=stage.min_rows_per_class,
                                         max_flagged=stage.max_flagged)
    stage.dynamics_log = {"score": stage.dynamics_score, **log,
                          "variability_median": D.median_or_none(runs[0][0].variability)}
    if stage.max_flagged is not None:
        stage.budget_log = {"max_flagged": stage.max_flagged, "issues_after": int(est.is_issue.sum()),
                            "issues_before": stage.dynamics_log["issues_before_budget"]}
    relabel = est.is_issue & (est.suggested != y) & (est.suggested_prob >= stage.relabel_min_confidence)
    stage._classes = classes
    stage._verdicts = Verdicts(
        ids=pa.array(ids, pa.string()), given=pa.array(labels, pa.string()),
        quality=pa.array(est.quality, pa.float32(), mask=~np.isfinite(est.quality)),
        suggested=pa.array(np.asarray(classes, dtype=object)[est.suggested] if len(y) else [], pa.string(),
                           mask=~seen),  # a row the run never drew is not judged: nulls
        suggested_prob=est.suggested_prob, issue=pa.array(est.is_issue, pa.bool_(), mask=~seen),
        relabel=pa.array(relabel, pa.bool_()))
    stage._probs = None
    stage.report = report.fit_report(y, est, relabel, len(classes), stage.action)
    stage.fitted = True


def rule_text(stage: Any) -> str:
    """The flagging rule in words, for rejected rows' detail."""
    log = getattr(stage, "dynamics_log", {}) or {}
    return f"training dynamics: {D.SCORE_NAMES[stage.dynamics_score]} < {log.get('cut_value')} ({log.get('cut')} cut)"


def apply_sft(stage: Any, batch: pa.Table) -> Outcome:
    """``dynamics_loss`` and ``hard_to_fit`` for every row the run saw; ``drop`` rejects the flagged."""
    n = batch.num_rows
    pos = pc.index_in(batch.column("id"), value_set=stage._ids) if n else pa.array([], pa.int32())
    loss = stage._loss.take(pos)
    flag = stage._issue.take(pos)
    out = set_column(batch, "dynamics_loss", loss)
    out = set_column(out, HARD_TO_FIT, flag)
    flag_np = pc.fill_null(flag, False).to_numpy(zero_copy_only=False).astype(bool)
    stats = Tally(counts=Counter(rows_in=n, seen=int(pc.sum(pc.is_valid(loss)).as_py() or 0),
                                 hard_to_fit=int(flag_np.sum())))
    if stage.action == "drop" and flag_np.any():
        cut = stage.dynamics_log.get("cut_value")
        values = loss.to_numpy(zero_copy_only=False)[flag_np]
        details = [f"late mean assistant-token loss {v:.4f} stays above {cut} ({stage.dynamics_log['cut']}) "
                   "in the training run's dynamics" for v in values]
        stats.add("dropped", int(flag_np.sum()))
        return Outcome(kept=out.filter(pa.array(~flag_np)), stats=stats,
                       rejected=reject_rows(out, flag_np, stage.name, HARD_TO_FIT, details))
    return Outcome(kept=out, stats=stats)


def describe_sft(stage: Any) -> dict[str, Any]:
    """The audit section of an sft run's dynamics: the late-loss histogram with the cut."""
    title = "Hard to fit (training dynamics)"
    if not stage.fitted:
        return {"title": title, "summary": {"fitted": False}, "blocks": []}
    loss = stage._loss_np[np.isfinite(stage._loss_np)]
    summary = {"dynamics": stage.dynamics, **stage.dynamics_log, "action": stage.action,
               "dropped": stage.tally.get("dropped")}
    blocks: list[dict[str, Any]] = []
    if loss.size:
        edges = np.histogram_bin_edges(loss, bins=30)
        counts, _ = np.histogram(loss, bins=edges)
        cut = stage.dynamics_log.get("cut_value")
        marks = [{"label": "cut", "value": cut}] if cut is not None else []
        blocks.append({"type": "histogram", "title": "Late mean assistant-token loss per row",
                       "edges": [round(float(e), 6) for e in edges], "series": {"rows": counts.tolist()},
                       "markers": marks, "x_label": "loss per token"})
    return {"title": title, "summary": summary, "blocks": blocks}
