"""Text normalisation before n-gram hashing, so that case, punctuation and spacing edits do
not hide a copied benchmark item.

Two paths that apply the same rules:

* :func:`normalize_batch` - the hot path. The whole batch is joined into one string, run
  through C-level string operations (NFKC, ``lower``), folded byte-wise with a numpy lookup
  table, and split again. No per-character Python.
* :func:`normalize_with_offsets` - the slow path for the few texts whose matching spans are
  shown or masked: it keeps, for every output character, the index of the input character
  it came from, so spans found on the normalised text map back onto the user's text.

Normalised documents have words separated by single spaces and start with one space, so a
BPE tokenizer sees every word in the same " word" form wherever it occurs (a reference item
embedded mid-sentence tokenizes like the item on its own).
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
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
        return not (self.lowercase or self.nfkc or self.punctuation or self.whitespace or not self.digits)

    def as_dict(self) -> dict[str, bool]:
        return asdict(self)


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


_UNICODE_FOLD = _UnicodeFold()
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
    if cfg.punctuation:
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
    lut = _lut_for(cfg)
    chars: list[str] = []
    src: list[int] = []
    if cfg.whitespace:
        chars.append(" ")
        src.append(0)
    for i, ch in enumerate(text):
        if ch == _SEP:
            ch = " "
        for c in _char_fold(ch, cfg, lut):
            if cfg.whitespace and c == " " and chars and chars[-1] == " ":
                continue
            chars.append(c)
            src.append(i)
    if cfg.whitespace and len(chars) > 1 and chars[-1] == " ":
        chars.pop()
        src.pop()
    if cfg.whitespace and len(chars) == 1:  # nothing but the leading space: empty document
        chars, src = [], []
    return "".join(chars), np.asarray(src, dtype=np.int64)
