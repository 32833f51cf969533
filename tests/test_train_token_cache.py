"""The token cache gives the same examples as encoding in memory, is built once and mapped by
every later start (resume included), and is keyed by what the ids depend on."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import torch

import dataguard.train.data.token_cache as token_cache
from dataguard.io.readers import InputSpec
from dataguard.pipeline import Pipeline
from dataguard.train.config import load_train_config
from dataguard.train.data import RunShards, run_split
from dataguard.train.data.encode import encode_sft
from dataguard.train.data.encoded import Encoded
from dataguard.train.data.labels import LabelMap
from dataguard.train.loop import Trainer
from dataguard.train.model.build import load_model
from dataguard.train.prepare import encode_split

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def sft_data(alpaca_shards) -> Path:
    return alpaca_shards


def _cfg(data: Path, out: Path, **kw):
    values = {"task": "sft", "model": "tiny-causal-lm", "data": str(data), "output": str(out), "max_steps": 4,
              "batch_size": 2, "lr": 3e-3, "max_length": 80, "eval_every": 2, "save_every": 2,
              "tensorboard": False, "device": "cpu"}
    values.update(kw)
    return load_train_config(values)


def _same(a, b) -> None:
    assert a.row_ids == b.row_ids and a.dropped == b.dropped and a.per_token == b.per_token
    assert np.array_equal(a.weights, b.weights) and np.array_equal(a.repeat, b.repeat)
    for i in range(len(a)):
        assert list(map(int, a.input_ids[i])) == list(map(int, b.input_ids[i]))
        labels_a, labels_b = a.labels[i], b.labels[i]
        assert np.array_equal(np.asarray(labels_a, dtype=np.int64), np.asarray(labels_b, dtype=np.int64))
    idx = list(range(0, len(a), 7))[:5]
    ca, cb = a.collate(idx, 0), b.collate(idx, 0)
    assert ca.keys() == cb.keys() and all(torch.equal(ca[k], cb[k]) for k in ca)


@pytest.mark.parametrize("chunk", [2048, 37])  # one record batch, or many
def test_cached_sft_examples_equal_the_in_memory_encoder(sft_data, tmp_path, monkeypatch, chunk):
    monkeypatch.setattr(token_cache, "CHUNK_ROWS", chunk)
    cfg = _cfg(sft_data, tmp_path / "run")
    run = RunShards.open(sft_data, task="sft")
    _, tok = load_model("sft", "tiny-causal-lm")
    train_idx, val_idx, _ = run_split(run, cfg.eval_fraction, cfg.seed)
    plain, plain_val, _ = encode_split(cfg, run, tok, None, train_idx, val_idx, lambda _: None)
    cached, cached_val, _ = encode_split(cfg, run, tok, None, train_idx, val_idx, lambda _: None,
                                         cache_dir=tmp_path / "cache")
    _same(plain, cached)
    _same(plain_val, cached_val)
    assert isinstance(cached.input_ids, token_cache.TokenRows)  # mapped, not lists
    # 4 bytes an id and 1 of mask per token, in the file the rows are views of
    arrow = next((tmp_path / "cache").glob("*/train.arrow"))
    tokens = json.loads(arrow.with_suffix(".json").read_text())["tokens"]
    assert tokens == plain.n_tokens() and arrow.stat().st_size < 5 * tokens + 64 * len(plain) + 4096


def test_cached_classify_examples_equal_the_in_memory_encoder(tmp_path):
    from dataguard.config import load_config

    spec = tmp_path / "p.yaml"
    spec.write_text("inputs:\n"
                    f"  - {{path: {REPO / 'sample_data/banking77/train.csv'}, name: b77, format: labelled_text, "
                    "aliases: {category: label}}\n"
                    f"output: {tmp_path / 'out'}\nstages: []\n")
    cfg_p = load_config(spec)
    cfg_p.pipeline(progress=False, workers=1).run(cfg_p.inputs, cfg_p.output)
    cfg = load_train_config({"task": "classify", "model": "minilm", "data": str(tmp_path / "out"),
                             "output": str(tmp_path / "run"), "max_length": 32})
    run = RunShards.open(cfg.data, task="classify")
    label_map = LabelMap.from_run(run.table, run.training)
    _, tok = load_model("classify", "minilm", label_map=label_map)
    train_idx, val_idx, _ = run_split(run, cfg.eval_fraction, cfg.seed)
    plain, _, _ = encode_split(cfg, run, tok, label_map, train_idx, val_idx, lambda _: None)
    cached, _, _ = encode_split(cfg, run, tok, label_map, train_idx, val_idx, lambda _: None,
                                cache_dir=tmp_path / "cache")
    _same(plain, cached)
    assert np.array_equal(plain.class_ids, cached.class_ids)


def test_a_resumed_run_maps_the_cache_its_first_start_built(sft_data, tmp_path):
    notes: list[str] = []
    Trainer(_cfg(sft_data, tmp_path / "run"), progress=False, echo=notes.append).fit(stop_after=2)
    files = sorted((tmp_path / "run" / "token_cache").glob("*/*.arrow"))
    assert [f.name for f in files] == ["train.arrow", "val.arrow"]
    before = [(f.stat().st_ino, f.stat().st_mtime_ns) for f in files]
    assert any(n.startswith("token cache: encoded train") for n in notes)
    notes.clear()
    Trainer(_cfg(sft_data, tmp_path / "run"), progress=False, echo=notes.append).fit(resume=True)
    assert [(f.stat().st_ino, f.stat().st_mtime_ns) for f in files] == before
    assert any(n.startswith("token cache: reusing") for n in notes), notes
    assert not any(n.startswith("token cache: encoded") for n in notes)


def test_the_key_changes_with_max_length_and_the_tokenizer(sft_data, tmp_path):
    run = RunShards.open(sft_data, task="sft")
    _, tok = load_model("sft", "tiny-causal-lm")
    idx = np.arange(10)
    key = token_cache.cache_key(task="sft", manifest=run.manifest, indices=idx, tokenizer=tok, max_length=80,
                                classes=None)
    assert key == token_cache.cache_key(task="sft", manifest=run.manifest, indices=idx, tokenizer=tok,
                                        max_length=80, classes=None)
    assert key != token_cache.cache_key(task="sft", manifest=run.manifest, indices=idx, tokenizer=tok,
                                        max_length=81, classes=None)
    assert key != token_cache.cache_key(task="sft", manifest=run.manifest, indices=idx[:9], tokenizer=tok,
                                        max_length=80, classes=None)
    tok.chat_template = tok.chat_template + " "
    assert key != token_cache.cache_key(task="sft", manifest=run.manifest, indices=idx, tokenizer=tok,
                                        max_length=80, classes=None)


def _counting_encoder(sft_data: Path) -> tuple[RunShards, list[int], Callable[[pa.Table], Encoded]]:
    """(the shards, the row counts each call encoded, an sft encoder that records them)."""
    run = RunShards.open(sft_data, task="sft")
    _, tok = load_model("sft", "tiny-causal-lm")
    calls: list[int] = []

    def encode(table: pa.Table) -> Encoded:
        calls.append(table.num_rows)
        return encode_sft(table, tok, 400, allow_empty=True)

    return run, calls, encode


def test_an_incomplete_split_is_rebuilt(sft_data, tmp_path):
    run, calls, encode = _counting_encoder(sft_data)
    folder = tmp_path / "k"
    token_cache.cached_encoding(folder, "train", lambda: run.table.slice(0, 20), encode, "sft")
    (folder / "train.json").unlink()  # killed before its JSON: not trusted
    enc = token_cache.cached_encoding(folder, "train", lambda: run.table.slice(0, 20), encode, "sft")
    assert len(calls) == 2 and len(enc) + sum(enc.dropped.values()) == 20 and len(enc) > 10


def test_rows_are_cut_at_the_model_context_when_nothing_else_cuts_them(tmp_path):
    long_row = [{"instruction": "Write a long essay.", "input": "", "output": " ".join(["word"] * 3000)},
                {"instruction": "Say hi.", "input": "", "output": "Hi."}]
    src = tmp_path / "long.json"
    src.write_text(json.dumps(long_row))
    Pipeline([], workers=1).run([InputSpec(path=str(src))], tmp_path / "out")
    cfg = load_train_config({"task": "sft", "model": "tiny-causal-lm", "data": str(tmp_path / "out"),
                             "output": str(tmp_path / "run"), "eval_fraction": 0.0})
    run = RunShards.open(cfg.data, task="sft")
    _, tok = load_model("sft", "tiny-causal-lm")
    warnings: list[str] = []
    enc, _, max_length = encode_split(cfg, run, tok, None, np.arange(2), np.arange(0), warnings.append,
                                      cache_dir=tmp_path / "cache", context=512)
    assert max_length == 512 and max(len(x) for x in enc.input_ids) == 512
    assert any("context" in w for w in warnings)


def test_a_damaged_split_is_encoded_again_never_trained_on(sft_data, tmp_path):
    """Flipped bytes (which would train on other ids without a word), a torn Arrow file and an
    unreadable JSON each fail the sha256 check: the split is rebuilt, with a note saying why."""
    run, calls, encode = _counting_encoder(sft_data)
    folder = tmp_path / "k"

    def build(notes: list[str]):
        return token_cache.cached_encoding(folder, "train", lambda: run.table.slice(0, 20), encode, "sft",
                                           notes.append)

    clean = build([])
    want = [list(map(int, r)) for r in clean.input_ids]
    arrow, meta = folder / "train.arrow", folder / "train.json"

    def flip() -> None:
        data = bytearray(arrow.read_bytes())
        data[len(data) // 2] ^= 0x01
        arrow.write_bytes(bytes(data))

    def tear() -> None:
        arrow.write_bytes(arrow.read_bytes()[:100])

    def garble() -> None:
        meta.write_text("{not json")

    for damage, why in ((flip, "does not match its sha256"), (tear, "does not match its sha256"),
                        (garble, "unreadable train.json")):
        damage()
        notes: list[str] = []
        enc = build(notes)
        assert [list(map(int, r)) for r in enc.input_ids] == want
        assert len(notes) == 1 and notes[0].startswith("token cache: train not trusted") and why in notes[0], notes
    assert len(calls) == 4  # built once, then once per damage
    notes = []
    build(notes)
    assert notes[0].startswith("token cache: reusing") and len(calls) == 4
