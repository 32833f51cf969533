"""What the stage tells the run: per-batch statistics (a `Tally`, merged in the driver by
the base ``Stage.absorb``), reject details, cross-split leakage counts and the ``describe``
blocks of the audit report. Each function gets the stage's `ReportOptions` and fitted
`ReferenceIndex`, never the stage itself."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from dataguard.stages.overlap.encoding import ScanRows, row_parts
from dataguard.stages.overlap.index import ReferenceIndex
from dataguard.stages.overlap.measure import item_threshold
from dataguard.stages.overlap.spans import Spans
from dataguard.tally import Best, Tally

HIST_EDGES = [round(i / 20, 2) for i in range(21)]


@dataclass(frozen=True)
class ReportOptions:
    """The overlap stage's options that its statistics, reject details and describe() read."""

    n: int
    mode: str
    action: str
    threshold: float
    ref_threshold: float
    near_duplicate: float
    roles: tuple[str, ...]
    max_examples: int
    validation_sources: tuple[str, ...]


def detail(opts: ReportOptions, ref: ReferenceIndex, m: dict[str, Any], r: int) -> str:
    """The reject detail: which item, how much of it, how much of the row, which rule."""
    it = int(m["best_item"][r])
    where = f"{ref.set_of(it)} item {ref.item_names[it]}" if it >= 0 else "references"
    if m["exact"][r]:
        what = "the whole row" if m["exact_tokens"][r] == m["row_tokens"][r] else "a message"
        return (f"exact copy of {where}: {what} ({int(m['exact_tokens'][r])} tokens, {m['ratio'][r]:.0%} of the "
                f"row) equals the item once case, punctuation and spacing are normalised")
    return (f"overlap with {where}: {m['coverage'][r]:.0%} of the item's tokens, {m['ratio'][r]:.0%} of the row "
            f"(longest span {int(m['longest'][r])} tokens, {int(m['ngrams'][r])} matching {opts.n}-grams); "
            f"thresholds: item coverage >= {m['need'][r]:.2g} (ref_threshold {opts.ref_threshold:g}"
            f"{' scaled to the item length' if m['need'][r] < opts.ref_threshold else ''}) "
            f"or row share >= {opts.threshold:g}")


def batch_stats(opts: ReportOptions, ref: ReferenceIndex, batch: pa.Table, rows: ScanRows, m: dict[str, Any],
                contaminated: np.ndarray, is_val: np.ndarray, ids: list[str], spans: dict[int, Spans],
                example_rows: np.ndarray, dropped: int, masked: int) -> Tally:
    """One batch's statistics; the base ``Stage.absorb`` merges them into the stage's tally."""
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
    t = Tally(counts=Counter(
        rows=batch.num_rows, tokens=len(rows.symbols), short_rows=int((m["row_tokens"] < opts.n).sum()),
        matched_rows=int(matched.sum()), contaminated=int(contaminated.sum()), exact_copies=int(m["exact"].sum()),
        dropped=dropped, masked=masked, val_rows=int(is_val.sum())))
    t.hist("per_set_any", per_set_any)  # one bin per reference set
    t.hist("per_set_contaminated", per_set_cont)
    t.hist("ratio_hist", np.histogram(m["ratio"][matched], bins=HIST_EDGES)[0])
    t.hist("coverage_hist", np.histogram(m["coverage"][matched], bins=HIST_EDGES)[0])
    examples = []
    if len(example_rows):
        parts = row_parts(batch.take(pa.array(example_rows)), opts.roles)  # only these rows
        for r, one in zip(example_rows.tolist(), parts, strict=True):
            examples.append(_example(ref, ids[r], one, spans.get(r, {}), m, r))
    # `balanced` picks round-robin over sets in describe; the first max_examples of each set suffice
    t.keep("examples", examples, opts.max_examples * (n_sets + 1), per=("label", opts.max_examples))
    if ref.val_set >= 0:
        _cross_split(opts, ref, m, is_val, ids, t)
    return t


def _cross_split(opts: ReportOptions, ref: ReferenceIndex, m: dict[str, Any], is_val: np.ndarray, ids: list[str],
                 t: Tally) -> None:
    """Validation rows found in training rows, and exact / near-exact cross-split pairs."""
    g_row, g_item, g_frac = m["pairs"]
    train = ~is_val
    sel = (ref.item_set[g_item] == ref.val_set) & train[g_row] if len(g_row) else np.zeros(0, bool)
    best = Best()  # per validation row: share of it covered, by which training row, its share of that row
    for r, it, f in zip(g_row[sel].tolist(), g_item[sel].tolist(), g_frac[sel].tolist(), strict=True):
        best.offer(it, f, (ids[r], float(m["ratio"][r])))
    t.put("val_best", best)
    near = sel & (g_frac >= opts.near_duplicate)
    if near.any():
        # both directions: the validation row is (almost) all in the training row
        # and the training row's matchable text is (almost) all validation text
        share = m["covered"] / np.maximum(m["coverable"], 1)
        both = g_row[near][share[g_row[near]] >= opts.near_duplicate]
        t.add("near_count", len(np.unique(both)))
    hit = np.flatnonzero(m["exact_val_row"] >= 0)  # training rows that are a whole validation row
    t.add("exact_count", len(hit))
    t.keep("exact", [(ids[r], ref.item_names[int(m["exact_val_row"][r])]) for r in hit[:20].tolist()], 20)


def _example(ref: ReferenceIndex, row_id: str, parts: list[tuple[int, str]], spans: Spans, m: dict[str, Any],
             r: int) -> dict[str, Any]:
    """One contaminated row for the report: its text around the first span, spans marked."""
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


def describe(opts: ReportOptions, ref: ReferenceIndex | None, t: Tally,
             item_text: Callable[[int], str]) -> dict[str, Any]:
    """The stage's section of the manifest and the audit report, from the merged tally
    (``ref``: None when the stage was never fitted)."""
    names = ref.set_names if ref is not None else []
    best = t.parts.get("val_best", Best()).entries  # validation item -> (share, (training row, its share))
    val_leaked = []
    if ref is not None:
        need = item_threshold(ref.item_len[list(best)], opts.ref_threshold, opts.n) if best else []
        val_leaked = sorted(((f, ref.item_names[it], row, share) for (it, (f, (row, share))), bar
                             in zip(best.items(), need, strict=True) if f >= bar), key=lambda x: (-x[0], x[1]))
    index = ref.index if ref is not None else None
    summary = {
        "mode": opts.mode, "n": opts.n, "action": opts.action, "threshold": opts.threshold,
        "ref_threshold": opts.ref_threshold, "references": ", ".join(names),
        "index_ngrams": len(index) if index is not None else 0,
        "index_mb": round((index.nbytes if index is not None else 0) / 2**20, 2),
        "rows_scanned": t.get("rows"), "tokens_scanned": t.get("tokens"),
        "rows_with_any_match": t.get("matched_rows"), "rows_contaminated": t.get("contaminated"),
        "rows_exact_copies": t.get("exact_copies"),
        "rows_dropped": t.get("dropped"), "rows_masked": t.get("masked"),
        "rows_shorter_than_n": t.get("short_rows"),
    }
    if opts.validation_sources:
        summary.update({
            "validation_rows": t.get("val_rows"),
            "validation_rows_found_in_train": len(val_leaked),
            "cross_split_exact_duplicates": t.get("exact_count"),
            "cross_split_near_duplicates": t.get("near_count"),
        })

    def bins(name: str, n: int) -> list[int]:
        return t.hists[name].tolist() if name in t.hists else [0] * n

    blocks: list[dict[str, Any]] = [
        {"type": "bar", "title": "Rows per reference set", "labels": names,
         "series": {"contaminated (best match)": bins("per_set_contaminated", len(names)),
                    "any matching n-gram": bins("per_set_any", len(names))}},
        {"type": "histogram", "title": "Overlap of rows with at least one matching n-gram",
         "edges": HIST_EDGES, "x_label": "share",
         "series": {"overlap_ratio (row tokens covered)": bins("ratio_hist", 20),
                    "overlap_ref_coverage (item tokens present)": bins("coverage_hist", 20)},
         "markers": [{"label": "threshold", "value": opts.threshold},
                     {"label": "ref_threshold", "value": opts.ref_threshold}]},
        {"type": "table", "title": "Reference sets",
         "columns": ["set", "items", f"items < {opts.n} tokens (exact copies only)", "n-grams", "tokens", "source"],
         "rows": [[i["set"], i["items"], i["too_short"], i["ngrams"], i["tokens"], i["source"]]
                  for i in (ref.set_info if ref is not None else [])]},
    ]
    if opts.validation_sources:
        blocks.append({"type": "table", "title": "Validation rows found in training (validation -> train)",
                       "columns": ["validation row", "training row", "validation tokens covered",
                                   "training row share"],
                       "rows": [[v, tr, round(f, 3), round(rt, 3)] for f, v, tr, rt in val_leaked[:20]]})
        if t.items("exact"):
            blocks.append({"type": "table", "title": "Exact duplicates across splits (normalised)",
                           "columns": ["training row", "validation row"], "rows": [list(p) for p in t.items("exact")]})
    items = []
    for ex in balanced(t.items("examples"), opts.max_examples):
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
