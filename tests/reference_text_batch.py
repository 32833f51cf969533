"""The NumPy reference's machinery: a batch of texts as one codepoint array, character
tables, polynomial span hashes and grouping equal hashes inside each text.

Part of the reference implementation the compiled kernel is checked against (see
``reference_quality_scores``). Every n-gram, word and line is a span of the codepoint array,
hashed in O(1) from one polynomial prefix hash (mod 2**64), and grouped per text by sorting
cache-sized chunks of packed keys ``[text | hash | position]`` (checked against the full
hashes; a chunk where the packed bits are ambiguous, or too big for them, is grouped by a sort
on (text, full hash)). No per-character Python runs.

One known difference from the kernel: the reference groups by the full 64-bit hash alone, so
adversarial texts whose polynomial hashes collide mod 2**64 (Thue-Morse blocks of 1024+
characters, or crafted ones) can be miscounted here; ordinary texts collide with probability
~ n**2 / 2**64. The kernel compares the text on every hash match and is exact.
"""

from __future__ import annotations

import itertools
import unicodedata
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

U64 = np.uint64
_BASE = U64(0x100000001B3)  # FNV prime: odd, so invertible mod 2**64
_BASE_INV = U64(pow(int(_BASE), -1, 2**64))
WORD_MIX = U64(0x9E3779B97F4A7C15)

# Chunked grouping: key = [text:11 | hash:36 | position:17].
_POS_BITS = 17
_TEXT_BITS = 11
_HASH_BITS = 64 - _POS_BITS - _TEXT_BITS
_CHUNK = 1 << 16  # elements per sort: cache-sized (sorting 64k uint64 is ~5x faster per element than 2M)

# Character classes, one byte per codepoint, built once per process.
SPACE, WORD, OTHER = 0, 1, 2
_TABLES_CACHE: dict[str, np.ndarray] = {}


def tables() -> dict[str, np.ndarray]:
    """Lookup tables over all codepoints: class, lower-case, data-juicer 'special'."""
    if not _TABLES_CACHE:
        n = 0x110000
        cls = np.full(n, OTHER, dtype=np.uint8)
        special = np.zeros(n, dtype=bool)
        lower = np.arange(n, dtype=np.uint32)
        # Assigned letters/symbols end at U+323AF (CJK ext. H) apart from plane 14's tags and
        # variation selectors; the rest (unassigned, private use) stays "other, not special".
        for c in itertools.chain(range(0x323B0), range(0xE0000, 0xE01F0)):
            ch = chr(c)
            cat = unicodedata.category(ch)
            if ch.isspace():
                cls[c] = SPACE
                special[c] = True
            elif cat[0] in "LNM" or ch == "_":
                cls[c] = WORD
            if cat[0] in "PSNZ" or cat == "Cc":
                special[c] = True  # data-juicer SPECIAL_CHARACTERS: punctuation, digits, whitespace, symbols/emoji
            lo = ch.lower()
            if len(lo) == 1:
                lower[c] = ord(lo)
        _TABLES_CACHE.update(cls=cls, special=special, lower=lower)
    return _TABLES_CACHE


_POW: dict[str, np.ndarray] = {}


def powers(n: int) -> tuple[np.ndarray, np.ndarray]:
    """BASE**i and BASE**-i mod 2**64 for i < n (grown geometrically, shared)."""
    have = _POW.get("pow")
    if have is None or len(have) < n:
        m = max(n, 1 << 16, 2 * (len(have) if have is not None else 0))
        with np.errstate(over="ignore"):
            _POW["pow"] = np.cumprod(np.concatenate([[U64(1)], np.full(m - 1, _BASE, dtype=U64)]), dtype=U64)
            _POW["inv"] = np.cumprod(np.concatenate([[U64(1)], np.full(m - 1, _BASE_INV, dtype=U64)]), dtype=U64)
    return _POW["pow"][:n], _POW["inv"][:n]


def prefix_hash(cp: np.ndarray) -> np.ndarray:
    """P[i] = sum_{j<i} (cp[j]+1) * BASE**j mod 2**64, length len(cp)+1."""
    pw, _ = powers(len(cp) + 1)
    out = np.zeros(len(cp) + 1, dtype=U64)
    with np.errstate(over="ignore"):
        np.cumsum((cp.astype(U64) + U64(1)) * pw[: len(cp)], out=out[1:])
    return out


def span_hash(prefix: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Position-independent hash of cp[start:end] (then mixed so high bits are usable)."""
    _, inv = powers(len(prefix))
    with np.errstate(over="ignore"):
        h = (prefix[end] - prefix[start]) * inv[start]
        h ^= h >> U64(31)
        h *= U64(0xBF58476D1CE4E5B9)
        h ^= h >> U64(29)
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
        mixed = hashes * U64(0xBF58476D1CE4E5B9)
        mixed ^= mixed >> U64(31)
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


_HSHIFT = U64(64 - _HASH_BITS)
_PSHIFT = U64(_POS_BITS)
_TSHIFT = U64(64 - _TEXT_BITS)
_PMASK = U64((1 << _POS_BITS) - 1)
_POSITIONS = np.arange(1 << _POS_BITS, dtype=U64)


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
    key = (text_of[a:b] - text_of[a]).view(U64) << _TSHIFT
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
        return prefix_hash(self.cp)

    @cached_property
    def cls(self) -> np.ndarray:
        return tables()["cls"][self.cp]

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
        prev[0] = SPACE
        prev[1:] = cls[:-1]
        start = (cls != SPACE) & ((cls == OTHER) | (prev != WORD) | is_text_start)
        nxt = np.empty(n, dtype=np.uint8)
        nxt[-1] = SPACE
        nxt[:-1] = cls[1:]
        is_text_end = np.zeros(n, dtype=bool)
        is_text_end[self.ends[self.lens > 0] - 1] = True
        end = (cls != SPACE) & ((cls == OTHER) | (nxt != WORD) | is_text_end)
        return np.flatnonzero(start), np.flatnonzero(end) + 1

    def text_of(self, positions: np.ndarray) -> np.ndarray:
        return self.text_of_char[positions]
