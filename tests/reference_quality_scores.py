"""The NumPy reference implementation of the repetition / URL scores (the definitions are
in ``dataguard.text.repetition_kernel``'s docstring).

The pipeline runs only the compiled kernel (``dataguard/text/_qscore.c``); this independent
implementation - array passes and sorts over the whole batch instead of one hash table per
text - is what the tests hold the kernel to, number for number. Pass ``REFERENCE`` as the
``scorer`` of ``repetition_kernel.score_strings`` / ``score_segments``.
Invalid UTF-8 (an Arrow string array built without validation) decodes as
``bytes.decode("utf-8", "replace")`` does, text by text, as in the kernel.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from reference_text_batch import (
    SPACE,
    U64,
    WORD_MIX,
    Groups,
    TextBatch,
    group_counts,
    group_within_texts,
    powers,
    prefix_hash,
    span_hash,
    tables,
)

from dataguard.text.repetition_kernel import URL_RE, ScoreSpec, score_strings

_SCHEME_MAX = 16  # a scheme is a letter plus 1-15 more characters
_ASCII_LETTERS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
_URL_TRAIL = ".,;:!?)]}"


@dataclass(frozen=True)
class ReferenceScorer:
    """Every score of a ``large_string`` array of texts (a ``repetition_kernel.TextScorer``)."""

    chunk_bytes: int = 4 << 20  # text bytes per call (~200 bytes of arrays per character)

    def __call__(self, texts: pa.Array, spec: ScoreSpec) -> dict[str, np.ndarray]:
        tb = TextBatch.from_arrow(texts)
        out: dict[str, np.ndarray] = {}
        out["char_repeat_ratio"] = char_repeat_ratio(tb, ignore_whitespace=spec.ignore_whitespace)
        out["url_count"], out["url_char_ratio"] = url_stats(tb)
        out["special_char_ratio"] = special_char_ratio(tb)
        out["char_rep_ratio"] = char_rep_ratio(tb, spec.char_rep_len)
        out["word_rep_ratio"] = word_rep_ratio(tb, spec.word_rep_len)
        out["dup_line_frac"], out["dup_line_char_frac"] = dup_line_fracs(tb)
        out.update(gopher_ngram_fracs(tb, spec.top_ns, spec.dup_ns))
        return out


REFERENCE = ReferenceScorer()
_DEFAULT_SPEC = ScoreSpec()


def assert_kernel_equals_reference(texts: list[str] | pa.Array,
                                   spec: ScoreSpec = _DEFAULT_SPEC) -> dict[str, np.ndarray]:
    """The kernel's scores of ``texts``, once checked against the reference's: same names,
    dtypes and numbers."""
    fast = score_strings(texts, spec)
    ref = score_strings(texts, spec, scorer=REFERENCE)
    assert fast.keys() == ref.keys()
    for name in ref:
        np.testing.assert_array_equal(fast[name], ref[name], err_msg=name)
        assert fast[name].dtype == ref[name].dtype, name
    return fast


def thue_morse(n: int) -> str:
    """The first n letters of the Thue-Morse sequence over "ab": its long blocks defeat any
    polynomial hash mod 2**64 (equal hashes, different text)."""
    return "".join("ab"[bin(i).count("1") % 2] for i in range(n))


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
        eq &= tb.cls[1:] != SPACE
    eq &= tb.text_of_char[1:] == tb.text_of_char[:-1]
    counts = np.bincount(tb.text_of_char[1:][eq], minlength=tb.n)
    return _safe_div(counts.astype(np.float64), tb.lens.astype(np.float64))


def special_char_ratio(tb: TextBatch) -> np.ndarray:
    """data-juicer special_characters_filter: share of punctuation, digits, whitespace, symbols."""
    if len(tb.cp) == 0:
        return np.zeros(tb.n, dtype=np.float32)
    special = tables()["special"][tb.cp]
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
    _, inv = powers(m)
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
    mask32 = U64(0xFFFFFFFF)
    key = (rep_text.astype(U64) << U64(32)) | (mask32 - rep_cnt.astype(U64))
    key.sort()
    rt = (key >> U64(32)).astype(np.int64)
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
    keep = ~tables()["special"][cp]
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
        return np.zeros(0, dtype=U64), np.zeros(0, dtype=np.int64)
    h = np.zeros(m, dtype=U64)
    with np.errstate(over="ignore"):
        for k in range(n):
            h = h * WORD_MIX + word_hash[k:k + m]
        h ^= h >> U64(29)
        h *= U64(0xBF58476D1CE4E5B9)
        h ^= h >> U64(32)
    ok = word_text[:m] == word_text[n - 1:]
    idx = np.flatnonzero(ok)
    return h[idx], idx


def word_rep_ratio(tb: TextBatch, rep_len: int = 10) -> np.ndarray:
    """data-juicer word_repetition_filter ratio (see module docstring)."""
    start, end, wtext = _dj_words(tb)
    out = np.zeros(tb.n, dtype=np.float32)
    if len(start) < rep_len:
        return out
    lower = tables()["lower"][tb.cp]
    wh = span_hash(prefix_hash(lower), start, end)
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
    g = group_within_texts(span_hash(tb.prefix, line_start, line_end), lt, want_dups=True)
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
    wh = span_hash(tb.prefix, start, end)
    csum = np.concatenate([[0], np.cumsum(wlen)])
    # Candidates for n = 2: every bigram inside one text; raw = un-mixed rolling hash.
    idx = np.flatnonzero(wtext[:-1] == wtext[1:])
    with np.errstate(over="ignore"):
        raw = wh[idx] * WORD_MIX + wh[idx + 1]
    for k in range(2, max_n + 1):
        if len(idx) == 0:
            break
        with np.errstate(over="ignore"):
            h = raw ^ (raw >> U64(29))
            h *= U64(0xBF58476D1CE4E5B9)
            h ^= h >> U64(32)
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
            raw = raw[sel] * WORD_MIX + wh[idx + k]
    return out


def _members_of_repeated(g: Groups, m: int) -> np.ndarray:
    """Indices of all elements whose group repeats (used when dups were not collected)."""
    # Non-first members are exactly the elements that are not a group's first occurrence.
    is_first = np.zeros(m, dtype=bool)
    is_first[g.first] = True
    repeated_first = np.zeros(m, dtype=bool)
    repeated_first[g.first[g.count > 1]] = True
    return np.flatnonzero(~is_first | repeated_first)
