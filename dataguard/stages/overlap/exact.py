"""Exact copies, whatever their length.

An n-gram scan cannot see a text shorter than ``n`` tokens, so a 3-word validation row or
a 5-token benchmark question copied into training would pass unseen. Here every scanned
message, and every row as a whole (its scanned messages in order), is hashed over its whole
normalised token sequence and looked up among the whole sequences of the reference items
and of the validation rows. Normalisation already undoes case, punctuation and spacing
edits, so a short "near-copy" that differs only by those is an exact copy here; shorter
texts that differ in words are not flagged (they cannot be told from common phrasing).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dataguard.stages.overlap.encoding import ScanRows
from dataguard.text.ngrams import segment_hashes


@dataclass
class ExactTable:
    """Sorted whole-sequence hashes and their items (smallest item first per hash)."""

    keys: np.ndarray = field(default_factory=lambda: np.zeros(0, np.uint64))
    items: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))

    @classmethod
    def build(cls, keys: np.ndarray, items: np.ndarray) -> ExactTable:
        order = np.lexsort((items, keys))
        return cls(keys[order].astype(np.uint64), items[order].astype(np.int32))

    def lookup(self, hashes: np.ndarray) -> np.ndarray:
        """Item of each hash, -1 where none."""
        if len(self.keys) == 0 or len(hashes) == 0:
            return np.full(len(hashes), -1, np.int64)
        i = np.minimum(np.searchsorted(self.keys, hashes), len(self.keys) - 1)
        return np.where(self.keys[i] == hashes, self.items[i].astype(np.int64), -1)


def whole_hashes(symbols: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Hash of each whole token sequence ``symbols[starts[k]:ends[k]]``."""
    return segment_hashes(symbols, starts, ends, salt=0xE8AC7)


def row_spans_flat(rows: ScanRows) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(first token, end token, tokens) of each row's scanned messages taken together;
    a row's messages are contiguous in the flat symbols, in message order."""
    tokens = rows.row_tokens()
    ends = np.cumsum(tokens).astype(np.int64)
    return ends - tokens, ends, tokens


def find_exact(ref_table: ExactTable, val_table: ExactTable, rows: ScanRows, is_val: np.ndarray) -> dict[str, Any]:
    """Per row: the item it (or one of its messages) is an exact copy of, and how many
    tokens that copy spans. Validation rows are not looked up among validation rows."""
    doc_len = rows.doc_len
    doc_h = whole_hashes(rows.symbols, rows.starts[:-1], rows.starts[1:])
    r_start, r_end, r_tok = row_spans_flat(rows)
    row_h = whole_hashes(rows.symbols, r_start, r_end)

    def lookup(hashes: np.ndarray, val_rows: np.ndarray) -> np.ndarray:
        item = ref_table.lookup(hashes)
        from_val = val_table.lookup(hashes)
        return np.where((item < 0) & ~val_rows, from_val, item)

    row_item = np.where(r_tok > 0, lookup(row_h, is_val), -1)
    val_row_item = np.where((r_tok > 0) & ~is_val, val_table.lookup(row_h), -1)
    doc_item = np.where(doc_len > 0, lookup(doc_h, is_val[rows.msg_row]), -1)
    item = row_item.copy()
    tokens = np.where(row_item >= 0, r_tok, 0)
    hit = np.flatnonzero(doc_item >= 0)
    if len(hit):  # per row without a whole-row copy: its longest copied message
        order = hit[np.lexsort((hit, -doc_len[hit], rows.msg_row[hit]))]
        first = order[np.concatenate([[True], rows.msg_row[order][1:] != rows.msg_row[order][:-1]])]
        r = rows.msg_row[first]
        free = row_item[r] < 0
        item[r[free]] = doc_item[first][free]
        tokens[r[free]] = doc_len[first][free]
    # the messages to mask: all of a whole-row copy, else every copied message
    docs_hit = (doc_item >= 0) | ((row_item[rows.msg_row] >= 0) & (doc_len > 0))
    return {"item": item, "tokens": tokens.astype(np.int64), "val_row_item": val_row_item, "docs": docs_hit}


def merge_exact(m: dict[str, Any], ex: dict[str, Any], item_set: np.ndarray, set_names: list[str],
                item_names: list[str]) -> None:
    """Fold exact copies into the n-gram measurements: an exact copy covers its item fully
    and is the row's attribution, whatever the n-grams said."""
    item = ex["item"]
    rows = np.flatnonzero(item >= 0)
    m["exact"] = item >= 0
    m["exact_tokens"] = ex["tokens"]
    m["exact_val_row"] = ex["val_row_item"]
    m["exact_docs"] = ex["docs"]
    if not len(rows):
        return
    share = ex["tokens"][rows] / np.maximum(m["row_tokens"][rows], 1)
    m["ratio"][rows] = np.maximum(m["ratio"][rows], share)
    m["longest"][rows] = np.maximum(m["longest"][rows], ex["tokens"][rows])
    m["coverage"][rows] = 1.0
    m["best_item"][rows] = item[rows]
    for r, it in zip(rows.tolist(), item[rows].tolist(), strict=True):
        m["set_name"][r] = set_names[item_set[it]]
        m["item_name"][r] = item_names[it]
    # (row, item, 1.0) pairs, replacing the n-gram pair of the same row and item
    g_row, g_item, g_frac = m["pairs"]
    n_items = len(item_names)
    keys = np.concatenate([g_row * n_items + g_item, rows * n_items + item[rows]])
    fracs = np.concatenate([g_frac, np.ones(len(rows))])
    order = np.lexsort((-fracs, keys))
    keys, fracs = keys[order], fracs[order]
    first = np.concatenate([[True], keys[1:] != keys[:-1]])
    m["pairs"] = (keys[first] // n_items, keys[first] % n_items, fracs[first])
