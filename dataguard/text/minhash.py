"""MinHash signatures, LSH banding and shingle-set Jaccard, vectorised over a whole batch.

No per-shingle Python: a batch's texts become one array of code points, hashed with a
polynomial prefix sum (mod 2^64, so any span's hash is O(1): ``(H[e] - H[s]) * P^-s``),
then mixed with the splitmix64 finaliser. Words are runs of characters that Python's
``str.isalnum`` accepts (plus ``_``; table for the BMP, anything above counts as a letter);
a word shingle is ``size`` consecutive words, a char shingle ``size`` consecutive characters
of the lower-cased text with whitespace runs collapsed to one space. A text shorter than one
shingle is one shingle (so short rows still match their copies). Shingles are 32-bit ids,
de-duplicated per row (the sets exact Jaccard is computed on; 32 bits: ~1e-4 chance of
any collision inside two 1,000-shingle sets).

MinHash: ``h_p(x) = ((a_p * x + b_p) mod 2^64) >> 32`` (Dietzfelbinger's multiply-add-shift,
a 2-universal family on 32-bit keys) with ``a_p, b_p`` from ``numpy.random.default_rng(seed)``,
so signatures depend only on the text and the seed. LSH: ``bands x rows`` chosen to minimise
the weighted false-positive / false-negative areas under the S-curve ``1 - (1 - s^r)^b``.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

import numpy as np

MASK64 = (1 << 64) - 1
_P = np.uint64(0x100000001B3)  # odd: invertible mod 2^64
_Q = np.uint64(0x9E3779B97F4A7C15)
_P_INV = np.uint64(pow(int(_P), -1, 1 << 64))
_Q_INV = np.uint64(pow(int(_Q), -1, 1 << 64))
CHUNK_ELEMENTS = 1 << 20  # shingles x permutations per MinHash step (8 MiB of uint64: stays in cache)
SHINGLE_KINDS = ("word", "char")


def mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser: spreads every input bit over the whole word (uint64 -> uint64)."""
    x = x.astype(np.uint64, copy=True)
    x ^= x >> np.uint64(30)
    x *= np.uint64(0xBF58476D1CE4E5B9)
    x ^= x >> np.uint64(27)
    x *= np.uint64(0x94D049BB133111EB)
    x ^= x >> np.uint64(31)
    return x


@lru_cache(maxsize=1)
def _char_tables() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(is word character, is whitespace, mixed hash) of every BMP code point, built once per
    process (10 ms): one gather per character instead of computing them."""
    chars = [chr(c) for c in range(0x10000)]
    word = np.fromiter((c.isalnum() or c == "_" for c in chars), dtype=bool, count=0x10000)
    space = np.fromiter((c.isspace() for c in chars), dtype=bool, count=0x10000)
    return word, space, _mix_cp(np.arange(0x10000, dtype=np.uint32))


def _mix_cp(cp: np.ndarray) -> np.ndarray:
    return mix64(cp.astype(np.uint64) + np.uint64(1))


def _mixed_codepoints(cp: np.ndarray, bmp: np.ndarray, idx: np.ndarray) -> np.ndarray:
    out = _char_tables()[2][idx]
    if not bmp.all():
        out[~bmp] = _mix_cp(cp[~bmp])
    return out


def _powers(base: np.uint64, n: int) -> np.ndarray:
    """base^0 .. base^(n-1) mod 2^64."""
    out = np.full(n, base, dtype=np.uint64)
    if n:
        out[0] = 1
        np.cumprod(out, out=out)
    return out


def _span_hashes(values: np.ndarray, starts: np.ndarray, ends: np.ndarray, base: np.uint64,
                 base_inv: np.uint64) -> np.ndarray:
    """Position-independent polynomial hash of values[s:e] for every (s, e) span."""
    n = len(values)
    pw = _powers(base, n + 1)
    prefix = np.zeros(n + 1, dtype=np.uint64)
    np.cumsum(values * pw[:n], out=prefix[1:])
    inv = _powers(base_inv, n + 1)
    return (prefix[ends] - prefix[starts]) * inv[starts]


def _codepoints(texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """Lower-cased code points of all texts (uint32) and each text's start offset (n + 1)."""
    low = [t.lower() for t in texts]
    offsets = np.zeros(len(low) + 1, dtype=np.int64)
    np.cumsum(np.fromiter(map(len, low), dtype=np.int64, count=len(low)), out=offsets[1:])
    cp = np.frombuffer("".join(low).encode("utf-32-le", "surrogatepass"), dtype=np.uint32)
    return cp, offsets


def _row_of(positions: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Text index of each code point position."""
    return np.searchsorted(offsets, positions, side="right") - 1


def _tokens(texts: Sequence[str], kind: str) -> tuple[np.ndarray, np.ndarray]:
    """(uint64 hash per token, row per token): words, or characters with spaces collapsed."""
    cp, offsets = _codepoints(texts)
    if not len(cp):
        return np.zeros(0, np.uint64), np.zeros(0, np.int64)
    word_t, space_t, _ = _char_tables()
    bmp = cp < 0x10000
    idx = np.where(bmp, cp, 0)
    boundary = np.zeros(len(cp) + 1, dtype=bool)  # a text starts here (or the end)
    boundary[offsets] = True
    if kind == "char":
        sp = space_t[idx] & bmp
        prev_sp = np.empty(len(cp), dtype=bool)
        prev_sp[0] = True
        prev_sp[1:] = sp[:-1]
        keep = ~(sp & (prev_sp | boundary[:-1]))  # no leading space, one space per run
        vals = np.where(sp, np.uint32(32), cp)[keep]
        vbmp = vals < 0x10000
        return _mixed_codepoints(vals, vbmp, np.where(vbmp, vals, 0)), _row_of(np.flatnonzero(keep), offsets)
    isw = np.where(bmp, word_t[idx], True)
    same_prev = np.zeros(len(cp), dtype=bool)
    same_prev[1:] = isw[:-1] & ~boundary[1:-1]
    same_next = np.zeros(len(cp), dtype=bool)
    same_next[:-1] = isw[1:] & ~boundary[1:-1]
    starts = np.flatnonzero(isw & ~same_prev)
    ends = np.flatnonzero(isw & ~same_next) + 1
    chars = _mixed_codepoints(cp, bmp, idx)
    return mix64(_span_hashes(chars, starts, ends, _P, _P_INV)), _row_of(starts, offsets)


def shingle_sets(texts: Sequence[str], kind: str = "word", size: int = 5) -> tuple[np.ndarray, np.ndarray]:
    """Distinct 32-bit shingle ids of every text: (sorted values per row, concatenated; offsets).

    Row ``i``'s set is ``values[offsets[i]:offsets[i + 1]]`` (empty for a text with no token).
    """
    n = len(texts)
    if kind not in SHINGLE_KINDS:
        raise ValueError(f"shingle must be one of {SHINGLE_KINDS}, got {kind!r}")
    toks, rows = _tokens(texts, kind)
    counts = np.bincount(rows, minlength=n).astype(np.int64)
    row_start = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(counts, out=row_start[1:])
    # window starts: every token with `size` tokens left in its row, or the row's first
    # token when the row is shorter than one shingle
    tok_idx = np.arange(len(toks), dtype=np.int64)
    row_end_of_tok = row_start[1:][rows]
    full = tok_idx + size <= row_end_of_tok
    short = (counts > 0) & (counts < size)
    s = np.concatenate([tok_idx[full], row_start[:-1][short]])
    e = np.concatenate([tok_idx[full] + size, row_start[1:][short]])
    r = np.concatenate([rows[full], np.flatnonzero(short)])
    ids = mix64(_span_hashes(toks, s, e, _Q, _Q_INV)) >> np.uint64(32)
    keys = np.sort((r.astype(np.uint64) << np.uint64(32)) | ids)
    if len(keys):
        keys = keys[np.concatenate([[True], keys[1:] != keys[:-1]])]
    values = (keys & np.uint64(0xFFFFFFFF)).astype(np.uint32)
    per_row = np.bincount((keys >> np.uint64(32)).astype(np.int64), minlength=n)
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(per_row, out=offsets[1:])
    return values, offsets


def permutations(num_perm: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """The (a, b) uint64 coefficients of the num_perm hash functions (a odd)."""
    rng = np.random.default_rng(seed)
    a = rng.integers(0, 1 << 63, size=num_perm, dtype=np.uint64) * np.uint64(2) + np.uint64(1)
    b = rng.integers(0, 1 << 63, size=num_perm, dtype=np.uint64) * np.uint64(2)
    return a, b


def signatures(values: np.ndarray, offsets: np.ndarray, num_perm: int, seed: int = 1) -> np.ndarray:
    """(rows, num_perm) uint32 MinHash signatures; a row with no shingle is all 0xFFFFFFFF."""
    n = len(offsets) - 1
    a, b = permutations(num_perm, seed)
    sig = np.full((n, num_perm), 0xFFFFFFFF, dtype=np.uint32)
    nonempty = np.flatnonzero(offsets[1:] > offsets[:-1])
    x = values.astype(np.uint64)
    step = max(1, CHUNK_ELEMENTS // num_perm)
    i = 0
    while i < len(nonempty):  # chunks of whole rows, about `step` shingles each
        lo = offsets[nonempty[i]]
        j = int(np.searchsorted(offsets[nonempty + 1], lo + step, side="right"))
        j = max(j, i + 1)
        rows = nonempty[i:j]
        hi = offsets[rows[-1] + 1]
        h = np.multiply.outer(a, x[lo:hi])  # permutation-major: each reduce runs on contiguous memory
        h += b[:, None]
        low = np.minimum.reduceat(h, offsets[rows] - lo, axis=1)  # min of the full value = min of its top bits
        sig[rows] = (low >> np.uint64(32)).T
        i = j
    return sig


def lsh_params(threshold: float, num_perm: int, fp_weight: float = 0.5) -> tuple[int, int]:
    """(bands, rows) with bands * rows <= num_perm minimising
    fp_weight * P(candidate | J < t) area + (1 - fp_weight) * P(missed | J >= t) area."""
    best, best_cost = (1, num_perm), np.inf
    lo = np.linspace(0.0, threshold, 201)
    hi = np.linspace(threshold, 1.0, 201)
    for bands in range(1, num_perm + 1):
        rows = num_perm // bands
        fp = np.trapezoid(1.0 - (1.0 - lo ** rows) ** bands, lo)
        fn = np.trapezoid((1.0 - hi ** rows) ** bands, hi)
        cost = fp_weight * fp + (1.0 - fp_weight) * fn
        if cost < best_cost - 1e-12:
            best, best_cost = (bands, rows), cost
    return best


def band_keys(sig: np.ndarray, bands: int, rows: int) -> np.ndarray:
    """(n, bands) uint64: one hash per band of `rows` signature values."""
    n = sig.shape[0]
    keys = np.zeros((n, bands), dtype=np.uint64)
    for r in range(rows):
        col = sig[:, np.arange(bands) * rows + r].astype(np.uint64)
        keys = mix64(keys * _Q + col + np.uint64(r + 1))
    return keys


def estimated_jaccard(sig: np.ndarray, pairs: np.ndarray) -> np.ndarray:
    """Fraction of equal MinHash values per pair (float64)."""
    out = np.zeros(len(pairs), dtype=np.float64)
    for s in range(0, len(pairs), 65536):
        p = pairs[s:s + 65536]
        out[s:s + 65536] = (sig[p[:, 0]] == sig[p[:, 1]]).mean(axis=1)
    return out


def exact_jaccard(values: np.ndarray, offsets: np.ndarray, pairs: np.ndarray) -> np.ndarray:
    """|A & B| / |A | B| of the shingle sets of every pair, vectorised (sort + adjacent equal)."""
    out = np.zeros(len(pairs), dtype=np.float64)
    sizes = np.diff(offsets)
    for s in range(0, len(pairs), 16384):
        p = pairs[s:s + 16384]
        la, lb = sizes[p[:, 0]], sizes[p[:, 1]]
        both = np.concatenate([p[:, 0], p[:, 1]])
        lens = np.concatenate([la, lb])
        tag = np.repeat(np.tile(np.arange(len(p), dtype=np.uint64), 2), lens)
        starts = np.repeat(offsets[both] - np.concatenate([[0], np.cumsum(lens)[:-1]]), lens)
        vals = values[np.arange(int(lens.sum()), dtype=np.int64) + starts].astype(np.uint64)
        key = np.sort((tag << np.uint64(32)) | vals)
        same = key[1:] == key[:-1]
        inter = np.bincount((key[1:][same] >> np.uint64(32)).astype(np.int64), minlength=len(p))
        union = la + lb - inter
        out[s:s + 16384] = np.where(union > 0, inter / np.maximum(union, 1), 0.0)
    return out
