"""Apply, part two: where in the user's text a copy sits, and masking it out.

Slow path on purpose: only rows shown as examples or masked are re-encoded with character
offsets, so the hot path never keeps offsets for every token."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa

from dataguard.records import MESSAGES_TYPE, rejected_texts, with_rejected
from dataguard.stages.overlap.encoding import Encoder, ScanRows
from dataguard.stages.overlap.index import ReferenceIndex
from dataguard.stages.overlap.measure import match
from dataguard.text.ngrams import ngram_hashes

Spans = dict[int, list[tuple[int, int]]]  # index in the row's messages list -> character spans


def row_spans(ref: ReferenceIndex, encoder: Encoder, rows: ScanRows, r: int, is_val: bool, n: int,
              exact_docs: np.ndarray) -> Spans:
    """Covered character spans per message of row ``r``; a message that is (part of) an
    exact copy is covered whole."""
    out: Spans = {}
    for d in np.flatnonzero(rows.msg_row == r).tolist():
        text = rows.contents[d]
        if exact_docs[d]:
            out[int(rows.msg_local[d])] = [(0, len(text))]
            continue
        symbols, cs, ce = encoder.encode_one_with_spans(text)
        if len(cs) < n:
            continue
        ng = ngram_hashes(symbols, np.array([0, len(symbols)], np.int64), n)
        pq, _, _ = match(ref, ng.hashes, np.zeros(len(ng.hashes), np.int64), np.array([is_val]))
        if len(pq) == 0:
            continue
        cov = np.zeros(len(symbols), dtype=bool)
        for start in np.unique(ng.pos[pq]).tolist():
            cov[start:start + n] = True
        edges = np.diff(cov.astype(np.int8), prepend=np.int8(0), append=np.int8(0))
        spans: list[tuple[int, int]] = []
        for a, b in zip(np.flatnonzero(edges == 1).tolist(), np.flatnonzero(edges == -1).tolist(), strict=True):
            s, e = widen(text, int(cs[a]), int(ce[b - 1]))
            if spans and s <= spans[-1][1]:
                spans[-1] = (spans[-1][0], max(spans[-1][1], e))
            else:
                spans.append((s, e))
        out[int(rows.msg_local[d])] = spans
    return out


def mask_rows(table: pa.Table, spans: dict[int, Spans], contaminated: np.ndarray,
              roles: Sequence[str]) -> tuple[pa.Table, np.ndarray, dict[int, str]]:
    """(table with the spans cut out, rows masked, {row: why it cannot be kept} for the
    masked rows that no longer make a training example)."""
    n_rows = table.num_rows
    masked = np.zeros(n_rows, dtype=bool)
    spoiled: dict[int, str] = {}
    pending = [r for r in np.flatnonzero(contaminated).tolist() if spans.get(r)]
    if not pending:
        return table, masked, spoiled
    messages = table.column("messages").to_pylist()
    rejected = rejected_texts(table)
    cut_rejected: dict[int, str] = {}
    for r in pending:
        msgs = messages[r]
        for local, sp in spans[r].items():
            if local == len(msgs):  # a preference pair's rejected response (``row_parts``)
                cut_rejected[r] = cut(rejected[r] or "", sp)
            else:
                msgs[local]["content"] = cut(msgs[local]["content"] or "", sp)
        masked[r] = True
        why = spoiled_by_mask(msgs, roles, rejected[r], cut_rejected.get(r, rejected[r]))
        if why:
            spoiled[r] = why
    col = pa.array(messages, MESSAGES_TYPE)
    idx = table.column_names.index("messages")
    return with_rejected(table.set_column(idx, "messages", col), cut_rejected), masked, spoiled


def spoiled_by_mask(msgs: list[dict[str, str]], roles: Sequence[str], rejected_before: str | None,
                    rejected_after: str | None) -> str:
    """Why a masked row no longer makes a training example ("" when it still does): nothing
    scanned is left, its final answer was cut away (training on an empty answer), or, for a
    preference pair, the rejected response was cut away or the cut made both responses the
    same (a pair that states no preference)."""
    if not any((m["content"] or "").strip() for m in msgs if m["role"] in roles):
        return "nothing left after masking"
    final = (msgs[-1]["content"] or "").strip() if msgs and msgs[-1]["role"] == "assistant" else None
    if final == "":
        return "the final answer was entirely the copied text"
    if rejected_before is None:
        return ""
    if not (rejected_after or "").strip():
        return "the rejected response was entirely the copied text"
    if final is not None and " ".join(final.split()) == " ".join((rejected_after or "").split()):
        return "after masking, the chosen and rejected responses are the same"
    return ""


def widen(text: str, s: int, e: int) -> tuple[int, int]:
    """Extend a span over the punctuation glued to it (``"Why?"``, ``"(x)"``), which
    normalisation folded away, so masking does not leave stray marks behind."""
    while s > 0 and not text[s - 1].isspace() and not text[s - 1].isalnum():
        s -= 1
    while e < len(text) and not text[e].isspace() and not text[e].isalnum():
        e += 1
    return s, e


def cut(text: str, spans: list[tuple[int, int]]) -> str:
    """``text`` without the spans; the pieces around a cut are joined by one space."""
    pieces, last = [], 0
    for s, e in spans:
        pieces.append(text[last:s])
        last = e
    pieces.append(text[last:])
    out = ""
    for p in pieces:
        if not p:
            continue
        if out and not out[-1].isspace() and not p[0].isspace():
            out += " "
        elif out and out[-1] == " " and p[0] == " ":
            p = p.lstrip(" ")
            if not p:
                continue
        out += p
    return out.strip()
