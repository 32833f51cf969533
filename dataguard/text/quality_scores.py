"""Repetition and URL scores for a batch of texts, vectorised over one codepoint array.

This is the NumPy reference implementation; the pipeline runs the compiled kernel
(``_qscore.c`` via ``repetition_kernel``) when it is built, and the tests hold both to the
same numbers. One difference: this reference groups by the full 64-bit hash alone, so
adversarial texts whose polynomial hashes collide mod 2**64 (Thue-Morse blocks of 1024+
characters, or crafted ones) can be miscounted here; ordinary texts collide with probability
~ n**2 / 2**64. The kernel compares the text on every hash match and is exact.
Invalid UTF-8 (an Arrow string array built without validation) decodes as
``bytes.decode("utf-8", "replace")`` does, text by text, as in the kernel.

All functions take a list of texts and return one float32 (or int32) value per text. The
texts of a batch are concatenated into one uint32 codepoint array; every n-gram, word and
line is a span of it, hashed in O(1) from one polynomial prefix hash (mod 2**64), and
grouped per text by sorting cache-sized chunks of packed keys ``[text | hash | position]``
(checked against the full hashes; a chunk where the packed bits are ambiguous, or too big
for them, is grouped by a sort on (text, full hash)).
No per-character Python runs; per-text Python is limited to the (few) texts with URLs.

Definitions (each checked against a hand-computed example in tests/test_quality.py):

* ``char_repeat_ratio``: share of characters equal to the previous character of the same
  text (whitespace runs ignored by default, so code indentation is not "repetition").
* ``url_count`` / ``url_char_ratio``: URLs (``scheme://...`` or ``www....``) and the share
  of characters inside them.
* ``special_char_ratio``: data-juicer ``special_characters_filter``: share of characters that
  are punctuation, digits, whitespace or symbols (Unicode categories P, N, Z, S, and controls;
  data-juicer lists them by hand plus the emoji set).
* ``char_rep_ratio``: data-juicer ``character_repetition_filter`` (rep_len 10): over the
  character 10-grams of the text, the sum of the frequencies of the ``min(isqrt(#distinct),
  #repeated)`` most frequent repeated 10-grams divided by the number of 10-grams.
* ``word_rep_ratio``: data-juicer ``word_repetition_filter`` (rep_len 10): words are split
  on space/newline/tab, lower-cased, stripped of special characters at both ends (empty ones
  dropped); the share of word 10-grams whose frequency is > 1.
* Gopher (Rae et al. 2021, Table A1; the datatrove ``GopherRepetitionFilter`` formulas):
  ``dup_line_frac`` (duplicate lines / lines, lines split on runs of newlines),
  ``dup_line_char_frac`` (characters in duplicate lines / characters),
  ``top_{2,3,4}gram_char_frac`` (characters of the most frequent n-gram times its count /
  characters; 0 when no n-gram repeats - datatrove scores the first n-gram of an all-unique
  text, which only measures shortness), ``dup_{5..10}gram_char_frac`` (characters of words
  covered by second-or-later occurrences of an n-gram, each character counted once /
  characters; datatrove counts the same occurrences greedily left to right). Gopher words
  are runs of letters/digits/marks/underscore, and every other non-space character is a word
  of its own (close to NLTK's ``word_tokenize`` that datatrove uses).
"""

from __future__ import annotations

import itertools
import re
import unicodedata
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

_U64 = np.uint64
_BASE = _U64(0x100000001B3)  # FNV prime: odd, so invertible mod 2**64
_BASE_INV = _U64(pow(int(_BASE), -1, 2**64))
_WORD_MIX = _U64(0x9E3779B97F4A7C15)

# Chunked grouping: key = [text:11 | hash:36 | position:17].
_POS_BITS = 17
_TEXT_BITS = 11
_HASH_BITS = 64 - _POS_BITS - _TEXT_BITS
_CHUNK = 1 << 16  # elements per sort: cache-sized (sorting 64k uint64 is ~5x faster per element than 2M)

_SCHEME_MAX = 16  # a scheme is a letter plus 1-15 more characters
_ASCII_LETTERS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
URL_RE = re.compile(r"(?:[a-zA-Z][a-zA-Z0-9+.\-]{1,15}://|www\.)[^\s<>\"'`]+")
_URL_TRAIL = ".,;:!?)]}"

# Character classes, one byte per codepoint, built once per process.
_SPACE, _WORD, _OTHER = 0, 1, 2
_TABLES: dict[str, np.ndarray] = {}


def _tables() -> dict[str, np.ndarray]:
    """Lookup tables over all codepoints: class, lower-case, data-juicer 'special'."""
    if not _TABLES:
        n = 0x110000
        cls = np.full(n, _OTHER, dtype=np.uint8)
        special = np.zeros(n, dtype=bool)
        lower = np.arange(n, dtype=np.uint32)
        # Assigned letters/symbols end at U+323AF (CJK ext. H) apart from plane 14's tags and
        # variation selectors; the rest (unassigned, private use) stays "other, not special".
        for c in itertools.chain(range(0x323B0), range(0xE0000, 0xE01F0)):
            ch = chr(c)
            cat = unicodedata.category(ch)
            if ch.isspace():
                cls[c] = _SPACE
                special[c] = True
            elif cat[0] in "LNM" or ch == "_":
                cls[c] = _WORD
            if cat[0] in "PSNZ" or cat == "Cc":
                special[c] = True  # data-juicer SPECIAL_CHARACTERS: punctuation, digits, whitespace, symbols/emoji
            lo = ch.lower()
            if len(lo) == 1:
                lower[c] = ord(lo)
        _TABLES.update(cls=cls, special=special, lower=lower)
    return _TABLES


_POW: dict[str, np.ndarray] = {}


def _powers(n: int) -> tuple[np.ndarray, np.ndarray]:
    """BASE**i and BASE**-i mod 2**64 for i < n (grown geometrically, shared)."""
    have = _POW.get("pow")
    if have is None or len(have) < n:
        m = max(n, 1 << 16, 2 * (len(have) if have is not None else 0))
        with np.errstate(over="ignore"):
            _POW["pow"] = np.cumprod(np.concatenate([[_U64(1)], np.full(m - 1, _BASE, dtype=_U64)]), dtype=_U64)
            _POW["inv"] = np.cumprod(np.concatenate([[_U64(1)], np.full(m - 1, _BASE_INV, dtype=_U64)]), dtype=_U64)
    return _POW["pow"][:n], _POW["inv"][:n]


def _prefix_hash(cp: np.ndarray) -> np.ndarray:
    """P[i] = sum_{j<i} (cp[j]+1) * BASE**j mod 2**64, length len(cp)+1."""
    pw, _ = _powers(len(cp) + 1)
    out = np.zeros(len(cp) + 1, dtype=_U64)
    with np.errstate(over="ignore"):
        np.cumsum((cp.astype(_U64) + _U64(1)) * pw[: len(cp)], out=out[1:])
    return out


def _span_hash(prefix: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Position-independent hash of cp[start:end] (then mixed so high bits are usable)."""
    _, inv = _powers(len(prefix))
    with np.errstate(over="ignore"):
        h = (prefix[end] - prefix[start]) * inv[start]
        h ^= h >> _U64(31)
        h *= _U64(0xBF58476D1CE4E5B9)
        h ^= h >> _U64(29)
    return h


@dataclass
class Groups:
    """Groups of equal hashes inside each text.

    ``text``/``count``/``first``: per group, its text, its size and the index (in the input
    arrays) of its first occurrence. ``dups``: indices of second-or-later occurrences
    (only when asked for).
    """

    text: np.ndarray
    count: np.ndarray
    first: np.ndarray
    dups: np.ndarray | None = None


def group_within_texts(hashes: np.ndarray, text_of: np.ndarray, want_dups: bool = False) -> Groups:
    """Group equal hashes inside each text. ``text_of`` must be non-decreasing."""
    n = len(hashes)
    empty = np.zeros(0, dtype=np.int64)
    if n == 0:
        return Groups(empty, empty, empty, empty if want_dups else None)
    # Chunks end at text changes: about _CHUNK elements and < 2**_TEXT_BITS texts each, so
    # each sort runs in cache on one packed uint64 key per element.
    change = (np.flatnonzero(text_of[1:] != text_of[:-1]) + 1).tolist()
    bounds = _chunk_bounds(change, n, text_of)
    parts = [_group_chunk(hashes, text_of, a, b, want_dups) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
    return Groups(
        np.concatenate([p[0] for p in parts]),
        np.concatenate([p[1] for p in parts]),
        np.concatenate([p[2] for p in parts]),
        np.concatenate([p[3] for p in parts]) if want_dups else None,
    )


def group_counts(hashes: np.ndarray, text_of: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(text, size) of each group of equal 64-bit hashes inside each text (``text_of``
    non-decreasing); like ``group_within_texts`` without first occurrences (cheaper)."""
    n = len(hashes)
    if n == 0:
        e = np.zeros(0, dtype=np.int64)
        return e, e
    # Mixed first (a bijection, so the groups are the same): the packed keys keep the top
    # bits, and an unmixed polynomial hash of two windows that differ in their first
    # character differs only in its low bits.
    with np.errstate(over="ignore"):
        mixed = hashes * _U64(0xBF58476D1CE4E5B9)
        mixed ^= mixed >> _U64(31)
    change = (np.flatnonzero(text_of[1:] != text_of[:-1]) + 1).tolist()
    bounds = _chunk_bounds(change, n, text_of)
    texts, counts = [], []
    for a, b in zip(bounds[:-1], bounds[1:], strict=True):
        got = _count_packed(mixed, text_of, a, b) if b - a <= 1 << _POS_BITS else None
        if got is None:
            t, c, _, _ = _group_sorted(mixed, text_of, a, b, False)
            got = t, c
        texts.append(got[0])
        counts.append(got[1])
    return np.concatenate(texts), np.concatenate(counts)


def _sorted_packed(hashes: np.ndarray, text_of: np.ndarray, a: int,
                   b: int) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """(sorted packed keys, their group bits, group-start mask) of elements a..b-1; None when
    the kept hash bits are ambiguous (the caller then sorts on the full hash)."""
    key = _packed_keys(hashes, text_of, a, b)
    g = key >> _PSHIFT
    new = np.empty(b - a, dtype=bool)
    new[0] = True
    np.not_equal(g[1:], g[:-1], out=new[1:])
    if not _packed_groups_exact(hashes[a:b], key, new):
        return None
    return key, g, new


def _count_packed(hashes: np.ndarray, text_of: np.ndarray, a: int,
                  b: int) -> tuple[np.ndarray, np.ndarray] | None:
    """(text, count) of the groups of elements a..b-1 from one packed sort (see
    ``_group_packed``); None when the kept hash bits are ambiguous."""
    sorted_ = _sorted_packed(hashes, text_of, a, b)
    if sorted_ is None:
        return None
    key, g, new = sorted_
    starts = np.flatnonzero(new)
    texts = (g[starts] >> (_TSHIFT - _PSHIFT)).view(np.int64) + int(text_of[a])
    return texts, np.diff(starts, append=b - a)


def _chunk_bounds(change: list[int], n: int, text_of: np.ndarray) -> list[int]:
    """Chunk boundaries at text changes: about _CHUNK elements, text ids spanning < 2**_TEXT_BITS."""
    bounds = [0]
    max_span = (1 << _TEXT_BITS) - 1
    first_text = int(text_of[0])
    texts = text_of[change].tolist() if change else []
    for s, t in zip(change, texts, strict=True):
        if s - bounds[-1] >= _CHUNK or t - first_text >= max_span:
            bounds.append(s)
            first_text = t
    bounds.append(n)
    return bounds


_HSHIFT = _U64(64 - _HASH_BITS)
_PSHIFT = _U64(_POS_BITS)
_TSHIFT = _U64(64 - _TEXT_BITS)
_PMASK = _U64((1 << _POS_BITS) - 1)
_POSITIONS = np.arange(1 << _POS_BITS, dtype=_U64)


def _group_chunk(hashes: np.ndarray, text_of: np.ndarray, a: int, b: int,
                 want_dups: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]:
    """Groups of elements a..b-1 by (text, full 64-bit hash): text, count, first index, dups."""
    if b - a <= 1 << _POS_BITS:
        got = _group_packed(hashes, text_of, a, b, want_dups)
        if got is not None:
            return got
    return _group_sorted(hashes, text_of, a, b, want_dups)


def _packed_keys(hashes: np.ndarray, text_of: np.ndarray, a: int, b: int) -> np.ndarray:
    """Sorted keys [text - text_of[a] | top hash bits | position] of elements a..b-1."""
    key = (text_of[a:b] - text_of[a]).view(_U64) << _TSHIFT
    key |= (hashes[a:b] >> _HSHIFT) << _PSHIFT
    key |= _POSITIONS[: b - a]
    key.sort()
    return key


def _packed_groups_exact(hashes: np.ndarray, key: np.ndarray, new: np.ndarray) -> bool:
    """Whether the groups of the packed keys (``new`` marks each group's start) hold one full
    hash each: merging two would score two different n-grams as one."""
    full = hashes[(key & _PMASK).view(np.int64)]  # positions < 2**17: a view, not a slow cast
    return not np.any((full[1:] != full[:-1]) > new[1:])


def _group_packed(hashes: np.ndarray, text_of: np.ndarray, a: int, b: int,
                  want_dups: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None] | None:
    """One in-cache sort of packed keys [text | top hash bits | position]; None when the kept
    bits are ambiguous (then the caller sorts on the full hash)."""
    sorted_ = _sorted_packed(hashes, text_of, a, b)
    if sorted_ is None:
        return None
    key, _, new = sorted_
    return _groups_from_sorted(text_of, a, (key & _PMASK).view(np.int64), new, want_dups)


def _group_sorted(hashes: np.ndarray, text_of: np.ndarray, a: int, b: int,
                  want_dups: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]:
    """Exact grouping by a stable sort on (text, hash): any chunk size, any collision of bits."""
    h, t = hashes[a:b], text_of[a:b]
    pos = np.lexsort((h, t))  # stable, so each group's first element is its first occurrence
    hs, ts = h[pos], t[pos]
    new = np.ones(b - a, dtype=bool)
    new[1:] = (hs[1:] != hs[:-1]) | (ts[1:] != ts[:-1])
    return _groups_from_sorted(text_of, a, pos, new, want_dups)


def _groups_from_sorted(text_of: np.ndarray, a: int, pos: np.ndarray, new: np.ndarray,
                        want_dups: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]:
    """(text, count, first, dups) from chunk positions in group order and group starts."""
    starts = np.flatnonzero(new)
    count = np.diff(np.append(starts, len(pos)))
    first = pos[starts] + a
    dups = (pos[~new] + a) if want_dups else None
    return text_of[first], count, first, dups


class TextBatch:
    """Texts of a batch as one codepoint array plus the spans the scores need."""

    def __init__(self, texts: list[str]) -> None:
        lens = np.fromiter(map(len, texts), dtype=np.int64, count=len(texts))
        self._init("".join(texts), lens)
        self._texts: list[str] | None = texts

    @classmethod
    def from_arrow(cls, arr: pa.Array) -> TextBatch:
        """From an Arrow string array without a Python string per row (nulls read as "")."""
        arr = pc.fill_null(arr, "")
        if isinstance(arr, pa.ChunkedArray):
            arr = arr.combine_chunks()
        arr = arr.cast(pa.large_string())
        self = cls.__new__(cls)
        n = len(arr)
        self._arrow = arr
        self._texts = None
        if n == 0:
            self._init("", np.zeros(0, dtype=np.int64))
            return self
        offs = np.frombuffer(arr.buffers()[1], dtype=np.int64)[arr.offset: arr.offset + n + 1]
        data = arr.buffers()[2]
        raw = data.to_pybytes()[int(offs[0]): int(offs[-1])] if data is not None else b""
        try:
            joined = raw.decode("utf-8")
        except UnicodeDecodeError:
            self._init_invalid(raw, offs - offs[0])
            return self
        self._init(joined, pc.utf8_length(arr).to_numpy(zero_copy_only=False).astype(np.int64))
        return self

    def _init_invalid(self, raw: bytes, offs: np.ndarray) -> None:
        """Invalid UTF-8: each text decoded on its own with U+FFFD replacements (decoding the
        joined bytes would let one text's bad bytes shift the next text's characters)."""
        bounds = offs.tolist()
        texts = [raw[s:e].decode("utf-8", "replace") for s, e in zip(bounds[:-1], bounds[1:], strict=True)]
        lens = np.fromiter(map(len, texts), dtype=np.int64, count=len(texts))
        self._init("".join(texts), lens)
        self._texts = texts
        self._arrow = None  # the URL pre-filter reads the decoded texts instead

    def _init(self, joined: str, lens: np.ndarray) -> None:
        self.joined = joined
        self.n = len(lens)
        self.lens = lens
        self.ends = np.cumsum(lens)
        self.starts = self.ends - lens
        self.cp = np.frombuffer(joined.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)
        self.text_of_char = np.repeat(np.arange(self.n, dtype=np.int64), lens)

    def text(self, i: int) -> str:
        if self._texts is not None:
            return self._texts[i]
        return self.joined[int(self.starts[i]): int(self.ends[i])]

    @property
    def texts(self) -> list[str]:
        if self._texts is None:
            self._texts = [self.text(i) for i in range(self.n)]
        return self._texts

    @cached_property
    def prefix(self) -> np.ndarray:
        return _prefix_hash(self.cp)

    @cached_property
    def cls(self) -> np.ndarray:
        return _tables()["cls"][self.cp]

    @cached_property
    def gopher_words(self) -> tuple[np.ndarray, np.ndarray]:
        """(start, end) of Gopher words: runs of word characters, or one other character."""
        cls = self.cls
        n = len(cls)
        if n == 0:
            e = np.zeros(0, dtype=np.int64)
            return e, e
        is_text_start = np.zeros(n, dtype=bool)
        is_text_start[self.starts[self.lens > 0]] = True
        prev = np.empty(n, dtype=np.uint8)
        prev[0] = _SPACE
        prev[1:] = cls[:-1]
        start = (cls != _SPACE) & ((cls == _OTHER) | (prev != _WORD) | is_text_start)
        nxt = np.empty(n, dtype=np.uint8)
        nxt[-1] = _SPACE
        nxt[:-1] = cls[1:]
        is_text_end = np.zeros(n, dtype=bool)
        is_text_end[self.ends[self.lens > 0] - 1] = True
        end = (cls != _SPACE) & ((cls == _OTHER) | (nxt != _WORD) | is_text_end)
        return np.flatnonzero(start), np.flatnonzero(end) + 1

    def text_of(self, positions: np.ndarray) -> np.ndarray:
        return self.text_of_char[positions]


def _per_text_sum(text_of: np.ndarray, weights: np.ndarray, n: int) -> np.ndarray:
    return np.bincount(text_of, weights=weights, minlength=n)


def _safe_div(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    out = np.zeros(len(num), dtype=np.float64)
    np.divide(num, den, out=out, where=den > 0)
    return out.astype(np.float32)


# ---------------------------------------------------------------------------------------
def char_repeat_ratio(tb: TextBatch, ignore_whitespace: bool = True) -> np.ndarray:
    """Share of characters equal to the previous character of the same text."""
    cp = tb.cp
    if len(cp) < 2:
        return np.zeros(tb.n, dtype=np.float32)
    eq = cp[1:] == cp[:-1]
    if ignore_whitespace:
        eq &= tb.cls[1:] != _SPACE
    eq &= tb.text_of_char[1:] == tb.text_of_char[:-1]
    counts = np.bincount(tb.text_of_char[1:][eq], minlength=tb.n)
    return _safe_div(counts.astype(np.float64), tb.lens.astype(np.float64))


def special_char_ratio(tb: TextBatch) -> np.ndarray:
    """data-juicer special_characters_filter: share of punctuation, digits, whitespace, symbols."""
    if len(tb.cp) == 0:
        return np.zeros(tb.n, dtype=np.float32)
    special = _tables()["special"][tb.cp]
    counts = np.bincount(tb.text_of_char[special], minlength=tb.n)
    return _safe_div(counts.astype(np.float64), tb.lens.astype(np.float64))


def url_stats(tb: TextBatch) -> tuple[np.ndarray, np.ndarray]:
    """(url_count int32, url_char_ratio float32) per text."""
    counts = np.zeros(tb.n, dtype=np.int32)
    chars = np.zeros(tb.n, dtype=np.float64)
    for i in _url_candidates(tb):
        counts[i], chars[i] = urls_in(tb.text(i))
    return counts, _safe_div(chars, tb.lens.astype(np.float64))


def urls_in(text: str) -> tuple[int, int]:
    """(number of URLs, characters inside them) of one text; trailing punctuation excluded.

    The same matches as ``URL_RE.finditer(text)``, found faster: a match needs a "://" at
    most 16 characters after its start, or starts at "www.", so the regex is only tried at
    the few positions before each such anchor instead of at every letter of the text.
    """
    count = chars = 0
    pos, n = 0, len(text)
    a, b = text.find("://"), text.find("www.")
    while pos < n:
        # Search again only once pos has passed the last hit: every character is scanned
        # once per anchor (searching both at every step made '://' * n quadratic).
        if 0 <= a < pos:
            a = text.find("://", pos)
        if 0 <= b < pos:
            b = text.find("www.", pos)
        q = a if b < 0 or (0 <= a < b) else b
        if q < 0:
            break
        m = None
        for start in range(max(pos, q - _SCHEME_MAX - 1), q + 1):
            if text[start] in _ASCII_LETTERS:  # both alternatives start with a letter
                m = URL_RE.match(text, start)
                if m:
                    break
        if m is None:
            pos = q + 1
            continue
        url = m.group(0).rstrip(_URL_TRAIL)
        if len(url) > 4:
            count += 1
            chars += len(url)
        pos = m.end()
    return count, chars


def _url_candidates(tb: TextBatch) -> list[int]:
    """Texts that may hold a URL (a cheap substring test before the regex)."""
    if getattr(tb, "_arrow", None) is not None:
        hit = pc.or_(pc.match_substring(tb._arrow, "://"), pc.match_substring(tb._arrow, "www."))
        return np.flatnonzero(hit.to_numpy(zero_copy_only=False)).tolist()
    return [i for i, t in enumerate(tb.texts) if "://" in t or "www." in t]


def char_rep_ratio(tb: TextBatch, rep_len: int = 10) -> np.ndarray:
    """data-juicer character_repetition_filter ratio (see module docstring)."""
    n_win = np.maximum(tb.lens - rep_len + 1, 0)
    out = np.zeros(tb.n, dtype=np.float32)
    m = len(tb.cp) - rep_len + 1
    if int(n_win.sum()) == 0 or m <= 0:
        return out
    # Hash every window of the joined array with contiguous slices, then keep those inside one text.
    prefix = tb.prefix
    _, inv = _powers(m)
    with np.errstate(over="ignore"):
        h = (prefix[rep_len:] - prefix[:m]) * inv
    inside = tb.text_of_char[:m] == tb.text_of_char[rep_len - 1:]
    g_text, g_count = group_counts(h[inside], tb.text_of_char[:m][inside])
    g = Groups(g_text, g_count, g_count)
    distinct = np.bincount(g.text, minlength=tb.n)
    rep = g.count > 1
    rep_text, rep_cnt = g.text[rep], g.count[rep]
    if len(rep_text) == 0:
        return out
    k = np.minimum(np.sqrt(distinct).astype(np.int64), np.bincount(rep_text, minlength=tb.n))
    # Rank repeated groups by count (descending) inside each text with one uint64 sort of
    # [text | ~count]; keep the top k of each text.
    mask32 = _U64(0xFFFFFFFF)
    key = (rep_text.astype(_U64) << _U64(32)) | (mask32 - rep_cnt.astype(_U64))
    key.sort()
    rt = (key >> _U64(32)).astype(np.int64)
    rc = (mask32 - (key & mask32)).astype(np.int64)
    seg = np.flatnonzero(np.concatenate([[True], rt[1:] != rt[:-1]]))
    rank = np.arange(len(rt)) - np.repeat(seg, np.diff(np.append(seg, len(rt))))
    keep = rank < k[rt]
    top = np.bincount(rt[keep], weights=rc[keep], minlength=tb.n)
    return _safe_div(top, n_win.astype(np.float64))


def _dj_words(tb: TextBatch) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """data-juicer words: split on ' ', '\\n', '\\t'; stripped of special chars; lower-cased.

    Returns (start, end, text) of each word in the codepoint array.
    """
    cp = tb.cp
    if len(cp) == 0:
        e = np.zeros(0, dtype=np.int64)
        return e, e, e
    sep = (cp == 32) | (cp == 10) | (cp == 9)
    # Segment id grows at each separator and at each text start.
    is_start = np.zeros(len(cp), dtype=bool)
    is_start[tb.starts[tb.lens > 0]] = True
    seg = np.cumsum(sep | is_start)
    keep = ~_tables()["special"][cp]
    pos = np.flatnonzero(keep)
    if len(pos) == 0:
        e = np.zeros(0, dtype=np.int64)
        return e, e, e
    s = seg[pos]
    new = np.ones(len(pos), dtype=bool)
    new[1:] = s[1:] != s[:-1]
    first = pos[new]
    last_idx = np.append(np.flatnonzero(new)[1:], len(pos)) - 1
    return first, pos[last_idx] + 1, tb.text_of_char[first]


def _ngram_hashes(word_hash: np.ndarray, word_text: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Hashes of word n-grams that stay inside one text, and the index of their first word."""
    m = len(word_hash) - n + 1
    if m <= 0:
        return np.zeros(0, dtype=_U64), np.zeros(0, dtype=np.int64)
    h = np.zeros(m, dtype=_U64)
    with np.errstate(over="ignore"):
        for k in range(n):
            h = h * _WORD_MIX + word_hash[k:k + m]
        h ^= h >> _U64(29)
        h *= _U64(0xBF58476D1CE4E5B9)
        h ^= h >> _U64(32)
    ok = word_text[:m] == word_text[n - 1:]
    idx = np.flatnonzero(ok)
    return h[idx], idx


def word_rep_ratio(tb: TextBatch, rep_len: int = 10) -> np.ndarray:
    """data-juicer word_repetition_filter ratio (see module docstring)."""
    start, end, wtext = _dj_words(tb)
    out = np.zeros(tb.n, dtype=np.float32)
    if len(start) < rep_len:
        return out
    lower = _tables()["lower"][tb.cp]
    wh = _span_hash(_prefix_hash(lower), start, end)
    h, idx = _ngram_hashes(wh, wtext, rep_len)
    if len(h) == 0:
        return out
    t = wtext[idx]
    g_text, g_count = group_counts(h, t)
    total = np.bincount(t, minlength=tb.n).astype(np.float64)
    rep_groups = g_count > 1
    rep = np.bincount(g_text[rep_groups], weights=g_count[rep_groups], minlength=tb.n)
    return _safe_div(rep, total)


def dup_line_fracs(tb: TextBatch) -> tuple[np.ndarray, np.ndarray]:
    """Gopher duplicate-line fraction and duplicate-line character fraction."""
    cp = tb.cp
    n = tb.n
    if len(cp) == 0:
        z = np.zeros(n, dtype=np.float32)
        return z, z.copy()
    nl = cp == 10
    # A line is a maximal run of non-newline characters inside a text (datatrove splits on "\n+").
    is_start = np.zeros(len(cp), dtype=bool)
    is_start[tb.starts[tb.lens > 0]] = True
    prev_nl = np.ones(len(cp), dtype=bool)
    prev_nl[1:] = nl[:-1]
    line_start = np.flatnonzero(~nl & (prev_nl | is_start))
    is_end = np.zeros(len(cp), dtype=bool)
    is_end[tb.ends[tb.lens > 0] - 1] = True
    next_nl = np.ones(len(cp), dtype=bool)
    next_nl[:-1] = nl[1:]
    line_end = np.flatnonzero(~nl & (next_nl | is_end)) + 1
    lt = tb.text_of_char[line_start]
    n_lines = np.bincount(lt, minlength=n).astype(np.float64)
    if len(line_start) == 0:
        z = np.zeros(n, dtype=np.float32)
        return z, z.copy()
    g = group_within_texts(_span_hash(tb.prefix, line_start, line_end), lt, want_dups=True)
    dup = g.dups
    dup_lines = np.bincount(lt[dup], minlength=n).astype(np.float64)
    dup_chars = np.bincount(lt[dup], weights=(line_end - line_start)[dup], minlength=n)
    return _safe_div(dup_lines, n_lines), _safe_div(dup_chars, tb.lens.astype(np.float64))


def gopher_ngram_fracs(tb: TextBatch, top_ns: tuple[int, ...] = (2, 3, 4),
                       dup_ns: tuple[int, ...] = (5, 6, 7, 8, 9, 10)) -> dict[str, np.ndarray]:
    """Gopher top n-gram and duplicate n-gram character fractions, plus the word count.

    Grows n from 2 upwards and only follows n-grams whose (n-1)-gram prefix repeats (an
    n-gram can repeat only if its prefix does), so the work shrinks with n instead of
    sorting every n-gram size of every text.
    """
    n = tb.n
    start, end = tb.gopher_words
    wtext = tb.text_of_char[start] if len(start) else np.zeros(0, dtype=np.int64)
    nw = len(start)
    wlen = (end - start).astype(np.int64)
    out: dict[str, np.ndarray] = {"gopher_words": np.bincount(wtext, minlength=n).astype(np.int32)}
    for kind, ns in (("top", top_ns), ("dup", dup_ns)):  # an n may be in both
        for k in ns:
            out[f"{kind}{k}_gram_char_frac"] = np.zeros(n, dtype=np.float32)
    max_n = max((*top_ns, *dup_ns), default=0)
    if nw < 2 or max_n < 2:
        return out
    lens = tb.lens.astype(np.float64)
    wh = _span_hash(tb.prefix, start, end)
    csum = np.concatenate([[0], np.cumsum(wlen)])
    # Candidates for n = 2: every bigram inside one text; raw = un-mixed rolling hash.
    idx = np.flatnonzero(wtext[:-1] == wtext[1:])
    with np.errstate(over="ignore"):
        raw = wh[idx] * _WORD_MIX + wh[idx + 1]
    for k in range(2, max_n + 1):
        if len(idx) == 0:
            break
        with np.errstate(over="ignore"):
            h = raw ^ (raw >> _U64(29))
            h *= _U64(0xBF58476D1CE4E5B9)
            h ^= h >> _U64(32)
        t = wtext[idx]
        g = group_within_texts(h, t, want_dups=k in dup_ns)
        rep = g.count > 1
        if k in top_ns and rep.any():
            gt, gc, gf = g.text[rep], g.count[rep], g.first[rep]
            best = np.zeros(n, dtype=np.int64)
            np.maximum.at(best, gt, gc)
            top = gc == best[gt]
            # The first-seen n-gram among those with the top count (Counter.most_common order).
            pick_first = np.full(n, np.iinfo(np.int64).max, dtype=np.int64)
            np.minimum.at(pick_first, gt[top], gf[top])
            has = np.flatnonzero(best > 1)
            w0 = idx[pick_first[has]]
            chars = csum[w0 + k] - csum[w0] + (k - 1)  # " ".join of k words
            out[f"top{k}_gram_char_frac"][has] = (chars * best[has] / np.maximum(lens[has], 1)).astype(np.float32)
        if k in dup_ns and g.dups is not None and len(g.dups):
            dup_start = idx[g.dups]
            diff = np.bincount(dup_start, minlength=nw + 1) - np.bincount(dup_start + k, minlength=nw + 1)
            covered = np.cumsum(diff[:nw]) > 0
            chars = np.bincount(wtext[covered], weights=wlen[covered], minlength=n)
            out[f"dup{k}_gram_char_frac"] = _safe_div(chars, lens)
        if k == max_n:
            break
        # Next candidates: members of repeated groups whose next word is in the same text.
        members = np.zeros(len(idx), dtype=bool)
        members[g.first[rep]] = True
        if g.dups is not None:
            members[g.dups] = True
        else:
            members[_members_of_repeated(g, len(idx))] = True
        nxt = idx + k
        members &= nxt < nw
        members[members] &= wtext[nxt[members]] == wtext[idx[members]]
        sel = np.flatnonzero(members)
        idx = idx[sel]
        with np.errstate(over="ignore"):
            raw = raw[sel] * _WORD_MIX + wh[idx + k]
    return out


def _members_of_repeated(g: Groups, m: int) -> np.ndarray:
    """Indices of all elements whose group repeats (used when dups were not collected)."""
    # Non-first members are exactly the elements that are not a group's first occurrence.
    is_first = np.zeros(m, dtype=bool)
    is_first[g.first] = True
    repeated_first = np.zeros(m, dtype=bool)
    repeated_first[g.first[g.count > 1]] = True
    return np.flatnonzero(~is_first | repeated_first)
