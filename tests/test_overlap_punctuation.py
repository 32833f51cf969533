"""Punctuation cannot hide a copy: intra-word punctuation deleted, changed or spaced out in a
GSM8K test item still matches it; short items get a coverage bar scaled to their length."""

from __future__ import annotations

import json
import pickle
import random
import re

import numpy as np
import pytest

from dataguard.records import canonical_table
from dataguard.references import parse_spec
from dataguard.stages.overlap import OverlapStage
from dataguard.testing.plant import edit_case_and_spacing, edit_punctuation
from dataguard.text.normalize_text import NormalizeConfig, normalize_batch, normalize_with_offsets

ISSUE_EDITS = {  # the edits of issue #14, on the items that hold them
    "gsm8k_test/418#question": ("Zack's", "Zacks"),
    "gsm8k_test/239#question": ("3/5", "35"),
    "gsm8k_test/257#question": ("10-foot", "10foot"),
}


@pytest.fixture(scope="module")
def gsm8k(real_data):
    """The 100 GSM8K test items of tests/data, with their ids in the shipped reference."""
    ids = {text: item_id for item_id, text in parse_spec("gsm8k_test").load().items}
    out = []
    for line in (real_data / "gsm8k" / "test.head100.jsonl").open():
        rec = json.loads(line)
        out += [(ids[rec["question"]], rec["question"]), (ids[rec["answer"]], rec["answer"])]
    return out


@pytest.fixture(scope="module")
def alpaca(real_data):
    return json.loads((real_data / "alpaca_en_demo" / "alpaca_en_demo.json").read_text())


@pytest.fixture(scope="module", params=["token", "word"])
def stage(request):
    st = OverlapStage(references=["gsm8k_test"], mode=request.param)
    st.fit([])
    return st


def _row(rid: str, user: str, assistant: str) -> dict:
    return {"id": rid, "source": "s", "messages": [{"role": "user", "content": user},
                                                   {"role": "assistant", "content": assistant}]}


def test_intraword_normalisation_joins_and_is_opt_in():
    text = "Zack's 3/5 of the 10-foot pole, Janet’s $2.50"
    joined = NormalizeConfig(intraword=True)
    assert normalize_batch([text, "Zacks 35 of the 10foot pole Janets $250"], joined) == [
        " zacks 35 of the 10foot pole janets 250"] * 2
    assert normalize_with_offsets(text, joined)[0] == " zacks 35 of the 10foot pole janets 250"
    # the default stays what other users of the normaliser rely on
    assert normalize_batch([text], NormalizeConfig()) == [" zack s 3 5 of the 10 foot pole janet s 2 50"]
    # the stage turns it on with punctuation folding, unless told otherwise
    assert OverlapStage(references=["gsm8k_test"]).norm.intraword
    assert not OverlapStage(references=["gsm8k_test"], normalize={"intraword": False}).norm.intraword
    assert not OverlapStage(references=["gsm8k_test"], normalize={"punctuation": False}).norm.joins_words


def test_issue_edits_are_found_and_were_missed_before(alpaca):
    """Every intra-word mark of the item deleted (Zack's -> Zacks, 3/5 -> 35, 10-foot -> 10foot)."""
    items = dict(parse_spec("gsm8k_test").load().items)
    rows = []
    for i, (k, (a, b)) in enumerate(ISSUE_EDITS.items()):
        copy = re.sub(r"(?<=\w)[^\w\s]+(?=\w)", "", items[k])
        assert b in copy and a not in copy
        rows.append(_row(k, copy, alpaca[i]["output"]))
    table = canonical_table(rows)
    for mode in ("token", "word"):
        new = OverlapStage(references=["gsm8k_test"], mode=mode)
        new.fit([])
        got = new.apply(table).kept.to_pylist()
        assert [(r["contaminated"], r["overlap_ref_item"], r["overlap_ref_coverage"]) for r in got] == [
            (True, k, 1.0) for k in ISSUE_EDITS]
    # with punctuation turned into spaces (the old rule) the Zack's item shares no 13-word run
    old = OverlapStage(references=["gsm8k_test"], mode="word", normalize={"intraword": False})
    old.fit([])
    first = old.apply(table).kept.to_pylist()[0]
    assert (first["contaminated"], first["overlap_ngrams"]) == (False, 0)


@pytest.mark.parametrize("spaced", [False, True])
def test_every_punctuation_edited_copy_of_100_gsm8k_items_is_found(stage, gsm8k, alpaca, spaced):
    rng = random.Random(5)
    rows = []
    for k, (item_id, text) in enumerate(gsm8k):
        copy = edit_case_and_spacing(edit_punctuation(text, rng, spaced=spaced), rng)
        a = alpaca[k]
        rows.append(_row(item_id, copy, a["output"]) if item_id.endswith("#question")
                    else _row(item_id, a["instruction"], copy))
    out = stage.apply(canonical_table(rows)).kept
    assert out.column("contaminated").to_pylist() == [True] * len(rows)
    assert out.column("overlap_ref_item").to_pylist() == [i for i, _ in gsm8k]
    assert min(out.column("overlap_ref_coverage").to_pylist()) > 0.9


def test_short_items_need_less_coverage(alpaca):
    """A 14-word window is 0.27-0.29 of a 48-52 word item (found: the bar is scaled down to
    0.3 x L / 65) but under 0.18 of an 80+ word item (not found: the bar stays 0.3)."""
    stage = OverlapStage(references=["gsm8k_test"], mode="word", action="drop")
    stage.fit([])
    ref = stage.fitted()
    items = dict(parse_spec("gsm8k_test").load().items)
    lens = {name: int(ref.item_len[i]) for i, name in enumerate(ref.item_names)}
    short = next(k for k in items if k.endswith("#question") and 48 <= lens[k] <= 52)
    long_ = next(k for k in items if k.endswith("#question") and lens[k] >= 80)
    rows = []
    for k, name in enumerate((short, long_)):
        window = " ".join(normalize_batch([items[name]], stage.norm)[0].split()[10:24])
        rows.append(_row(name, alpaca[k]["instruction"], alpaca[k]["output"] + "\n\n" + window))
    out = stage.apply(canonical_table(rows))
    assert out.rejected.column("id").to_pylist() == [short]
    detail = out.rejected.column("detail")[0].as_py()
    assert "scaled to the item length" in detail and short in detail
    kept = out.kept.to_pylist()[0]
    assert kept["id"] == long_ and kept["overlap_ngrams"] > 0 and kept["overlap_ref_coverage"] < 0.2
    assert np.isclose(kept["overlap_ref_coverage"], 14 / lens[long_])


@pytest.mark.parametrize("spaced", [False, True])
def test_mask_cuts_an_edited_copy_out_of_a_longer_answer(gsm8k, alpaca, spaced):
    """Spans of a copy found through the joined or the split form map back onto the
    user's text: masking removes it and a rescan finds nothing left."""
    stage = OverlapStage(references=["gsm8k_test"], mode="token", action="mask")
    stage.fit([])
    rng = random.Random(9)
    rows = []
    for k, (item_id, text) in enumerate(gsm8k[:20]):
        copy = edit_punctuation(text, rng, spaced=spaced)
        rows.append(_row(item_id, alpaca[k]["instruction"], alpaca[k]["output"] + "\n\nExample:\n" + copy))
    out = pickle.loads(pickle.dumps(stage)).apply(canonical_table(rows))
    assert out.rejected.num_rows == 0
    kept = out.kept.to_pylist()
    assert all(r["overlap_masked"] and r["contaminated"] for r in kept)
    for row, k in zip(rows, kept, strict=True):
        answer = k["messages"][1]["content"]
        assert answer.startswith(row["messages"][1]["content"][:30]) and "Example:" in answer[-20:]
    again = stage.apply(out.kept.select(["id", "source", "messages", "label", "meta"])).kept
    assert not any(again.column("contaminated").to_pylist())
