"""The compiled repetition kernel: exact agreement with the NumPy reference in tests/, exactness
where hashes collide, Arrow edge cases, argument checks, its tables and its install message."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pyarrow as pa
import pytest
from reference_quality_scores import REFERENCE, assert_kernel_equals_reference, thue_morse
from reference_text_batch import tables as reference_tables

from dataguard.text import _qscore
from dataguard.text import repetition_kernel as rk

SPEC = rk.ScoreSpec()


def test_tables_built_in_c_equal_the_reference_tables():
    # The kernel builds its character tables at import from the interpreter's Unicode
    # database; the reference builds its own the same way in NumPy.
    ref = reference_tables()
    got = _qscore.tables()
    np.testing.assert_array_equal(np.frombuffer(got["cls"], np.uint8), ref["cls"])
    np.testing.assert_array_equal(np.frombuffer(got["special"], np.uint8), ref["special"].view(np.uint8))
    np.testing.assert_array_equal(np.frombuffer(got["lower"], np.uint32), ref["lower"])
    with pytest.raises(TypeError):
        got["cls"][0] = 0  # read-only


def test_unbuilt_kernel_is_a_clear_import_error():
    # A checkout that was never built (or an install without a C compiler) must say what to do.
    code = ("import sys; sys.modules['dataguard.text._qscore'] = None\n"
            "try:\n    import dataguard.text.repetition_kernel\nexcept ImportError as e:\n    print(e)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60).stdout
    assert "not built" in out and "pip install -e ." in out and "C compiler" in out and "apt install gcc" in out


def test_install_without_a_compiler_says_what_to_install(tmp_path):
    # setup.py builds the kernel; with no usable compiler it stops with one clear message.
    repo = Path(__file__).resolve().parent.parent
    (tmp_path / "dataguard" / "text").mkdir(parents=True)
    (tmp_path / "dataguard" / "io").mkdir(parents=True)
    for name in ("setup.py", "pyproject.toml", "README.md", "dataguard/text/_qscore.c", "dataguard/io/_jsonscan.c"):
        (tmp_path / name).write_bytes((repo / name).read_bytes())
    env = {**os.environ, "CC": str(tmp_path / "no-such-compiler")}
    proc = subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--inplace"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    assert "could not compile its kernels" in proc.stderr
    assert "apt install gcc python3-dev" in proc.stderr and "no-such-compiler" in proc.stderr
    assert not list((tmp_path / "dataguard").rglob("*.so"))


def test_results_are_keyed_by_name():
    spec = rk.ScoreSpec(top_ns=(3,), dup_ns=(2, 7))
    got = rk.score_strings(["a b a b", ""], spec)
    assert list(got) == spec.names() == [
        "char_repeat_ratio", "special_char_ratio", "char_rep_ratio", "word_rep_ratio", "dup_line_frac",
        "dup_line_char_frac", "top3_gram_char_frac", "dup2_gram_char_frac", "dup7_gram_char_frac",
        "gopher_words", "url_count", "url_char_ratio"]
    assert got["gopher_words"].dtype == np.int32 and got["dup2_gram_char_frac"].dtype == np.float32


def _real_texts(real_data) -> list[str]:
    texts: list[str] = []
    alpaca = json.loads((real_data / "alpaca_en_demo" / "alpaca_en_demo.json").read_text())
    texts += [r["instruction"] + "\n" + r["input"] + "\n" + r["output"] for r in alpaca]
    glaive = json.loads((real_data / "sharegpt_glaive_toolcall" / "glaive_toolcall_en_demo.json").read_text())
    texts += ["\n".join(t["value"] for t in r["conversations"]) for r in glaive]
    with gzip.open(real_data / "20news_label_errors" / "20news_test_texts.head600.jsonl.gz", "rt") as f:
        texts += [json.loads(line)["text"] for _, line in zip(range(600), f, strict=False)]
    with gzip.open(real_data / "humaneval" / "HumanEval.jsonl.gz", "rt") as f:
        texts += [(r := json.loads(line))["prompt"] + r["canonical_solution"] for line in f]
    return texts


def test_kernel_equals_reference_on_real_data(real_data):
    texts = _real_texts(real_data)
    s = assert_kernel_equals_reference(texts)
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
    assert_kernel_equals_reference(texts, spec)


def test_kernel_urls_equal_the_regex():
    # The kernel implements URL_RE's matching rules in C: random URL-dense texts (nested,
    # adjacent, over-long schemes, Unicode whitespace, trailing punctuation) against the regex.
    rng = np.random.default_rng(13)
    parts = ["http://", "https://a.b/", "www.", "ftp://x", "://", "abcdefghijklmnopqrstu://", "x", " ", "\n",
             "see", ".", ")", "<", "git+ssh://h", "wwww.", "9ab://", "a" * 15 + "://z", "a" * 16 + "://z",
             "\u00a0", "\u2003", "é://", "W://x", "`", "'", "www.x", "?!", "}"]
    texts = ["".join(rng.choice(parts, size=int(rng.integers(0, 30)))) for _ in range(5000)]
    s = assert_kernel_equals_reference(texts)
    assert (s["url_count"] > 0).sum() > 2000 and s["url_count"].max() >= 5


def test_kernel_groups_exactly_where_polynomial_hashes_collide():
    # Thue-Morse blocks defeat any polynomial hash mod 2**64 (their hashes are equal for
    # long enough blocks); the kernel compares the text on every hash match, so two
    # different lines are never counted as duplicates.
    tm = thue_morse(1 << 12)
    a, b = tm[: 1 << 11], tm[1 << 11:]
    assert a != b
    text = "\n".join([a, b, a])
    s = rk.score_strings([text], SPEC)
    lines = text.split("\n")
    dup = sum(c - 1 for c in Counter(lines).values())
    assert s["dup_line_frac"][0] == pytest.approx(dup / 3)
    assert s["dup_line_char_frac"][0] == pytest.approx(len(a) / len(text))


def test_arrow_inputs_slices_chunks_and_nulls():
    base = ["ha ha ha ha ha ha ha ha ha ha ha ha", None, "fine text here", "", "x\nx\nx"]
    arr = pa.array(base * 3, pa.string())
    sliced = arr.slice(3, 9)
    chunked = pa.chunked_array([arr.slice(0, 4), arr.slice(4)])
    expect = rk.score_strings([t or "" for t in base * 3], SPEC)
    got_sliced = assert_kernel_equals_reference(sliced)
    got_chunked = assert_kernel_equals_reference(chunked)
    for name in expect:
        np.testing.assert_array_equal(got_sliced[name], expect[name][3:12])
        np.testing.assert_array_equal(got_chunked[name], expect[name])
    empty = rk.score_strings(pa.array([], pa.string()), SPEC)
    assert all(len(v) == 0 for v in empty.values())


def test_long_single_text():
    rng = np.random.default_rng(3)
    vocab = ["data", "quality", "matters", "for", "fine", "tuning", "\n"]
    text = " ".join(rng.choice(vocab, size=60_000))
    assert_kernel_equals_reference([text, text[:1000]])


def test_bad_arguments_raise_clear_errors():
    starts, ends, groups = np.array([0], np.int64), np.array([3], np.int64), np.array([0, 1], np.int64)

    def call(data=b"abc", s=starts, e=ends, g=groups, **spec):
        return _qscore.score_texts(data, s, e, g, SimpleNamespace(**{**vars(SPEC), **spec}))

    out = call()  # the valid call
    assert out["char_repeat_ratio"] == np.zeros(1, np.float32).tobytes()
    assert [np.frombuffer(out[k], np.int32)[0] for k in ("chars", "gopher_words", "url_count")] == [3, 1, 0]
    with pytest.raises(ValueError, match="top_ns must be strictly increasing n-gram sizes in 2..20, got 1"):
        call(top_ns=(1,))
    with pytest.raises(ValueError, match="increasing"):
        call(top_ns=(3, 2))
    with pytest.raises(ValueError, match="dup_ns"):
        call(dup_ns=(5, 21))
    with pytest.raises(AttributeError, match="word_rep_len"):
        _qscore.score_texts(b"abc", starts, ends, groups, SimpleNamespace(char_rep_len=10))
    with pytest.raises(ValueError, match="segment offsets out of range"):
        call(e=np.array([9], np.int64))
    with pytest.raises(ValueError, match="groups out of range"):
        call(g=np.array([0, 2], np.int64))
    with pytest.raises(ValueError, match="starts/ends"):
        call(e=np.array([3, 3], np.int64))
    with pytest.raises(TypeError, match="stats"):
        _qscore.score_texts(b"abc", starts, ends, groups, SPEC, stats=b"read-only")
    with pytest.raises(TypeError):
        _qscore.score_texts(b"abc", starts, ends, groups, SPEC, 10)  # nothing positional past stats


def test_segments_score_like_the_joined_text(real_data):
    # A side of a conversation = its messages joined by "\n"; the kernel assembles it from
    # the message buffer directly. Same numbers as scoring the joined strings.
    glaive = json.loads((real_data / "sharegpt_glaive_toolcall" / "glaive_toolcall_en_demo.json").read_text())
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
    want = rk.score_strings(joined, SPEC, scorer=REFERENCE)
    for scorer in (None, REFERENCE):
        got = rk.score_segments(content, segments, groups, SPEC, scorer=scorer)
        for name in want:
            np.testing.assert_array_equal(got[name], want[name], err_msg=f"{name} scorer={scorer}")
    assert (want["url_count"] > 0).any() or (want["dup_line_frac"] > 0).any()
