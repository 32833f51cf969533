"""Train/validation overlap and benchmark contamination: token n-gram scan, row by row.

How it works
------------
* ``fit`` builds one :class:`~dataguard.text.ngrams.NgramIndex` (sorted uint64 n-gram
  hashes + parallel (reference item, position) postings) from the reference sets (shipped
  benchmarks, user files) and from the run's own validation rows (collected by
  ``summarize`` from the sources named in ``validation_sources``).
* ``apply`` normalises every scanned message (lowercase, NFKC, punctuation and whitespace
  folding; digits kept), tokenises it (the shared tokenizer; or words in ``mode="word"``),
  hashes all n-grams of each message with a vectorised polynomial hash, and looks them up.
  Messages are scanned separately, so no n-gram spans two turns.
* Per row it writes: ``overlap_ratio`` (share of the row's tokens covered by matching
  n-grams), ``overlap_longest`` (longest covered span, tokens), ``overlap_ngrams`` (matching
  n-gram positions), ``overlap_ref_set``/``overlap_ref_item`` (the reference item the row
  covers most, by share of that item's tokens), ``overlap_ref_coverage`` (that share) and
  ``contaminated``.
* A row is contaminated when it shares at least one n-gram and either its
  ``overlap_ratio >= threshold`` (the row is mostly reference text) or its
  ``overlap_ref_coverage >= ref_threshold`` (most of one reference item is in the row, e.g.
  a benchmark question embedded in a long answer). A row with fewer than ``n`` tokens has
  no n-grams and is never flagged (unlike the lm-eval Janitor, which calls every short
  document dirty).
* Train/validation leakage, both directions: training rows are scanned against the
  validation rows (reference set ``validation``); validation rows are scanned against the
  benchmarks only, and ``absorb`` records, per validation row, the training row that covers
  most of it. Exact (normalised) duplicates across the splits are counted from whole-row
  hashes; near-exact ones are pairs where the training row is >= ``near_duplicate``
  validation text and covers >= ``near_duplicate`` of the validation row.

Actions: ``flag`` (keep, ``contaminated`` column), ``drop`` (reason ``contamination``, the
detail names the set, the item and the measured shares), ``mask`` (remove the covered
character spans from the messages, keep the row, ``overlap_masked`` = true; a row with
nothing left is dropped with reason ``contamination``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from dataguard.records import MESSAGES_TYPE, ROLES, reject_rows, set_column
from dataguard.references import DEFAULT_REFERENCES, ReferenceError, ReferenceSpec, parse_specs
from dataguard.stage import Outcome, Stage, StageConfigError
from dataguard.text.ngrams import (
    NgramIndex,
    concat_ids,
    expand_postings,
    mix_ids,
    ngram_hashes,
    segment_hashes,
    word_symbols,
)
from dataguard.text.normalize_text import (
    NormalizeConfig,
    normalize_batch,
    normalize_joined,
    normalize_with_offsets,
)
from dataguard.text.tokenizers import check_tokenizer_spec

VALIDATION_SET = "validation"
REASON = "contamination"
MODES = ("token", "word")
ACTIONS = ("flag", "drop", "mask")
HIST_EDGES = [round(i / 20, 2) for i in range(21)]
_WORD_RE = re.compile(r"[^ \t\n\r\x0b\x0c\x00]+")
_POSTING_CAP = 64  # postings followed per matching n-gram (attribution of very common n-grams)


# ---------------------------------------------------------------------------------------
# Encoding: texts -> flat uint64 symbols + document offsets
# ---------------------------------------------------------------------------------------
class _Encoder:
    """Normalise + tokenise documents, the same way for references and scanned rows."""

    def __init__(self, mode: str, norm: NormalizeConfig, tokenizer: str | None) -> None:
        self.mode, self.norm, self.tokenizer_spec = mode, norm, tokenizer
        self._tok: Any = None

    def __getstate__(self) -> dict[str, Any]:
        return {"mode": self.mode, "norm": self.norm, "tokenizer_spec": self.tokenizer_spec, "_tok": None}

    def tokenizer(self) -> Any:
        if self._tok is None:
            from dataguard.text.tokenizers import get_tokenizer

            self._tok = get_tokenizer(self.tokenizer_spec)
        return self._tok

    def encode(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """(uint64 symbols of all documents, offsets with len(texts) + 1 entries)."""
        if self.mode == "word":
            return word_symbols(normalize_joined(texts, self.norm, collapse=False))
        ids, starts = concat_ids(self.tokenizer().encode_batch(normalize_batch(texts, self.norm)))
        return mix_ids(ids), starts

    def encode_one_with_spans(self, text: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Slow path for one text: (symbols, token start char, token end char) in ``text``."""
        norm, src = normalize_with_offsets(text, self.norm)
        if self.mode == "word":
            spans = [(m.start(), m.end()) for m in _WORD_RE.finditer(norm)]
            symbols, _ = word_symbols(normalize_joined([norm], NormalizeConfig.from_param(False)))
        else:
            ids = self.tokenizer().encode_batch([norm])[0]
            spans = _token_char_spans(self.tokenizer(), ids, norm)
            symbols = mix_ids(ids)
        if len(spans) != len(symbols):  # cannot align: report no spans rather than wrong ones
            return symbols, np.zeros(0, np.int64), np.zeros(0, np.int64)
        if not spans:
            return symbols, np.zeros(0, np.int64), np.zeros(0, np.int64)
        # a BPE token " word" starts at its space; the word itself is what was copied
        s = np.array([a + 1 if a + 1 < b and norm[a] == " " else a for a, b in spans], dtype=np.int64)
        e = np.array([b for _, b in spans], dtype=np.int64)
        # map normalised-char offsets to the user's text
        return symbols, src[np.minimum(s, len(src) - 1)], src[np.maximum(e - 1, 0)] + 1


def _token_char_spans(tok: Any, ids: np.ndarray, text: str) -> list[tuple[int, int]]:
    """Character span of each token in ``text`` by decoding; tokens that split a character
    share the span of the smallest token group that decodes to whole characters."""
    spans: list[tuple[int, int]] = []
    pos = 0
    group: list[int] = []
    for t in ids.tolist():
        group.append(t)
        piece = tok.decode(group)
        if text.startswith(piece, pos) or len(group) >= 8:
            end = min(pos + len(piece), len(text))
            spans.extend([(pos, end)] * len(group))
            pos, group = end, []
    if group:
        spans.extend([(pos, len(text))] * len(group))
    return spans


# ---------------------------------------------------------------------------------------
@dataclass
class _Rows:
    """The scanned messages of a batch, flattened."""

    n_rows: int
    contents: list[str]  # one per scanned message (document)
    msg_row: np.ndarray  # row of each document
    msg_local: np.ndarray  # index of the document inside its row's messages list
    symbols: np.ndarray
    starts: np.ndarray

    @property
    def doc_len(self) -> np.ndarray:
        return np.diff(self.starts)

    def row_tokens(self, min_doc: int = 0) -> np.ndarray:
        """Tokens per row, counting only messages of at least ``min_doc`` tokens (the
        messages that can hold an n-gram, when ``min_doc = n``)."""
        lens = self.doc_len
        return np.bincount(self.msg_row, weights=lens * (lens >= min_doc), minlength=self.n_rows).astype(np.int64)


def _row_hashes(rows: _Rows) -> np.ndarray:
    """Order-sensitive hash of each row's normalised token sequence (empty messages skipped)."""
    doc_h = segment_hashes(rows.symbols, rows.starts[:-1], rows.starts[1:])
    keep = rows.doc_len > 0
    doc_h, doc_row = doc_h[keep], rows.msg_row[keep]
    counts = np.bincount(doc_row, minlength=rows.n_rows)
    ends = np.cumsum(counts)
    return segment_hashes(doc_h, ends - counts, ends, salt=0xD0C)


# ---------------------------------------------------------------------------------------
class OverlapStage(Stage):
    """n-gram overlap with benchmarks and with the run's validation split (module docstring)."""

    name = "overlap"
    needs_fit = True

    def __init__(
        self,
        *,
        references: Sequence[str | Mapping[str, Any]] = DEFAULT_REFERENCES,
        validation_sources: Sequence[str] = (),
        n: int = 13,
        mode: str = "token",
        tokenizer: str | None = None,
        threshold: float = 0.5,
        ref_threshold: float = 0.3,
        action: str = "flag",
        normalize: bool | Mapping[str, bool] | None = None,
        roles: Sequence[str] = ROLES,
        near_duplicate: float = 0.9,
        max_examples: int = 20,
    ) -> None:
        if isinstance(references, str | Mapping):
            references = [references]
        try:
            self.references: list[ReferenceSpec] = parse_specs(list(references))
        except ReferenceError as exc:
            raise StageConfigError(f"references: {exc}") from exc
        if isinstance(validation_sources, str):
            validation_sources = [validation_sources]
        if not all(isinstance(s, str) and s for s in validation_sources):
            raise StageConfigError("validation_sources: must be a list of input (source) names")
        if VALIDATION_SET in {r.name for r in self.references}:
            raise StageConfigError(f"references: the name {VALIDATION_SET!r} is reserved for the validation split")
        if not self.references and not validation_sources:
            raise StageConfigError("references: give at least one reference set or validation_sources")
        if not isinstance(n, int) or isinstance(n, bool) or not 8 <= n <= 50:
            raise StageConfigError(f"n: must be an integer in 8..50, got {n!r}")
        if mode not in MODES:
            raise StageConfigError(f"mode: must be one of {MODES}, got {mode!r}")
        if tokenizer is not None and not isinstance(tokenizer, str):
            raise StageConfigError(f"tokenizer: must be a name or a path, got {tokenizer!r}")
        try:
            check_tokenizer_spec(tokenizer)  # fail here, not in a worker
        except ValueError as exc:
            raise StageConfigError(str(exc), param="tokenizer") from None
        for pname, value in (("threshold", threshold), ("ref_threshold", ref_threshold),
                             ("near_duplicate", near_duplicate)):
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0.0 < float(value) <= 1.0:
                raise StageConfigError(f"{pname}: must be a number in (0, 1], got {value!r}")
        if action not in ACTIONS:
            raise StageConfigError(f"action: must be one of {ACTIONS}, got {action!r}")
        try:
            self.norm = NormalizeConfig.from_param(normalize)
        except ValueError as exc:
            raise StageConfigError(f"normalize: {exc}") from exc
        roles = [roles] if isinstance(roles, str) else list(roles)
        bad = [r for r in roles if r not in ROLES]
        if not roles or bad:
            raise StageConfigError(f"roles: must be a non-empty subset of {ROLES}, got {roles!r}")
        if not isinstance(max_examples, int) or isinstance(max_examples, bool) or not 0 <= max_examples <= 50:
            raise StageConfigError(f"max_examples: must be an integer in 0..50, got {max_examples!r}")
        self.validation_sources = tuple(validation_sources)
        self.n, self.mode, self.action = n, mode, action
        self.threshold, self.ref_threshold = float(threshold), float(ref_threshold)
        self.near_duplicate = float(near_duplicate)
        self.roles = tuple(roles)
        self.max_examples = max_examples
        self._encoder = _Encoder(mode, self.norm, tokenizer)
        self.tokenizer_spec = tokenizer
        # fitted state
        self._index: NgramIndex | None = None
        self._set_names: list[str] = []
        self._item_set: np.ndarray = np.zeros(0, np.int16)
        self._item_names: list[str] = []
        self._item_len: np.ndarray = np.zeros(0, np.int32)
        self._set_info: list[dict[str, Any]] = []
        self._val_hashes: np.ndarray = np.zeros(0, np.uint64)
        self._val_hash_ids: list[str] = []
        self._item_texts: list[str] | None = None  # driver only
        self._stats: dict[str, Any] | None = None

    # -- pickling: workers need the index, not the texts or a loaded tokenizer -----------------
    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_item_texts"] = None  # the encoder drops its loaded tokenizer itself
        return state

    # -- columns --------------------------------------------------------------------------
    def output_columns(self) -> dict[str, pa.DataType]:
        cols = {
            "overlap_ratio": pa.float64(),
            "overlap_longest": pa.int64(),
            "overlap_ngrams": pa.int64(),
            "overlap_ref_set": pa.string(),
            "overlap_ref_item": pa.string(),
            "overlap_ref_coverage": pa.float64(),
            "contaminated": pa.bool_(),
        }
        if self.action == "mask":
            cols["overlap_masked"] = pa.bool_()
        return cols

    # -- rows -----------------------------------------------------------------------------
    def _rows(self, table: pa.Table) -> _Rows:
        n_rows = table.num_rows
        msgs = table.column("messages").combine_chunks() if n_rows else pa.array([], MESSAGES_TYPE)
        if isinstance(msgs, pa.ChunkedArray):
            msgs = pa.concat_arrays(msgs.chunks) if msgs.num_chunks else pa.array([], MESSAGES_TYPE)
        lengths = pc.fill_null(pc.list_value_length(msgs), 0).to_numpy(zero_copy_only=False).astype(np.int64)
        flat = pc.list_flatten(msgs)
        total = len(flat)
        row_of = np.repeat(np.arange(n_rows, dtype=np.int64), lengths)
        local = np.arange(total, dtype=np.int64) - np.repeat(np.cumsum(lengths) - lengths, lengths)
        if total:
            roles = flat.field("role")
            keep = pc.fill_null(pc.is_in(roles, value_set=pa.array(self.roles, pa.string())), False)
            keep_np = keep.to_numpy(zero_copy_only=False)
            contents = pc.fill_null(flat.field("content").filter(keep), "").to_pylist()
            row_of, local = row_of[keep_np], local[keep_np]
        else:
            contents = []
        symbols, starts = self._encoder.encode(contents)
        return _Rows(n_rows, contents, row_of, local, symbols, starts)

    # -- fit ------------------------------------------------------------------------------
    def summarize(self, batch: pa.Table) -> dict[str, Any] | None:
        """The validation rows of the batch (ids, scanned message texts): they become the
        ``validation`` reference set at fit time, encoded in the driver with the same
        tokenizer / word vocabulary as the benchmarks."""
        if not self.validation_sources or batch.num_rows == 0:
            return None
        is_val = pc.is_in(batch.column("source"), value_set=pa.array(self.validation_sources, pa.string()))
        val = batch.filter(pc.fill_null(is_val, False))
        if val.num_rows == 0:
            return None
        return {"ids": val.column("id").to_pylist(),
                "parts": [[c for _, c in parts] for parts in _row_parts(val, self.roles)]}

    def _encode_validation(self, summaries: Sequence[Any]) -> dict[str, Any]:
        ids = [i for s in summaries for i in s["ids"]]
        parts = [p for s in summaries for p in s["parts"]]
        docs = [c for p in parts for c in p]
        msg_row = np.repeat(np.arange(len(parts), dtype=np.int64), [len(p) for p in parts])
        symbols, starts = self._encoder.encode(docs)
        rows = _Rows(len(parts), docs, msg_row, np.zeros(len(docs), np.int64), symbols, starts)
        ng = ngram_hashes(symbols, starts, self.n)
        row_tokens = rows.row_tokens()
        row_first = (np.cumsum(row_tokens) - row_tokens).astype(np.int64)
        ng_row = msg_row[ng.doc] if len(ng.doc) else np.zeros(0, np.int64)
        return {
            "ids": ids,
            "texts": ["\n".join(p)[:1500] for p in parts],
            "hashes": ng.hashes,
            "item": ng_row.astype(np.int32),
            "pos": (ng.pos - row_first[ng_row]).astype(np.int32),
            # coverage is measured against the tokens an n-gram can reach: a 5-token
            # instruction next to a long answer cannot be matched and should not dilute it
            "item_len": rows.row_tokens(self.n).astype(np.int32),
            "row_len": row_tokens,
            "row_hash": _row_hashes(rows),
        }

    def fit(self, summaries: Sequence[Any]) -> None:
        """Tokenise the reference sets and merge them with the validation postings."""
        keys, items, poss = [], [], []
        set_names, item_set, item_names, item_len, item_texts, info = [], [], [], [], [], []
        for set_idx, spec in enumerate(self.references):
            ref = spec.load()
            texts = [t for _, t in ref.items]
            symbols, starts = self._encoder.encode(texts)
            ng = ngram_hashes(symbols, starts, self.n)
            base = len(item_names)
            lens = np.diff(starts).astype(np.int32)
            keys.append(ng.hashes)
            items.append((ng.doc + base).astype(np.int32))
            poss.append((ng.pos - starts[ng.doc]).astype(np.int32))
            set_names.append(spec.name)
            item_set.append(np.full(len(texts), set_idx, np.int16))
            item_names.extend(i for i, _ in ref.items)
            item_len.append(lens)
            item_texts.extend(texts)
            info.append({"set": spec.name, "items": len(texts), "too_short": int((lens < self.n).sum()),
                         "ngrams": int(len(ng.hashes)), "tokens": int(lens.sum()),
                         "source": spec.path or "shipped"})
        val_summaries = [self._encode_validation([s for s in summaries if s])] if self.validation_sources else []
        val_hashes, val_hash_ids = [], []
        if self.validation_sources:
            set_idx = len(set_names)
            set_names.append(VALIDATION_SET)
            n_val, n_short, n_grams, n_tok = 0, 0, 0, 0
            for s in val_summaries:
                base = len(item_names)
                keys.append(s["hashes"])
                items.append(s["item"] + base)
                poss.append(s["pos"])
                item_set.append(np.full(len(s["ids"]), set_idx, np.int16))
                item_names.extend(s["ids"])
                item_len.append(s["item_len"])
                item_texts.extend(s["texts"])
                nonempty = s["row_len"] > 0
                val_hashes.append(s["row_hash"][nonempty])
                val_hash_ids.extend(i for i, ok in zip(s["ids"], nonempty, strict=True) if ok)
                n_val += len(s["ids"])
                n_short += int((s["item_len"] == 0).sum())
                n_grams += len(s["hashes"])
                n_tok += int(s["item_len"].sum())
            info.append({"set": VALIDATION_SET, "items": n_val, "too_short": n_short, "ngrams": n_grams,
                         "tokens": n_tok, "source": ", ".join(self.validation_sources)})
        cat = (lambda xs, dt: np.concatenate(xs).astype(dt) if xs else np.zeros(0, dt))  # noqa: E731
        self._index = NgramIndex.build(cat(keys, np.uint64), cat(items, np.int32), cat(poss, np.int32))
        self._set_names = set_names
        self._item_set = cat(item_set, np.int16)
        self._item_names = item_names
        self._item_len = cat(item_len, np.int32)
        self._item_texts = item_texts
        self._set_info = info
        self._val_hashes = cat(val_hashes, np.uint64)
        self._val_hash_ids = val_hash_ids

    # -- apply ----------------------------------------------------------------------------
    def apply(self, batch: pa.Table) -> Outcome:
        if self._index is None:
            raise RuntimeError("OverlapStage.apply called before fit()")
        n_rows = batch.num_rows
        rows = self._rows(batch)
        is_val = self._is_val(batch)
        m = self._measure(rows, is_val)
        contaminated = (m["ngrams"] > 0) & ((m["ratio"] >= self.threshold) | (m["coverage"] >= self.ref_threshold))
        kept_cols = {
            "overlap_ratio": pa.array(m["ratio"], pa.float64()),
            "overlap_longest": pa.array(m["longest"], pa.int64()),
            "overlap_ngrams": pa.array(m["ngrams"], pa.int64()),
            "overlap_ref_set": pa.array(m["set_name"], pa.string()),
            "overlap_ref_item": pa.array(m["item_name"], pa.string()),
            "overlap_ref_coverage": pa.array(m["coverage"], pa.float64()),
            "contaminated": pa.array(contaminated, pa.bool_()),
        }
        table = batch
        for name, col in kept_cols.items():
            table = set_column(table, name, col)
        ids = batch.column("id").to_pylist() if n_rows else []
        example_rows = np.flatnonzero(contaminated)[: self.max_examples]
        need_spans = set(example_rows.tolist())
        if self.action == "mask":
            need_spans |= set(np.flatnonzero(contaminated).tolist())
        spans = {r: self._row_spans(rows, r, bool(is_val[r])) for r in sorted(need_spans)}

        drop = np.zeros(n_rows, dtype=bool)
        details: list[str] = []
        masked = np.zeros(n_rows, dtype=bool)
        original = table  # rejected rows keep the text as it came in, never a masked copy
        if self.action == "drop":
            drop = contaminated.copy()
        elif self.action == "mask":
            table, masked, emptied = self._mask(table, rows, spans, contaminated)
            # a contaminated row whose spans could not be located is dropped, not kept as is
            drop = emptied | (contaminated & ~masked)
            masked_col = pa.array(masked, pa.bool_())
            table = set_column(table, "overlap_masked", masked_col)
            original = set_column(original, "overlap_masked", pa.array(np.zeros(n_rows, bool), pa.bool_()))
        for r in np.flatnonzero(drop):
            note = ""
            if self.action == "mask":
                note = "; nothing left after masking" if masked[r] else "; spans could not be located for masking"
            details.append(self._detail(m, int(r)) + note)
        rejected = reject_rows(original, drop, self.name, REASON, details) if drop.any() else None
        kept = table.filter(pa.array(~drop, pa.bool_())) if drop.any() else table
        stats = self._batch_stats(batch, rows, m, contaminated, is_val, ids, spans, example_rows,
                                  int(drop.sum()), int(masked.sum()))
        if rejected is None:
            return Outcome(kept=kept, stats=stats)
        return Outcome(kept=kept, rejected=rejected, stats=stats)

    def _is_val(self, batch: pa.Table) -> np.ndarray:
        if not self.validation_sources or batch.num_rows == 0:
            return np.zeros(batch.num_rows, dtype=bool)
        mask = pc.is_in(batch.column("source"), value_set=pa.array(self.validation_sources, pa.string()))
        return pc.fill_null(mask, False).to_numpy(zero_copy_only=False).astype(bool)

    def _val_set(self) -> int:
        return self._set_names.index(VALIDATION_SET) if VALIDATION_SET in self._set_names else -1

    def _match(self, hashes: np.ndarray, ng_row: np.ndarray, is_val: np.ndarray) -> tuple[np.ndarray, ...]:
        """Postings (query n-gram, item, position in item) of matching n-grams, with
        validation rows never matched against the validation set itself."""
        assert self._index is not None
        q, lo, hi = self._index.lookup(hashes)
        pq, entry = expand_postings(q, lo, hi, _POSTING_CAP)
        item = self._index.items[entry]
        ipos = self._index.pos[entry]
        val_set = self._val_set()
        if val_set >= 0 and is_val.any() and len(pq):
            ok = ~(is_val[ng_row[pq]] & (self._item_set[item] == val_set))
            pq, item, ipos = pq[ok], item[ok], ipos[ok]
        return pq, item, ipos

    def _measure(self, rows: _Rows, is_val: np.ndarray) -> dict[str, Any]:
        n, n_rows = self.n, rows.n_rows
        total = len(rows.symbols)
        ng = ngram_hashes(rows.symbols, rows.starts, n)
        ng_row = rows.msg_row[ng.doc] if len(ng.doc) else np.zeros(0, np.int64)
        pq, item, ipos = self._match(ng.hashes, ng_row, is_val)
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
        # row side: tokens covered by matching n-grams
        p = ng.pos[matched_q]
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
        # item side: share of each matched item's tokens present in the row
        prow = ng_row[pq]
        key = prow * len(self._item_names) + item
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
        g_row = g_key // len(self._item_names)
        g_item = g_key % len(self._item_names)
        g_frac = np.minimum(item_cov / np.maximum(self._item_len[g_item], 1), 1.0)
        out["pairs"] = (g_row, g_item, g_frac)
        best = np.lexsort((g_item, -item_cov, -g_frac, g_row))
        first = best[np.concatenate([[True], g_row[best][1:] != g_row[best][:-1]])]
        b_row, b_item = g_row[first], g_item[first]
        out["coverage"][b_row] = g_frac[first]
        out["best_item"][b_row] = b_item
        for r, it in zip(b_row.tolist(), b_item.tolist(), strict=True):
            out["set_name"][r] = self._set_names[self._item_set[it]]
            out["item_name"][r] = self._item_names[it]
        return out

    # -- spans, masking, details --------------------------------------------------------
    def _row_spans(self, rows: _Rows, r: int, is_val: bool) -> dict[int, list[tuple[int, int]]]:
        """Covered character spans per message (index into the row's messages list)."""
        out: dict[int, list[tuple[int, int]]] = {}
        for d in np.flatnonzero(rows.msg_row == r).tolist():
            text = rows.contents[d]
            symbols, cs, ce = self._encoder.encode_one_with_spans(text)
            if len(cs) < self.n:
                continue
            ng = ngram_hashes(symbols, np.array([0, len(symbols)], np.int64), self.n)
            pq, _, _ = self._match(ng.hashes, np.zeros(len(ng.hashes), np.int64), np.array([is_val]))
            if len(pq) == 0:
                continue
            cov = np.zeros(len(symbols), dtype=bool)
            for start in np.unique(ng.pos[pq]).tolist():
                cov[start:start + self.n] = True
            edges = np.diff(cov.astype(np.int8), prepend=np.int8(0), append=np.int8(0))
            spans = []
            for a, b in zip(np.flatnonzero(edges == 1).tolist(), np.flatnonzero(edges == -1).tolist(), strict=True):
                s, e = _widen(text, int(cs[a]), int(ce[b - 1]))
                if spans and s <= spans[-1][1]:
                    spans[-1] = (spans[-1][0], max(spans[-1][1], e))
                else:
                    spans.append((s, e))
            out[int(rows.msg_local[d])] = spans
        return out

    def _mask(self, table: pa.Table, rows: _Rows, spans: dict[int, dict[int, list[tuple[int, int]]]],
              contaminated: np.ndarray) -> tuple[pa.Table, np.ndarray, np.ndarray]:
        n_rows = table.num_rows
        masked = np.zeros(n_rows, dtype=bool)
        emptied = np.zeros(n_rows, dtype=bool)
        todo = [r for r in np.flatnonzero(contaminated).tolist() if spans.get(r)]
        if not todo:
            return table, masked, emptied
        messages = table.column("messages").to_pylist()
        for r in todo:
            msgs = messages[r]
            for local, sp in spans[r].items():
                msgs[local]["content"] = _cut(msgs[local]["content"] or "", sp)
            masked[r] = True
            emptied[r] = not any((m["content"] or "").strip() for m in msgs if m["role"] in self.roles)
        col = pa.array(messages, MESSAGES_TYPE)
        idx = table.column_names.index("messages")
        return table.set_column(idx, "messages", col), masked, emptied

    def _detail(self, m: dict[str, Any], r: int) -> str:
        it = int(m["best_item"][r])
        where = f"{self._set_names[self._item_set[it]]} item {self._item_names[it]}" if it >= 0 else "references"
        text = (f"overlap with {where}: {m['coverage'][r]:.0%} of the item's tokens, {m['ratio'][r]:.0%} of the row "
                f"(longest span {int(m['longest'][r])} tokens, {int(m['ngrams'][r])} matching {self.n}-grams); "
                f"thresholds: item coverage >= {self.ref_threshold:g} or row share >= {self.threshold:g}")
        return text

    # -- stats / describe -----------------------------------------------------------------
    def _batch_stats(self, batch: pa.Table, rows: _Rows, m: dict[str, Any], contaminated: np.ndarray,
                     is_val: np.ndarray, ids: list[str], spans: dict[int, Any], example_rows: np.ndarray,
                     dropped: int, masked: int) -> dict[str, Any]:
        n_sets = len(self._set_names)
        g_row, g_item, g_frac = m["pairs"]
        g_set = self._item_set[g_item].astype(np.int64) if len(g_item) else np.zeros(0, np.int64)
        any_pairs = np.unique(g_row * n_sets + g_set)
        per_set_any = np.bincount(any_pairs % n_sets, minlength=n_sets) if len(any_pairs) else np.zeros(n_sets, int)
        best = m["best_item"]
        best_set = np.where(best >= 0, self._item_set[np.maximum(best, 0)] if len(self._item_set) else -1, -1)
        per_set_cont = np.bincount(best_set[contaminated], minlength=n_sets) if contaminated.any() else np.zeros(n_sets, int)
        matched = m["ngrams"] > 0
        stats: dict[str, Any] = {
            "rows": int(batch.num_rows),
            "tokens": int(len(rows.symbols)),
            "short_rows": int((m["row_tokens"] < self.n).sum()),
            "matched_rows": int(matched.sum()),
            "contaminated": int(contaminated.sum()),
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
            parts = _row_parts(batch.take(pa.array(example_rows)), self.roles)  # only these rows
            for r, row_parts in zip(example_rows.tolist(), parts, strict=True):
                stats["examples"].append(self._example(ids[r], row_parts, spans.get(r, {}), m, r))
        val_set = self._val_set()
        if val_set >= 0:
            train = ~is_val
            sel = (self._item_set[g_item] == val_set) & train[g_row] if len(g_row) else np.zeros(0, bool)
            best: dict[int, tuple[float, str, float]] = {}
            for r, it, f in zip(g_row[sel].tolist(), g_item[sel].tolist(), g_frac[sel].tolist(), strict=True):
                cur = best.get(it)
                if cur is None or f > cur[0]:
                    best[it] = (f, ids[r], float(m["ratio"][r]))
            stats["val_best"] = best
            near = sel & (g_frac >= self.near_duplicate)
            if near.any():
                # both directions: the validation row is (almost) all in the training row
                # and the training row's matchable text is (almost) all validation text
                share = m["covered"] / np.maximum(m["coverable"], 1)
                both = g_row[near][share[g_row[near]] >= self.near_duplicate]
                stats["near_count"] = int(len(np.unique(both)))
            if len(self._val_hashes) and train.any():
                rh = _row_hashes(rows)
                hit = train & np.isin(rh, self._val_hashes) & (m["row_tokens"] > 0)
                stats["exact_count"] = int(hit.sum())
                lookup = dict(zip(self._val_hashes.tolist(), self._val_hash_ids, strict=True))
                stats["exact"] = [(ids[r], lookup[int(rh[r])]) for r in np.flatnonzero(hit)[:20].tolist()]
        return stats

    def _example(self, row_id: str, parts: list[tuple[int, str]], spans: dict[int, list[tuple[int, int]]],
                 m: dict[str, Any], r: int) -> dict[str, Any]:
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
            "label": self._set_names[self._item_set[it]] if it >= 0 else None,
            "item": it,
            "text": ("…" if lo else "") + joined[lo:hi] + ("…" if hi < len(joined) else ""),
            "spans": [[s + (1 if lo else 0), e + (1 if lo else 0)] for s, e in clipped],
            "note": (f"{self._item_names[it] if it >= 0 else ''}: item coverage {m['coverage'][r]:.0%}, "
                     f"row share {m['ratio'][r]:.0%}, longest span {int(m['longest'][r])} tokens"),
        }

    def absorb(self, stats: Sequence[Any]) -> None:
        n_sets = len(self._set_names)
        agg: dict[str, Any] = {
            "rows": 0, "tokens": 0, "short_rows": 0, "matched_rows": 0, "contaminated": 0, "dropped": 0,
            "masked": 0, "val_rows": 0, "exact_count": 0, "near_count": 0,
            "per_set_any": [0] * n_sets, "per_set_contaminated": [0] * n_sets,
            "ratio_hist": [0] * (len(HIST_EDGES) - 1), "coverage_hist": [0] * (len(HIST_EDGES) - 1),
            "examples": [], "val_best": {}, "exact": [],
        }
        for s in stats:
            if not s:
                continue
            for k in ("rows", "tokens", "short_rows", "matched_rows", "contaminated", "dropped", "masked",
                      "val_rows", "exact_count", "near_count"):
                agg[k] += s[k]
            for k in ("per_set_any", "per_set_contaminated", "ratio_hist", "coverage_hist"):
                agg[k] = [a + b for a, b in zip(agg[k], s[k], strict=True)]
            agg["examples"].extend(s["examples"])
            agg["exact"].extend(s["exact"])
            for it, v in s["val_best"].items():
                cur = agg["val_best"].get(it)
                if cur is None or v[0] > cur[0]:
                    agg["val_best"][it] = v
        agg["examples"] = _balanced(agg["examples"], self.max_examples)
        agg["exact"] = agg["exact"][:20]
        self._stats = agg

    def _item_text(self, it: int) -> str:
        if self._item_texts is None:
            texts: list[str] = []
            for spec in self.references:
                texts.extend(t for _, t in spec.load().items)
            self._item_texts = texts  # validation texts are not recoverable here
        return self._item_texts[it] if it < len(self._item_texts) else ""

    def training_state(self) -> dict[str, Any]:
        """The sources this run treats as validation: a runner evaluates on them, never trains."""
        return {"splits": {"validation": list(self.validation_sources)}}

    def describe(self) -> dict[str, Any]:
        s = self._stats or {}
        names = self._set_names
        val_best = s.get("val_best", {})
        val_leaked = sorted(((v[0], self._item_names[it], v[1], v[2]) for it, v in val_best.items()
                             if v[0] >= self.ref_threshold), key=lambda x: (-x[0], x[1]))
        summary = {
            "mode": self.mode, "n": self.n, "action": self.action, "threshold": self.threshold,
            "ref_threshold": self.ref_threshold, "references": ", ".join(names),
            "index_ngrams": len(self._index) if self._index is not None else 0,
            "index_mb": round((self._index.nbytes if self._index is not None else 0) / 2**20, 2),
            "rows_scanned": s.get("rows", 0), "tokens_scanned": s.get("tokens", 0),
            "rows_with_any_match": s.get("matched_rows", 0), "rows_contaminated": s.get("contaminated", 0),
            "rows_dropped": s.get("dropped", 0), "rows_masked": s.get("masked", 0),
            "rows_shorter_than_n": s.get("short_rows", 0),
        }
        if self.validation_sources:
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
             "markers": [{"label": "threshold", "value": self.threshold},
                         {"label": "ref_threshold", "value": self.ref_threshold}]},
            {"type": "table", "title": "Reference sets",
             "columns": ["set", "items", f"items < {self.n} tokens (not indexable)", "n-grams", "tokens", "source"],
             "rows": [[i["set"], i["items"], i["too_short"], i["ngrams"], i["tokens"], i["source"]]
                      for i in self._set_info]},
        ]
        if self.validation_sources:
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
            ex["reference"] = self._item_text(it)[:1500] if it >= 0 else None
            items.append(ex)
        blocks.append({"type": "examples", "title": "Contaminated rows (overlapping spans marked)", "items": items})
        return {"title": "Benchmark contamination and train/validation overlap", "summary": summary,
                "blocks": blocks}


# ---------------------------------------------------------------------------------------

def _row_parts(table: pa.Table, roles: Sequence[str]) -> list[list[tuple[int, str]]]:
    wanted = set(roles)
    return [[(i, m["content"] or "") for i, m in enumerate(msgs or []) if m["role"] in wanted]
            for msgs in table.column("messages").to_pylist()]


def _row_texts(table: pa.Table, roles: Sequence[str]) -> list[str]:
    return ["\n".join(c for _, c in parts) for parts in _row_parts(table, roles)]


def _widen(text: str, s: int, e: int) -> tuple[int, int]:
    """Extend a span over the punctuation glued to it (``"Why?"``, ``"(x)"``), which
    normalisation folded away, so masking does not leave stray marks behind."""
    while s > 0 and not text[s - 1].isspace() and not text[s - 1].isalnum():
        s -= 1
    while e < len(text) and not text[e].isspace() and not text[e].isalnum():
        e += 1
    return s, e


def _cut(text: str, spans: list[tuple[int, int]]) -> str:
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


def _balanced(examples: list[dict[str, Any]], k: int) -> list[dict[str, Any]]:
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
