"""All repetition / URL scores of one Arrow string column, by the fastest implementation here.

The compiled kernel (``dataguard.text._qscore``, built from ``_qscore.c`` at install time)
reads the Arrow UTF-8 buffer directly and scores each text in one cache-resident pass. Where
it could not be built (no C compiler), the NumPy reference in ``quality_scores`` computes
the same numbers; ``tests/test_repetition_kernel.py`` and ``tests/test_kernel_fallback_parity.py``
hold the two to exact agreement. URLs: the kernel implements ``quality_scores.URL_RE``'s
matching rules directly; the reference runs the regex.

Texts are scored in chunks of bounded size, so the reference's memory follows the chunk and
the kernel's scratch follows the longest text scored. A text that cannot be scored - longer
than ``max_text_bytes`` (and never above ``MAX_TEXT_BYTES``), or one that alone runs out of
memory - gets NaN for every float score and 0 for the counts, instead of an exception for
the whole batch; callers decide what that means (the quality stage rejects the row).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from dataguard.text import quality_scores as qs

try:  # pragma: no cover - exercised by whichever path this install has
    from dataguard.text import _qscore
except ImportError:  # no compiler at install time
    _qscore = None

KERNEL_AVAILABLE = _qscore is not None

MAX_REP_LEN = 1000  # data-juicer window / n-gram length; the kernel checks the same bound
MAX_NGRAM = 20  # Gopher n-gram sizes 2..MAX_NGRAM
MAX_TEXT_BYTES = 0x7FFFFF00  # the kernel's positions are 32-bit; longer texts are not scored
KERNEL_CHUNK_BYTES = 64 << 20  # text bytes per kernel call (a MemoryError retries per half)
REFERENCE_CHUNK_BYTES = 4 << 20  # text bytes per reference call (~200 bytes of arrays per character)
INT_SCORES = ("gopher_words", "url_count")


def kernel_enabled() -> bool:
    """Whether scoring uses the kernel: built, and not switched off with DATAGUARD_NO_KERNEL=1
    (which forces the NumPy reference, for comparisons and debugging)."""
    return KERNEL_AVAILABLE and os.environ.get("DATAGUARD_NO_KERNEL", "") in ("", "0")


def _is_int(v: object) -> bool:
    return isinstance(v, int | np.integer) and not isinstance(v, bool)


@dataclass(frozen=True)
class ScoreSpec:
    """Which scores and with which parameters (the QualityStage's settings). Checked here so
    both implementations refuse the same values (the kernel's C ints would wrap them)."""

    ignore_whitespace: bool = True
    char_rep_len: int = 10
    word_rep_len: int = 10
    top_ns: tuple[int, ...] = (2, 3, 4)
    dup_ns: tuple[int, ...] = (5, 6, 7, 8, 9, 10)

    def __post_init__(self) -> None:
        for name in ("char_rep_len", "word_rep_len"):
            v = getattr(self, name)
            if not (_is_int(v) and 1 <= v <= MAX_REP_LEN):
                raise ValueError(f"{name} must be an integer between 1 and {MAX_REP_LEN}, got {v!r}")
        for name in ("top_ns", "dup_ns"):
            ns = getattr(self, name)
            if not all(_is_int(k) and 2 <= k <= MAX_NGRAM for k in ns) or list(ns) != sorted(set(ns)):
                raise ValueError(f"{name} must be increasing n-gram sizes in 2..{MAX_NGRAM}, got {ns!r}")

    def names(self) -> list[str]:
        """Kernel output columns, in order."""
        return (["char_repeat_ratio", "special_char_ratio", "char_rep_ratio", "word_rep_ratio", "dup_line_frac",
                 "dup_line_char_frac"] + [f"top{k}_gram_char_frac" for k in self.top_ns]
                + [f"dup{k}_gram_char_frac" for k in self.dup_ns])

    def all_names(self) -> list[str]:
        """Every score returned, in order (kernel columns, then the counts and the URL ratio)."""
        return [*self.names(), "gopher_words", "url_count", "url_char_ratio"]


def _as_large_string(arr: pa.Array | pa.ChunkedArray) -> pa.Array:
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks() if arr.num_chunks != 1 else arr.chunk(0)
    arr = pc.fill_null(arr, "")
    return arr if arr.type == pa.large_string() else arr.cast(pa.large_string())


def _byte_offsets(arr: pa.Array) -> np.ndarray:
    """int64 offsets (n + 1) of a string / large_string array into its data buffer."""
    if len(arr) == 0:
        return np.zeros(1, dtype=np.int64)
    dtype = np.int64 if arr.type == pa.large_string() else np.int32
    offs = np.frombuffer(arr.buffers()[1], dtype=dtype)[arr.offset: arr.offset + len(arr) + 1]
    return offs.astype(np.int64)


def _check_kernel(use_kernel: bool | None) -> bool:
    if use_kernel is None:
        return kernel_enabled()
    if use_kernel and not KERNEL_AVAILABLE:
        raise RuntimeError("the compiled repetition kernel is not built (reinstall with a C compiler)")
    return use_kernel


def score_strings(arr: pa.Array | pa.ChunkedArray | Sequence[str], spec: ScoreSpec = ScoreSpec(),
                  use_kernel: bool | None = None, max_text_bytes: int | None = None) -> dict[str, np.ndarray]:
    """Every score (see ``quality_scores``) of each string; nulls score as empty strings.
    Texts over ``max_text_bytes`` UTF-8 bytes are not scored (NaN, see the module docstring)."""
    if not isinstance(arr, pa.Array | pa.ChunkedArray):
        arr = pa.array(list(arr), pa.large_string())
    arr = _as_large_string(arr)
    n = len(arr)
    layout = _Layout(arr, np.arange(n, dtype=np.int64), np.arange(n + 1, dtype=np.int64), joined=True)
    return _score(layout, spec, _check_kernel(use_kernel), max_text_bytes)


def score_segments(content: pa.Array | pa.ChunkedArray, segments: np.ndarray, groups: np.ndarray,
                   spec: ScoreSpec = ScoreSpec(), use_kernel: bool | None = None,
                   max_text_bytes: int | None = None) -> dict[str, np.ndarray]:
    """Scores of texts assembled from pieces: text t is ``content[segments[groups[t]:groups[t+1]]]``
    joined by newlines (a side of each conversation, without building the joined strings).
    Texts over ``max_text_bytes`` UTF-8 bytes (joined) are not scored (NaN)."""
    if isinstance(content, pa.ChunkedArray):
        content = content.combine_chunks()
    if content.null_count:
        content = pc.fill_null(content, "")
    layout = _Layout(content, np.asarray(segments, dtype=np.int64), np.asarray(groups, dtype=np.int64))
    return _score(layout, spec, _check_kernel(use_kernel), max_text_bytes)


def join_segments(content: pa.Array, segments: np.ndarray, groups: np.ndarray) -> pa.Array:
    """The texts ``score_segments`` scores, built as strings: content[segments[groups[t]:groups[t+1]]]
    joined by newlines (for the reference path and for showing examples)."""
    if isinstance(content, pa.ChunkedArray):
        content = content.combine_chunks()
    if content.null_count:
        content = pc.fill_null(content, "")
    lists = pa.ListArray.from_arrays(pa.array(np.asarray(groups, dtype=np.int32)),
                                     content.take(pa.array(np.asarray(segments, dtype=np.int64))))
    # The separator's type must match the values' (string or large_string).
    return pc.binary_join(lists, pa.scalar("\n", content.type))


# -- chunked scoring ---------------------------------------------------------------------------
@dataclass
class _Layout:
    """Texts as pieces of one Arrow string array: text t is ``content[segments[groups[t]:groups[t+1]]]``
    joined by newlines; ``joined`` says each text is one element already (no join needed)."""

    content: pa.Array
    segments: np.ndarray
    groups: np.ndarray
    joined: bool = False

    def __post_init__(self) -> None:
        offs = _byte_offsets(self.content)
        self.starts, self.ends = offs[self.segments], offs[self.segments + 1]

    @property
    def n(self) -> int:
        return len(self.groups) - 1

    def text_bytes(self) -> np.ndarray:
        """UTF-8 bytes of each joined text (its segments plus the newlines between them)."""
        cs = np.concatenate([[0], np.cumsum(self.ends - self.starts)])
        count = np.diff(self.groups)
        return cs[self.groups[1:]] - cs[self.groups[:-1]] + np.maximum(count - 1, 0)

    def pieces(self, a: int, b: int, skip: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(segment indices, groups) of texts a..b-1, the skipped ones left empty."""
        g = self.groups[a:b + 1]
        count = np.diff(g)
        if not skip[a:b].any():
            return np.arange(g[0], g[-1], dtype=np.int64), g - g[0]
        count = np.where(skip[a:b], 0, count)
        keep = np.repeat(~skip[a:b], np.diff(g))
        return np.arange(g[0], g[-1], dtype=np.int64)[keep], np.concatenate([[0], np.cumsum(count)]).astype(np.int64)

    def kernel_scores(self, a: int, b: int, skip: np.ndarray, spec: ScoreSpec) -> dict[str, np.ndarray]:
        idx, groups = self.pieces(a, b, skip)
        return _kernel(self.content, self.starts[idx], self.ends[idx], groups, spec)

    def reference_scores(self, a: int, b: int, skip: np.ndarray, spec: ScoreSpec) -> dict[str, np.ndarray]:
        if self.joined:
            texts = self.content.slice(a, b - a)
            if skip[a:b].any():
                texts = pc.if_else(pa.array(skip[a:b]), pa.scalar("", texts.type), texts)
        else:
            idx, groups = self.pieces(a, b, skip)
            texts = join_segments(self.content, self.segments[idx], groups)
        return _reference(_as_large_string(texts), spec)


def _chunks(sizes: np.ndarray, budget: int) -> list[tuple[int, int]]:
    """Consecutive ranges of texts whose sizes add up to at most ``budget`` (a longer text
    is a range of its own)."""
    n = len(sizes)
    if n == 0:
        return []
    if int(sizes.sum()) <= budget:
        return [(0, n)]
    bounds, total = [0], 0
    for i, s in enumerate(sizes.tolist()):
        if total + s > budget and i > bounds[-1]:
            bounds.append(i)
            total = 0
        total += s
    bounds.append(n)
    return list(zip(bounds[:-1], bounds[1:], strict=True))


def _score(layout: _Layout, spec: ScoreSpec, kernel: bool, max_text_bytes: int | None) -> dict[str, np.ndarray]:
    """Scores every text chunk by chunk; the texts that cannot be scored get NaN / 0."""
    n = layout.n
    limit = MAX_TEXT_BYTES if max_text_bytes is None else min(int(max_text_bytes), MAX_TEXT_BYTES)
    nbytes = layout.text_bytes()
    skip = nbytes > limit
    run: Callable[[int, int], dict[str, np.ndarray]]
    if kernel:
        def run(a: int, b: int) -> dict[str, np.ndarray]:
            return layout.kernel_scores(a, b, skip, spec)
    else:
        def run(a: int, b: int) -> dict[str, np.ndarray]:
            return layout.reference_scores(a, b, skip, spec)
    ranges = _chunks(np.where(skip, 0, nbytes), KERNEL_CHUNK_BYTES if kernel else REFERENCE_CHUNK_BYTES)
    if ranges == [(0, n)] and not skip.any():
        try:
            return _ordered(run(0, n), spec)  # the usual batch: one call, no copies
        except MemoryError:
            pass
    out = _empty_scores(spec, n)
    failed = skip.copy()
    for a, b in ranges:
        _fill(run, a, b, out, failed)
    _mark_unscored(out, failed)
    return out


def _fill(run: Callable[[int, int], dict[str, np.ndarray]], a: int, b: int, out: dict[str, np.ndarray],
          failed: np.ndarray) -> None:
    """Scores texts a..b-1 into ``out``; on MemoryError, each half again, down to one text."""
    try:
        part = run(a, b)
    except MemoryError:
        if b - a == 1:
            failed[a] = True
            return
        mid = (a + b) // 2
        _fill(run, a, mid, out, failed)
        _fill(run, mid, b, out, failed)
        return
    for name, col in out.items():
        col[a:b] = part[name]


def _empty_scores(spec: ScoreSpec, n: int) -> dict[str, np.ndarray]:
    return {name: np.zeros(n, dtype=np.int32 if name in INT_SCORES else np.float32) for name in spec.all_names()}


def _ordered(scores: dict[str, np.ndarray], spec: ScoreSpec) -> dict[str, np.ndarray]:
    return {name: scores[name] for name in spec.all_names()}


def _mark_unscored(out: dict[str, np.ndarray], failed: np.ndarray) -> None:
    """NaN floats and zero counts for texts that were not scored."""
    if failed.any():
        for name, col in out.items():
            col[failed] = 0 if name in INT_SCORES else np.nan


def _kernel(arr: pa.Array, starts: np.ndarray, ends: np.ndarray, groups: np.ndarray,
            spec: ScoreSpec, stats: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """One kernel call (``stats``: optional int64[3] debug counters, see ``_qscore.c``)."""
    n = len(groups) - 1
    names = spec.names()
    # Column-major: each score is one contiguous array (Arrow takes it without a copy).
    out_f = np.zeros((len(names), n), dtype=np.float32)
    out_i = np.zeros((4, n), dtype=np.int32)
    if n:
        tables = qs._tables()
        data = arr.buffers()[2] if len(arr) else None
        # The kernel copies starts / ends / groups before it releases the GIL.
        _qscore.score_texts(data if data is not None else b"", starts, ends, groups, tables["cls"],
                            tables["special"].view(np.uint8), tables["lower"], out_f, out_i,
                            spec.char_rep_len, spec.word_rep_len, spec.ignore_whitespace,
                            bytes(spec.top_ns), bytes(spec.dup_ns), stats)
    scores = {name: out_f[j] for j, name in enumerate(names)}
    chars, scores["gopher_words"], scores["url_count"], url_chars = out_i
    ratio = np.zeros(n, dtype=np.float64)
    np.divide(url_chars, chars, out=ratio, where=chars > 0)
    scores["url_char_ratio"] = ratio.astype(np.float32)
    return scores


def _reference(arr: pa.Array, spec: ScoreSpec) -> dict[str, np.ndarray]:
    tb = qs.TextBatch.from_arrow(arr)
    out: dict[str, np.ndarray] = {}
    out["char_repeat_ratio"] = qs.char_repeat_ratio(tb, ignore_whitespace=spec.ignore_whitespace)
    out["url_count"], out["url_char_ratio"] = qs.url_stats(tb)
    out["special_char_ratio"] = qs.special_char_ratio(tb)
    out["char_rep_ratio"] = qs.char_rep_ratio(tb, spec.char_rep_len)
    out["word_rep_ratio"] = qs.word_rep_ratio(tb, spec.word_rep_len)
    out["dup_line_frac"], out["dup_line_char_frac"] = qs.dup_line_fracs(tb)
    out.update(qs.gopher_ngram_fracs(tb, spec.top_ns, spec.dup_ns))
    return out
