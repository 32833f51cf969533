"""Normalisation and n-gram hashing: the building blocks of the overlap scan."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from dataguard.text.ngrams import (
    _TOKEN_BASE,
    NgramIndex,
    concat_ids,
    expand_postings,
    mix_ids,
    ngram_hashes,
    segment_hashes,
    splitmix64,
    word_symbols,
)
from dataguard.text.normalize_text import (
    NormalizeConfig,
    normalize_batch,
    normalize_joined,
    normalize_with_offsets,
)

MASK = (1 << 64) - 1


def _naive_ngram(symbols: list[int], n: int) -> int:
    """Reference implementation with Python ints: sum x_k B**k, then splitmix64(h ^ n)."""
    h = 0
    for k, x in enumerate(symbols):
        h = (h + x * pow(_TOKEN_BASE, k, 1 << 64)) & MASK
    return int(splitmix64(np.array([h ^ n], dtype=np.uint64))[0])


def _alpaca_texts(real_data, k: int = 300) -> list[str]:
    rows = json.loads((real_data / "alpaca_en_demo" / "alpaca_en_demo.json").read_text())
    return [r["instruction"] + "\n" + r["input"] + "\n" + r["output"] for r in rows[:k]]


# -- normalisation -------------------------------------------------------------------------
def test_normalisation_folds_case_punctuation_whitespace_and_compat_forms():
    cfg = NormalizeConfig()
    out = normalize_batch(["Janet’s  ducks,\tlay 16 EGGS!!", "ＡＢＣ ﬁne — ok…", "", "?!"], cfg)
    assert out == [" janet s ducks lay 16 eggs", " abc fine ok", "", ""]
    # the same content edited in case, punctuation and spacing normalises identically
    a, b = normalize_batch(["How much does she make, in dollars?", "HOW much  does she make in DOLLARS"], cfg)
    assert a == b


def test_digits_kept_by_default_and_foldable():
    assert normalize_batch(["She has 16 eggs"], NormalizeConfig()) == [" she has 16 eggs"]
    assert normalize_batch(["She has 16 eggs"], NormalizeConfig(digits=False)) == [" she has eggs"]


def test_no_normalisation_is_identity():
    cfg = NormalizeConfig.from_param(False)
    assert cfg.identity
    texts = ["A  b,\nC", "x"]
    assert normalize_batch(texts, cfg) == texts


def test_normalize_config_rejects_unknown_options():
    with pytest.raises(ValueError, match="unknown normalize option"):
        NormalizeConfig.from_param({"lower": True})
    with pytest.raises(ValueError, match="true/false"):
        NormalizeConfig.from_param({"lowercase": "yes"})


def test_batch_and_offset_paths_agree_on_real_text(real_data):
    cfg = NormalizeConfig()
    texts = _alpaca_texts(real_data)
    gsm = [json.loads(line)["question"] for line in (real_data / "gsm8k" / "test.head100.jsonl").open()][:100]
    texts += gsm + ["ﬁnal   café\u00a0(ok)", "e\u0301t\u00e9"]
    batch = normalize_batch(texts, cfg)
    for text, expected in zip(texts, batch, strict=True):
        norm, src = normalize_with_offsets(text, cfg)
        if text == "e\u0301t\u00e9":  # a combining sequence: documented per-character difference
            continue
        assert norm == expected
        assert len(src) == len(norm)
        # every normalised letter comes from the same letter (or its compatibility form)
        for k in range(len(norm)):
            if norm[k].isascii() and norm[k].isalpha() and text[src[k]].isascii():
                assert text[src[k]].lower() == norm[k]


def test_joined_buffer_with_nul_in_text():
    buf = normalize_joined(["a\x00b", "c"], NormalizeConfig())
    assert buf.tobytes() == b"\x00 a b\x00 c"


# -- hashing -------------------------------------------------------------------------------
def test_rolling_hash_matches_naive_polynomial():
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 150_000, size=60)
    sym = mix_ids(ids)
    for n in (8, 13, 50):
        ng = ngram_hashes(sym, np.array([0, 60]), n)
        assert len(ng.hashes) == 60 - n + 1
        for i in (0, 7, 60 - n):
            assert int(ng.hashes[i]) == _naive_ngram([int(x) for x in sym[i:i + n]], n)


def test_ngrams_never_cross_documents_and_short_docs_have_none():
    ids, starts = concat_ids([np.arange(20), np.arange(5), np.arange(13), np.zeros(0, int)])
    ng = ngram_hashes(mix_ids(ids), starts, 13)
    assert np.bincount(ng.doc, minlength=4).tolist() == [8, 0, 1, 0]
    # the same 13 ids hash the same wherever they are
    assert ng.hashes[0] == ng.hashes[8]
    assert len(set(ng.hashes[:8].tolist())) == 8


def test_hashes_are_process_independent():
    code = ("import numpy as np; from dataguard.text.ngrams import *; "
            "print(int(ngram_hashes(mix_ids(np.arange(30)), np.array([0, 30]), 13).hashes.sum(dtype=np.uint64)))")
    outs = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           env={"PYTHONHASHSEED": seed, "PATH": ""}).stdout for seed in ("1", "2")}
    assert len(outs) == 1
    here = int(ngram_hashes(mix_ids(np.arange(30)), np.array([0, 30]), 13).hashes.sum(dtype=np.uint64))
    assert outs == {f"{here}\n"}


def test_segment_hashes_are_order_sensitive():
    sym = mix_ids(np.array([1, 2, 3, 3, 2, 1, 1, 2, 3]))
    h = segment_hashes(sym, np.array([0, 3, 6]), np.array([3, 6, 9]))
    assert h[0] == h[2] and h[0] != h[1]


def test_index_lookup_and_postings_agree_with_python_sets():
    rng = np.random.default_rng(1)
    keys = rng.integers(0, 2**63, size=5000, dtype=np.uint64)
    keys[100:110] = keys[0]  # one n-gram in 11 items
    items = np.arange(5000, dtype=np.int32)
    pos = rng.integers(0, 100, 5000).astype(np.int32)
    index = NgramIndex.build(keys, items, pos)
    queries = np.concatenate([keys[:50], rng.integers(0, 2**63, size=1000, dtype=np.uint64)])
    q, lo, hi = index.lookup(queries)
    expected = [i for i, k in enumerate(queries.tolist()) if k in set(keys.tolist())]
    assert sorted(q.tolist()) == expected
    pq, entry = expand_postings(q, lo, hi, cap=64)
    hit_items = sorted(index.items[entry[pq == 0]].tolist())
    assert hit_items == [0, *range(100, 110)]
    pq, entry = expand_postings(q, lo, hi, cap=3)
    assert int((pq == 0).sum()) == 3
    # pickling drops the bitmap, lookups still agree
    import pickle

    again = pickle.loads(pickle.dumps(index))
    assert again._bitmap is None
    assert np.array_equal(again.lookup(queries)[0], q)


def test_word_symbols_hash_words_and_keep_documents():
    cfg = NormalizeConfig()
    h, starts = word_symbols(normalize_joined(["the cat sat", "", "The  dog,\tthe"], cfg, collapse=False))
    assert starts.tolist() == [0, 3, 3, 6]
    assert h[0] == h[3] == h[5] and len(set(h.tolist())) == 4
    # no collapse needed: runs of whitespace and punctuation split words the same way
    h2, _ = word_symbols(normalize_joined(["the cat sat", "", "The  dog,\tthe"], cfg, collapse=True))
    assert np.array_equal(h, h2)
    # process-independent values: a word's hash depends on its bytes only
    h3, _ = word_symbols(normalize_joined(["dog"], cfg))
    assert h3[0] == h[4]
