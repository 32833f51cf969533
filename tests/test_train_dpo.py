"""Preference pairs and DPO as a third task: the real Trainer on the DPO demo's real pairs (the
tiny causal LM with LoRA): the DPO objective fits the pairs it trains on, exact resume,
convert, and the pairs it cannot use left out with a reason. The tiny LM is random, so it has
no preference of its own to carry to the demo's unseen pairs (`benchmarks/bench_dpo.py`
measures that with SmolLM2); what it can show is that a preference planted in every pair is
learned and carried to held-out pairs, which fails if either side, the sign or the
reference is wrong."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pyarrow as pa
import pytest
import torch

from dataguard.config_yaml import ConfigError
from dataguard.io.readers import InputSpec
from dataguard.pipeline import Pipeline
from dataguard.train.config import load_train_config
from dataguard.train.convert import convert_checkpoint
from dataguard.train.data import RunShards, TrainDataError
from dataguard.train.data.encode import encode_sft
from dataguard.train.data.pair_window import fit_pair, response_start
from dataguard.train.loop import Trainer
from dataguard.train.model.tiny import tiny_tokenizer
from dataguard.train.optim.losses import IGNORE_INDEX
from dataguard.train.tasks import get_task

REPO = Path(__file__).resolve().parents[1]
PAIRS = REPO / "sample_data" / "dpo_en_demo.head160.json"  # the first 160 rows of LLaMA-Factory's DPO demo


@pytest.fixture(scope="module")
def pair_shards(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("dpo") / "out"
    Pipeline([], workers=1).run([InputSpec(path=str(PAIRS))], out)
    return out


@pytest.fixture(scope="module")
def few_pair_shards(tmp_path_factory) -> Path:
    """The demo's first 40 pairs: small enough for three passes over the training pairs."""
    folder = tmp_path_factory.mktemp("dpo_few")
    (folder / "pairs.json").write_text(json.dumps(json.loads(PAIRS.read_text(encoding="utf-8"))[:40]))
    Pipeline([], workers=1).run([InputSpec(path=str(folder / "pairs.json"))], folder / "out")
    return folder / "out"


def _cfg(data: Path, out: Path, **kw):
    values = {"task": "dpo", "model": "tiny-causal-lm", "data": str(data), "output": str(out), "max_steps": 24,
              "batch_size": 4, "lr": 5e-4, "max_length": 1024, "eval_fraction": 0.2, "eval_every": 12,
              "save_every": 12, "tensorboard": False, "device": "cpu", "seed": 0, "lora": {"r": 8}}
    values.update(kw)
    return load_train_config(values)


def _metrics(run: Path, key: str) -> list[dict]:
    return [m for m in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
            if key in m and (key != "loss" or "eval_loss" not in m)]


def test_dpo_fits_its_training_pairs_resumes_exactly_and_converts(few_pair_shards, tmp_path):
    straight = Trainer(_cfg(few_pair_shards, tmp_path / "straight"), progress=False).fit()
    assert straight.steps == 24 and straight.skipped_steps == 0
    losses = [m["loss"] for m in _metrics(tmp_path / "straight", "loss")]
    record = json.loads((tmp_path / "straight" / "run.json").read_text())
    # the LoRA adapter starts at zero, so the policy IS the reference: every pair's loss is ln 2
    assert losses[0] == pytest.approx(math.log(2), abs=1e-4)
    # the third pass over the same training pairs: the objective has moved them below ln 2
    # (32 training pairs; seeds 0, 1, 2 give 0.643, 0.658, 0.651; the first pass, over unseen pairs, 0.696-0.703)
    per_pass = math.ceil(record["train_examples"] / 4)
    assert 3 * per_pass <= 24 and sum(losses[-per_pass:]) / per_pass < math.log(2) - 0.02
    evals = _metrics(tmp_path / "straight", "eval_loss")
    assert [e["step"] for e in evals] == [12, 24]
    for e in evals:  # the pair metrics are logged at every evaluation
        assert 0 <= e["eval_accuracy"] <= 1 and math.isfinite(e["eval_reward_margin"])
        assert e["eval_reward_margin"] == pytest.approx(e["eval_reward_chosen"] - e["eval_reward_rejected"], abs=1e-5)

    # stopped at 12 and resumed: the same evaluations as the straight run, bit for bit
    Trainer(_cfg(few_pair_shards, tmp_path / "resumed"), progress=False).fit(stop_after=12)
    Trainer(_cfg(few_pair_shards, tmp_path / "resumed"), progress=False).fit(resume=True)
    assert _metrics(tmp_path / "resumed", "eval_loss") == evals

    model_dir = convert_checkpoint(tmp_path / "straight", tmp_path / "merged", "newest")
    from transformers import AutoModelForCausalLM

    merged = AutoModelForCausalLM.from_pretrained(str(model_dir), local_files_only=True)
    assert not any("lora" in name for name, _ in merged.named_parameters())


BOILERPLATE = "As an AI language model, I cannot help with that. "


def test_a_planted_preference_carries_to_held_out_pairs(tmp_path):
    """The demo's prompts and chosen answers; every rejected answer is the chosen one after a
    refusal boilerplate. Trained on 3/4 of the pairs, the model must rank the held-out quarter
    right: the reward accuracy starts at 0 (policy == reference, no margin) and must end near 1."""
    rows = json.loads(PAIRS.read_text(encoding="utf-8"))[:80]
    for row in rows:
        row["rejected"] = {"from": "gpt", "value": BOILERPLATE + row["chosen"]["value"]}
    (tmp_path / "pairs.json").write_text(json.dumps(rows))
    Pipeline([], workers=1).run([InputSpec(path=str(tmp_path / "pairs.json"))], tmp_path / "out")
    run = tmp_path / "run"
    Trainer(_cfg(tmp_path / "out", run, max_length=384, eval_fraction=0.25, max_steps=24, eval_every=12,
                 save_every=24), progress=False).fit()
    record = json.loads((run / "run.json").read_text())
    assert record["val_examples"] == 20  # held out: never in a training batch
    evals = _metrics(run, "eval_loss")
    assert [e["step"] for e in evals] == [12, 24]
    final = evals[-1]
    assert final["eval_accuracy"] >= 0.9 and final["eval_reward_margin"] > 0
    assert final["eval_reward_rejected"] < 0 < final["eval_reward_margin"]  # the boilerplate made less likely
    assert final["eval_loss"] < evals[0]["eval_loss"] < math.log(2)


def test_long_pairs_keep_their_response_and_lose_the_start_of_their_prompt(pair_shards):
    """At 1024 byte tokens many demo prompts fill the window. Cutting those pairs at their end,
    as SFT cuts a row, would leave no response token and a margin of zero; each keeps its
    response instead, after the last tokens of its prompt, the same on both sides."""
    table = RunShards.open(pair_shards).table
    every = get_task("dpo").encode(table, tiny_tokenizer(), max_length=1024, label_map=None, allow_empty=False)
    assert len(every) == table.num_rows == 160 and every.dropped == {}
    whole = get_task("dpo").encode(table, tiny_tokenizer(), max_length=None, label_map=None, allow_empty=False)
    cut = 0
    for i in range(len(every)):
        c_ids, c_labels = every.chosen.input_ids[i], every.chosen.labels[i]
        r_ids, r_labels = every.rejected.input_ids[i], every.rejected.labels[i]
        start = response_start(c_labels)
        assert max(len(c_ids), len(r_ids)) <= 1024
        assert start == response_start(r_labels) and c_ids[:start] == r_ids[:start]  # one context, both sides
        assert 0 < start and start < len(c_ids) and start < len(r_ids)  # a response token on each side
        full = whole.chosen.input_ids[i]
        full_start = response_start(whole.chosen.labels[i])
        if len(full) > 1024 or len(whole.rejected.input_ids[i]) > 1024:
            cut += 1
            # the prompt's end and the response's start, exactly as rendered
            assert c_ids == full[full_start - start:full_start - start + len(c_ids)]
            assert start >= min(full_start, 512)  # a long answer never leaves under half the window of prompt
        else:
            assert c_ids == full
    assert cut > 20
    # only the final response is scored: the conversation's earlier assistant turns are shared context
    sft = encode_sft(table, tiny_tokenizer(), None)
    scored = {r: sum(x != IGNORE_INDEX for x in lab) for r, lab in zip(sft.row_ids, sft.labels, strict=True)}
    multi = [str(r["id"]) for r in table.select(["id", "messages"]).to_pylist()
             if sum(m["role"] == "assistant" for m in r["messages"]) > 1]
    assert len(multi) > 10
    for row_id in multi:
        labels = whole.chosen.labels[whole.row_ids.index(row_id)]
        n = sum(x != IGNORE_INDEX for x in labels)
        assert 0 < n < scored[row_id] and all(x != IGNORE_INDEX for x in labels[response_start(labels):])


def test_a_pair_whose_prompts_render_differently_keeps_its_start():
    ids = list(range(10))
    labels = [IGNORE_INDEX] * 6 + ids[6:]
    other = ids[:5] + [99] + ids[6:]
    assert fit_pair((ids, labels), (other, labels), 8) is None
    window = fit_pair((ids, labels), (ids + [10, 11], labels + [10, 11]), 8)
    assert window is not None and window.prompt_cut == 2 and window.chosen_ids == ids[2:]  # 4 prompt + 4 response
    assert window.rejected_ids == ids[2:] and window.rejected_labels[4:] == [6, 7, 8, 9]


def test_unusable_pairs_are_left_out_with_a_reason(tmp_path):
    rows = [
        {"conversations": [{"from": "human", "value": "Name a colour."}], "chosen": {"from": "gpt", "value": "Blue."},
         "rejected": {"from": "gpt", "value": "I will not."}},
        {"conversations": [{"from": "human", "value": "Name a fruit."}], "chosen": {"from": "gpt", "value": "A pear."},
         "rejected": {"from": "gpt", "value": "A  pear. "}},  # the same answer after whitespace
        {"conversations": [{"from": "human", "value": "Name a city."}], "chosen": {"from": "gpt", "value": "Oslo."},
         "rejected": {"from": "gpt", "value": "   "}},
        {"conversations": [{"from": "human", "value": "Name a river."}, {"from": "gpt", "value": "The Nile."}]},
    ]
    src = tmp_path / "pairs.json"
    src.write_text(json.dumps(rows))
    Pipeline([], workers=1).run([InputSpec(path=str(src))], tmp_path / "out")
    # the normaliser rejects the pairs that state no preference, with their reasons
    rejected = pa.ipc.open_stream(next((tmp_path / "out" / "rejected").glob("*.arrow"))).read_all()
    assert dict(zip(rejected.column("id").to_pylist(), rejected.column("reason").to_pylist(), strict=True)) == {
        "pairs.json:1": "identical_pair", "pairs.json:2": "empty_rejected"}
    run = RunShards.open(tmp_path / "out")
    pairs = get_task("dpo").encode(run.table, tiny_tokenizer(), max_length=256, label_map=None, allow_empty=False)
    assert len(pairs) == 1 and pairs.row_ids == ["pairs.json:0"]
    assert pairs.dropped == {"no_rejected_response": 1}
    # shards written elsewhere get the same judgement from the encoder itself
    metas = run.table.column("meta").to_pylist()
    chosen = run.table.column("messages")[0].as_py()[-1]["content"]
    edited = run.table.set_column(run.table.schema.get_field_index("meta"), "meta", pa.array(
        [json.dumps({"rejected": f" {chosen} "}), json.dumps({"rejected": ""}), *metas[2:]], pa.string()))
    none = get_task("dpo").encode(edited, tiny_tokenizer(), max_length=256, label_map=None, allow_empty=True)
    assert len(none) == 0 and none.dropped == {"identical_pair": 1, "empty_rejected": 1}
    batch = pairs.collate([0, 0], pad_id=0)
    assert batch["input_ids"].shape[0] == 4 and batch["sample_weight"].shape == (2,)  # chosen rows, then rejected
    chosen, rejected = batch["labels"][0], batch["labels"][2]
    assert not torch.equal(chosen, rejected) and (chosen != -100).any() and (rejected != -100).any()


def test_dpo_without_lora_is_one_config_line(tmp_path):
    spec = tmp_path / "t.yaml"
    spec.write_text("task: dpo\nmodel: tiny-causal-lm\ndata: d\noutput: o\n")
    with pytest.raises(ConfigError) as err:
        load_train_config(spec)
    text = str(err.value)
    assert "\n" not in text and "t.yaml" in text and "task" in text and "lora" in text


def test_shards_without_pairs_are_refused_before_training(alpaca_shards, tmp_path):
    with pytest.raises(TrainDataError, match="needs preference pairs"):
        Trainer(_cfg(alpaca_shards, tmp_path / "run"), progress=False).fit()
