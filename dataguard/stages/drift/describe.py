"""The drift stage's report: summary, per-column table (PSI, KL, after correction), labels, MMD.

Each function reads one `Reported` (None before fit), which the stage builds from what it holds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from dataguard.stages.drift.measure import label_report, rounded
from dataguard.stages.drift.params import DriftSettings
from dataguard.stages.drift.reference import ReferenceState
from dataguard.stages.drift.state import Fitted
from dataguard.stats.kl import kl_from_counts
from dataguard.stats.psi import category_keys, psi_from_counts, verdict
from dataguard.tally import Tally

MAX_BAR_CATEGORIES = 30
TITLE = "Distribution shift (PSI)"


@dataclass(frozen=True, eq=False)
class Reported:
    """What the report reads of a fitted stage."""

    s: DriftSettings
    ref: ReferenceState
    fit: Fitted
    after: dict[str, Any] | None  # what apply emitted (`emitted.after`); None until absorb
    tally: Tally


def _after_pairs(r: Reported) -> dict[str, tuple[Any, Any]]:
    """(reference counts, emitted counts) per column, aligned."""
    after = r.after
    assert after is not None
    pairs: dict[str, tuple[Any, Any]] = {c: (r.ref.counts[c], after["numeric"][c]) for c in r.s.columns}
    for c in r.s.categorical:
        keys = category_keys(r.ref.cats[c], after["categorical"][c], r.fit.training.cats[c])
        pairs[c] = ([r.ref.cats[c].get(k, 0) for k in keys], [after["categorical"][c].get(k, 0) for k in keys])
    return pairs


def psi_after(r: Reported | None) -> dict[str, float]:
    """PSI of what apply emitted (weighted by ``drift_weight``), per column."""
    if r is None or r.after is None:
        return {}
    return {c: psi_from_counts(ref, act, r.s.epsilon) for c, (ref, act) in _after_pairs(r).items()}


def kl_after(r: Reported) -> dict[str, float]:
    if r.after is None:
        return {}
    return {c: kl_from_counts(ref, act, r.s.epsilon) for c, (ref, act) in _after_pairs(r).items()}


def text_verdict(r: Reported | None) -> str:
    if r is None or r.fit.samples.text_auc is None:
        return "unknown"
    return verdict(r.fit.samples.text_auc, r.s.auc_thresholds)


def label_psi(r: Reported | None) -> dict[str, Any] | None:
    """Label distribution before/after correction (PSI, classes kept); None without labels."""
    if r is None or r.fit.training.labels is None:
        return None
    after = r.after.get("labels") if r.after is not None else None
    return label_report(str(r.s.label_column), r.fit.training.labels, after, r.ref.labels, r.s.epsilon)


def _numeric_block(r: Reported, c: str) -> dict[str, Any]:
    edges, ref_range, train_range = r.ref.edges[c], r.ref.ranges[c], r.fit.training.ranges[c]
    lo = min(ref_range[0], (train_range or ref_range)[0])
    hi = max(ref_range[1], (train_range or ref_range)[1])
    full = [lo, *[float(e) for e in edges], hi]
    nb = len(edges) + 1

    def frac(counts: np.ndarray) -> list[float]:
        tot = counts.sum()
        return [round(float(x / tot), 6) if tot else 0.0 for x in counts[:nb]]

    series = {"reference": frac(r.ref.counts[c]), "training": frac(r.fit.training.counts[c])}
    if r.after is not None and r.s.correct:
        series["after correction"] = frac(r.after["numeric"][c])
    res = r.fit.results[c]
    return {"type": "histogram", "title": f"{c}: share per reference quantile bin (PSI "
            f"{res['psi']:.4f}, {res['verdict']})",
            "edges": full, "series": series, "x_label": c}


def _categorical_block(r: Reported, c: str) -> dict[str, Any]:
    ref_s, tr_s = r.ref.cats[c], r.fit.training.cats[c]
    rt, tt = sum(ref_s.values()) or 1, sum(tr_s.values()) or 1
    keys = category_keys(ref_s, tr_s)
    keys = sorted(keys, key=lambda k: -abs(tr_s.get(k, 0) / tt - ref_s.get(k, 0) / rt))[:MAX_BAR_CATEGORIES]
    series = {"reference": [round(ref_s.get(k, 0) / rt, 6) for k in keys],
              "training": [round(tr_s.get(k, 0) / tt, 6) for k in keys]}
    if r.after is not None and r.s.correct:
        a = r.after["categorical"][c]
        at = sum(a.values()) or 1
        series["after correction"] = [round(a.get(k, 0) / at, 6) for k in keys]
    res = r.fit.results[c]
    return {"type": "bar", "title": f"{c}: shares (largest differences first, PSI "
            f"{res['psi']:.4f}, {res['verdict']})",
            "labels": ["(null)" if k is None else str(k) for k in keys], "series": series}


def _column_table(r: Reported, after: dict[str, float]) -> dict[str, Any]:
    rows = []
    cor = r.fit.correction
    for c, res in r.fit.results.items():
        a = after.get(c) if r.s.correct else None
        rows.append([c, res["kind"], rounded(res["psi"]), res["verdict"], rounded(res["kl"]), res["kl_verdict"],
                     None if a is None else rounded(a), None if a is None else verdict(a, r.s.thresholds),
                     c in cor.ratios or c in cor.cat_ratios])
    return {"type": "table", "title": "PSI and KL per column (reference = expected)",
            "columns": ["column", "kind", "psi", "verdict", "kl", "kl_verdict", "psi_after", "verdict_after",
                        "corrected"], "rows": rows}


def _mmd_block(r: Reported) -> dict[str, Any]:
    rows = [[space, m["mmd2"], m["p_value"], m["verdict"], m["n_training"], m["n_reference"]]
            for space, m in r.fit.samples.mmd.items() if m is not None]
    return {"type": "table", "title": "MMD two-sample test (RBF kernel, permutation p-value)",
            "columns": ["features", "mmd2", "p_value", "verdict", "n_training", "n_reference"], "rows": rows}


def _text_block(r: Reported) -> dict[str, Any]:
    text_auc = r.fit.samples.text_auc
    auc = "n/a" if text_auc is None else f"{text_auc:.4f}"
    n1, n2 = r.fit.samples.text_sizes
    # Mann-Whitney standard deviation of the AUC of a random scorer: how far from 0.5
    # sampling noise alone moves it (out-of-fold AUCs vary somewhat more).
    null_sd = ((n1 + n2 + 1) / (12 * n1 * n2)) ** 0.5 if n1 and n2 else float("nan")
    return {"type": "text", "title": "Text domain classifier", "text": (
        f"Logistic regression on MiniLM embeddings of {n1} training and {n2} reference "
        f"{r.s.text} texts, 5-fold out-of-fold ROC AUC = {auc} ({text_verdict(r)}; thresholds "
        f"{list(r.s.auc_thresholds)}; 0.5 = indistinguishable, sampling noise ~ +/-{null_sd:.3f} per sd; "
        f"use text_sample >= 500 for a steady estimate).")}


def _method_block(s: DriftSettings) -> dict[str, Any]:
    text = (f"PSI = sum (a - e) ln(a / e) over {s.bins} reference quantile bins (numeric) or categories; "
            f"empty shares replaced by epsilon = {s.epsilon}; verdicts: < {s.thresholds[0]} stable, "
            f"< {s.thresholds[1]} moderate, else major. KL(training || reference) on the same bins "
            f"(renormalised): < {s.kl_thresholds[0]} stable, < {s.kl_thresholds[1]} moderate, else major.")
    if s.mmd_sample:
        text += (f" MMD: RBF kernel (median heuristic) on up to {s.mmd_sample} sampled rows per side, "
                 f"{s.mmd_permutations} seeded permutations; p < {s.mmd_thresholds[0]} major, "
                 f"< {s.mmd_thresholds[1]} moderate, else stable.")
    return {"type": "text", "title": "Method", "text": text}


def describe(r: Reported | None) -> dict[str, Any]:
    if r is None:
        return {"title": TITLE, "summary": {"fitted": False}, "blocks": []}
    s, results, cor, samples = r.s, r.fit.results, r.fit.correction, r.fit.samples
    after = psi_after(r)
    major = [c for c, res in results.items() if res["verdict"] == "major"]
    labels = label_psi(r)
    summary: dict[str, Any] = {
        "training_rows": r.fit.training.rows, "reference_rows": r.ref.rows,
        "weight_column": s.weight_column,
        "max_psi": rounded(max((res["psi"] for res in results.values() if res["psi"] == res["psi"]),
                               default=float("nan"))),
        "columns_major": len(major),
        "columns_moderate": sum(res["verdict"] == "moderate" for res in results.values()),
        "max_kl": rounded(max((res["kl"] for res in results.values() if res["kl"] == res["kl"]),
                              default=float("nan"))),
        "text_auc": None if samples.text_auc is None else round(samples.text_auc, 4),
        "text_verdict": text_verdict(r) if s.text else None,
        "mmd_verdicts": {space: (m["verdict"] if m else "unknown") for space, m in samples.mmd.items()},
        "correction": s.correct,
        "corrected_column": cor.column if s.correct and not cor.note else None,
        "stratified_by": s.label_column if cor.scales else None,
        "rows_resampled_out": r.tally.get("resampled_out"),
        "rows_repeated": r.tally.get("repeated"),
    }
    if labels is not None:
        summary["label_psi"] = labels
    blocks: list[dict[str, Any]] = [_column_table(r, after)]
    if cor.note:
        blocks.append({"type": "text", "title": "Correction", "text": cor.note})
    if labels is not None and s.correct:
        blocks.append({"type": "table", "title": f"Label distribution ({labels['column']}) before and after correction",
                       "columns": ["measure", "value"], "rows": [[k, str(v) if isinstance(v, list) else v]
                                                                 for k, v in labels.items() if k != "column"]})
    blocks += [_numeric_block(r, c) for c in s.columns]
    blocks += [_categorical_block(r, c) for c in s.categorical]
    if any(m is not None for m in samples.mmd.values()):
        blocks.append(_mmd_block(r))
    if s.text:
        blocks.append(_text_block(r))
    blocks.append(_method_block(s))
    kl_a = kl_after(r)
    return {"title": TITLE, "summary": summary, "blocks": blocks,
            "psi": {c: {"psi": rounded(res["psi"], 12), "verdict": res["verdict"],
                        "psi_after": rounded(after.get(c), 12), "kl": rounded(res["kl"], 12),
                        "kl_verdict": res["kl_verdict"], "kl_after": rounded(kl_a.get(c), 12)}
                    for c, res in results.items()},
            "mmd": samples.mmd}
