"""Text normalisation before n-gram hashing, so that case, punctuation and spacing edits do
not hide a copied benchmark item.

Two paths that apply the same rules:

* :func:`normalize_batch` - the hot path. The whole batch is joined into one string, run
  through C-level string operations (NFKC, ``lower``), folded byte-wise with a numpy lookup
  table, and split again. No per-character Python.
* :func:`normalize_with_offsets` - the slow path for the few texts whose matching spans are
  shown or masked: it keeps, for every output character, the index of the input character
  it came from, so spans found on the normalised text map back onto the user's text.

With ``intraword`` (opt-in; the overlap stage turns it on), a run of punctuation *between
two letters or digits* is deleted instead of becoming a space (``Zack's`` -> ``zacks``,
``3/5`` -> ``35``, ``10-foot`` -> ``10foot``), so a copy whose intra-word punctuation was
deleted or changed normalises to the same words as the original.

Normalised documents have words separated by single spaces and start with one space, so a
BPE tokenizer sees every word in the same " word" form wherever it occurs (a reference item
embedded mid-sentence tokenizes like the item on its own).
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

_SEP = "\x00"  # document separator inside a joined batch; never survives normalisation
_SPACE = 0x20
_NON_ASCII_RUN = re.compile(r"[^\x00-\x7f]+")


@dataclass(frozen=True)
class NormalizeConfig:
    """Which edits normalisation undoes. Digits are kept by default: numbers carry the
    content of math items, and folding them would make different problems collide."""

    lowercase: bool = True
    nfkc: bool = True
    punctuation: bool = True  # punctuation and symbols (ASCII and Unicode P*/S*) -> space
    whitespace: bool = True  # every run of whitespace -> one space
    digits: bool = True  # False: digits are folded away (spaces), so changed numbers still match
    intraword: bool = False  # with punctuation: punctuation between two letters/digits is deleted

    @classmethod
    def from_param(cls, value: bool | Mapping[str, Any] | NormalizeConfig | None) -> NormalizeConfig:
        """``True``/``None``: defaults; ``False``: no normalisation; a dict overrides fields."""
        if isinstance(value, NormalizeConfig):
            return value
        if value is None or value is True:
            return cls()
        if value is False:
            return cls(lowercase=False, nfkc=False, punctuation=False, whitespace=False, digits=True)
        if isinstance(value, Mapping):
            known = set(cls.__dataclass_fields__)
            bad = sorted(set(value) - known)
            if bad:
                raise ValueError(f"unknown normalize option(s) {bad}; known: {sorted(known)}")
            for k, v in value.items():
                if not isinstance(v, bool):
                    raise ValueError(f"normalize option {k!r} must be true/false, got {v!r}")
            return cls(**value)
        raise ValueError(f"normalize must be true/false or a mapping of options, got {value!r}")

    @property
    def identity(self) -> bool:
        return not (self.lowercase or self.nfkc or self.punctuation or self.whitespace or self.intraword
                    or not self.digits)

    @property
    def joins_words(self) -> bool:
        """Intra-word punctuation is deleted (it only applies when punctuation is folded)."""
        return self.intraword and self.punctuation



# ---------------------------------------------------------------------------------------
# Character classes
# ---------------------------------------------------------------------------------------
class _UnicodeFold(dict):
    """``str.translate`` table for non-ASCII characters, filled lazily per code point:
    punctuation/symbols/separators/controls -> space, format characters (zero-width space,
    soft hyphen) -> deleted, everything else unchanged."""

    def __missing__(self, cp: int) -> str | None:
        cat = unicodedata.category(chr(cp))
        if cat == "Cf":
            value: str | None = None
        elif cat[0] in "PSZ" or cat in ("Cc", "Zl", "Zp"):
            value = " "
        else:
            value = chr(cp)
        self[cp] = value
        return value


class _UnicodeMark(_UnicodeFold):
    """Like :class:`_UnicodeFold`, but punctuation and symbols become an ASCII mark (``'``)
    instead of a space, so the byte pass can tell intra-word punctuation from spacing."""

    def __missing__(self, cp: int) -> str | None:
        value = _MARK if unicodedata.category(chr(cp))[0] in "PS" else super().__missing__(cp)
        self[cp] = value
        return value


_MARK = "'"
_UNICODE_FOLD = _UnicodeFold()
_UNICODE_MARK = _UnicodeMark()
_UNICODE_SPACE_ONLY = {cp: " " for cp in (0x85, 0xA0, 0x1680, *range(0x2000, 0x200B), 0x2028, 0x2029,
                                           0x202F, 0x205F, 0x3000)}


def _byte_lut(cfg: NormalizeConfig) -> np.ndarray:
    """uint8 -> uint8 table applied to the UTF-8 bytes of the joined batch."""
    lut = np.arange(256, dtype=np.uint8)
    if cfg.lowercase:
        lut[ord("A"):ord("Z") + 1] = np.arange(ord("a"), ord("z") + 1, dtype=np.uint8)
    if cfg.whitespace:
        for c in "\t\n\r\x0b\x0c\x1c\x1d\x1e\x1f":
            lut[ord(c)] = _SPACE
    if cfg.punctuation:
        for c in range(0x21, 0x7F):
            ch = chr(c)
            if not ch.isalnum():
                lut[c] = _SPACE
        for c in range(0x01, 0x20):  # other ASCII controls
            lut[c] = _SPACE
    if not cfg.digits:
        lut[ord("0"):ord("9") + 1] = _SPACE
    return lut


_LUTS: dict[NormalizeConfig, np.ndarray] = {}


def _lut_for(cfg: NormalizeConfig) -> np.ndarray:
    lut = _LUTS.get(cfg)
    if lut is None:
        lut = _LUTS[cfg] = _byte_lut(cfg)
    return lut


def _fold_non_ascii(match: re.Match[str]) -> str:
    return match.group().translate(_UNICODE_FOLD)


def _fold_non_ascii_space(match: re.Match[str]) -> str:
    return match.group().translate(_UNICODE_SPACE_ONLY)


def _mark_non_ascii(match: re.Match[str]) -> str:
    return match.group().translate(_UNICODE_MARK)


# byte / code point classes for intra-word punctuation; every code >= 128 is a word
# character (by then non-ASCII punctuation is a mark and non-ASCII spacing a space)
_IS_PUNCT = np.array([0x21 <= c < 0x7F and not chr(c).isalnum() for c in range(256)], dtype=bool)
_IS_WORD = np.array([c >= 128 or chr(c).isalnum() for c in range(256)], dtype=bool)


def _intraword_drop(codes: np.ndarray) -> np.ndarray:
    """Positions of the characters (bytes or code points) in runs of ASCII punctuation that
    sit between two word characters, e.g. the ``'`` of ``zack's`` or the ``-`` of ``10-foot``."""
    cls = codes if codes.dtype == np.uint8 else np.minimum(codes, 255)
    punct = _IS_PUNCT[cls]
    if len(punct) < 3:
        return np.zeros(0, np.int64)
    # a run can only be inner if it neither starts at 0 nor ends at the last character
    starts = np.flatnonzero(punct[1:] & ~punct[:-1]) + 1
    ends = np.flatnonzero(punct[:-1] & ~punct[1:]) + 1
    if punct[0]:  # the run at 0 has its end first in ``ends``: drop that end
        ends = ends[1:]
    starts = starts[: len(ends)]  # a run reaching the last character has no end
    inner = _IS_WORD[cls[starts - 1]] & _IS_WORD[cls[ends]]
    starts, ends = starts[inner], ends[inner]
    lengths = ends - starts
    return np.arange(int(lengths.sum()), dtype=np.int64) + np.repeat(starts - (np.cumsum(lengths) - lengths), lengths)


# ---------------------------------------------------------------------------------------
# Hot path
# ---------------------------------------------------------------------------------------
def normalize_joined(texts: Sequence[str], cfg: NormalizeConfig, collapse: bool = True) -> np.ndarray:
    """UTF-8 bytes of all normalised texts, each preceded by one NUL separator byte.

    Word mode hashes straight from this buffer; :func:`normalize_batch` splits it. With
    whitespace folding, every document is ``\\x00 word word`` (one leading space, no
    trailing space); an empty document is ``\\x00``.

    ASCII texts (the vast majority) are left to the byte lookup table, which lowercases and
    folds them at numpy speed; only texts with non-ASCII characters go through NFKC,
    ``str.lower`` and the Unicode punctuation table, one by one.
    """
    texts = [t if t.isascii() else _prepare_non_ascii(t, cfg) for t in texts]
    # with whitespace folding every document gets one leading space (see _collapse_spaces)
    sep = _SEP + " " if cfg.whitespace else _SEP
    big = sep + sep.join(texts)
    if big.count(_SEP) != len(texts):  # a text holds NUL itself: treat it as whitespace
        big = sep + sep.join(t.replace(_SEP, " ") for t in texts)
    buf = np.frombuffer(big.encode("utf-8"), dtype=np.uint8)
    if cfg.joins_words:
        buf = np.delete(buf, _intraword_drop(buf))
    buf = _lut_for(cfg)[buf]
    if cfg.whitespace and collapse:  # word mode splits on any whitespace run: no need
        buf = _collapse_spaces(buf)
    return buf


def _prepare_non_ascii(text: str, cfg: NormalizeConfig) -> str:
    """The Unicode part of normalisation, for one text that is not pure ASCII."""
    if cfg.nfkc and not unicodedata.is_normalized("NFKC", text):
        text = unicodedata.normalize("NFKC", text)
    if cfg.lowercase:
        text = text.lower()
    if cfg.joins_words:  # punctuation -> a mark the byte pass deletes inside words
        text = _NON_ASCII_RUN.sub(_mark_non_ascii, text)
    elif cfg.punctuation:
        text = _NON_ASCII_RUN.sub(_fold_non_ascii, text)
    elif cfg.whitespace:
        text = _NON_ASCII_RUN.sub(_fold_non_ascii_space, text)
    return text


def _collapse_spaces(buf: np.ndarray) -> np.ndarray:
    """One space between words, none at the end of a document.

    Every separator is followed by the space ``normalize_joined`` put there, so after
    dropping each space that follows a space (runs -> one) and each space that precedes a
    separator or the end, every non-empty document reads ``\\x00 word word``.
    """
    is_space = buf == _SPACE
    drop = np.zeros(len(buf), dtype=bool)
    drop[1:] = is_space[1:] & is_space[:-1]
    out = buf[~drop]
    is_space = out == _SPACE
    before_sep = np.zeros(len(out), dtype=bool)
    if len(out):
        before_sep[-1] = True
        before_sep[:-1] = out[1:] == 0
    return out[~(is_space & before_sep)]


def normalize_batch(texts: Sequence[str], cfg: NormalizeConfig) -> list[str]:
    """Normalised copies of ``texts`` (same order), for tokenisation."""
    if not texts:
        return []
    if cfg.identity:
        return list(texts)
    parts = normalize_joined(texts, cfg).tobytes().decode("utf-8", errors="replace").split(_SEP)
    return parts[1:]


# ---------------------------------------------------------------------------------------
# Slow path with offsets
# ---------------------------------------------------------------------------------------
def _char_fold(ch: str, cfg: NormalizeConfig, lut: np.ndarray) -> str:
    """What normalisation turns one character into (before whitespace collapsing)."""
    out = []
    piece = unicodedata.normalize("NFKC", ch) if cfg.nfkc and not ch.isascii() else ch
    if cfg.lowercase:
        piece = piece.lower()
    for c in piece:
        cp = ord(c)
        if cp < 128:
            out.append(chr(lut[cp]))
        elif cfg.punctuation:
            folded = _UNICODE_FOLD[cp]
            if folded is not None:
                out.append(folded)
        elif cfg.whitespace and cp in _UNICODE_SPACE_ONLY:
            out.append(" ")
        else:
            out.append(c)
    return "".join(out)


def normalize_with_offsets(text: str, cfg: NormalizeConfig) -> tuple[str, np.ndarray]:
    """Normalised text and, per output character, the index of its source character.

    Character-by-character, so NFKC compositions across characters (a letter followed by
    a combining accent) may differ from :func:`normalize_batch`; callers re-tokenise this
    output rather than reuse the batch tokens, so spans stay self-consistent.
    """
    if cfg.identity:
        return text, np.arange(len(text), dtype=np.int64)
    if cfg.joins_words:
        return _with_offsets_joining(text, cfg)
    lut = _lut_for(cfg)
    folded = ((c, i) for i, ch in enumerate(text) for c in _char_fold(" " if ch == _SEP else ch, cfg, lut))
    return _assemble(folded, cfg.whitespace)


def _assemble(chars_with_source: Iterable[tuple[str, int]], whitespace: bool) -> tuple[str, np.ndarray]:
    """Join (character, source index) pairs; with ``whitespace``, as the batch path does: one
    leading space, runs of spaces collapsed, no trailing space, and empty for a blank text."""
    chars: list[str] = [" "] if whitespace else []
    src: list[int] = [0] if whitespace else []
    for c, i in chars_with_source:
        if whitespace and c == " " and chars and chars[-1] == " ":
            continue
        chars.append(c)
        src.append(i)
    if whitespace and len(chars) > 1 and chars[-1] == " ":
        chars.pop()
        src.pop()
    if whitespace and len(chars) == 1:  # nothing but the leading space: empty document
        chars, src = [], []
    return "".join(chars), np.asarray(src, dtype=np.int64)


def _with_offsets_joining(text: str, cfg: NormalizeConfig) -> tuple[str, np.ndarray]:
    """:func:`normalize_with_offsets` with intra-word punctuation deleted: the characters
    before the byte table (NFKC, lower, Unicode punctuation as a mark), then the same
    intra-word deletion as the hot path, then the byte table and space collapsing."""
    raw: list[str] = []
    raw_src: list[int] = []
    for i, ch in enumerate(text):
        piece = " " if ch == _SEP else unicodedata.normalize("NFKC", ch) if cfg.nfkc and not ch.isascii() else ch
        if cfg.lowercase:
            piece = piece.lower()
        for c in piece:
            folded = c if c.isascii() else _UNICODE_MARK[ord(c)]
            if folded is not None:
                raw.append(folded)
                raw_src.append(i)
    codes = np.fromiter((ord(c) for c in raw), dtype=np.int64, count=len(raw))
    keep = np.ones(len(raw), dtype=bool)
    keep[_intraword_drop(codes)] = False
    lut = _lut_for(cfg)
    kept = ((chr(lut[ord(c)]) if ord(c) < 128 else c, i)
            for c, i, k in zip(raw, raw_src, keep.tolist(), strict=True) if k)
    return _assemble(kept, cfg.whitespace)
