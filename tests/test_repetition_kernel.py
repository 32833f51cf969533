"""The compiled repetition kernel: exact agreement with the NumPy reference, exactness where
hashes collide, Arrow edge cases, argument checks."""

from __future__ import annotations

import gzip
import json
from collections import Counter
from pathlib import Path

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


# --- robustness of the compiled kernel (issue 10: "The compiled kernel and its fallback") -----
def _raw_call(data: bytes, starts: np.ndarray, ends: np.ndarray, groups: np.ndarray, *, spec: rk.ScoreSpec = SPEC,
              char_len: int | None = None, stats: np.ndarray | None = None, **bufs: np.ndarray) -> np.ndarray:
    """One direct _qscore.score_texts call; returns out_i (characters, words, URLs, URL chars)."""
    from dataguard.text import _qscore

    t = qs._tables()
    n = len(groups) - 1
    args = {"lower": t["lower"], "out_f": np.zeros((len(spec.names()), n), np.float32),
            "out_i": np.zeros((4, n), np.int32)}
    args.update(bufs)
    _qscore.score_texts(data, starts, ends, groups, t["cls"], t["special"].view(np.uint8), args["lower"],
                        args["out_f"], args["out_i"], spec.char_rep_len if char_len is None else char_len,
                        spec.word_rep_len, True, bytes(spec.top_ns), bytes(spec.dup_ns), stats)
    return args["out_i"]


def _misaligned(a: np.ndarray) -> np.ndarray:
    """A copy of a whose data starts one byte past an aligned address."""
    raw = np.zeros(a.nbytes + 1, np.uint8)
    view = raw[1:].view(a.dtype).reshape(a.shape)
    view[...] = a
    assert not view.flags.aligned
    return view


_RACE = """
import sys, threading
import numpy as np
from dataguard.text import _qscore, quality_scores as qs

t = qs._tables()
nseg = 20_000
data = b"x" * (nseg * 16)
starts = np.arange(nseg, dtype=np.int64) * 16
small, large = starts + 1, starts + 16
ends = small.copy()
groups = np.array([0, nseg], np.int64)
out_f = np.zeros((15, 1), np.float32)
out_i = np.zeros((4, 1), np.int32)
stop = False

def flip():  # runs whenever the kernel has released the GIL
    while not stop:
        ends[:] = large
        ends[:] = small

th = threading.Thread(target=flip)
th.start()
seen = set()
try:
    for _ in range(60):
        _qscore.score_texts(data, starts, ends, groups, t["cls"], t["special"].view(np.uint8), t["lower"], out_f,
                            out_i, 10, 10, True, bytes([2, 3, 4]), bytes([5, 6, 7, 8, 9, 10]))
        seen.add(int(out_i[0, 0]))
finally:
    stop = True
    th.join()
print(min(seen), max(seen))
"""


def test_kernel_snapshots_offsets_before_releasing_the_gil():
    # Another thread rewrites `ends` (between two valid states) while the kernel runs without
    # the GIL. Reading them again after the check used to size the scratch for one state and
    # decode the other: a heap overflow (this script segfaulted in 2 of 2 runs). Run in a
    # subprocess so a crash is a failed assertion, not a dead test runner.
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", _RACE], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lo, hi = map(int, proc.stdout.split())
    nseg = 20_000
    # Each call scored one consistent snapshot: between all-short and all-long segments.
    assert 2 * nseg - 1 <= lo <= hi <= 17 * nseg - 1


def test_misaligned_buffers_are_copied_or_refused():
    starts, ends, groups = np.array([0], np.int64), np.array([7], np.int64), np.array([0, 1], np.int64)
    # Offsets are copied with memcpy: any alignment works and gives the same numbers.
    out = _raw_call(b"abc abc", _misaligned(starts), _misaligned(ends), _misaligned(groups))
    assert out[:, 0].tolist() == [7, 2, 0, 0]
    # Tables and outputs are read / written in place: refused, with the buffer named.
    t = qs._tables()
    for name, buf in (("lower", t["lower"]), ("out_f", np.zeros((15, 1), np.float32)),
                      ("out_i", np.zeros((4, 1), np.int32))):
        with pytest.raises(ValueError, match=f"{name} must be 4-byte aligned"):
            _raw_call(b"abc abc", starts, ends, groups, **{name: _misaligned(buf)})


def test_rep_lengths_are_range_checked_not_wrapped():
    from dataguard.text import _qscore

    starts, ends, groups = np.array([0], np.int64), np.array([7], np.int64), np.array([0, 1], np.int64)
    # 2**32 + 3 used to pass the "I" format as 3.
    for bad in (2**32 + 3, 0, -1, rk.MAX_REP_LEN + 1):
        with pytest.raises(ValueError, match="char_rep_len must be between 1 and 1000"):
            _raw_call(b"abc abc", starts, ends, groups, char_len=bad)
        with pytest.raises(ValueError, match="char_rep_len"):
            rk.ScoreSpec(char_rep_len=bad)
    with pytest.raises(OverflowError):
        _raw_call(b"abc abc", starts, ends, groups, char_len=2**70)
    with pytest.raises(ValueError, match="word_rep_len"):
        rk.ScoreSpec(word_rep_len=True)
    with pytest.raises(ValueError, match="dup_ns"):
        rk.ScoreSpec(dup_ns=(5, 5))
    assert (_qscore.MAX_REP_LEN, _qscore.MAX_TEXT_BYTES) == (rk.MAX_REP_LEN, rk.MAX_TEXT_BYTES)
    _raw_call(b"abc abc", starts, ends, groups, char_len=rk.MAX_REP_LEN)  # the bound itself is fine


def test_text_over_the_kernel_limit_is_refused_before_any_allocation():
    # 2,200 segments over the same 1 MB: a 2.2 GB text. Positions are 32-bit, so the kernel
    # refuses it up front (it used to start allocating ~200 GB of scratch).
    data = b"x" * 1_000_000
    nseg = 2_200
    starts, ends = np.zeros(nseg, np.int64), np.full(nseg, len(data), np.int64)
    with pytest.raises(ValueError, match="longer than"):
        _raw_call(data, starts, ends, np.array([0, nseg], np.int64))
    # The wrapper does not call the kernel for it: the text's scores are NaN, the others scored.
    content = pa.array([data.decode(), "ok ok"], pa.large_string())
    s = rk.score_segments(content, np.array([0] * nseg + [1]), np.array([0, nseg, nseg + 1]), use_kernel=True)
    assert np.isnan(s["char_rep_ratio"][0]) and s["gopher_words"].tolist() == [0, 2]


_LOW_MEMORY = """
import resource
import numpy as np
import pyarrow as pa
from dataguard.text import quality_scores as qs, repetition_kernel as rk

qs._tables()
arr = pa.array(["ok ok ok", "word " * 8_000_000, "fine"], pa.large_string())  # 40 MB: ~4 GB of scratch
offs = rk._byte_offsets(arr)
with open("/proc/self/status") as f:
    vm = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize"))
resource.setrlimit(resource.RLIMIT_AS, (vm + (600 << 20),) * 2)
try:
    rk._kernel(arr, offs[:-1], offs[1:], np.arange(4, dtype=np.int64), rk.ScoreSpec())
    print("no error")
except MemoryError:
    print("MemoryError")
s = rk.score_strings(arr, use_kernel=True)
print(s["gopher_words"].tolist(), np.isnan(s["char_rep_ratio"]).tolist())
"""


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs /proc to size the memory cap")
def test_out_of_memory_is_a_memory_error_and_one_unscored_text():
    # Under an address-space cap the kernel's allocations fail: a MemoryError, not a crash;
    # the wrapper retries the batch in halves and leaves only the text that cannot fit unscored.
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", _LOW_MEMORY], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    assert lines == ["MemoryError", "[3, 0, 1] [False, True, False]"]


def _colliding_lines(nblocks: int, nlines: int) -> str:
    """nlines different lines of nblocks Thue-Morse blocks each: every line has the same
    polynomial hash mod 2**64 (blocks a and b collide, and so does any mix of them)."""
    tm = _thue_morse(1 << 12)
    a, b = tm[: 1 << 11], tm[1 << 11:]
    return "\n".join("".join(a if (i >> j) & 1 else b for j in range(nblocks)) for i in range(nlines))


def _kernel_counters(text: str) -> np.ndarray:
    arr = pa.array([text], pa.large_string())
    offs = rk._byte_offsets(arr)
    stats = np.zeros(3, np.int64)
    rk._kernel(arr, offs[:-1], offs[1:], np.array([0, 1], np.int64), SPEC, stats)
    return stats


def test_colliding_lines_cost_a_bounded_number_of_false_matches():
    # Distinct lines with equal hashes were each compared with every earlier line of their
    # bucket: false matches (equal hash, different text) grew with the square of the lines
    # (16.8M characters: 5.2 s). Now a text that floods the fast hash is rescored with a
    # keyed one: false matches stop at the kernel's small limit whatever the size, and all
    # comparisons (most are true repeats of 10-character windows) grow with the text.
    small, big = _kernel_counters(_colliding_lines(8, 64)), _kernel_counters(_colliding_lines(8, 256))
    assert small[1:].tolist() == [9, 1] and big[1:].tolist() == [9, 1]  # 8 tolerated, the 9th rehashes
    assert big[0] <= 4.5 * small[0]  # 4x the text: ~4x the comparisons
    # Exact all the same: no two lines are equal.
    s = rk.score_strings([_colliding_lines(8, 256)], SPEC, use_kernel=True)
    assert s["dup_line_frac"][0] == 0 and s["top2_gram_char_frac"][0] == 0
    # Ordinary text never needs the keyed hash.
    ordinary = _kernel_counters("\n".join(f"line {i % 97} of the text" for i in range(5000)))
    assert ordinary[1:].tolist() == [0, 0] and ordinary[0] > 0


def test_invalid_utf8_decodes_like_python_replace():
    # Arrow strings built without validation can hold any bytes: the kernel replaces each
    # maximal ill-formed subpart with one U+FFFD, as bytes.decode("utf-8", "replace") does,
    # so its character counts (and the reference's) are Python's.
    rng = np.random.default_rng(17)
    pieces = [b"a", b" ", b"\n", b"\xff", b"\xc0\xaf", b"\xe0\x80\x80", b"\xed\xa0\x80", b"\xf4\x90\x80\x80",
              b"\xe2\x82", b"\xac", b"\xf0\x9f\x98", b"\x80", "é".encode(), "€".encode(), "😀".encode(), b"http://x.y"]
    raw = [b"".join(rng.choice(pieces, size=int(rng.integers(0, 12)))) for _ in range(3000)]
    raw += [bytes(rng.integers(0, 256, size=int(rng.integers(0, 40)), dtype=np.uint8)) for _ in range(2000)]
    arr = pa.array(raw, pa.binary()).view(pa.string())
    chars = _raw_call(arr.buffers()[2].to_pybytes(), *(lambda o: (o[:-1], o[1:]))(rk._byte_offsets(arr)),
                      np.arange(len(raw) + 1, dtype=np.int64))[0]
    assert chars.tolist() == [len(b.decode("utf-8", "replace")) for b in raw]
    _assert_same(arr)


def test_chunked_calls_score_like_one_call(monkeypatch):
    rng = np.random.default_rng(9)
    words = ["la", "la", "tra", "http://a.b/c", "\n", "é"]
    texts = [" ".join(rng.choice(words, size=int(rng.integers(0, 200)))) for _ in range(300)]
    whole = {k: rk.score_strings(texts, SPEC, use_kernel=k) for k in (True, False)}
    monkeypatch.setattr(rk, "KERNEL_CHUNK_BYTES", 500)
    monkeypatch.setattr(rk, "REFERENCE_CHUNK_BYTES", 700)
    for k in (True, False):
        got = rk.score_strings(texts, SPEC, use_kernel=k)
        for name in whole[k]:
            np.testing.assert_array_equal(got[name], whole[k][name], err_msg=f"{name} kernel={k}")
    assert len(rk._chunks(np.full(300, 100), 700)) > 40
