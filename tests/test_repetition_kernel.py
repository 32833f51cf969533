"""The compiled repetition kernel: exact agreement with the NumPy reference, exactness where
hashes collide, Arrow edge cases, argument checks."""

from __future__ import annotations

import gzip
import json
from collections import Counter

import numpy as np
import pyarrow as pa
import pytest

from dataguard.text import quality_scores as qs
from dataguard.text import repetition_kernel as rk

SPEC = rk.ScoreSpec()


def test_kernel_is_built():
    # The install compiles it (gcc is on every machine here); a silent fallback would hide a
    # 10x slowdown, so its absence is a failure, not a skip.
    assert rk.KERNEL_AVAILABLE, "dataguard.text._qscore was not built: run `pip install -e .` with a C compiler"


def _assert_same(texts: list[str] | pa.Array, spec: rk.ScoreSpec = SPEC) -> dict[str, np.ndarray]:
    fast = rk.score_strings(texts, spec, use_kernel=True)
    ref = rk.score_strings(texts, spec, use_kernel=False)
    assert fast.keys() == ref.keys()
    for name in ref:
        np.testing.assert_array_equal(fast[name], ref[name], err_msg=name)
        assert fast[name].dtype == ref[name].dtype, name
    return fast


def _real_texts(shared_data) -> list[str]:
    texts: list[str] = []
    alpaca = json.loads((shared_data / "alpaca_en_demo" / "alpaca_en_demo.json").read_text())
    texts += [r["instruction"] + "\n" + r["input"] + "\n" + r["output"] for r in alpaca]
    glaive = json.loads((shared_data / "sharegpt_glaive_toolcall" / "glaive_toolcall_en_demo.json").read_text())
    texts += ["\n".join(t["value"] for t in r["conversations"]) for r in glaive]
    with gzip.open(shared_data / "20news_label_errors" / "20news_test_texts.jsonl.gz", "rt") as f:
        texts += [json.loads(line)["text"] for _, line in zip(range(600), f, strict=False)]
    with gzip.open(shared_data / "humaneval" / "HumanEval.jsonl.gz", "rt") as f:
        texts += [(r := json.loads(line))["prompt"] + r["canonical_solution"] for line in f]
    return texts


def test_kernel_equals_reference_on_real_data(shared_data):
    texts = _real_texts(shared_data)
    s = _assert_same(texts)
    # Not vacuous: the real data trips the interesting branches.
    assert (s["char_rep_ratio"] > 0).sum() > 500
    assert (s["dup_line_frac"] > 0).sum() > 50
    assert (s["top2_gram_char_frac"] > 0).sum() > 1000
    assert (s["dup10_gram_char_frac"] > 0).sum() > 20
    assert (s["url_count"] > 0).sum() > 5


@pytest.mark.parametrize("spec", [
    rk.ScoreSpec(),
    rk.ScoreSpec(ignore_whitespace=False, char_rep_len=3, word_rep_len=2, top_ns=(2, 5), dup_ns=(3, 4, 20)),
    rk.ScoreSpec(char_rep_len=1, word_rep_len=1, top_ns=(), dup_ns=(2,)),
    rk.ScoreSpec(top_ns=(4,), dup_ns=()),
])
def test_kernel_equals_reference_on_repetitive_random_text(spec):
    # Tiny alphabets: most n-grams repeat, so every hash-table path runs (chains, many groups).
    rng = np.random.default_rng(7)
    alphabet = list("ab \n") + ["é", "Ж", "😀", "\t", ".", "!"]
    texts = ["".join(rng.choice(alphabet, size=int(rng.integers(0, 400)))) for _ in range(400)]
    words = ["the", "The", "THE", "cat", "sat", "on", "mat", ",", "!!"]
    texts += [" ".join(rng.choice(words, size=int(rng.integers(0, 300)))) for _ in range(400)]
    texts += ["", " ", "\n\n\n", "a", "aaaaaaaaaaaaaaaaaaaaaa", "x" * 5000 + "\n" + "x" * 5000]
    _assert_same(texts, spec)


def test_kernel_urls_equal_the_regex():
    # The kernel implements URL_RE's matching rules in C: random URL-dense texts (nested,
    # adjacent, over-long schemes, Unicode whitespace, trailing punctuation) against the regex.
    rng = np.random.default_rng(13)
    parts = ["http://", "https://a.b/", "www.", "ftp://x", "://", "abcdefghijklmnopqrstu://", "x", " ", "\n",
             "see", ".", ")", "<", "git+ssh://h", "wwww.", "9ab://", "a" * 15 + "://z", "a" * 16 + "://z",
             "\u00a0", "\u2003", "é://", "W://x", "`", "'", "www.x", "?!", "}"]
    texts = ["".join(rng.choice(parts, size=int(rng.integers(0, 30)))) for _ in range(5000)]
    s = _assert_same(texts)
    assert (s["url_count"] > 0).sum() > 2000 and s["url_count"].max() >= 5


def _thue_morse(n: int) -> str:
    return "".join("ab"[bin(i).count("1") % 2] for i in range(n))


def test_kernel_groups_exactly_where_polynomial_hashes_collide():
    # Thue-Morse blocks defeat any polynomial hash mod 2**64 (their hashes are equal for
    # long enough blocks); the kernel compares the text on every hash match, so two
    # different lines are never counted as duplicates.
    tm = _thue_morse(1 << 12)
    a, b = tm[: 1 << 11], tm[1 << 11:]
    assert a != b
    text = "\n".join([a, b, a])
    s = rk.score_strings([text], SPEC, use_kernel=True)
    lines = text.split("\n")
    dup = sum(c - 1 for c in Counter(lines).values())
    assert s["dup_line_frac"][0] == pytest.approx(dup / 3)
    assert s["dup_line_char_frac"][0] == pytest.approx(len(a) / len(text))


def test_arrow_inputs_slices_chunks_and_nulls():
    base = ["ha ha ha ha ha ha ha ha ha ha ha ha", None, "fine text here", "", "x\nx\nx"]
    arr = pa.array(base * 3, pa.string())
    sliced = arr.slice(3, 9)
    chunked = pa.chunked_array([arr.slice(0, 4), arr.slice(4)])
    expect = rk.score_strings([t or "" for t in base * 3], SPEC, use_kernel=True)
    got_sliced = _assert_same(sliced)
    got_chunked = _assert_same(chunked)
    for name in expect:
        np.testing.assert_array_equal(got_sliced[name], expect[name][3:12])
        np.testing.assert_array_equal(got_chunked[name], expect[name])
    empty = rk.score_strings(pa.array([], pa.string()), SPEC, use_kernel=True)
    assert all(len(v) == 0 for v in empty.values())


def test_long_single_text():
    rng = np.random.default_rng(3)
    vocab = ["data", "quality", "matters", "for", "fine", "tuning", "\n"]
    text = " ".join(rng.choice(vocab, size=60_000))
    _assert_same([text, text[:1000]])


def test_bad_arguments_raise_clear_errors():
    from dataguard.text import _qscore

    t = qs._tables()
    starts, ends, groups = np.array([0], np.int64), np.array([3], np.int64), np.array([0, 1], np.int64)
    of = np.zeros((1, 15), np.float32)
    oi = np.zeros((1, 4), np.int32)
    tables = (t["cls"], t["special"].view(np.uint8), t["lower"])
    params = (10, 10, True)

    def call(data=b"abc", s=starts, e=ends, g=groups, out_f=of, top=bytes([2, 3, 4]), dup=bytes([5, 6, 7, 8, 9, 10])):
        _qscore.score_texts(data, s, e, g, *tables, out_f, oi, *params, top, dup)

    call()  # the valid call
    assert of[0].tolist()[:2] == [0.0, 0.0] and oi[0].tolist() == [3, 1, 0, 0]
    with pytest.raises(ValueError, match="n-gram size 1"):
        call(top=bytes([1]))
    with pytest.raises(ValueError, match="increasing"):
        call(top=bytes([3, 2]))
    with pytest.raises(ValueError, match="too small"):
        call(out_f=np.zeros(3, np.float32))
    with pytest.raises(ValueError, match="segment offsets out of range"):
        call(e=np.array([9], np.int64))
    with pytest.raises(ValueError, match="groups out of range"):
        call(g=np.array([0, 2], np.int64))
    with pytest.raises(ValueError, match="starts/ends"):
        call(e=np.array([3, 3], np.int64))
    with pytest.raises(TypeError, match="out_f"):
        call(out_f=b"read-only")


def test_segments_score_like_the_joined_text(shared_data):
    # A side of a conversation = its messages joined by "\n"; the kernel assembles it from
    # the message buffer directly. Same numbers as scoring the joined strings.
    glaive = json.loads((shared_data / "sharegpt_glaive_toolcall" / "glaive_toolcall_en_demo.json").read_text())
    convs = [[t["value"] for t in r["conversations"]] for r in glaive[:120]]
    convs += [[], ["only one"], ["", "after an empty one"], ["a\na", "a"]]
    rng = np.random.default_rng(5)
    flat = [m for c in convs for m in c]
    # Pick a random subset of each conversation's messages (like a role filter).
    picked = [sorted(rng.choice(len(c), size=int(rng.integers(0, len(c) + 1)), replace=False).tolist()) if c else []
              for c in convs]
    base = np.concatenate([[0], np.cumsum([len(c) for c in convs])]).astype(np.int64)
    segments = np.array([base[i] + j for i, js in enumerate(picked) for j in js], dtype=np.int64)
    groups = np.concatenate([[0], np.cumsum([len(js) for js in picked])]).astype(np.int64)
    joined = ["\n".join(convs[i][j] for j in js) for i, js in enumerate(picked)]
    content = pa.array(flat, pa.string()).slice(0)  # int32 offsets, as in the canonical schema
    want = rk.score_strings(joined, SPEC, use_kernel=False)
    for use_kernel in (True, False):
        got = rk.score_segments(content, segments, groups, SPEC, use_kernel=use_kernel)
        for name in want:
            np.testing.assert_array_equal(got[name], want[name], err_msg=f"{name} kernel={use_kernel}")
    assert (want["url_count"] > 0).any() or (want["dup_line_frac"] > 0).any()


def test_env_switch_selects_the_reference(monkeypatch):
    monkeypatch.setenv("DATAGUARD_NO_KERNEL", "1")
    assert not rk.kernel_enabled()
    monkeypatch.setenv("DATAGUARD_NO_KERNEL", "0")
    assert rk.kernel_enabled()
