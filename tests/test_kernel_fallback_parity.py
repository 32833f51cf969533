"""The NumPy reference (tests/reference_quality_scores.py, once the fallback where no C compiler
existed) against the compiled kernel on mixed batches, and the reference's own former defects:
scores leaking between texts of a big sort chunk, 36-bit hash keys, quadratic URL search,
invalid UTF-8, ``list<large_string>`` content, one n in both Gopher maps."""

from __future__ import annotations

import functools
import re

import numpy as np
import pyarrow as pa
import pytest
from reference_quality_scores import REFERENCE, thue_morse, urls_in
from reference_text_batch import TextBatch, span_hash

from dataguard.records import CANONICAL_SCHEMA
from dataguard.stages import quality
from dataguard.stages.quality import QualityStage
from dataguard.text import repetition_kernel as rk


def _mixed_batch(seed: int) -> list[str]:
    """Short and long texts in one batch: > 2**17 words and n-grams, Unicode, URLs, empty
    texts, duplicate lines, whitespace runs."""
    rng = np.random.default_rng(seed)
    vocab = ["the", "The", "data", "é", "Ж", "😀", "naïve", "http://x.org/a?b=1", "www.y.com.", "://", "\n", "\n\n",
             " ", "  ", "\t", "line", ",", "!!", "_", "x" * 30, "ﬁ", "İ", "\u00a0", "\u2003", "(see https://z.io)."]
    lines = ["same line", "Same line", "another one", "", "  indented", "😀😀"]
    texts = ["", " ", "\n", "\n\n\n", "a", "a b", "a b " * 70000]
    texts += ["".join(rng.choice(vocab, size=int(rng.integers(0, 60)))) for _ in range(300)]
    texts += [" ".join(rng.choice(vocab[:8], size=150_000))]  # one text of > 2**17 words
    texts += ["\n".join(rng.choice(lines, size=int(rng.integers(1, 80)))) for _ in range(100)]
    texts += [" ".join(rng.choice(["la", "le", "li"], size=int(rng.integers(0, 3000)))) for _ in range(40)]
    order = rng.permutation(len(texts))  # the long texts land between short ones
    return [texts[i] for i in order]


def _scores(texts: list[str] | pa.Array, spec: rk.ScoreSpec, fallback: bool) -> dict[str, np.ndarray]:
    """Scores through the public entry point: the kernel, or the reference passed explicitly."""
    return rk.score_strings(texts, spec, scorer=REFERENCE if fallback else None)


def _assert_same(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> None:
    assert list(a) == list(b)
    for name in a:
        assert a[name].dtype == b[name].dtype, name
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)


@pytest.mark.parametrize("spec", [
    rk.ScoreSpec(),
    rk.ScoreSpec(char_rep_len=3, word_rep_len=2, top_ns=(2, 3), dup_ns=(3, 5)),  # n = 3 in both
    rk.ScoreSpec(ignore_whitespace=False, char_rep_len=1, word_rep_len=rk.MAX_REP_LEN, top_ns=(20,), dup_ns=(2, 20)),
], ids=["default", "small-and-shared-n", "extremes"])
def test_kernel_and_fallback_agree_on_mixed_batches(spec):
    texts = _mixed_batch(21)
    kernel = _scores(texts, spec, fallback=False)
    fallback = _scores(texts, spec, fallback=True)
    _assert_same(kernel, fallback)
    # Not vacuous: the batch trips the interesting branches.
    assert (kernel["char_rep_ratio"] > 0).sum() > 100 and (kernel["dup_line_frac"] > 0).sum() > 50
    assert (kernel["url_count"] > 0).sum() > 50 and kernel["gopher_words"].max() > 1 << 17


def test_kernel_and_fallback_agree_on_conversation_sides_with_large_strings(monkeypatch):
    # A side = its messages joined by newlines; content as large_string (what a reader that
    # keeps 64-bit offsets produces) used to crash the fallback in binary_join.
    rng = np.random.default_rng(4)
    words = ["hi", "hello", "https://a.b/c", "\n", "é", "same line\n"]
    msgs = [[{"role": r, "content": " ".join(rng.choice(words, size=int(rng.integers(0, 40))))}
             for r in rng.choice(["system", "user", "assistant", "tool"], size=int(rng.integers(0, 6)))]
            for _ in range(300)]
    schema = CANONICAL_SCHEMA.set(2, pa.field("messages", pa.list_(pa.struct(
        [("role", pa.string()), ("content", pa.large_string())]))))
    table = pa.Table.from_pylist([{"id": str(i), "source": "t", "messages": m, "label": None, "meta": None}
                                  for i, m in enumerate(msgs)], schema=schema)
    stage = QualityStage()
    kernel = stage.score(table)
    monkeypatch.setattr(quality, "score_segments", functools.partial(quality.score_segments, scorer=REFERENCE))
    fallback = stage.score(table)
    assert kernel.equals(fallback)
    assert pa.compute.sum(kernel.column("response_url_count")).as_py() > 0


def test_fallback_keeps_texts_apart_in_a_big_sort_chunk():
    # "a b " * 70000 has 140k bigrams: its sort chunk (shared with "a b") is too big for the
    # packed keys, and the generic path grouped by hash alone, so "a b" got 70001.0.
    texts = ["a b", "a b " * 70000]
    together = rk.score_strings(texts, scorer=REFERENCE)
    for i, text in enumerate(texts):
        alone = rk.score_strings([text], scorer=REFERENCE)
        for name in together:
            assert together[name][i] == alone[name][0], name
    assert together["top2_gram_char_frac"][0] == 0 and together["top2_gram_char_frac"][1] == pytest.approx(0.75)


def test_fallback_groups_by_the_full_64_bit_hash():
    # Two ordinary lines whose hashes share the 36 bits the packed sort keys keep (found by
    # a birthday search over "line {i}"): they used to count as duplicate lines.
    a, b = "line 955504", "line 1409581"
    tb = TextBatch([a + "\n" + b])
    h = span_hash(tb.prefix, np.array([0, len(a) + 1]), np.array([len(a), len(a) + 1 + len(b)]))
    assert h[0] >> np.uint64(28) == h[1] >> np.uint64(28) and h[0] != h[1]
    assert rk.score_strings([a + "\n" + b], scorer=REFERENCE)["dup_line_frac"][0] == 0
    # Thue-Morse windows of 512 characters: their polynomial hashes agree in the low 53 bits
    # (the old key for window counts) but not in all 64.
    tm = thue_morse(1024)
    spec = rk.ScoreSpec(char_rep_len=512)
    got = rk.score_strings([tm], spec, scorer=REFERENCE)["char_rep_ratio"][0]
    windows = [tm[i:i + 512] for i in range(513)]
    assert len(set(windows)) == len(windows) and got == 0


class _CountingStr(str):
    """A str that counts the characters its find() calls scan."""

    scanned = 0

    def find(self, sub, start=0, *args):  # noqa: ANN001, ANN201 - str's own signature
        hit = str.find(self, sub, start, *args)
        _CountingStr.scanned += (hit if hit >= 0 else len(self)) - start
        return hit


@pytest.mark.parametrize("text", ["://" * 20000, "www." * 15000, "a://b www.c " * 5000, "x" * 60000],
                         ids=["scheme-separators", "www", "mixed", "none"])
def test_urls_in_scans_each_character_a_bounded_number_of_times(text):
    # Searching both anchors from every match position made '://' * 133333 take 12.6 s.
    _CountingStr.scanned = 0
    got = urls_in(_CountingStr(text))
    assert _CountingStr.scanned <= 2 * len(text)
    assert got == urls_in(str(text))


_INVALID = [b"ab\xffcd", b"a\xe2\x82", b"\xacxyz xyz", b"hello hello", b"\xed\xa0\x80 x \xf0\x9f\x98",
            b"ok\nok\nok", b"\xc0\xaf\xe0\x80\x80 http://x.y", b""]


def _invalid_utf8_batch() -> pa.Array:
    return pa.array(_INVALID, pa.binary()).view(pa.string())


def test_fallback_keeps_a_batch_aligned_across_invalid_utf8():
    # Decoding the joined bytes with replacement changed the character count, so every text
    # after a bad one was scored on shifted characters.
    arr = _invalid_utf8_batch()
    together = rk.score_strings(arr, scorer=REFERENCE)
    for i in range(len(arr)):
        alone = rk.score_strings(arr.slice(i, 1), scorer=REFERENCE)
        for name in together:
            assert together[name][i] == alone[name][0], (name, i)
    # Gopher words of Python's decoding: word runs, and every other non-space character.
    words = [len(re.findall(r"\w+|[^\w\s]", b.decode("utf-8", "replace"))) for b in _INVALID]
    assert together["gopher_words"].tolist() == words


def test_kernel_and_fallback_agree_on_invalid_utf8():
    spec = rk.ScoreSpec()
    _assert_same(_scores(_invalid_utf8_batch(), spec, fallback=False), _scores(_invalid_utf8_batch(), spec, fallback=True))


def test_fallback_accepts_one_n_in_both_gopher_maps():
    stage = QualityStage(top_ngram_max={3: 0.2}, dup_ngram_max={3: 0.1, 5: 0.1}, gopher_min_words=0)
    # No repeated 3-gram: the dup3 column was never created (KeyError).
    assert stage.side_scores(["one two three four"], scorer=REFERENCE)["dup3_gram_char_frac"].tolist() == [0.0]
    s = stage.side_scores(["a b c a b c a b c x"], scorer=REFERENCE)
    assert s["top3_gram_char_frac"][0] > 0 and s["dup3_gram_char_frac"][0] > 0
    k = stage.side_scores(["a b c a b c a b c x"])
    assert (k["top3_gram_char_frac"][0], k["dup3_gram_char_frac"][0]) == (
        s["top3_gram_char_frac"][0], s["dup3_gram_char_frac"][0])
