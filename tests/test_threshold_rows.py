"""Threshold rows (Pleiss et al. 2020; issue #27): ``threshold_rows: 1`` / ``2`` trains two
disjoint sets of ``n / (c + 1)`` training rows under a fake class, the dynamics file names
them, and the noise stage learns its cut from their AUM (the 99th percentile) and judges
every row from the two runs together. Real banking77 rows, the tiny classifier, no mocks."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from banking_slice import banking_rows, banking_shards

from dataguard.config import ConfigError
from dataguard.io.readers import InputSpec
from dataguard.pipeline import Pipeline
from dataguard.stages.longtail import LongTailStage
from dataguard.stages.noise.dynamics import aggregate
from dataguard.stages.noise.stage import NoiseStage
from dataguard.train.config import load_train_config
from dataguard.train.data import RunShards
from dataguard.train.data.threshold_rows import THRESHOLD_CLASS, threshold_ids
from dataguard.train.dynamics.file import read_dynamics
from dataguard.train.errors import TrainError
from dataguard.train.loop import Trainer

REPO = Path(__file__).resolve().parent.parent
BANKING = REPO / "tests/data/banking77/train.csv"
CLASSES = ("card_payment_fee_charged", "direct_debit_payment_not_recognised",
           "balance_not_updated_after_cheque_or_cash_deposit", "wrong_amount_of_cash_received")


def _settings(data: Path, out: Path, **kw) -> dict:
    return {"task": "classify", "model": "tiny-classifier", "data": str(data), "output": str(out), "epochs": 12,
            "batch_size": 16, "lr": 5e-3, "eval_fraction": 0.0, "save_every": 50, "eval_every": 1000,
            "tensorboard": False, "logit_adjustment": False, "threads": 1, **kw}


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> tuple[pa.Table, Path, Path]:
    """Four banking77 intents, 60 rows each; two runs, threshold sets 1 and 2."""
    tmp = tmp_path_factory.mktemp("threshold")
    data = banking_shards(tmp, banking_rows(CLASSES, 60))
    first, second = tmp / "t1", tmp / "t2"
    for part, run in ((1, first), (2, second)):
        Trainer(load_train_config(_settings(data, run, threshold_rows=part)), progress=False).fit()
    return RunShards.open(data, task="classify").table, first, second


def test_two_disjoint_sets_train_under_the_fake_class(runs):
    table, first, second = runs
    ids = table.column("id").to_pylist()
    sets = []
    for part, run in ((1, first), (2, second)):
        dyn, meta = read_dynamics(run)
        assert meta["labels"][-1] == THRESHOLD_CLASS and len(meta["labels"]) == len(CLASSES) + 1
        assert json.loads((run / "label_map.json").read_text())["classes"][-1] == THRESHOLD_CLASS
        fake = set(meta["threshold_rows"])
        assert len(fake) == 240 // (len(CLASSES) + 1)  # n / (c + 1)
        assert sorted(fake) == threshold_ids(ids, len(CLASSES), part, seed=0)
        assert threshold_ids(ids[::-1], len(CLASSES), part, seed=0) == sorted(fake)  # whatever order the shards hold
        assert any("threshold rows (set" in n for n in json.loads((run / "run.json").read_text())["notes"])
        # the recorded gold is the fake class for those rows and the data's label for the others
        label = dict(zip(ids, table.column("label").to_pylist(), strict=True))
        correct = dyn.column("correct").to_pylist()
        for rid, pred, ok in zip(dyn.column("id").to_pylist(), dyn.column("predicted").to_pylist(), correct,
                                 strict=True):
            assert ok == (pred == (THRESHOLD_CLASS if rid in fake else label[rid]))
        assert any(ok for rid, ok in zip(dyn.column("id").to_pylist(), correct, strict=True) if rid in fake)
        sets.append(fake)
    assert not sets[0] & sets[1]


def test_a_resumed_threshold_run_writes_the_same_file(runs, tmp_path):
    _, first, _ = runs
    data, run = first.parent / "shards", tmp_path / "resumed"
    Trainer(load_train_config(_settings(data, run, threshold_rows=1)), progress=False).fit(stop_after=55)
    Trainer(load_train_config(_settings(data, run, threshold_rows=1)), progress=False).fit(resume=True)
    assert (run / "dynamics.arrow").read_bytes() == (first / "dynamics.arrow").read_bytes()
    assert json.loads((run / "label_map.json").read_text())["classes"].count(THRESHOLD_CLASS) == 1
    other = tmp_path / "other"
    Trainer(load_train_config(_settings(data, other, threshold_rows=1)), progress=False).fit(stop_after=55)
    for changed in (2, 0):  # another set, or none: the memorised fake class would mix into the file
        with pytest.raises(TrainError, match=rf"threshold_rows 1 -> {changed}"):
            Trainer(load_train_config(_settings(data, other, threshold_rows=changed)), progress=False).fit(resume=True)


def _judge(table: pa.Table, dynamics, **kw) -> tuple[NoiseStage, pa.Table]:
    stage = NoiseStage(inputs="dynamics", dynamics=dynamics, min_rows_per_class=0, **kw)
    stage.fit([stage.summarize(table)])
    return stage, stage.apply(table).kept


def test_the_cut_is_the_threshold_rows_99th_percentile_and_they_are_not_judged(runs):
    table, first, _ = runs
    dyn, meta = read_dynamics(first)
    rows = aggregate(dyn)
    aum = dict(zip(rows.ids, rows.aum, strict=True))
    fake = set(meta["threshold_rows"])
    stage, out = _judge(table, str(first))
    cut = float(np.percentile([aum[i] for i in fake], 99))
    assert stage.dynamics_log["cut"] == "threshold rows" and stage.dynamics_log["threshold_rows"] == len(fake)
    assert stage.dynamics_log["cut_value"] == pytest.approx(cut, abs=1e-5)
    flagged = 0
    for rid, q, flag in zip(out.column("id").to_pylist(), out.column("label_quality").to_pylist(),
                            out.column("is_label_issue").to_pylist(), strict=True):
        if rid in fake:  # trained under the fake class: this run says nothing about its label
            assert q is None and flag is None
            continue
        assert q == pytest.approx(aum[rid], abs=1e-5)
        assert flag == (q < cut)
        flagged += bool(flag)
    assert stage.dynamics_log["rows_unseen"] == len(fake)
    assert flagged == stage.dynamics_log["below_cut"]


def test_two_runs_judge_every_row_against_their_mean_cut(runs):
    table, first, second = runs
    views = []
    for run in (first, second):
        dyn, meta = read_dynamics(run)
        rows = aggregate(dyn)
        aum = dict(zip(rows.ids, rows.aum, strict=True))
        fake = set(meta["threshold_rows"])
        views.append(({i: a for i, a in aum.items() if i not in fake}, float(np.percentile([aum[i] for i in fake], 99))))
    cut = (views[0][1] + views[1][1]) / 2
    stage, out = _judge(table, [str(first), str(second)], action="flag")
    assert stage.dynamics_log["runs"] == 2 and stage.dynamics_log["cut_value"] == pytest.approx(cut, abs=1e-5)
    assert stage.dynamics_log["rows_unseen"] == 0  # each run judges the other's threshold rows
    only_one = 0
    for rid, q, flag in zip(out.column("id").to_pylist(), out.column("label_quality").to_pylist(),
                            out.column("is_label_issue").to_pylist(), strict=True):
        # each run's AUM measured from that run's own cut, on the mean cut's scale
        mine = [v[rid] - run_cut for v, run_cut in views if rid in v]
        assert mine and q == pytest.approx(float(np.mean(mine)) + cut, abs=1e-4)
        assert flag == (float(np.mean(mine)) < 0)
        only_one += len(mine) == 1
    assert only_one == 2 * (240 // (len(CLASSES) + 1))  # the two threshold sets, each judged by the other run
    dropped = NoiseStage(inputs="dynamics", dynamics=[str(first), str(second)], action="drop")
    dropped.fit([dropped.summarize(table)])
    result = dropped.apply(table)
    assert result.kept.num_rows + result.rejected.num_rows == table.num_rows
    assert result.rejected.num_rows > 0 and set(result.rejected.column("reason").to_pylist()) == {"label_issue"}


def test_threshold_rows_mistakes_are_one_line(runs, tmp_path):
    table, first, _ = runs
    data = str(first.parent / "shards")
    for extra, message in (({"task": "sft", "model": "tiny-causal-lm"}, r"threshold_rows: applies to task classify"),
                           ({"dynamics": False}, r"threshold_rows: needs dynamics: true"),
                           ({"threshold_rows": 3}, r"threshold_rows")):
        with pytest.raises(ConfigError, match=message) as err:
            load_train_config({**_settings(Path(data), tmp_path / "x"), "threshold_rows": 1, **extra})
        assert "\n" not in str(err.value)
    sft = tmp_path / "sft"
    Pipeline([], workers=1).run([InputSpec(path=str(REPO / "sample_data/alpaca_en_demo.json"))], sft)
    run, run_b = tmp_path / "sft_run", tmp_path / "sft_run_b"
    for out in (run, run_b):
        Trainer(load_train_config({"task": "sft", "model": "tiny-causal-lm", "data": str(sft), "output": str(out),
                                   "max_steps": 2, "batch_size": 4, "max_length": 64, "save_every": 1000,
                                   "tensorboard": False, "threads": 1}), progress=False).fit()
    with pytest.raises(ValueError, match="same run"):
        NoiseStage(inputs="dynamics", dynamics=[str(first), str(first / "dynamics.arrow")])
    reseeded = tmp_path / "t2_seed1"  # set 2 of another seed overlaps set 1 of seed 0: rows nobody judges
    Trainer(load_train_config(_settings(first.parent / "shards", reseeded, threshold_rows=2, seed=1, epochs=1)),
            progress=False).fit()
    with pytest.raises(ValueError, match=r"two runs trained \d+ of the same rows under the fake class"):
        NoiseStage(inputs="dynamics", dynamics=[str(first), str(reseeded)])
    with pytest.raises(ValueError, match="different tasks"):
        NoiseStage(inputs="dynamics", dynamics=[str(first), str(run)])
    with pytest.raises(ValueError, match="several runs apply to classify runs"):
        NoiseStage(inputs="dynamics", dynamics=[str(run), str(run_b)])


def test_the_loop_refuses_a_diagnostic_run_and_offsets_are_not_applied(runs, tmp_path):
    _, first, _ = runs
    csv_path = first.parent / "bank.csv"
    cfg = tmp_path / "loop.yaml"
    cfg.write_text(f"inputs:\n  - path: {csv_path}\n    format: labelled_text\n    aliases: {{category: label}}\n"
                   "stages:\n  - longtail: {}\n"
                   "train: {task: classify, model: tiny-classifier, threshold_rows: 1, threads: 1}\n")
    out = tmp_path / "loop"
    done = subprocess.run([sys.executable, "-m", "dataguard", "loop", str(cfg), "--output", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert "threshold_rows trains a diagnostic model" in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert not out.exists()
    # with the longtail stage's logit offsets in the manifest, a threshold run trains plain cross-entropy
    data = tmp_path / "longtail"
    Pipeline([LongTailStage()], workers=1).run([InputSpec(path=str(csv_path), format="labelled_text",
                                                          aliases={"category": "label"})], data)
    run = tmp_path / "lt_run"
    Trainer(load_train_config(_settings(data, run, threshold_rows=1, logit_adjustment=True, max_steps=4)),
            progress=False).fit()
    notes = json.loads((run / "run.json").read_text())["notes"]
    assert any("logit offsets are not applied" in n for n in notes)
    plain = tmp_path / "lt_plain"
    Trainer(load_train_config(_settings(data, plain, logit_adjustment=True, max_steps=4)), progress=False).fit()
    assert not any("logit offsets" in n for n in json.loads((plain / "run.json").read_text())["notes"])
