"""The drift stage's report: summary, per-column table (PSI, KL, after correction), labels, MMD."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from dataguard.stages.drift.measure import rounded
from dataguard.stats.kl import kl_from_counts
from dataguard.stats.psi import category_keys, psi_from_counts, verdict

if TYPE_CHECKING:
    from dataguard.stages.drift.stage import DriftStage

MAX_BAR_CATEGORIES = 30
TITLE = "Distribution shift (PSI)"


def _after_pairs(st: DriftStage) -> dict[str, tuple[Any, Any]]:
    """(reference counts, emitted counts) per column, aligned."""
    after = st._after
    assert after is not None
    pairs: dict[str, tuple[Any, Any]] = {c: (st.ref_counts[c], after["numeric"][c]) for c in st.columns}
    for c in st.categorical:
        keys = category_keys(st.ref_cats[c], after["categorical"][c], st.train_cats[c])
        pairs[c] = ([st.ref_cats[c].get(k, 0) for k in keys], [after["categorical"][c].get(k, 0) for k in keys])
    return pairs


def psi_after(st: DriftStage) -> dict[str, float]:
    """PSI of what apply emitted (weighted by ``drift_weight``), per column."""
    if st._after is None:
        return {}
    return {c: psi_from_counts(ref, act, st.epsilon) for c, (ref, act) in _after_pairs(st).items()}


def kl_after(st: DriftStage) -> dict[str, float]:
    if st._after is None:
        return {}
    return {c: kl_from_counts(ref, act, st.epsilon) for c, (ref, act) in _after_pairs(st).items()}


def text_verdict(st: DriftStage) -> str:
    if st.text_auc is None:
        return "unknown"
    return verdict(st.text_auc, st.auc_thresholds)


def _numeric_block(st: DriftStage, c: str) -> dict[str, Any]:
    edges = st.ref_edges[c]
    lo = min(st.ref_range[c][0], (st.train_range[c] or st.ref_range[c])[0])
    hi = max(st.ref_range[c][1], (st.train_range[c] or st.ref_range[c])[1])
    full = [lo, *[float(e) for e in edges], hi]
    nb = len(edges) + 1

    def frac(counts: np.ndarray) -> list[float]:
        tot = counts.sum()
        return [round(float(x / tot), 6) if tot else 0.0 for x in counts[:nb]]

    series = {"reference": frac(st.ref_counts[c]), "training": frac(st.train_counts[c])}
    if st._after is not None and st.correct:
        series["after correction"] = frac(st._after["numeric"][c])
    return {"type": "histogram", "title": f"{c}: share per reference quantile bin (PSI "
            f"{st.results[c]['psi']:.4f}, {st.results[c]['verdict']})",
            "edges": full, "series": series, "x_label": c}


def _categorical_block(st: DriftStage, c: str) -> dict[str, Any]:
    ref_s, tr_s = st.ref_cats[c], st.train_cats[c]
    rt, tt = sum(ref_s.values()) or 1, sum(tr_s.values()) or 1
    keys = category_keys(ref_s, tr_s)
    keys = sorted(keys, key=lambda k: -abs(tr_s.get(k, 0) / tt - ref_s.get(k, 0) / rt))[:MAX_BAR_CATEGORIES]
    series = {"reference": [round(ref_s.get(k, 0) / rt, 6) for k in keys],
              "training": [round(tr_s.get(k, 0) / tt, 6) for k in keys]}
    if st._after is not None and st.correct:
        a = st._after["categorical"][c]
        at = sum(a.values()) or 1
        series["after correction"] = [round(a.get(k, 0) / at, 6) for k in keys]
    return {"type": "bar", "title": f"{c}: shares (largest differences first, PSI "
            f"{st.results[c]['psi']:.4f}, {st.results[c]['verdict']})",
            "labels": ["(null)" if k is None else str(k) for k in keys], "series": series}


def _column_table(st: DriftStage, after: dict[str, float]) -> dict[str, Any]:
    rows = []
    for c, r in st.results.items():
        a = after.get(c) if st.correct else None
        rows.append([c, r["kind"], rounded(r["psi"]), r["verdict"], rounded(r["kl"]), r["kl_verdict"],
                     None if a is None else rounded(a), None if a is None else verdict(a, st.thresholds),
                     c in st.ratios or c in st.cat_ratios])
    return {"type": "table", "title": "PSI and KL per column (reference = expected)",
            "columns": ["column", "kind", "psi", "verdict", "kl", "kl_verdict", "psi_after", "verdict_after",
                        "corrected"], "rows": rows}


def _mmd_block(st: DriftStage) -> dict[str, Any]:
    rows = [[space, m["mmd2"], m["p_value"], m["verdict"], m["n_training"], m["n_reference"]]
            for space, m in st.mmd.items() if m is not None]
    return {"type": "table", "title": "MMD two-sample test (RBF kernel, permutation p-value)",
            "columns": ["features", "mmd2", "p_value", "verdict", "n_training", "n_reference"], "rows": rows}


def _text_block(st: DriftStage) -> dict[str, Any]:
    auc = "n/a" if st.text_auc is None else f"{st.text_auc:.4f}"
    n1, n2 = st.text_sizes
    # Mann-Whitney standard deviation of the AUC of a random scorer: how far from 0.5
    # sampling noise alone moves it (out-of-fold AUCs vary somewhat more).
    null_sd = ((n1 + n2 + 1) / (12 * n1 * n2)) ** 0.5 if n1 and n2 else float("nan")
    return {"type": "text", "title": "Text domain classifier", "text": (
        f"Logistic regression on MiniLM embeddings of {n1} training and {n2} reference "
        f"{st.text} texts, 5-fold out-of-fold ROC AUC = {auc} ({text_verdict(st)}; thresholds "
        f"{list(st.auc_thresholds)}; 0.5 = indistinguishable, sampling noise ~ +/-{null_sd:.3f} per sd; "
        f"use text_sample >= 500 for a steady estimate).")}


def _method_block(st: DriftStage) -> dict[str, Any]:
    text = (f"PSI = sum (a - e) ln(a / e) over {st.bins} reference quantile bins (numeric) or categories; "
            f"empty shares replaced by epsilon = {st.epsilon}; verdicts: < {st.thresholds[0]} stable, "
            f"< {st.thresholds[1]} moderate, else major. KL(training || reference) on the same bins "
            f"(renormalised): < {st.kl_thresholds[0]} stable, < {st.kl_thresholds[1]} moderate, else major.")
    if st.mmd_sample:
        text += (f" MMD: RBF kernel (median heuristic) on up to {st.mmd_sample} sampled rows per side, "
                 f"{st.mmd_permutations} seeded permutations; p < {st.mmd_thresholds[0]} major, "
                 f"< {st.mmd_thresholds[1]} moderate, else stable.")
    return {"type": "text", "title": "Method", "text": text}


def describe(st: DriftStage) -> dict[str, Any]:
    if not st._fitted:
        return {"title": TITLE, "summary": {"fitted": False}, "blocks": []}
    after = psi_after(st)
    major = [c for c, r in st.results.items() if r["verdict"] == "major"]
    labels = st.label_psi()
    summary: dict[str, Any] = {
        "training_rows": st.rows, "reference_rows": st.reference_rows,
        "weight_column": st.weight_column,
        "max_psi": rounded(max((r["psi"] for r in st.results.values() if r["psi"] == r["psi"]),
                               default=float("nan"))),
        "columns_major": len(major),
        "columns_moderate": sum(r["verdict"] == "moderate" for r in st.results.values()),
        "max_kl": rounded(max((r["kl"] for r in st.results.values() if r["kl"] == r["kl"]), default=float("nan"))),
        "text_auc": None if st.text_auc is None else round(st.text_auc, 4),
        "text_verdict": text_verdict(st) if st.text else None,
        "mmd_verdicts": {space: (m["verdict"] if m else "unknown") for space, m in st.mmd.items()},
        "correction": st.correct,
        "corrected_column": st.corrected if st.correct and not st.correction_note else None,
        "stratified_by": st.label_column if st.scales else None,
        "rows_resampled_out": st.tally.get("resampled_out"),
        "rows_repeated": st.tally.get("repeated"),
    }
    if labels is not None:
        summary["label_psi"] = labels
    blocks: list[dict[str, Any]] = [_column_table(st, after)]
    if st.correction_note:
        blocks.append({"type": "text", "title": "Correction", "text": st.correction_note})
    if labels is not None and st.correct:
        blocks.append({"type": "table", "title": f"Label distribution ({labels['column']}) before and after correction",
                       "columns": ["measure", "value"], "rows": [[k, str(v) if isinstance(v, list) else v]
                                                                 for k, v in labels.items() if k != "column"]})
    blocks += [_numeric_block(st, c) for c in st.columns]
    blocks += [_categorical_block(st, c) for c in st.categorical]
    if any(m is not None for m in st.mmd.values()):
        blocks.append(_mmd_block(st))
    if st.text:
        blocks.append(_text_block(st))
    blocks.append(_method_block(st))
    kl_a = kl_after(st)
    return {"title": TITLE, "summary": summary, "blocks": blocks,
            "psi": {c: {"psi": rounded(r["psi"], 12), "verdict": r["verdict"], "psi_after": rounded(after.get(c), 12),
                        "kl": rounded(r["kl"], 12), "kl_verdict": r["kl_verdict"], "kl_after": rounded(kl_a.get(c), 12)}
                    for c, r in st.results.items()},
            "mmd": st.mmd}
