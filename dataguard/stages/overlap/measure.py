"""Apply, part one: look every scanned n-gram up and measure, per row, how much of the row
is reference text and how much of one reference item is in the row."""

from __future__ import annotations

from typing import Any

import numpy as np

from dataguard.stages.overlap.encoding import ScanRows
from dataguard.stages.overlap.exact import find_exact, merge_exact
from dataguard.stages.overlap.index import ReferenceIndex
from dataguard.text.ngrams import expand_postings, ngram_hashes

POSTING_CAP = 64  # postings followed per matching n-gram (attribution of very common n-grams)
FULL_BAR_NGRAMS = 5  # items of at least 5n tokens need the full ref_threshold coverage


def item_threshold(item_len: np.ndarray, ref_threshold: float, n: int) -> np.ndarray:
    """Coverage an item of ``item_len`` tokens needs: ``ref_threshold`` from 5n tokens up,
    in proportion below (0.24 for a 52-token item at n = 13, the default 0.3).

    Why: an n-gram scan loses n n-grams around every edited token, so an edited copy of a
    short item shows less coverage than the same edits in a long one; and one matching
    n-gram is already a large share of a short item (13 of 48 tokens is 0.27)."""
    return ref_threshold * np.minimum(1.0, item_len / float(FULL_BAR_NGRAMS * n))


def match(ref: ReferenceIndex, hashes: np.ndarray, ng_row: np.ndarray,
          is_val: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Postings (query n-gram, item, position in item) of matching n-grams, with
    validation rows never matched against the validation set itself."""
    q, lo, hi = ref.index.lookup(hashes)
    pq, entry = expand_postings(q, lo, hi, POSTING_CAP)
    item = ref.index.items[entry]
    ipos = ref.index.pos[entry]
    val_set = ref.val_set
    if val_set >= 0 and is_val.any() and len(pq):
        ok = ~(is_val[ng_row[pq]] & (ref.item_set[item] == val_set))
        pq, item, ipos = pq[ok], item[ok], ipos[ok]
    return pq, item, ipos


def measure(ref: ReferenceIndex, rows: ScanRows, is_val: np.ndarray, n: int) -> dict[str, Any]:
    """Per-row measurements (arrays over rows) and the (row, item, coverage) pairs, n-gram
    matches and exact copies (see exact.py) together."""
    out = _ngram_measure(ref, rows, is_val, n)
    ex = find_exact(ref.exact_ref, ref.exact_val, rows, is_val)
    merge_exact(out, ex, ref.item_set, ref.set_names, ref.item_names)
    return out


def _ngram_measure(ref: ReferenceIndex, rows: ScanRows, is_val: np.ndarray, n: int) -> dict[str, Any]:
    n_rows = rows.n_rows
    ng = ngram_hashes(rows.symbols, rows.starts, n)
    ng_row = rows.msg_row[ng.doc] if len(ng.doc) else np.zeros(0, np.int64)
    pq, item, ipos = match(ref, ng.hashes, ng_row, is_val)
    matched_q = np.unique(pq)
    row_tokens = rows.row_tokens()
    out: dict[str, Any] = {
        "row_tokens": row_tokens,
        "coverable": rows.row_tokens(n),
        "covered": np.zeros(n_rows, np.int64),
        "ngrams": np.bincount(ng_row[matched_q], minlength=n_rows).astype(np.int64),
        "ratio": np.zeros(n_rows),
        "longest": np.zeros(n_rows, np.int64),
        "coverage": np.zeros(n_rows),
        "best_item": np.full(n_rows, -1, np.int64),
        "set_name": [None] * n_rows,
        "item_name": [None] * n_rows,
        "pairs": (np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0)),
    }
    if len(matched_q) == 0:
        return out
    _row_side(rows, ng.pos[matched_q], n, out)
    _item_side(ref, ng_row[pq], item, ipos, n, out)
    return out


def _row_side(rows: ScanRows, p: np.ndarray, n: int, out: dict[str, Any]) -> None:
    """Tokens of each row covered by matching n-grams starting at flat positions ``p``."""
    n_rows, total = rows.n_rows, len(rows.symbols)
    row_tokens = out["row_tokens"]
    diff = np.bincount(p, minlength=total + 1)[: total + 1] - np.bincount(p + n, minlength=total + 1)[: total + 1]
    cov = np.cumsum(diff)[:total] > 0
    token_row = np.repeat(rows.msg_row, rows.doc_len)
    covered = np.bincount(token_row[cov], minlength=n_rows)
    out["ratio"] = np.where(row_tokens > 0, covered / np.maximum(row_tokens, 1), 0.0)
    out["covered"] = covered
    doc_start = np.zeros(total, dtype=bool)
    doc_start[rows.starts[:-1][rows.doc_len > 0]] = True
    prev = np.concatenate([[False], cov[:-1]])
    run_start = cov & (~prev | doc_start)
    run_id = np.cumsum(run_start) - 1
    run_len = np.bincount(run_id[cov])
    run_row = token_row[np.flatnonzero(run_start)]
    longest = np.zeros(n_rows, np.int64)
    np.maximum.at(longest, run_row, run_len)
    out["longest"] = longest


def _item_side(ref: ReferenceIndex, prow: np.ndarray, item: np.ndarray, ipos: np.ndarray, n: int,
               out: dict[str, Any]) -> None:
    """Share of each matched item's tokens present in the row; the best item per row."""
    n_items = len(ref.item_set)  # canonical items and their split-form variants
    key = prow * n_items + item
    order = np.lexsort((ipos, key))
    key, ipos_s = key[order], ipos[order].astype(np.int64)
    group_start = np.flatnonzero(np.concatenate([[True], key[1:] != key[:-1]]))
    step = np.empty(len(key), dtype=np.int64)
    step[:-1] = np.minimum(np.diff(ipos_s), n)
    step[-1] = n
    last_in_group = np.concatenate([group_start[1:] - 1, [len(key) - 1]])
    step[last_in_group] = n
    item_cov = np.add.reduceat(step, group_start)
    g_key = key[group_start]
    g_row = g_key // n_items
    g_item = g_key % n_items
    g_frac = np.minimum(item_cov / np.maximum(ref.item_len[g_item], 1), 1.0)
    if len(ref.item_canon) > len(ref.item_names) and len(g_item):
        # a variant counts for its item; per (row, item) the better of the two forms
        g_item = ref.item_canon[g_item].astype(np.int64)
        keep = np.lexsort((-item_cov, -g_frac, g_item, g_row))
        g_row, g_item, g_frac, item_cov = g_row[keep], g_item[keep], g_frac[keep], item_cov[keep]
        first = np.concatenate([[True], (g_row[1:] != g_row[:-1]) | (g_item[1:] != g_item[:-1])])
        g_row, g_item, g_frac, item_cov = g_row[first], g_item[first], g_frac[first], item_cov[first]
    out["pairs"] = (g_row, g_item, g_frac)
    best = np.lexsort((g_item, -item_cov, -g_frac, g_row))
    first = best[np.concatenate([[True], g_row[best][1:] != g_row[best][:-1]])]
    b_row, b_item = g_row[first], g_item[first]
    out["coverage"][b_row] = g_frac[first]
    out["best_item"][b_row] = b_item
    for r, it in zip(b_row.tolist(), b_item.tolist(), strict=True):
        out["set_name"][r] = ref.set_of(it)
        out["item_name"][r] = ref.item_names[it]
