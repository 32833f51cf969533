"""All repetition / URL scores of one Arrow string column, by the compiled kernel.

The kernel (``dataguard.text._qscore``, built from ``_qscore.c`` by ``setup.py`` at install
time; the install fails, naming what to install, where no C compiler exists) is the one
implementation. It reads the Arrow UTF-8 buffer directly, scores each text in one
cache-resident pass, builds its character tables at import from the interpreter's Unicode
database, and returns the scores keyed by name. Its n-gram groups are exact (a hash match is
confirmed by comparing the text). ``tests/reference_quality_scores.py`` is an independent
NumPy implementation of the same definitions that the tests hold the kernel to, number for
number; tests pass it as ``scorer`` to the functions below.

Definitions (each checked against a hand-computed example in tests/test_quality.py); every
score is one float32 (or int32) value per text:

* ``char_repeat_ratio``: share of characters equal to the previous character of the same
  text (whitespace runs ignored by default, so code indentation is not "repetition").
* ``url_count`` / ``url_char_ratio``: URLs - the matches of ``URL_RE`` below, trailing
  ``.,;:!?)]}`` excluded, longer than 4 characters - and the share of characters inside them.
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
  of its own (close to NLTK's ``word_tokenize`` that datatrove uses); ``gopher_words`` counts
  them.

Invalid UTF-8 (an Arrow string array built without validation) decodes as
``bytes.decode("utf-8", "replace")`` does, text by text.

Texts are scored in chunks of bounded size, so the kernel's scratch follows the longest text
scored. A text that cannot be scored - longer than ``max_text_bytes`` (and never above
``MAX_TEXT_BYTES``), or one that alone runs out of memory - gets NaN for every float score and
0 for the counts, instead of an exception for the whole batch; callers decide what that means
(the quality stage rejects the row).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

try:
    from dataguard.text import _qscore
except ImportError as err:  # a source tree that was never built
    raise ImportError(
        "dataguard.text._qscore, the compiled repetition kernel, is not built. Install dataguard with "
        "`pip install -e .` (or `python setup.py build_ext --inplace` in a checkout); it needs a C "
        "compiler and the Python headers (Debian/Ubuntu: apt install gcc python3-dev)") from err

MAX_REP_LEN: int = _qscore.MAX_REP_LEN  # data-juicer window / n-gram length (1000)
MAX_NGRAM: int = _qscore.MAX_NGRAM  # Gopher n-gram sizes 2..MAX_NGRAM (20)
MAX_TEXT_BYTES: int = _qscore.MAX_TEXT_BYTES  # the kernel's positions are 32-bit; longer texts are not scored
KERNEL_CHUNK_BYTES = 64 << 20  # text bytes per kernel call (a MemoryError retries per half)
INT_SCORES = ("gopher_words", "url_count")
_INT_COLUMNS = ("chars", *INT_SCORES)  # the kernel's int32 columns ("chars": characters per text)
# The URLs the kernel counts (it implements these matching rules in C, see count_urls).
URL_RE = re.compile(r"(?:[a-zA-Z][a-zA-Z0-9+.\-]{1,15}://|www\.)[^\s<>\"'`]+")


class TextScorer(Protocol):
    """Another implementation of every score, over whole texts (the tests' NumPy reference):
    called with a ``large_string`` array and the spec, at most ``chunk_bytes`` of text a call."""

    chunk_bytes: int

    def __call__(self, texts: pa.Array, spec: ScoreSpec) -> dict[str, np.ndarray]: ...


def _is_int(v: object) -> bool:
    return isinstance(v, int | np.integer) and not isinstance(v, bool)


@dataclass(frozen=True)
class ScoreSpec:
    """Which scores and with which parameters (the QualityStage's settings), read by name by
    the kernel. Checked here with the stage's messages; the kernel checks the same bounds."""

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
        """Every score returned, in order."""
        return (["char_repeat_ratio", "special_char_ratio", "char_rep_ratio", "word_rep_ratio", "dup_line_frac",
                 "dup_line_char_frac"] + [f"top{k}_gram_char_frac" for k in self.top_ns]
                + [f"dup{k}_gram_char_frac" for k in self.dup_ns] + ["gopher_words", "url_count", "url_char_ratio"])


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


def score_strings(arr: pa.Array | pa.ChunkedArray | Sequence[str], spec: ScoreSpec = ScoreSpec(), *,
                  max_text_bytes: int | None = None, scorer: TextScorer | None = None) -> dict[str, np.ndarray]:
    """Every score (see the module docstring) of each string; nulls score as empty strings.
    Texts over ``max_text_bytes`` UTF-8 bytes are not scored (NaN). ``scorer``: another
    implementation instead of the kernel (the tests' reference)."""
    if not isinstance(arr, pa.Array | pa.ChunkedArray):
        arr = pa.array(list(arr), pa.large_string())
    arr = _as_large_string(arr)
    n = len(arr)
    layout = _Layout(arr, np.arange(n, dtype=np.int64), np.arange(n + 1, dtype=np.int64), joined=True)
    return _score(layout, spec, scorer, max_text_bytes)


def score_segments(content: pa.Array | pa.ChunkedArray, segments: np.ndarray, groups: np.ndarray,
                   spec: ScoreSpec = ScoreSpec(), *, max_text_bytes: int | None = None,
                   scorer: TextScorer | None = None) -> dict[str, np.ndarray]:
    """Scores of texts assembled from pieces: text t is ``content[segments[groups[t]:groups[t+1]]]``
    joined by newlines (a side of each conversation, without building the joined strings).
    Texts over ``max_text_bytes`` UTF-8 bytes (joined) are not scored (NaN)."""
    if isinstance(content, pa.ChunkedArray):
        content = content.combine_chunks()
    if content.null_count:
        content = pc.fill_null(content, "")
    layout = _Layout(content, np.asarray(segments, dtype=np.int64), np.asarray(groups, dtype=np.int64))
    return _score(layout, spec, scorer, max_text_bytes)


def join_segments(content: pa.Array, segments: np.ndarray, groups: np.ndarray) -> pa.Array:
    """The texts ``score_segments`` scores, built as strings: content[segments[groups[t]:groups[t+1]]]
    joined by newlines (for another scorer and for showing examples)."""
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

    def joined_texts(self, a: int, b: int, skip: np.ndarray) -> pa.Array:
        """Texts a..b-1 as strings (the skipped ones empty), for a scorer other than the kernel."""
        if self.joined:
            texts = self.content.slice(a, b - a)
            if skip[a:b].any():
                texts = pc.if_else(pa.array(skip[a:b]), pa.scalar("", texts.type), texts)
        else:
            idx, groups = self.pieces(a, b, skip)
            texts = join_segments(self.content, self.segments[idx], groups)
        return _as_large_string(texts)


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


def _score(layout: _Layout, spec: ScoreSpec, scorer: TextScorer | None,
           max_text_bytes: int | None) -> dict[str, np.ndarray]:
    """Scores every text chunk by chunk; the texts that cannot be scored get NaN / 0."""
    n = layout.n
    limit = MAX_TEXT_BYTES if max_text_bytes is None else min(int(max_text_bytes), MAX_TEXT_BYTES)
    nbytes = layout.text_bytes()
    skip = nbytes > limit
    run: Callable[[int, int], dict[str, np.ndarray]]
    if scorer is None:
        def run(a: int, b: int) -> dict[str, np.ndarray]:
            return layout.kernel_scores(a, b, skip, spec)
    else:
        def run(a: int, b: int) -> dict[str, np.ndarray]:
            return scorer(layout.joined_texts(a, b, skip), spec)
    ranges = _chunks(np.where(skip, 0, nbytes), KERNEL_CHUNK_BYTES if scorer is None else scorer.chunk_bytes)
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
    return {name: np.zeros(n, dtype=np.int32 if name in INT_SCORES else np.float32) for name in spec.names()}


def _ordered(scores: dict[str, np.ndarray], spec: ScoreSpec) -> dict[str, np.ndarray]:
    return {name: scores[name] for name in spec.names()}


def _mark_unscored(out: dict[str, np.ndarray], failed: np.ndarray) -> None:
    """NaN floats and zero counts for texts that were not scored."""
    if failed.any():
        for name, col in out.items():
            col[failed] = 0 if name in INT_SCORES else np.nan


def _kernel(arr: pa.Array, starts: np.ndarray, ends: np.ndarray, groups: np.ndarray,
            spec: ScoreSpec, stats: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """One kernel call: every score by name, plus "chars" (characters per text); ``stats``:
    optional int64[3] debug counters (see ``_qscore.c``)."""
    data = arr.buffers()[2] if len(arr) else None
    # The kernel copies starts / ends / groups before it releases the GIL.
    raw = _qscore.score_texts(data if data is not None else b"", starts, ends, groups, spec, stats)
    return {name: np.frombuffer(buf, np.int32 if name in _INT_COLUMNS else np.float32) for name, buf in raw.items()}
