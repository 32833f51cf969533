"""Repetition / URL scores: published definitions, one reason code per rule, real data."""

from __future__ import annotations

import functools
import json
import pickle
import re
import unicodedata
from collections import Counter

import numpy as np
import pyarrow as pa
import pytest
from reference_quality_scores import REFERENCE, urls_in

from dataguard.records import canonical_table
from dataguard.stage import StageConfigError
from dataguard.stages.quality import QualityStage
from dataguard.text.repetition_kernel import URL_RE, TextScorer


def scores(texts: list[str], scorer: TextScorer | None = None, **params) -> dict[str, np.ndarray]:
    return QualityStage(**params).side_scores(texts, scorer=scorer)


# The compiled kernel (what the pipeline runs) and the tests' NumPy reference.
IMPLEMENTATIONS = [pytest.param(None, id="kernel"), pytest.param(REFERENCE, id="numpy")]


# --- hand-computed examples ---------------------------------------------------------------
@pytest.mark.parametrize("scorer", IMPLEMENTATIONS)
def test_char_repeat_ratio_by_hand(scorer):
    texts = ["aaab", "a  b", "", "xyz"]
    assert scores(texts, scorer)["char_repeat_ratio"].tolist() == [0.5, 0.0, 0.0, 0.0]
    assert scores(texts, scorer, ignore_whitespace_repeats=False)["char_repeat_ratio"].tolist() == [
        0.5, 0.25, 0.0, 0.0]


@pytest.mark.parametrize("scorer", IMPLEMENTATIONS)
def test_data_juicer_char_rep_ratio_by_hand(scorer):
    # 3-grams of "abcabcabcabc": abc x4, bca x3, cab x3 -> 3 distinct, isqrt(3)=1 top group:
    # 4 / 10 n-grams = 0.4.  "abcdefg": no repeats -> 0.  Shorter than rep_len -> 0.
    got = scores(["abcabcabcabc", "abcdefg", "ab"], scorer, char_rep_len=3)["char_rep_ratio"]
    assert got.tolist() == pytest.approx([0.4, 0.0, 0.0])
    # 10-grams of "ab" * 10 (20 chars): 11 windows, 2 distinct (x6, x5); isqrt(2)=1 -> 6/11.
    assert scores(["ab" * 10], scorer)["char_rep_ratio"][0] == pytest.approx(6 / 11)


@pytest.mark.parametrize("scorer", IMPLEMENTATIONS)
def test_data_juicer_word_rep_ratio_by_hand(scorer):
    # words: the cat the cat a dog (lower-cased, punctuation stripped); bigrams: "the cat" x2,
    # "cat the", "cat a", "a dog" -> 2 of 5 bigrams are repeated = 0.4.
    got = scores(["The cat. the CAT! a dog", "one two three"], scorer, word_rep_len=2)["word_rep_ratio"]
    assert got.tolist() == pytest.approx([0.4, 0.0])


@pytest.mark.parametrize("scorer", IMPLEMENTATIONS)
def test_gopher_scores_by_hand(scorer):
    s = scores(["a\nb\na\n\na", "x y x y z", "a b c d e a b c d e"], scorer)
    # lines [a, b, a, a]: 2 duplicates of 4; 2 duplicate chars of 8.
    assert s["dup_line_frac"][0] == pytest.approx(0.5)
    assert s["dup_line_char_frac"][0] == pytest.approx(2 / 8)
    # top 2-gram "x y" twice: 3 chars * 2 / 9 chars.
    assert s["top2_gram_char_frac"][1] == pytest.approx(6 / 9)
    assert s["top3_gram_char_frac"][1] == 0.0  # no 3-gram repeats
    # duplicate 5-gram "a b c d e" (second occurrence: 5 word chars) / 19 chars.
    assert s["dup5_gram_char_frac"][2] == pytest.approx(5 / 19)
    assert s["dup6_gram_char_frac"][2] == 0.0
    assert s["gopher_words"].tolist() == [4, 5, 10]


@pytest.mark.parametrize("scorer", IMPLEMENTATIONS)
def test_special_char_ratio_by_hand(scorer):
    # "a1, b!" -> '1' ',' ' ' '!' are special (digit, punctuation, space): 4 of 6.
    got = scores(["a1, b!", "", "abc"], scorer)["special_char_ratio"]
    assert got.tolist() == pytest.approx([4 / 6, 0, 0])


@pytest.mark.parametrize("scorer", IMPLEMENTATIONS)
def test_urls_by_hand(scorer):
    text = "see https://a.com/x and www.b.org, also http://c.io."
    s = scores([text, "no links here"], scorer)
    assert s["url_count"].tolist() == [3, 0]
    # https://a.com/x (15) + www.b.org (9) + http://c.io (11), trailing punctuation excluded.
    assert s["url_char_ratio"][0] == pytest.approx(35 / len(text))


# --- the published definitions, written out plainly, against the vectorised code ----------
def ref_char_rep(t: str, n: int = 10) -> float:
    """data-juicer character_repetition_filter.compute_stats."""
    grams = [t[i:i + n] for i in range(len(t) - n + 1)]
    if not grams:
        return 0.0
    freq = sorted(Counter(grams).values(), reverse=True)
    k = min(int(np.sqrt(len(freq))), len(freq) - sum(1 for f in freq if f == 1))
    return sum(freq[:k]) / sum(freq)


def _special(c: str) -> bool:
    cat = unicodedata.category(c)
    return c.isspace() or cat[0] in "PSNZ" or cat == "Cc"


def ref_word_rep(t: str, n: int = 10) -> float:
    """data-juicer word_repetition_filter (split on space/newline/tab, lower, strip specials)."""
    words = []
    for w in re.split(" |\n|\t", t):
        w = "".join(ch.lower() if len(ch.lower()) == 1 else ch for ch in w)
        a, b = 0, len(w)
        while a < b and _special(w[a]):
            a += 1
        while b > a and _special(w[b - 1]):
            b -= 1
        if w[a:b]:
            words.append(w[a:b])
    grams = [" ".join(words[i:i + n]) for i in range(len(words) - n + 1)]
    if not grams:
        return 0.0
    return sum(v for v in Counter(grams).values() if v > 1) / len(grams)


def ref_lines(t: str) -> tuple[float, float]:
    """Gopher duplicate lines as datatrove computes them (lines split on runs of newlines)."""
    lines = [x for x in re.split("\n+", t) if x]
    seen: set[str] = set()
    dup = dup_chars = 0
    for x in lines:
        if x in seen:
            dup, dup_chars = dup + 1, dup_chars + len(x)
        seen.add(x)
    return (dup / len(lines) if lines else 0.0), (dup_chars / len(t) if t else 0.0)


def ref_words(t: str) -> list[str]:
    return [m.group(0) for m in re.finditer(r"[^\W]+|[^\w\s]", t) if m.group(0).strip()]


def ref_top(t: str, n: int) -> float:
    w = ref_words(t)
    grams = [" ".join(w[i:i + n]) for i in range(len(w) - n + 1)]
    if not grams:
        return 0.0
    gram, count = Counter(grams).most_common(1)[0]
    return 0.0 if count < 2 else len(gram) * count / len(t)


def ref_dup(t: str, n: int) -> float:
    w = ref_words(t)
    seen: set[tuple[str, ...]] = set()
    covered = [False] * len(w)
    for i in range(len(w) - n + 1):
        g = tuple(w[i:i + n])
        if g in seen:
            covered[i:i + n] = [True] * n
        seen.add(g)
    return sum(len(x) for x, c in zip(w, covered, strict=True) if c) / len(t) if t else 0.0


@pytest.mark.parametrize("scorer", IMPLEMENTATIONS)
def test_scores_equal_plain_python_definitions_on_real_text(real_data, scorer):
    data = json.loads((real_data / "alpaca_en_demo" / "alpaca_en_demo.json").read_text())[:400]
    texts = [r["output"] for r in data] + [r["instruction"] for r in data[:100]]
    texts += ["", "x", "Ünïcödé ÜNÏCÖDÉ ünïcödé " * 5, "la la la la la la la la la la la la", "😀" * 30]
    s = scores(texts, scorer)
    np.testing.assert_allclose(s["char_rep_ratio"], [ref_char_rep(t) for t in texts], atol=1e-6)
    np.testing.assert_allclose(s["word_rep_ratio"], [ref_word_rep(t) for t in texts], atol=1e-6)
    np.testing.assert_allclose(s["dup_line_frac"], [ref_lines(t)[0] for t in texts], atol=1e-6)
    np.testing.assert_allclose(s["dup_line_char_frac"], [ref_lines(t)[1] for t in texts], atol=1e-6)
    for n in (2, 3, 4):
        np.testing.assert_allclose(s[f"top{n}_gram_char_frac"], [ref_top(t, n) for t in texts], atol=1e-6)
    for n in (5, 8, 10):
        np.testing.assert_allclose(s[f"dup{n}_gram_char_frac"], [ref_dup(t, n) for t in texts], atol=1e-6)
    assert (s["char_rep_ratio"] > 0).sum() > 50  # the comparison is not vacuous


@pytest.mark.parametrize("scorer", IMPLEMENTATIONS)
def test_chunked_grouping_matches_single_text_results(scorer):
    # Many texts force several sort chunks; each text's score must not depend on its neighbours.
    rng = np.random.default_rng(1)
    vocab = ["alpha", "beta", "gamma", "delta", "eps"]
    texts = [" ".join(rng.choice(vocab, size=int(rng.integers(0, 120)))) for _ in range(3000)]
    together = scores(texts, scorer)
    for i in (0, 1, 777, 2999):
        alone = scores([texts[i]], scorer)
        for key in ("char_rep_ratio", "word_rep_ratio", "top2_gram_char_frac", "dup7_gram_char_frac"):
            assert together[key][i] == pytest.approx(alone[key][0])


# --- stage: one reason code per rule ----------------------------------------------------------
LONG_OK = ("The committee reviewed the annual budget and approved new funding for public libraries, "
           "school repairs, and a small grant program that helps local artists share their work with "
           "neighbours. Members also asked the city to publish a clear timeline so residents can follow "
           "each project from planning to completion, and they agreed to meet again next spring.")


def row(rid: str, prompt: str, response: str) -> dict:
    return {"id": rid, "source": "t", "messages": [{"role": "user", "content": prompt},
                                                    {"role": "assistant", "content": response}]}


CRAFTED = {
    "char_repeat": row("cr", "Say it", "Nooooooooooooooooo!!!!!!!!!! way"),
    "too_many_urls": row("tu", "Sources?", "See https://a.org/1 and https://b.org/2 plus http://c.org/3 for more."),
    "url_ratio": row("ur", "Link please", "https://example.com/a/very/long/path/to/some/document.html"),
    "char_ngram_repetition": row("cn", "Laugh", "ha" * 60),
    "word_ngram_repetition": row("wn", "Count", "; ".join(["one two three four five six seven eight nine ten eleven"] * 3)),
    "duplicate_lines": row("dl", "List", "\n".join(["Item: apples"] * 4 + [f"Unique line number {i} with text here and more" for i in range(2)]) + "\n" + LONG_OK),
    "gopher_top_ngram": row("gt", "Describe", LONG_OK + " " + " ".join(["of the"] * 20)),
    "gopher_dup_ngram": row("gd", "Story", LONG_OK + " Members also asked the city to publish a clear timeline so residents"),
}


def test_each_rule_has_its_own_reason_code():
    stage = QualityStage()
    rows = list(CRAFTED.values()) + [row("ok", "Summarize the meeting.", LONG_OK)]
    scored = stage.score(canonical_table(rows))
    out = stage.apply(scored)
    got = {r["id"]: r["reason"] for r in out.rejected.to_pylist()}
    want = {r["id"]: reason for reason, r in CRAFTED.items()}
    assert got == want
    assert out.kept.column("id").to_pylist() == ["ok"]
    details = {r["id"]: r["detail"] for r in out.rejected.to_pylist()}
    assert "response char_repeat_ratio=" in details["cr"] and ">= 0.3" in details["cr"]
    assert "response url_count=3 >= 3" in details["tu"]
    assert "response dup_line_frac=" in details["dl"]


def test_special_characters_rule_is_opt_in():
    r = row("sc", "Math", "1 + 2 = 3; 4 * 5 = 20; (6 / 2) = 3 !!")
    assert QualityStage().apply(canonical_table([r])).kept.num_rows == 1
    out = QualityStage(special_char_max=0.25).apply(canonical_table([r]))
    assert out.rejected.column("reason").to_pylist() == ["special_characters"]


def test_prompt_side_scored_separately():
    r = row("p", "Hiiiiiiiiiiiiiiiiiiiiiiiiii there", "A normal answer.")
    out = QualityStage().apply(canonical_table([r]))
    (rej,) = out.rejected.to_pylist()
    assert rej["reason"] == "char_repeat" and rej["detail"].startswith("prompt ")
    kept = QualityStage(sides=["response"]).apply(canonical_table([r]))
    assert kept.kept.num_rows == 1 and "prompt_char_repeat_ratio" not in kept.kept.column_names


def test_gopher_rules_skip_short_texts():
    short = row("s", "x", "of the of the of the")  # top 2-gram covers the whole text, but 8 words
    assert QualityStage(word_rep_max=None).apply(canonical_table([short])).kept.num_rows == 1
    out = QualityStage(word_rep_max=None, gopher_min_words=0).apply(canonical_table([short]))
    assert out.rejected.to_pylist()[0]["reason"] == "gopher_top_ngram"


def test_real_data_nothing_lost_and_report(real_data):
    data = json.loads((real_data / "alpaca_en_demo" / "alpaca_en_demo.json").read_text())
    rows = [row(f"a{i}", r["instruction"] + ("\n" + r["input"] if r["input"] else ""), r["output"])
            for i, r in enumerate(data)]
    stage = pickle.loads(pickle.dumps(QualityStage()))
    outs = [stage.apply(stage.score(canonical_table(rows[i:i + 300]))) for i in range(0, len(rows), 300)]
    stage.absorb([o.stats for o in outs])
    kept = [i for o in outs for i in o.kept.column("id").to_pylist()]
    rej = [i for o in outs for i in o.rejected.column("id").to_pylist()]
    assert sorted(kept + rej) == sorted(r["id"] for r in rows) and not set(kept) & set(rej)
    assert 0 < len(rej) < 0.1 * len(rows)  # clean instruction data: few rejections, but some
    schemas = {o.kept.schema for o in outs}
    assert len(schemas) == 1
    d = stage.describe()
    json.dumps(d)
    assert d["summary"]["rows_rejected"] == len(rej)
    assert sum(b["series"]["response"][0] + sum(b["series"]["response"][1:])
               for b in d["blocks"] if b["type"] == "histogram" and b["title"] == "char rep ratio") == len(rows)
    # Deterministic: same input, same bytes.
    again = QualityStage().apply(QualityStage().score(canonical_table(rows[:300])))
    assert again.kept.equals(outs[0].kept) and again.rejected.equals(outs[0].rejected)


def test_empty_batch_has_declared_columns():
    stage = QualityStage()
    out = stage.apply(stage.score(canonical_table([])))
    for name, typ in stage.output_columns().items():
        assert out.kept.schema.field(name).type == typ
    assert isinstance(out.kept, pa.Table) and out.kept.num_rows == 0


@pytest.mark.parametrize("kwargs, bad", [
    ({"sides": ["answer"]}, "sides"), ({"char_repeat_threshold": 2}, "char_repeat_threshold"),
    ({"url_count_threshold": 0}, "url_count_threshold"), ({"top_ngram_max": {1: 0.2}}, "top_ngram_max"),
    ({"dup_ngram_max": {"x": 0.1}}, "dup_ngram_max"), ({"char_rep_len": 0}, "char_rep_len"),
    ({"gopher_min_words": -1}, "gopher_min_words"),
    # 2**32 + 3 used to reach the kernel's unsigned-int format and score as 3.
    ({"char_rep_len": 2**32 + 3}, r"char_rep_len.*positive integer <= 1000"),
    ({"word_rep_len": 1001}, r"word_rep_len.*positive integer <= 1000"),
    ({"word_rep_len": True}, "word_rep_len"), ({"gopher_min_words": True}, "gopher_min_words"),
    ({"top_ngram_max": {2.5: 0.2}}, "top_ngram_max"), ({"dup_ngram_max": {5: True}}, "dup_ngram_max"),
    ({"top_ngram_max": {2: 0.2, "2": 0.3}}, "given twice"),
    ({"max_text_bytes": 0}, r"max_text_bytes.*positive integer"),
    ({"max_text_bytes": 2**40}, "max_text_bytes"),
])
def test_config_errors_name_the_parameter(kwargs, bad):
    with pytest.raises(StageConfigError, match=bad):
        QualityStage(**kwargs)


def _urls_by_finditer(text: str) -> tuple[int, int]:
    count = chars = 0
    for m in URL_RE.finditer(text):
        url = m.group(0).rstrip(".,;:!?)]}")
        if len(url) > 4:
            count, chars = count + 1, chars + len(url)
    return count, chars


def test_url_search_equals_finditer(real_data):
    # The kernel (in C) and the reference's urls_in (the regex, tried only near "://" and
    # "www.") must find exactly what a plain finditer over the whole text finds, including
    # nested, adjacent and malformed URLs.
    rng = np.random.default_rng(11)
    parts = ["http://", "https://a.b/", "www.", "ftp://x", "://", "abcdefghijklmnopqrstu://", "x", " ", "\n",
             "see", ".", ")", "<", "git+ssh://h", "wwww.", "9ab://", "a" * 17 + "://z"]
    texts = ["".join(rng.choice(parts, size=int(rng.integers(0, 25)))) for _ in range(3000)]
    with open(real_data / "sharegpt_glaive_toolcall" / "glaive_toolcall_en_demo.json") as f:
        texts += [t["value"] for r in json.load(f) for t in r["conversations"]]
    want = [_urls_by_finditer(t) for t in texts]
    for t, w in zip(texts, want, strict=True):
        assert urls_in(t) == w, t
    assert sum(w[0] > 0 for w in want) > 500
    kernel = scores(texts)
    assert kernel["url_count"].tolist() == [w[0] for w in want]
    assert kernel["url_char_ratio"].tolist() == [np.float32(w[1] / len(t)) if t else 0.0
                                                 for t, w in zip(texts, want, strict=True)]


# --- texts too long to score --------------------------------------------------------------
def _strict_json(text: str) -> object:
    def no_constant(name: str) -> object:
        raise ValueError(f"not JSON: {name}")
    return json.loads(text, parse_constant=no_constant)


def score_stage_with(monkeypatch: pytest.MonkeyPatch, scorer: TextScorer | None) -> None:
    """Makes QualityStage.score use this implementation (None: the kernel, as the pipeline does)."""
    if scorer is not None:
        from dataguard.stages import quality

        monkeypatch.setattr(quality, "score_segments", functools.partial(quality.score_segments, scorer=scorer))


@pytest.mark.parametrize("scorer", IMPLEMENTATIONS)
def test_side_over_max_text_bytes_is_rejected_not_scored(scorer, monkeypatch):
    # Scoring needs ~100 bytes per character, so a huge side was an OOM kill; over the limit
    # it is now a clean reject and the rest of the batch is scored as if it were not there.
    score_stage_with(monkeypatch, scorer)
    big = "lorem ipsum " * 500
    rows = [row("a", "Summarize the meeting.", LONG_OK), row("big", "Say it all", big),
            row("c", "x" * 10, "Nooooooooooooooooo!!!!!!!!!! way")]
    stage = QualityStage(max_text_bytes=4000)
    scored = stage.score(canonical_table(rows))
    out = stage.apply(scored)
    assert out.kept.column("id").to_pylist() == ["a"]
    reasons = {r["id"]: (r["reason"], r["detail"]) for r in out.rejected.to_pylist()}
    assert reasons["big"] == ("text_too_long", f"response text not scored: {len(big)} bytes > max_text_bytes 4000")
    assert reasons["c"][0] == "char_repeat"
    # Not scored = null scores on that side (valid JSON in the rejected record, no NaN).
    assert scored.column("response_char_rep_ratio").null_count == 1
    assert scored.column("prompt_char_rep_ratio").null_count == 0
    for r in out.rejected.to_pylist():
        _strict_json(r["record"])
    # The other rows score exactly as in a batch without the long one.
    alone = stage.score(canonical_table([rows[0], rows[2]]))
    for name in stage.output_columns():
        assert scored.column(name).take([0, 2]).equals(alone.column(name)), name
    stage.absorb([out.stats])
    d = stage.describe()
    assert d["summary"]["rejected_text_too_long"] == 1
    assert "rejected_text_too_long" not in QualityStage().describe()["summary"]  # ordinary reports unchanged


def test_out_of_memory_while_scoring_rejects_only_that_row(monkeypatch):
    # A MemoryError for a batch is retried half by half; the one text that cannot be scored
    # alone is rejected as text_too_long, the others are scored normally.
    from dataguard.text import repetition_kernel as rk

    real = rk._kernel

    def fails_on_long_texts(arr, starts, ends, groups, spec, stats=None):
        if np.any(np.add.reduceat(ends - starts, groups[:-1])[np.diff(groups) > 0] > 1000):
            raise MemoryError
        return real(arr, starts, ends, groups, spec, stats)

    monkeypatch.setattr(rk, "_kernel", fails_on_long_texts)
    rows = [row(str(i), "Summarize the meeting.", LONG_OK) for i in range(6)]
    rows[3] = row("3", "Summarize the meeting.", LONG_OK * 4)
    out = QualityStage().apply(QualityStage().score(canonical_table(rows)))
    (rej,) = out.rejected.to_pylist()
    assert rej["id"] == "3" and rej["reason"] == "text_too_long" and rej["detail"].endswith("out of memory")
    assert out.kept.num_rows == 5
