"""Vectorised uint64 hashing of words and n-grams, plus a sorted-array n-gram index.

Everything works on *flat* arrays: the token ids of many documents concatenated, with a
``starts`` array of document offsets (``len(starts) == n_docs + 1``). Hashes are
polynomial hashes modulo 2**64 computed with prefix sums, so one n-gram costs a handful of
numpy element operations whatever ``n`` is, and no n-gram ever touches Python:

    S[i] = sum_{j<i} x_j * B**j            (wrapping uint64 cumsum)
    H(i, n) = (S[i+n] - S[i]) * B**-i      (B odd, so B**-1 exists mod 2**64)

followed by a splitmix64 finaliser. The functions are pure and process-independent (no
salted ``hash()``), so hashes made in worker processes, in the driver and in an earlier run
agree.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

U64 = np.uint64
_TOKEN_BASE = 0x9E3779B97F4A7C15 | 1
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def _inverse(b: int) -> int:
    return pow(b, -1, 1 << 64)


class _Powers:
    """Cached B**i and B**-i (mod 2**64) for i < length, grown by doubling."""

    def __init__(self, base: int) -> None:
        self.base = base
        self.inv = _inverse(base)
        self.pos = np.ones(1, dtype=U64)
        self.neg = np.ones(1, dtype=U64)

    def get(self, length: int) -> tuple[np.ndarray, np.ndarray]:
        if len(self.pos) < length:
            size = max(length, 2 * len(self.pos), 1024)
            one = np.ones(1, dtype=U64)
            with np.errstate(over="ignore"):
                self.pos = np.concatenate([one, np.cumprod(np.full(size - 1, self.base, dtype=U64))])
                self.neg = np.concatenate([one, np.cumprod(np.full(size - 1, self.inv, dtype=U64))])
        return self.pos[:length], self.neg[:length]


_TOKEN_POWERS = _Powers(_TOKEN_BASE)


def splitmix64(x: np.ndarray) -> np.ndarray:
    """The splitmix64 finaliser: spreads polynomial hashes over all 64 bits."""
    with np.errstate(over="ignore"):
        z = x + _GOLDEN
        z = (z ^ (z >> U64(30))) * U64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> U64(27))) * U64(0x94D049BB133111EB)
        return z ^ (z >> U64(31))


def _prefix(values: np.ndarray, pw: _Powers) -> tuple[np.ndarray, np.ndarray]:
    """(S, B**-i) where S[i] = sum_{j<i} values[j] * B**j, S has len(values) + 1 entries."""
    pos, neg = pw.get(len(values) + 1)
    s = np.zeros(len(values) + 1, dtype=U64)
    with np.errstate(over="ignore"):
        np.multiply(values, pos[:len(values)], out=s[1:], dtype=U64)  # no uint64 copy of bytes
        np.cumsum(s[1:], out=s[1:])
    return s, neg


def segment_hashes(values: np.ndarray, starts: np.ndarray, ends: np.ndarray, pw: _Powers = _TOKEN_POWERS,
                   salt: int = 0) -> np.ndarray:
    """uint64 hash of each ``values[starts[k]:ends[k]]`` (order-sensitive)."""
    s, neg = _prefix(values, pw)
    with np.errstate(over="ignore"):
        h = (s[ends] - s[starts]) * neg[starts]
        return splitmix64(h ^ U64(salt) ^ (ends - starts).astype(U64) * U64(0xFF51AFD7ED558CCD))


def mix_ids(ids: np.ndarray) -> np.ndarray:
    """Token ids (any integer dtype) -> well-spread uint64 symbols for the polynomial."""
    return splitmix64(ids.astype(U64, copy=False))


@dataclass
class NgramHashes:
    """n-gram hashes of a flat token array: ``hashes[k]`` starts at flat position ``pos[k]``."""

    hashes: np.ndarray  # uint64
    pos: np.ndarray  # int64 flat token position of the n-gram's first token
    doc: np.ndarray  # int64 document of each n-gram


def ngram_hashes(symbols: np.ndarray, starts: np.ndarray, n: int) -> NgramHashes:
    """All n-grams of every document that has at least ``n`` tokens (none cross documents).

    ``symbols`` are mixed uint64 token symbols (see :func:`mix_ids`), ``starts`` the
    document offsets (n_docs + 1 entries).
    """
    lengths = np.diff(starts)
    counts = np.maximum(lengths - n + 1, 0)
    n_grams = int(counts.sum())
    if n_grams == 0:
        empty = np.zeros(0, dtype=np.int64)
        return NgramHashes(np.zeros(0, dtype=U64), empty, empty)
    doc = np.repeat(np.arange(len(lengths), dtype=np.int64), counts)
    # position = doc start + rank within the doc
    first = np.cumsum(counts) - counts
    pos = np.arange(n_grams, dtype=np.int64) - np.repeat(first, counts) + np.repeat(starts[:-1], counts)
    s, neg = _prefix(symbols, _TOKEN_POWERS)
    with np.errstate(over="ignore"):
        h = (s[pos + n] - s[pos]) * neg[pos]
        h = splitmix64(h ^ U64(n))
    return NgramHashes(h, pos, doc)


_BYTE_POWERS = _Powers(0xC2B2AE3D27D4EB4F | 1)
_IS_WORD = np.ones(256, dtype=bool)
_IS_WORD[[0x00, 0x09, 0x0A, 0x0B, 0x0C, 0x0D, 0x20]] = False  # NUL separates documents


def word_symbols(buf: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Word-level tokens of a normalised joined buffer (``normalize_joined``).

    Words are maximal runs of bytes that are neither ASCII whitespace nor the NUL document
    separator; each becomes the uint64 polynomial hash of its bytes (no Python object per
    word: measured 1.6x less CPU than ``bytes.split`` + a dict lookup per word).
    Returns (word hashes, document offsets with n_docs + 1 entries).
    """
    n = len(buf)
    if n == 0:
        return np.zeros(0, dtype=U64), np.zeros(1, dtype=np.int64)
    is_word = np.zeros(n + 2, dtype=bool)
    is_word[1:-1] = _IS_WORD[buf]
    edges = np.flatnonzero(is_word[1:] != is_word[:-1])  # alternating word starts and ends
    w_start, w_end = edges[0::2], edges[1::2]
    seps = np.flatnonzero(buf == 0)
    # first word of each document = first word after its separator (few queries, many words)
    starts = np.append(np.searchsorted(w_start, seps, side="right"), len(w_start)).astype(np.int64)
    starts[0] = 0
    return segment_hashes(buf, w_start, w_end, _BYTE_POWERS, salt=0x57), starts


# ---------------------------------------------------------------------------------------
@dataclass
class NgramIndex:
    """Sorted n-gram hashes with parallel postings (reference item, position in the item).

    Membership is a bitmap probe on the top hash bits (a few MB, rebuilt lazily after
    unpickling) followed by ``np.searchsorted`` on the few candidates, so clean text costs
    one gather per n-gram.
    """

    keys: np.ndarray  # uint64, sorted
    items: np.ndarray  # int32, item of each key entry
    pos: np.ndarray  # int32, token position of the n-gram inside its item
    bitmap_bits: int = 0
    _bitmap: np.ndarray | None = None

    @classmethod
    def build(cls, keys: np.ndarray, items: np.ndarray, pos: np.ndarray) -> NgramIndex:
        order = np.lexsort((pos, items, keys))
        return cls(keys[order].astype(U64), items[order].astype(np.int32), pos[order].astype(np.int32))

    def __len__(self) -> int:
        return len(self.keys)

    def __getstate__(self) -> dict:
        return {"keys": self.keys, "items": self.items, "pos": self.pos}

    def __setstate__(self, state: dict) -> None:
        self.keys, self.items, self.pos = state["keys"], state["items"], state["pos"]
        self.bitmap_bits = 0
        self._bitmap = None

    @property
    def nbytes(self) -> int:
        return int(self.keys.nbytes + self.items.nbytes + self.pos.nbytes)

    def _bits(self) -> tuple[np.ndarray, int]:
        if self._bitmap is None:
            # ~32 bits per key keeps false candidates near 3 %, capped at 2**28 bits (32 MB)
            bits = int(min(max(10, int(np.ceil(np.log2(max(len(self.keys), 1) * 32)))), 28))
            top = np.unique(self.keys >> U64(64 - bits)).astype(np.int64)  # distinct bits
            weights = np.left_shift(1, top & 7).astype(np.float64)  # distinct bits of a byte add up
            bitmap = np.bincount(top >> 3, weights=weights, minlength=1 << (bits - 3)).astype(np.uint8)
            self._bitmap, self.bitmap_bits = bitmap, bits
        return self._bitmap, self.bitmap_bits

    def lookup(self, hashes: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(query indices that match, first key entry, end key entry) for each match."""
        if len(self.keys) == 0 or len(hashes) == 0:
            e = np.zeros(0, dtype=np.int64)
            return e, e, e
        bitmap, bits = self._bits()
        top = (hashes >> U64(64 - bits)).astype(np.int64)
        maybe = np.flatnonzero((bitmap[top >> 3] >> (top & 7).astype(np.uint8)) & 1)
        cand = hashes[maybe]
        lo = np.searchsorted(self.keys, cand, side="left")
        hi = np.searchsorted(self.keys, cand, side="right")
        hit = hi > lo
        return maybe[hit], lo[hit], hi[hit]


def expand_postings(q: np.ndarray, lo: np.ndarray, hi: np.ndarray, cap: int) -> tuple[np.ndarray, np.ndarray]:
    """For each matched query ``q[k]``, every key entry in ``[lo[k], hi[k])`` (at most ``cap``).

    Returns (query index per posting, key entry per posting).
    """
    span = np.minimum(hi - lo, cap)
    total = int(span.sum())
    if total == 0:
        e = np.zeros(0, dtype=np.int64)
        return e, e
    rep_q = np.repeat(q, span)
    first = np.cumsum(span) - span
    entry = np.arange(total, dtype=np.int64) - np.repeat(first, span) + np.repeat(lo, span)
    return rep_q, entry


def concat_ids(arrays: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Flatten a list of per-document id arrays into (ids, starts)."""
    starts = np.zeros(len(arrays) + 1, dtype=np.int64)
    if arrays:
        np.cumsum(np.fromiter((len(a) for a in arrays), dtype=np.int64, count=len(arrays)), out=starts[1:])
        ids = np.concatenate(arrays) if starts[-1] else np.zeros(0, dtype=np.int64)
    else:
        ids = np.zeros(0, dtype=np.int64)
    return ids, starts
