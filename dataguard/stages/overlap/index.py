"""Fit: the n-gram index of the reference sets and of the run's validation rows."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from dataguard.references import ReferenceSpec
from dataguard.stages.overlap.encoding import Encoder, ScanRows, row_parts
from dataguard.stages.overlap.exact import ExactTable, row_spans_flat, whole_hashes
from dataguard.text.ngrams import NgramIndex, ngram_hashes

VALIDATION_SET = "validation"


@dataclass
class ReferenceIndex:
    """Everything ``apply`` needs from fit, small enough to ship to every worker."""

    index: NgramIndex
    set_names: list[str]
    item_set: np.ndarray  # int16 set of each item (variants included)
    item_names: list[str]  # canonical items only
    item_len: np.ndarray  # int32 tokens of each item (validation: tokens an n-gram can reach)
    set_info: list[dict[str, Any]]
    item_canon: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))  # variant -> its item
    exact_ref: ExactTable = field(default_factory=ExactTable)  # whole reference items
    exact_val: ExactTable = field(default_factory=ExactTable)  # whole validation rows

    @property
    def val_set(self) -> int:
        """Index of the validation set, -1 when the run has none."""
        return self.set_names.index(VALIDATION_SET) if VALIDATION_SET in self.set_names else -1

    def set_of(self, item: int) -> str:
        return self.set_names[self.item_set[item]]


def validation_summary(batch: pa.Table, sources: Sequence[str], roles: Sequence[str]) -> dict[str, Any] | None:
    """The validation rows of a batch (ids, scanned message texts), for ``fit``."""
    if not sources or batch.num_rows == 0:
        return None
    is_val = pc.is_in(batch.column("source"), value_set=pa.array(list(sources), pa.string()))
    val = batch.filter(pc.fill_null(is_val, False))
    if val.num_rows == 0:
        return None
    return {"ids": val.column("id").to_pylist(), "parts": [[c for _, c in parts] for parts in row_parts(val, roles)]}


@dataclass
class _Items:
    """The n-grams and whole-sequence hashes of some items, in one normal form."""

    hashes: np.ndarray  # n-gram hashes
    item: np.ndarray  # local item of each n-gram
    pos: np.ndarray  # position of each n-gram in its item
    item_len: np.ndarray  # tokens of each item that coverage is measured against
    tokens: np.ndarray  # all tokens of each item
    whole: np.ndarray  # hash of each item's whole token sequence

    def only(self, keep: np.ndarray, base: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(hashes, item, pos) of the items in ``keep``, renumbered from ``base`` in order."""
        new_id = np.cumsum(keep) - 1 + base
        sel = keep[self.item] if len(self.item) else np.zeros(0, bool)
        return self.hashes[sel], new_id[self.item[sel]].astype(np.int32), self.pos[sel]


def _reference_items(texts: Sequence[str], encoder: Encoder, n: int, split: bool) -> _Items:
    symbols, starts = encoder.encode(texts, split=split)
    ng = ngram_hashes(symbols, starts, n)
    lens = np.diff(starts).astype(np.int32)
    return _Items(ng.hashes, ng.doc.astype(np.int32), (ng.pos - starts[ng.doc]).astype(np.int32), lens, lens,
                  whole_hashes(symbols, starts[:-1], starts[1:]))


def _validation_items(parts: Sequence[Sequence[str]], encoder: Encoder, n: int, split: bool) -> _Items:
    """Validation rows as items: a row's scanned messages in order, n-grams within messages."""
    docs = [c for p in parts for c in p]
    msg_row = np.repeat(np.arange(len(parts), dtype=np.int64), [len(p) for p in parts])
    symbols, starts = encoder.encode(docs, split=split)
    rows = ScanRows(len(parts), docs, msg_row, np.zeros(len(docs), np.int64), symbols, starts)
    ng = ngram_hashes(symbols, starts, n)
    first, end, tokens = row_spans_flat(rows)
    ng_row = msg_row[ng.doc] if len(ng.doc) else np.zeros(0, np.int64)
    # coverage is measured against the tokens an n-gram can reach: a 5-token
    # instruction next to a long answer cannot be matched and should not dilute it
    return _Items(ng.hashes, ng_row.astype(np.int32), (ng.pos - first[ng_row]).astype(np.int32),
                  rows.row_tokens(n).astype(np.int32), tokens, whole_hashes(symbols, first, end))


_MAY_SPLIT = re.compile(r"[^\W_](?:[^\w\s]|_)+[^\W_]")


class _Variants:
    """The split-form encoding of the items whose text may differ in that form: a pure
    ASCII text without punctuation between two letters/digits normalises the same both ways
    (non-ASCII texts are always encoded: NFKC can create punctuation, e.g. in "½")."""

    def __init__(self, items: Sequence[Any], encode: Callable[[list[Any]], _Items]) -> None:
        self.items, self.encode = items, encode

    def __call__(self) -> tuple[_Items, np.ndarray]:
        def may_split(item: Any) -> bool:
            texts = [item] if isinstance(item, str) else item
            return any(not t.isascii() or _MAY_SPLIT.search(t) for t in texts)

        idx = np.array([k for k, it in enumerate(self.items) if may_split(it)], dtype=np.int64)
        return self.encode([self.items[k] for k in idx.tolist()]), idx


class _Builder:
    """Collects items set by set: canonical items first (their numbers are what the report
    and ``_item_text`` use), then the split-form variants, numbered after all of them."""

    def __init__(self, exact_min_tokens: int = 1) -> None:
        self.exact_min_tokens = exact_min_tokens  # for benchmark items; validation rows: any length
        self.keys: list[np.ndarray] = []
        self.items: list[np.ndarray] = []
        self.pos: list[np.ndarray] = []
        self.item_set: list[np.ndarray] = []
        self.item_len: list[np.ndarray] = []
        self.names: list[str] = []
        self.exact: dict[bool, tuple[list[np.ndarray], list[np.ndarray]]] = {False: ([], []), True: ([], [])}
        self.pending: list[tuple[int, int, _Items, _Variants | None, bool]] = []

    def add(self, set_idx: int, names: list[str], canon: _Items, variant: _Variants | None,
            validation: bool) -> None:
        """One set's canonical items; ``variant`` encodes (some of) them in the split form."""
        base = len(self.names)
        self.keys.append(canon.hashes)
        self.items.append(canon.item + base)
        self.pos.append(canon.pos)
        self.item_set.append(np.full(len(names), set_idx, np.int16))
        self.item_len.append(canon.item_len)
        self.names.extend(names)
        self._exact(canon, np.arange(len(names)) + base, validation)
        self.pending.append((set_idx, base, canon, variant, validation))

    def _exact(self, items: _Items, item_ids: np.ndarray, validation: bool) -> None:
        ok = (items.tokens >= (1 if validation else self.exact_min_tokens)) & (item_ids >= 0)
        self.exact[validation][0].append(items.whole[ok])
        self.exact[validation][1].append(item_ids[ok])

    def finish(self, set_names: list[str], set_info: list[dict[str, Any]]) -> ReferenceIndex:
        n_canon = len(self.names)
        canon_of = [np.arange(n_canon, dtype=np.int32)]
        for set_idx, base, canon, variant_fn, validation in self.pending:
            if variant_fn is None:
                continue
            variant, idx = variant_fn()
            differs = (variant.whole != canon.whole[idx]) & (variant.tokens > 0)
            if not differs.any():
                continue
            vbase = n_canon + sum(len(c) for c in canon_of[1:])
            hashes, item, pos = variant.only(differs, vbase)
            self.keys.append(hashes)
            self.items.append(item)
            self.pos.append(pos)
            self.item_set.append(np.full(int(differs.sum()), set_idx, np.int16))
            self.item_len.append(variant.item_len[differs])
            canon_of.append((idx[differs] + base).astype(np.int32))
            self._exact(variant, np.where(differs, idx + base, -1), validation)
        exact = {k: ExactTable.build(_cat(v[0], np.uint64), _cat(v[1], np.int32)) for k, v in self.exact.items()}
        return ReferenceIndex(
            index=NgramIndex.build(_cat(self.keys, np.uint64), _cat(self.items, np.int32), _cat(self.pos, np.int32)),
            set_names=set_names, item_set=_cat(self.item_set, np.int16), item_names=self.names,
            item_len=_cat(self.item_len, np.int32), set_info=set_info, item_canon=_cat(canon_of, np.int32),
            exact_ref=exact[False], exact_val=exact[True])


def build_index(references: Sequence[ReferenceSpec], summaries: Sequence[Any], validation_sources: Sequence[str],
                encoder: Encoder, n: int, *, exact_min_tokens: int = 1) -> tuple[ReferenceIndex, list[str]]:
    """Tokenise the reference sets and the validation rows into one index.

    Returns the index and the item texts (kept in the driver for the report only)."""
    b = _Builder(exact_min_tokens)
    set_names: list[str] = []
    item_texts: list[str] = []
    info: list[dict[str, Any]] = []
    split = encoder.has_split_form
    for spec in references:
        ref = spec.load()
        texts = [t for _, t in ref.items]
        canon = _reference_items(texts, encoder, n, split=False)
        variant = _Variants(texts, lambda sub: _reference_items(sub, encoder, n, split=True)) if split else None
        b.add(len(set_names), [i for i, _ in ref.items], canon, variant, validation=False)
        set_names.append(spec.name)
        item_texts.extend(texts)
        info.append({"set": spec.name, "items": len(texts), "too_short": int((canon.tokens < n).sum()),
                     "ngrams": int(len(canon.hashes)), "tokens": int(canon.tokens.sum()),
                     "source": spec.path or "shipped"})
    if validation_sources:
        summaries = [s for s in summaries if s]
        ids = [i for s in summaries for i in s["ids"]]
        parts = [p for s in summaries for p in s["parts"]]
        canon = _validation_items(parts, encoder, n, split=False)
        variant = _Variants(parts, lambda sub: _validation_items(sub, encoder, n, split=True)) if split else None
        b.add(len(set_names), ids, canon, variant, validation=True)
        set_names.append(VALIDATION_SET)
        item_texts.extend("\n".join(p)[:1500] for p in parts)
        info.append({"set": VALIDATION_SET, "items": len(ids), "too_short": int((canon.item_len == 0).sum()),
                     "ngrams": len(canon.hashes), "tokens": int(canon.item_len.sum()),
                     "source": ", ".join(validation_sources)})
    return b.finish(set_names, info), item_texts


def _cat(xs: Sequence[np.ndarray], dtype: Any) -> np.ndarray:
    return np.concatenate(xs).astype(dtype) if xs else np.zeros(0, dtype)
