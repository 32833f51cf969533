"""Texts -> flat uint64 symbols: the one normalise + tokenise path shared by references,
validation rows and scanned rows, so a copy encodes the same wherever it appears."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from dataguard.records import flat_messages, has_pairs, rejected_texts
from dataguard.text.ngrams import concat_ids, mix_ids, word_symbols
from dataguard.text.normalize_text import (
    NormalizeConfig,
    normalize_batch,
    normalize_joined,
    normalize_with_offsets,
)

_WORD_RE = re.compile(r"[^ \t\n\r\x0b\x0c\x00]+")
_EMPTY = np.zeros(0, np.int64)


class Encoder:
    """Normalise + tokenise documents, the same way for references and scanned rows."""

    def __init__(self, mode: str, norm: NormalizeConfig, tokenizer: str | None) -> None:
        self.mode, self.norm, self.tokenizer_spec = mode, norm, tokenizer
        self._tok: Any = None

    def __getstate__(self) -> dict[str, Any]:
        # workers load their own tokenizer; a loaded one does not pickle cheaply
        return {"mode": self.mode, "norm": self.norm, "tokenizer_spec": self.tokenizer_spec, "_tok": None}

    @property
    def has_split_form(self) -> bool:
        """Whether intra-word punctuation is deleted (``zacks``), so that references are also
        indexed in the split form (``zack s``) that a copy with spaces instead would give."""
        return self.norm.joins_words

    def tokenizer(self) -> Any:
        if self._tok is None:
            from dataguard.text.tokenizers import get_tokenizer

            self._tok = get_tokenizer(self.tokenizer_spec)
        return self._tok

    def encode(self, texts: Sequence[str], split: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """(uint64 symbols of all documents, offsets with len(texts) + 1 entries);
        ``split``: intra-word punctuation becomes a space instead (references only)."""
        norm = replace(self.norm, intraword=False) if split else self.norm
        if self.mode == "word":
            return word_symbols(normalize_joined(texts, norm, collapse=False))
        ids, starts = concat_ids(self.tokenizer().encode_batch(normalize_batch(texts, norm)))
        return mix_ids(ids), starts

    def encode_one_with_spans(self, text: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Slow path for one text: (symbols, token start char, token end char) in ``text``."""
        norm, src = normalize_with_offsets(text, self.norm)
        if self.mode == "word":
            spans = [(m.start(), m.end()) for m in _WORD_RE.finditer(norm)]
            symbols, _ = word_symbols(normalize_joined([norm], NormalizeConfig.from_param(False)))
        else:
            ids = self.tokenizer().encode_batch([norm])[0]
            spans = token_char_spans(self.tokenizer(), ids, norm)
            symbols = mix_ids(ids)
        if len(spans) != len(symbols) or not spans:  # cannot align: no spans rather than wrong ones
            return symbols, _EMPTY, _EMPTY
        # a BPE token " word" starts at its space; the word itself is what was copied
        s = np.array([a + 1 if a + 1 < b and norm[a] == " " else a for a, b in spans], dtype=np.int64)
        e = np.array([b for _, b in spans], dtype=np.int64)
        # map normalised-char offsets to the user's text
        return symbols, src[np.minimum(s, len(src) - 1)], src[np.maximum(e - 1, 0)] + 1


def token_char_spans(tok: Any, ids: np.ndarray, text: str) -> list[tuple[int, int]]:
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


@dataclass
class ScanRows:
    """The scanned messages of a batch, flattened: one document per scanned message."""

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


def scan_rows(table: pa.Table, roles: Sequence[str], encoder: Encoder) -> ScanRows:
    """Encode the messages with a scanned role, keeping each one's row and position (a
    preference pair's rejected response is one more document: ``row_parts``)."""
    n_rows = table.num_rows
    if "assistant" in roles and has_pairs(table):
        parts = row_parts(table, roles)
        texts = [c for one in parts for _, c in one]
        doc_row = np.array([r for r, one in enumerate(parts) for _ in one], np.int64)
        doc_local = np.array([i for one in parts for i, _ in one], np.int64)
        symbols, starts = encoder.encode(texts)
        return ScanRows(n_rows, texts, doc_row, doc_local, symbols, starts)
    lengths, flat = flat_messages(table)
    total = len(flat)
    row_of = np.repeat(np.arange(n_rows, dtype=np.int64), lengths)
    local = np.arange(total, dtype=np.int64) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    contents: list[str] = []
    if total:
        keep = pc.fill_null(pc.is_in(flat.field("role"), value_set=pa.array(list(roles), pa.string())), False)
        keep_np = keep.to_numpy(zero_copy_only=False)
        contents = pc.fill_null(flat.field("content").filter(keep), "").to_pylist()
        row_of, local = row_of[keep_np], local[keep_np]
    symbols, starts = encoder.encode(contents)
    return ScanRows(n_rows, contents, row_of, local, symbols, starts)


def row_parts(table: pa.Table, roles: Sequence[str]) -> list[list[tuple[int, str]]]:
    """Per row, (index in the messages list, content) of each scanned message. When assistant
    turns are scanned, a preference pair's rejected response follows as index
    ``len(messages)``: a benchmark copied into either response contaminates the pair."""
    wanted = set(roles)
    rejected = rejected_texts(table) if "assistant" in wanted else [None] * table.num_rows
    out = []
    for msgs, other in zip(table.column("messages").to_pylist(), rejected, strict=True):
        parts = [(i, m["content"] or "") for i, m in enumerate(msgs or []) if m["role"] in wanted]
        if other is not None:
            parts.append((len(msgs or []), other))
        out.append(parts)
    return out
