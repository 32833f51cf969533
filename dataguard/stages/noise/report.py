"""What the noise stage shows in the audit and the manifest: fit statistics and describe().

Split from the stage so the stage keeps one job (summarize / fit / apply). Everything here
is small and JSON-able: per-class counts, the noise matrix (at most 25 classes drawn), the
most frequent given -> suggested pairs, and how the options acted (rounds, the flag budget,
the features ``auto`` chose and why).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dataguard.stages.noise.confident import NoiseEstimate
from dataguard.stages.noise.dynamics import SCORE_NAMES, run_list

MAX_MATRIX_CLASSES = 25


def fit_report(y: np.ndarray, est: NoiseEstimate, relabel: np.ndarray, k: int, action: str) -> dict[str, Any]:
    """Everything describe() shows that depends on fit only (small, JSON-able)."""
    n = len(y)
    given = np.bincount(y, minlength=k)
    issues = np.bincount(y[est.is_issue], minlength=k)
    if action == "drop":
        after = given - issues
    elif action == "relabel":
        new = np.where(relabel, est.suggested, y)
        after = np.bincount(new, minlength=k)
    else:
        after = given
    pairs: dict[tuple[int, int], int] = {}
    for g, s in zip(y[est.is_issue], est.suggested[est.is_issue], strict=True):
        pairs[(int(g), int(s))] = pairs.get((int(g), int(s)), 0) + 1
    top_pairs = sorted(pairs.items(), key=lambda kv: (-kv[1], kv[0]))[:20]
    return {"n": n, "given": given.tolist(), "issues": issues.tolist(), "after": after.tolist(),
            "accuracy": float((est.suggested == y).mean()) if n else None,
            "n_issues": int(est.is_issue.sum()), "n_relabel": int(relabel.sum()),
            "thresholds": est.thresholds.tolist(), "noise_matrix": est.noise_matrix.tolist(),
            "joint_offdiag": int(est.confident_joint.sum() - np.trace(est.confident_joint)),
            "joint_total": int(est.confident_joint.sum()), "pairs": top_pairs}


def rule_text(method: str, filter_by: str, threshold: float, second_view: str | None = None) -> str:
    """The flagging rule in words, for rejected rows' detail (``second_view``: the training
    dynamics score that ranked the rows with the out-of-fold margin)."""
    if method == "threshold":
        rule = f"p(given) < {threshold:g}"
    elif method == "confidence":
        rule = f"max p > {threshold:g} on another class"
    else:
        rule = f"confident learning ({filter_by})"
    if second_view is None:
        return rule
    return f"{rule} count, rows ranked by out-of-fold margin and training {SCORE_NAMES[second_view]} together"


def summary(stage: Any, r: dict[str, Any], k: int) -> dict[str, Any]:
    """The key figures; new keys appear only when their option is used (old manifests stay identical)."""
    clf = stage.classifier if isinstance(stage.classifier, str) else type(stage.classifier).__name__
    features = stage.features_used or stage.features
    out: dict[str, Any] = {
        "rows_labelled": r["n"], "classes": k, "method": stage.method,
        "filter_by": stage.filter_by if stage.method == "cleanlab" else None,
        "threshold": stage.threshold if stage.method != "cleanlab" else None,
        "probabilities": "given" if stage.probabilities else f"{stage.folds}-fold CV, {features}, {clf}",
        "C": stage.chosen_C,
        "rank_by": stage.rank_by,
        "cv_accuracy_vs_given": None if r["accuracy"] is None else round(r["accuracy"], 4),
        "label_issues": r["n_issues"],
        "issue_rate": round(r["n_issues"] / r["n"], 4) if r["n"] else 0.0,
        "estimated_noise_rate": round(r["joint_offdiag"] / r["joint_total"], 4) if r["joint_total"] else 0.0,
        "action": stage.action, "dropped": stage.tally.get("dropped"), "relabelled": stage.tally.get("relabelled"),
    }
    if getattr(stage, "inputs", None) == "dynamics":
        out["probabilities"] = f"training dynamics of {', '.join(run_list(stage.dynamics))}"
        out["dynamics"] = stage.dynamics_log
        out["method"] = stage.dynamics_score
    elif getattr(stage, "dynamics", None) is not None:
        out["second_view"] = stage.dynamics_log
    if stage.probabilities and stage.inputs == "logits":
        out["inputs"] = f"logits (softmax, temperature {stage.temperature:g})"
    if stage.features == "auto" and stage.auto_choice:
        out["features_auto"] = stage.auto_choice
    if stage.rounds > 1:
        out["rounds"] = stage.round_log
    if stage.max_flagged is not None:
        out["budget"] = stage.budget_log
    return out


def _matrix_block(classes: list[str], nm: np.ndarray) -> dict[str, Any]:
    k = len(classes)
    if k > MAX_MATRIX_CLASSES:  # keep the classes whose labels are noisiest
        off = 1.0 - np.diag(nm)
        keep = np.sort(np.argsort(-off, kind="stable")[:MAX_MATRIX_CLASSES])
        title = f"Noise transition P(given | true), {MAX_MATRIX_CLASSES} noisiest of {k} classes"
    else:
        keep = np.arange(k)
        title = "Noise transition P(given | true)"
    return {"type": "matrix", "title": title, "row_labels": [classes[i] for i in keep],
            "col_labels": [classes[i] for i in keep], "values": np.round(nm[np.ix_(keep, keep)], 4).tolist(),
            "row_title": "given", "col_title": "true"}


def describe(stage: Any) -> dict[str, Any]:
    """The audit section: summary, class bars, noise matrix, per-class table, pairs, examples."""
    title = "Label noise (confident learning)"
    if not stage.fitted:
        return {"title": title, "summary": {"fitted": False}, "blocks": []}
    r = stage.report
    classes = stage.classes_
    k = len(classes)
    blocks: list[dict[str, Any]] = [
        {"type": "bar", "title": "Class distribution", "labels": classes,
         "series": {"given": r["given"], "after": r["after"]}},
    ]
    if k:
        blocks.append(_matrix_block(classes, np.asarray(r["noise_matrix"])))
    order = sorted(range(k), key=lambda i: (-r["issues"][i], classes[i]))
    blocks.append({"type": "table", "title": "Label issues per given class",
                   "columns": ["class", "rows", "issues", "issue rate", "confident threshold"],
                   "rows": [[classes[i], r["given"][i], r["issues"][i],
                             round(r["issues"][i] / r["given"][i], 4) if r["given"][i] else 0.0,
                             round(r["thresholds"][i], 4)] for i in order[:100]]})
    if stage.rounds > 1 and stage.round_log:
        blocks.append({"type": "table", "title": "Iterative re-estimation (each round refits on the rows the "
                                                 "previous one kept)",
                       "columns": ["round", "rows trained on", "issues", "cv accuracy vs given"],
                       "rows": [[e["round"], e["trained_on"], e["issues"], e["cv_accuracy"]]
                                for e in stage.round_log]})
    if r["pairs"]:
        blocks.append({"type": "table", "title": "Most frequent issues (given -> suggested)",
                       "columns": ["given", "suggested", "rows"],
                       "rows": [[classes[g], classes[s], c] for (g, s), c in r["pairs"]]})
    if stage.tally.items("examples"):
        blocks.append({"type": "examples", "title": "Worst labels (lowest label quality)",
                       "items": [{key: e[key] for key in ("id", "label", "text", "note")}
                                 for e in stage.tally.items("examples")]})
    return {"title": title, "summary": summary(stage, r, k), "blocks": blocks}

