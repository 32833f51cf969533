"""What the stage tells the run: per-batch statistics (merged in the driver), reject
details, cross-split leakage counts and the ``describe`` blocks of the audit report."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from dataguard.stages.overlap.encoding import ScanRows, row_parts
from dataguard.stages.overlap.measure import item_threshold
from dataguard.stages.overlap.spans import Spans

if TYPE_CHECKING:
    from dataguard.stages.overlap.stage import OverlapStage

HIST_EDGES = [round(i / 20, 2) for i in range(21)]
_SUM_KEYS = ("rows", "tokens", "short_rows", "matched_rows", "contaminated", "exact_copies", "dropped", "masked",
             "val_rows", "exact_count", "near_count")
_LIST_KEYS = ("per_set_any", "per_set_contaminated", "ratio_hist", "coverage_hist")


def detail(stage: OverlapStage, m: dict[str, Any], r: int) -> str:
    """The reject detail: which item, how much of it, how much of the row, which rule."""
    ref = stage.fitted()
    it = int(m["best_item"][r])
    where = f"{ref.set_of(it)} item {ref.item_names[it]}" if it >= 0 else "references"
    if m["exact"][r]:
        what = "the whole row" if m["exact_tokens"][r] == m["row_tokens"][r] else "a message"
        return (f"exact copy of {where}: {what} ({int(m['exact_tokens'][r])} tokens, {m['ratio'][r]:.0%} of the "
                f"row) equals the item once case, punctuation and spacing are normalised")
    return (f"overlap with {where}: {m['coverage'][r]:.0%} of the item's tokens, {m['ratio'][r]:.0%} of the row "
            f"(longest span {int(m['longest'][r])} tokens, {int(m['ngrams'][r])} matching {stage.n}-grams); "
            f"thresholds: item coverage >= {m['need'][r]:.2g} (ref_threshold {stage.ref_threshold:g}"
            f"{' scaled to the item length' if m['need'][r] < stage.ref_threshold else ''}) "
            f"or row share >= {stage.threshold:g}")


def batch_stats(stage: OverlapStage, batch: pa.Table, rows: ScanRows, m: dict[str, Any], contaminated: np.ndarray,
                is_val: np.ndarray, ids: list[str], spans: dict[int, Spans], example_rows: np.ndarray,
                dropped: int, masked: int) -> dict[str, Any]:
    """Mergeable statistics of one batch (see :func:`merge_stats`)."""
    ref = stage.fitted()
    n_sets = len(ref.set_names)
    g_row, g_item, g_frac = m["pairs"]
    g_set = ref.item_set[g_item].astype(np.int64) if len(g_item) else np.zeros(0, np.int64)
    any_pairs = np.unique(g_row * n_sets + g_set)
    per_set_any = np.bincount(any_pairs % n_sets, minlength=n_sets) if len(any_pairs) else np.zeros(n_sets, int)
    best = m["best_item"]
    best_set = np.where(best >= 0, ref.item_set[np.maximum(best, 0)] if len(ref.item_set) else -1, -1)
    per_set_cont = (np.bincount(best_set[contaminated], minlength=n_sets) if contaminated.any()
                    else np.zeros(n_sets, int))
    matched = (m["ngrams"] > 0) | m["exact"]
    stats: dict[str, Any] = {
        "rows": int(batch.num_rows),
        "tokens": int(len(rows.symbols)),
        "short_rows": int((m["row_tokens"] < stage.n).sum()),
        "matched_rows": int(matched.sum()),
        "contaminated": int(contaminated.sum()),
        "exact_copies": int(m["exact"].sum()),
        "dropped": dropped,
        "masked": masked,
        "val_rows": int(is_val.sum()),
        "per_set_any": per_set_any.tolist(),
        "per_set_contaminated": per_set_cont.tolist(),
        "ratio_hist": np.histogram(m["ratio"][matched], bins=HIST_EDGES)[0].tolist(),
        "coverage_hist": np.histogram(m["coverage"][matched], bins=HIST_EDGES)[0].tolist(),
        "examples": [],
        "val_best": {},
        "exact": [],
        "exact_count": 0,
        "near_count": 0,
    }
    if len(example_rows):
        parts = row_parts(batch.take(pa.array(example_rows)), stage.roles)  # only these rows
        for r, one in zip(example_rows.tolist(), parts, strict=True):
            stats["examples"].append(_example(stage, ids[r], one, spans.get(r, {}), m, r))
    if ref.val_set >= 0:
        stats.update(_cross_split(stage, rows, m, is_val, ids))
    return stats


def _cross_split(stage: OverlapStage, rows: ScanRows, m: dict[str, Any], is_val: np.ndarray,
                 ids: list[str]) -> dict[str, Any]:
    """Validation rows found in training rows, and exact / near-exact cross-split pairs."""
    ref = stage.fitted()
    g_row, g_item, g_frac = m["pairs"]
    out: dict[str, Any] = {}
    train = ~is_val
    sel = (ref.item_set[g_item] == ref.val_set) & train[g_row] if len(g_row) else np.zeros(0, bool)
    best: dict[int, tuple[float, str, float]] = {}
    for r, it, f in zip(g_row[sel].tolist(), g_item[sel].tolist(), g_frac[sel].tolist(), strict=True):
        cur = best.get(it)
        if cur is None or f > cur[0]:
            best[it] = (f, ids[r], float(m["ratio"][r]))
    out["val_best"] = best
    near = sel & (g_frac >= stage.near_duplicate)
    if near.any():
        # both directions: the validation row is (almost) all in the training row
        # and the training row's matchable text is (almost) all validation text
        share = m["covered"] / np.maximum(m["coverable"], 1)
        both = g_row[near][share[g_row[near]] >= stage.near_duplicate]
        out["near_count"] = int(len(np.unique(both)))
    hit = np.flatnonzero(m["exact_val_row"] >= 0)  # training rows that are a whole validation row
    out["exact_count"] = len(hit)
    out["exact"] = [(ids[r], ref.item_names[int(m["exact_val_row"][r])]) for r in hit[:20].tolist()]
    return out


def _example(stage: OverlapStage, row_id: str, parts: list[tuple[int, str]], spans: Spans, m: dict[str, Any],
             r: int) -> dict[str, Any]:
    """One contaminated row for the report: its text around the first span, spans marked."""
    ref = stage.fitted()
    text, out_spans, offset = [], [], 0
    for local, content in parts:
        for s, e in spans.get(local, []):
            out_spans.append([offset + s, offset + e])
        text.append(content)
        offset += len(content) + 1
    joined = "\n".join(text)
    lo = max(0, (out_spans[0][0] if out_spans else 0) - 300)
    hi = min(len(joined), lo + 2500)
    clipped = [[max(s, lo) - lo, min(e, hi) - lo] for s, e in out_spans if e > lo and s < hi]
    it = int(m["best_item"][r])
    return {
        "id": row_id,
        "label": ref.set_of(it) if it >= 0 else None,
        "item": it,
        "text": ("…" if lo else "") + joined[lo:hi] + ("…" if hi < len(joined) else ""),
        "spans": [[s + (1 if lo else 0), e + (1 if lo else 0)] for s, e in clipped],
        "note": (f"{ref.item_names[it] if it >= 0 else ''}: item coverage {m['coverage'][r]:.0%}, "
                 f"row share {m['ratio'][r]:.0%}, longest span {int(m['longest'][r])} tokens"),
    }


def merge_stats(stats: Sequence[Any], n_sets: int, max_examples: int) -> dict[str, Any]:
    """Sum the batches' statistics in input order (what ``absorb`` keeps)."""
    agg: dict[str, Any] = {k: 0 for k in _SUM_KEYS}
    agg.update({"per_set_any": [0] * n_sets, "per_set_contaminated": [0] * n_sets,
                "ratio_hist": [0] * (len(HIST_EDGES) - 1), "coverage_hist": [0] * (len(HIST_EDGES) - 1),
                "examples": [], "val_best": {}, "exact": []})
    for s in stats:
        if not s:
            continue
        for k in _SUM_KEYS:
            agg[k] += s[k]
        for k in _LIST_KEYS:
            agg[k] = [a + b for a, b in zip(agg[k], s[k], strict=True)]
        agg["examples"].extend(s["examples"])
        agg["exact"].extend(s["exact"])
        for it, v in s["val_best"].items():
            cur = agg["val_best"].get(it)
            if cur is None or v[0] > cur[0]:
                agg["val_best"][it] = v
    agg["examples"] = balanced(agg["examples"], max_examples)
    agg["exact"] = agg["exact"][:20]
    return agg


def describe(stage: OverlapStage, s: dict[str, Any], item_text: Callable[[int], str]) -> dict[str, Any]:
    """The stage's section of the manifest and the audit report."""
    ref = stage.fitted_or_none()
    names = ref.set_names if ref is not None else []
    val_best = s.get("val_best", {})
    val_leaked = []
    if ref is not None:
        need = item_threshold(ref.item_len[list(val_best)], stage.ref_threshold, stage.n) if val_best else []
        val_leaked = sorted(((v[0], ref.item_names[it], v[1], v[2]) for (it, v), t in zip(val_best.items(), need,
                                                                                          strict=True)
                             if v[0] >= t), key=lambda x: (-x[0], x[1]))
    index = ref.index if ref is not None else None
    summary = {
        "mode": stage.mode, "n": stage.n, "action": stage.action, "threshold": stage.threshold,
        "ref_threshold": stage.ref_threshold, "references": ", ".join(names),
        "index_ngrams": len(index) if index is not None else 0,
        "index_mb": round((index.nbytes if index is not None else 0) / 2**20, 2),
        "rows_scanned": s.get("rows", 0), "tokens_scanned": s.get("tokens", 0),
        "rows_with_any_match": s.get("matched_rows", 0), "rows_contaminated": s.get("contaminated", 0),
        "rows_exact_copies": s.get("exact_copies", 0),
        "rows_dropped": s.get("dropped", 0), "rows_masked": s.get("masked", 0),
        "rows_shorter_than_n": s.get("short_rows", 0),
    }
    if stage.validation_sources:
        summary.update({
            "validation_rows": s.get("val_rows", 0),
            "validation_rows_found_in_train": len(val_leaked),
            "cross_split_exact_duplicates": s.get("exact_count", 0),
            "cross_split_near_duplicates": s.get("near_count", 0),
        })
    blocks: list[dict[str, Any]] = [
        {"type": "bar", "title": "Rows per reference set", "labels": names,
         "series": {"contaminated (best match)": s.get("per_set_contaminated", [0] * len(names)),
                    "any matching n-gram": s.get("per_set_any", [0] * len(names))}},
        {"type": "histogram", "title": "Overlap of rows with at least one matching n-gram",
         "edges": HIST_EDGES, "x_label": "share",
         "series": {"overlap_ratio (row tokens covered)": s.get("ratio_hist", [0] * 20),
                    "overlap_ref_coverage (item tokens present)": s.get("coverage_hist", [0] * 20)},
         "markers": [{"label": "threshold", "value": stage.threshold},
                     {"label": "ref_threshold", "value": stage.ref_threshold}]},
        {"type": "table", "title": "Reference sets",
         "columns": ["set", "items", f"items < {stage.n} tokens (exact copies only)", "n-grams", "tokens", "source"],
         "rows": [[i["set"], i["items"], i["too_short"], i["ngrams"], i["tokens"], i["source"]]
                  for i in (ref.set_info if ref is not None else [])]},
    ]
    if stage.validation_sources:
        blocks.append({"type": "table", "title": "Validation rows found in training (validation -> train)",
                       "columns": ["validation row", "training row", "validation tokens covered",
                                   "training row share"],
                       "rows": [[v, t, round(f, 3), round(rt, 3)] for f, v, t, rt in val_leaked[:20]]})
        if s.get("exact"):
            blocks.append({"type": "table", "title": "Exact duplicates across splits (normalised)",
                           "columns": ["training row", "validation row"], "rows": [list(p) for p in s["exact"]]})
    items = []
    for ex in s.get("examples", []):
        ex = dict(ex)
        it = ex.pop("item")
        ex["reference"] = item_text(it)[:1500] if it >= 0 else None
        items.append(ex)
    blocks.append({"type": "examples", "title": "Contaminated rows (overlapping spans marked)", "items": items})
    return {"title": "Benchmark contamination and train/validation overlap", "summary": summary, "blocks": blocks}


def balanced(examples: list[dict[str, Any]], k: int) -> list[dict[str, Any]]:
    """Up to k examples, round-robin over reference sets, in input order within a set."""
    by_set: dict[Any, list[dict[str, Any]]] = {}
    for ex in examples:
        by_set.setdefault(ex["label"], []).append(ex)
    out: list[dict[str, Any]] = []
    queues = list(by_set.values())
    while len(out) < k and any(queues):
        for q in queues:
            if q and len(out) < k:
                out.append(q.pop(0))
    return out
