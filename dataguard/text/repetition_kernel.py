"""All repetition / URL scores of one Arrow string column, by the fastest implementation here.

The compiled kernel (``dataguard.text._qscore``, built from ``_qscore.c`` at install time)
reads the Arrow UTF-8 buffer directly and scores each text in one cache-resident pass. Where
it could not be built (no C compiler), the NumPy reference in ``quality_scores`` computes
the same numbers; ``tests/test_repetition_kernel.py`` holds the two to exact agreement.
URLs: the kernel implements ``quality_scores.URL_RE``'s matching rules directly; the
reference runs the regex.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
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


def kernel_enabled() -> bool:
    """Whether scoring uses the kernel: built, and not switched off with DATAGUARD_NO_KERNEL=1
    (which forces the NumPy reference, for comparisons and debugging)."""
    return KERNEL_AVAILABLE and os.environ.get("DATAGUARD_NO_KERNEL", "") in ("", "0")


@dataclass(frozen=True)
class ScoreSpec:
    """Which scores and with which parameters (the QualityStage's settings)."""

    ignore_whitespace: bool = True
    char_rep_len: int = 10
    word_rep_len: int = 10
    top_ns: tuple[int, ...] = (2, 3, 4)
    dup_ns: tuple[int, ...] = (5, 6, 7, 8, 9, 10)

    def names(self) -> list[str]:
        """Kernel output columns, in order."""
        return (["char_repeat_ratio", "special_char_ratio", "char_rep_ratio", "word_rep_ratio", "dup_line_frac",
                 "dup_line_char_frac"] + [f"top{k}_gram_char_frac" for k in self.top_ns]
                + [f"dup{k}_gram_char_frac" for k in self.dup_ns])


def _as_large_string(arr: pa.Array | pa.ChunkedArray) -> pa.Array:
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks() if arr.num_chunks != 1 else arr.chunk(0)
    arr = pc.fill_null(arr, "")
    return arr if arr.type == pa.large_string() else arr.cast(pa.large_string())


def _byte_offsets(arr: pa.Array) -> np.ndarray:
    """int64 offsets (n + 1) of a string / large_string array into its data buffer."""
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
                  use_kernel: bool | None = None) -> dict[str, np.ndarray]:
    """Every score (see ``quality_scores``) of each string; nulls score as empty strings."""
    if not isinstance(arr, pa.Array | pa.ChunkedArray):
        arr = pa.array(list(arr), pa.large_string())
    arr = _as_large_string(arr)
    if not _check_kernel(use_kernel):
        return _reference(arr, spec)
    n = len(arr)
    offs = _byte_offsets(arr) if n else np.zeros(1, dtype=np.int64)
    return _kernel(arr, offs[:-1], offs[1:], np.arange(n + 1, dtype=np.int64), spec)


def score_segments(content: pa.Array | pa.ChunkedArray, segments: np.ndarray, groups: np.ndarray,
                   spec: ScoreSpec = ScoreSpec(), use_kernel: bool | None = None) -> dict[str, np.ndarray]:
    """Scores of texts assembled from pieces: text t is ``content[segments[groups[t]:groups[t+1]]]``
    joined by newlines (a side of each conversation, without building the joined strings)."""
    if isinstance(content, pa.ChunkedArray):
        content = content.combine_chunks()
    if content.null_count:
        content = pc.fill_null(content, "")
    segments = np.asarray(segments, dtype=np.int64)
    groups = np.asarray(groups, dtype=np.int64)
    if not _check_kernel(use_kernel):
        return _reference(_as_large_string(join_segments(content, segments, groups)), spec)
    offs = _byte_offsets(content) if len(content) else np.zeros(1, dtype=np.int64)
    return _kernel(content, offs[segments], offs[segments + 1], groups, spec)


def join_segments(content: pa.Array, segments: np.ndarray, groups: np.ndarray) -> pa.Array:
    """The texts ``score_segments`` scores, built as strings: content[segments[groups[t]:groups[t+1]]]
    joined by newlines (for the reference path and for showing examples)."""
    if isinstance(content, pa.ChunkedArray):
        content = content.combine_chunks()
    if content.null_count:
        content = pc.fill_null(content, "")
    lists = pa.ListArray.from_arrays(pa.array(np.asarray(groups, dtype=np.int32)),
                                     content.take(pa.array(np.asarray(segments, dtype=np.int64))))
    return pc.binary_join(lists, "\n")


def _kernel(arr: pa.Array, starts: np.ndarray, ends: np.ndarray, groups: np.ndarray,
            spec: ScoreSpec) -> dict[str, np.ndarray]:
    n = len(groups) - 1
    names = spec.names()
    # Column-major: each score is one contiguous array (Arrow takes it without a copy).
    out_f = np.zeros((len(names), n), dtype=np.float32)
    out_i = np.zeros((4, n), dtype=np.int32)
    if n:
        tables = qs._tables()
        data = arr.buffers()[2] if len(arr) else None
        _qscore.score_texts(data if data is not None else b"", np.ascontiguousarray(starts),
                            np.ascontiguousarray(ends), np.ascontiguousarray(groups), tables["cls"],
                            tables["special"].view(np.uint8), tables["lower"], out_f, out_i,
                            spec.char_rep_len, spec.word_rep_len, spec.ignore_whitespace,
                            bytes(spec.top_ns), bytes(spec.dup_ns))
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
