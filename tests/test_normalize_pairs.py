"""Preference pairs in every shape the normalizer detects, on small real-shaped rows: the
sample's ShareGPT pairs, TRL's prompt/chosen/rejected (standard and conversational), TRL's
implicit-prompt pairs, Anthropic HH-RLHF transcripts and LLaMA-Factory's alpaca pairs; each becomes one canonical pair."""

from __future__ import annotations

import json

import pytest
from pairs_data import dpo_records
from test_normalize import run

from dataguard.records import pair_responses
from dataguard.stages.normalize import Normalizer

Q = "What is the boiling point of water at sea level?"
GOOD = "Water boils at 100 degrees Celsius (212 degrees Fahrenheit) at sea level."
BAD = "It boils at 50 degrees."
HH_PROMPT = "\n\nHuman: I want to make tea.\n\nAssistant: Green or black?\n\nHuman: " + Q
SHAPES = {
    "sharegpt": ({"conversations": [{"from": "human", "value": Q}], "chosen": {"from": "gpt", "value": GOOD},
                  "rejected": {"from": "gpt", "value": BAD}}, [("user", Q)]),
    "prompt_completion": ({"prompt": Q, "chosen": GOOD, "rejected": BAD}, [("user", Q)]),
    "trl_conversational": ({"prompt": [{"role": "user", "content": Q}],
                            "chosen": [{"role": "assistant", "content": GOOD}],
                            "rejected": [{"role": "assistant", "content": BAD}]}, [("user", Q)]),
    "trl_implicit": ({"chosen": [{"role": "user", "content": Q}, {"role": "assistant", "content": GOOD}],
                      "rejected": [{"role": "user", "content": Q}, {"role": "assistant", "content": BAD}]},
                     [("user", Q)]),
    "llamafactory_alpaca": ({"instruction": Q, "input": "", "chosen": GOOD, "rejected": BAD}, [("user", Q)]),
    "hh_rlhf": ({"chosen": HH_PROMPT + "\n\nAssistant: " + GOOD, "rejected": HH_PROMPT + "\n\nAssistant: " + BAD},
                [("user", "I want to make tea."), ("assistant", "Green or black?"), ("user", Q)]),
}
FORMAT = {"sharegpt": "sharegpt", "prompt_completion": "prompt_completion", "trl_conversational": "prompt_completion",
          "trl_implicit": "preference", "hh_rlhf": "preference", "llamafactory_alpaca": "alpaca"}


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_each_shape_becomes_one_canonical_pair(shape: str) -> None:
    record, prompt = SHAPES[shape]
    out = run([record])
    assert out.rejected.num_rows == 0
    row = out.kept.to_pylist()[0]
    assert row["format"] == FORMAT[shape]
    assert [(m["role"], m["content"]) for m in row["messages"][:-1]] == prompt
    assert pair_responses(out.kept) == [(GOOD, BAD)]
    assert json.loads(row["meta"])["rejected"] == BAD  # always plain text


@pytest.mark.parametrize(("record", "reason"), [
    ({"chosen": HH_PROMPT + "\n\nAssistant: " + GOOD, "rejected": "\n\nHuman: other\n\nAssistant: " + BAD},
     "pair_prompt_mismatch"),
    ({"chosen": HH_PROMPT + "\n\nAssistant: " + GOOD, "rejected": HH_PROMPT + "\n\nAssistant: " + GOOD},
     "identical_pair"),
    ({"chosen": HH_PROMPT + "\n\nAssistant: " + GOOD, "rejected": HH_PROMPT + "\n\nAssistant:"}, "empty_rejected"),
    ({"chosen": [{"role": "user", "content": Q}], "rejected": [{"role": "user", "content": Q}]}, "missing_assistant"),
    ({"prompt": Q, "chosen": GOOD, "rejected": [{"role": "user", "content": Q}]}, "missing_assistant"),
    ({"chosen": "plain text", "rejected": "other text"}, "unknown_format"),
    ({"chosen": [{"role": "user", "content": Q}, {"role": "assistant", "content": GOOD}], "rejected": [7]},
     "wrong_type"),
])
def test_broken_pairs_are_rejected_with_a_reason(record: dict, reason: str) -> None:
    out = run([record])
    assert out.kept.num_rows == 0
    assert out.rejected.column("reason").to_pylist() == [reason]


def test_length_balance_of_the_real_pairs() -> None:
    norm = Normalizer()
    out = run(dpo_records(), normalizer=norm)
    norm.absorb([out.stats])
    summary = norm.describe()["pairs"]["summary"]
    chosen_longer = sum(len(c) > len(r) for c, r in pair_responses(out.kept))
    assert summary["pairs"] == 160 and summary["chosen_longer"] == chosen_longer == 67
    assert summary["median_length_ratio"] == 0.822


def test_a_run_without_pairs_describes_no_balance() -> None:
    norm = Normalizer()
    out = run([{"instruction": Q, "output": GOOD}], normalizer=norm)
    norm.absorb([out.stats])
    assert "pairs" not in norm.describe()


def test_an_alpaca_rejected_response_that_is_not_text_is_a_wrong_type() -> None:
    """A rejected response beside an alpaca answer is a pair's, and is checked like one
    (it once rode along in meta unchecked when it was not a string)."""
    out = run([{"instruction": Q, "input": "", "output": GOOD, "rejected": 12}])
    assert out.kept.num_rows == 0 and out.rejected.column("reason").to_pylist() == ["wrong_type"]


@pytest.mark.parametrize(("record", "named"), [
    ({"prompt": Q, "chosen": None, "rejected": BAD}, "'chosen'"),
    ({"prompt": Q}, "'completion' (or 'chosen')"),
])
def test_a_pair_without_its_chosen_response_names_that_field(record: dict, named: str) -> None:
    out = run([record])
    assert out.rejected.column("reason").to_pylist() == ["missing_assistant"]
    assert named in out.rejected.column("detail")[0].as_py()
