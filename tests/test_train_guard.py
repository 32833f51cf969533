"""The stability guard and monitor on CPU with the tiny causal LM and injected faults: a NaN
step is skipped, not applied; repeated NaNs roll back (lr halved, clipping tightened, moments
reset) and the run recovers close to a clean one; too many rollbacks stop with a diagnosis
naming the layer and the rows; no checkpoint holds a non-finite tensor; resume (also after
kill -9 in the middle of a rollback) continues the very same run."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dataguard.config import ConfigError
from dataguard.io.readers import InputSpec
from dataguard.pipeline import Pipeline
from dataguard.train.checkpoint import complete_checkpoints, latest_checkpoint, read_weights
from dataguard.train.config import load_train_config
from dataguard.train.loop import TrainDiverged, Trainer, TrainError
from dataguard.train.stability.guard import Guard, robust_z
from dataguard.train.stability.monitor import layer_of
from dataguard.train.state import Trainables

REPO = Path(__file__).resolve().parent.parent
GUARD = {"snapshot_every": 2, "max_anomalies": 2, "anomaly_window": 5, "verify_steps": 1}
ROLLBACK_FAULTS = [{"step": 7, "kind": "nan_grad", "layer": "layers.0"}, {"step": 8, "kind": "nan_loss"}]


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("guard") / "shards"
    Pipeline([], workers=1).run([InputSpec(path=str(REPO / "sample_data/alpaca_en_demo.json"))], out)
    return out


@pytest.fixture(scope="module")
def faulty(data, tmp_path_factory):
    """The rollback scenario run straight through (shared by the rollback and kill tests)."""
    run = tmp_path_factory.mktemp("faulty") / "run"
    return Trainer(_cfg(data, run, faults=ROLLBACK_FAULTS, save_every=5)).fit()


def _cfg(data: Path, out: Path, **kw):
    values = {"task": "sft", "model": "tiny-causal-lm", "data": str(data), "output": str(out), "max_steps": 14,
              "batch_size": 2, "lr": 3e-3, "max_length": 64, "eval_every": 1000, "save_every": 1000,
              "tensorboard": False, "monitor_every": 2, "histogram_every": 5, "guard": dict(GUARD)}
    values.update(kw)
    return load_train_config(values)


def _lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def _all_finite(run: Path) -> None:
    for ckpt in complete_checkpoints(run):
        for name, w in read_weights(ckpt).items():
            assert torch.isfinite(w).all(), (ckpt.name, name)
        opt = torch.load(ckpt / "optimizer.pt", weights_only=True)
        for slots in opt["state"].values():
            for key, value in slots.items():
                if isinstance(value, torch.Tensor) and value.is_floating_point():
                    assert torch.isfinite(value).all(), (ckpt.name, key)


def test_guard_and_fault_config_errors(tmp_path):
    spec = tmp_path / "t.yaml"
    spec.write_text("task: sft\nmodel: tiny-causal-lm\ndata: x\nfaults:\n  - {step: 3, kind: boom}\n")
    with pytest.raises(ConfigError, match=r"t\.yaml:5: faults\[0\]\.kind: must be one of nan_loss"):
        load_train_config(spec)
    spec.write_text("task: sft\nmodel: tiny-causal-lm\ndata: x\nguard:\n  max_rollbacks: -1\n")
    with pytest.raises(ConfigError, match=r"t\.yaml:5: guard\.max_rollbacks: must be an integer >= 0"):
        load_train_config(spec)
    spec.write_text("task: sft\nmodel: tiny-causal-lm\ndata: x\nguard: {zscor: 3}\n")
    with pytest.raises(ConfigError, match=r"guard\.zscor: unknown key"):
        load_train_config(spec)
    cfg = load_train_config({"task": "sft", "model": "tiny-causal-lm", "data": "x", "guard": False})
    assert cfg.guard is None and cfg.monitor_every == 10 and cfg.histogram_every == 1000
    cfg = load_train_config({"task": "sft", "model": "tiny-causal-lm", "data": "x"})
    assert cfg.guard["lr_backoff"] == 0.5 and cfg.guard["recovery_clip"] == 0.5 and cfg.faults == []


def test_robust_z_spikes_and_layer_names():
    window = [2.0 + 0.01 * (i % 5) for i in range(30)]
    assert abs(robust_z(2.02, window)) < 1 and robust_z(5.0, window) > 6
    guard = Guard(load_train_config({"task": "sft", "model": "tiny-causal-lm", "data": "x"}).guard, 1.0)
    model = torch.nn.Linear(2, 2)
    guard.snapshots.take(0, Trainables(model, torch.optim.AdamW(model.parameters()), None), verified=True)
    for v in window:
        guard.accept(v, 1.0)
    assert not guard.check(31, 2.03, 1.02, True, []).anomalies
    spike = guard.check(32, 9.0, 1.0, True, [])
    assert spike.skip and [a["cause"] for a in spike.anomalies] == ["loss_spike"]
    assert [a["cause"] for a in guard.check(33, 2.0, 50.0, True, []).anomalies] == ["grad_spike"]
    third = guard.check(34, math.nan, math.nan, False, [])
    assert third.anomalies[0]["cause"] == "nonfinite_loss" and third.rollback  # 3 within the window
    assert [layer_of(n) for n in ("model.embed_tokens.weight", "model.layers.1.mlp.up_proj.weight",
                                  "bert.encoder.layer.0.output.dense.bias", "lm_head.weight", "model.norm.weight",
                                  "base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight")] == \
        ["embed", "layers.1", "layers.0", "head", "other", "layers.0"]


def test_nan_step_is_skipped_not_applied_and_monitored(data, tmp_path):
    run = tmp_path / "run"
    cfg = _cfg(data, run, max_steps=4, save_every=1, keep_checkpoints=10, histogram_every=2,
               faults=[{"step": 3, "kind": "inf_loss"}, {"step": 4, "kind": "garbage_batch"}])
    result = Trainer(cfg).fit()
    assert [h["skipped"] for h in result.history] == [False, False, True, False] and result.rollbacks == 0
    w2, w3, w4 = (read_weights(run / "checkpoints" / f"step-00000{i}") for i in (2, 3, 4))
    assert all(torch.equal(w2[k], w3[k]) for k in w2)  # the NaN step changed nothing
    assert any(not torch.equal(w3[k], w4[k]) for k in w3)
    _all_finite(run)
    steps = [x for x in _lines(run / "metrics.jsonl") if "loss" in x]
    assert steps[2]["lr"] == steps[3]["lr"]  # skipped: the schedule did not advance
    assert all({"skipped", "amp_scale", "lr_groups"} <= set(x) for x in steps)
    monitored = steps[1]
    assert list(monitored["layer_grad_norms"]) == ["embed", "layers.0", "layers.1", "other", "head"]
    assert set(monitored["update_ratios"]) == set(monitored["grad_std_ratio"]) == set(monitored["layer_grad_norms"])
    assert all(v > 0 for v in monitored["update_ratios"].values())
    assert monitored["n_big_grads"] == 0 and monitored["n_big_weights"] == 0
    assert "layer_grad_norms" not in steps[0]
    hists = _lines(run / "histograms.jsonl")
    assert [h["step"] for h in hists] == [2, 4]
    h = hists[0]["layers"]["layers.0"]
    assert len(h["edges"]) == len(h["counts"]) + 1 and sum(h["counts"]) > 0
    events = _lines(run / "events.jsonl")
    kinds = [(e["step"], e["kind"], e["cause"]) for e in events if e["kind"] not in ("checkpoint", "verified")]
    assert kinds == [(3, "fault", "inf_loss"), (3, "anomaly", "nonfinite_loss"), (3, "skip", "nonfinite_loss"),
                     (4, "fault", "garbage_batch")]  # garbage tokens: a finite step, applied
    anomaly = next(e for e in events if e["kind"] == "anomaly")
    assert anomaly["rows"] and all(r.startswith("alpaca_en_demo.json:") for r in anomaly["rows"])
    assert sum(e["kind"] == "checkpoint" for e in events) == 4


def test_repeated_nans_roll_back_and_recover(data, faulty, tmp_path):
    clean = Trainer(_cfg(data, tmp_path / "clean")).fit()
    run = faulty.run_dir
    assert faulty.rollbacks == 1 and faulty.skipped_steps == 2
    rollback = next(e for e in faulty.events if e["kind"] == "rollback")
    # the newest *verified* state: 5 (the checkpoint, one clean step after it); 6 was pending at the fault
    assert rollback["step"] == 8 and "state of step 5" in rollback["detail"]
    assert "clip max_norm 0.5" in rollback["detail"] and "Adam moments reset" in rollback["detail"]
    # lr halved: step 9 runs the schedule position of clean step 7, at half its lr
    assert faulty.history[8]["lr"] == pytest.approx(0.5 * clean.history[6]["lr"], rel=1e-6)
    assert faulty.last_eval and clean.last_eval
    # within 10% of the clean run (the guard's goal): the rollback costs the steps since the verified
    # state and the lr is halved at the schedule's current position (it is not rewound)
    assert abs(faulty.last_eval["loss"] - clean.last_eval["loss"]) <= 0.10 * clean.last_eval["loss"]
    assert abs(faulty.final_loss - clean.final_loss) <= 0.10 * clean.final_loss
    assert all(torch.isfinite(w).all() for w in read_weights(latest_checkpoint(run)).values())
    _all_finite(run)
    # resume after the rollback: the guard's state comes back, the run is the same bit for bit
    Trainer(_cfg(data, tmp_path / "resumed", faults=ROLLBACK_FAULTS, save_every=5)).fit(stop_after=10)
    resumed = Trainer(_cfg(data, tmp_path / "resumed", faults=ROLLBACK_FAULTS, save_every=5)).fit(resume=True)
    assert resumed.rollbacks == 1
    assert [repr(h["loss"]) for h in resumed.history] == [repr(h["loss"]) for h in faulty.history]
    a, b = read_weights(latest_checkpoint(run)), read_weights(latest_checkpoint(tmp_path / "resumed"))
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert [e["kind"] for e in _lines(tmp_path / "resumed" / "events.jsonl")] == \
        [e["kind"] for e in _lines(run / "events.jsonl")]


def test_too_many_rollbacks_stop_with_a_diagnosis(data, tmp_path, capsys):
    from dataguard.cli import main

    run = tmp_path / "run"
    spec = tmp_path / "train.yaml"
    faults = "".join(f"  - {{step: {s}, kind: nan_grad, layer: layers.1}}\n" for s in (3, 4, 6, 7))
    spec.write_text(f"task: sft\nmodel: tiny-causal-lm\ndata: {data}\noutput: {run}\nmax_steps: 10\n"
                    "batch_size: 2\nlr: 0.003\nmax_length: 64\ntensorboard: false\nsave_every: 1\n"
                    "keep_checkpoints: 20\nguard: {snapshot_every: 2, max_anomalies: 2, anomaly_window: 5, "
                    f"max_rollbacks: 1}}\nfaults:\n{faults}")
    assert main(["train", str(spec), "--quiet"]) == 1
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("dataguard:")]
    assert len(errors) == 1 and "training diverged at step 7" in errors[0] and "layers.1" in errors[0]
    assert "diagnosis.json" in errors[0]
    diag = json.loads((run / "diagnosis.json").read_text())
    assert diag["first_layer"] == "layers.1" and diag["step"] == 3 and diag["cause"] == "nonfinite_grad"
    events = _lines(run / "events.jsonl")
    bad = {r for e in events if e["kind"] == "anomaly" for r in e["rows"]}
    assert [e["step"] for e in events if e["kind"] == "anomaly"] == [3, 4, 6, 7]
    assert bad and set(diag["rows"]) == bad and diag["events"][-1]["kind"] == "stop"
    assert [e["kind"] for e in events if e["kind"] in ("rollback", "stop")] == ["rollback", "stop"]
    assert latest_checkpoint(run).name == "step-000006"  # the stopping step is never saved
    _all_finite(run)
    assert issubclass(TrainDiverged, TrainError)  # what the API raises; the CLI made it one line


_KILLER = """
import os, signal, sys
from dataguard.train.stability import guard
from dataguard.train.config import load_train_config
from dataguard.train.loop import Trainer
real = guard.Guard.roll_back
def dying(self, step, parts):
    with __import__("torch").no_grad():
        parts.model.load_state_dict(self.snapshots.target.model, strict=False)  # half-way through restoring
    os.kill(os.getpid(), signal.SIGKILL)
guard.Guard.roll_back = dying
cfg = load_train_config(dict(task="sft", model="tiny-causal-lm", data=sys.argv[1], output=sys.argv[2],
    max_steps=14, batch_size=2, lr=3e-3, max_length=64, eval_every=1000, save_every=5, tensorboard=False,
    monitor_every=2, histogram_every=5, guard=dict(snapshot_every=2, max_anomalies=2, anomaly_window=5, verify_steps=1),
    faults=[dict(step=7, kind="nan_grad", layer="layers.0"), dict(step=8, kind="nan_loss")]))
Trainer(cfg).fit()
"""


def test_kill_during_rollback_then_resume_is_consistent(data, faulty, tmp_path):
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.run([sys.executable, "-c", _KILLER, str(data), str(tmp_path / "killed")], env=env, cwd=REPO,
                          capture_output=True, timeout=300)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()[-2000:]
    assert latest_checkpoint(tmp_path / "killed").name == "step-000005"
    resumed = Trainer(_cfg(data, tmp_path / "killed", faults=ROLLBACK_FAULTS, save_every=5)).fit(resume=True)
    assert resumed.rollbacks == faulty.rollbacks == 1
    a, b = read_weights(latest_checkpoint(tmp_path / "killed")), read_weights(latest_checkpoint(faulty.run_dir))
    assert all(torch.equal(a[k], b[k]) for k in a)
    _all_finite(tmp_path / "killed")
    metrics = [x["step"] for x in _lines(tmp_path / "killed" / "metrics.jsonl") if "loss" in x]
    assert metrics == list(range(1, 15))


def test_monitor_values_and_histograms_reach_tensorboard(data, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run = tmp_path / "run"
    Trainer(_cfg(data, run, max_steps=4, tensorboard=True, monitor_every=2, histogram_every=2)).fit()
    acc = EventAccumulator(str(run / "tensorboard"), size_guidance={"histograms": 0, "scalars": 0})
    acc.Reload()
    scalars = set(acc.Tags()["scalars"])
    histograms = set(acc.Tags()["histograms"])
    assert "train/loss" in scalars
    assert any(t.startswith("train/layer_grad_norms/") for t in scalars)
    assert any(t.startswith("train/update_ratios/") for t in scalars)
    assert any(t.startswith("grad_log10/layers.") for t in histograms)
    steps = {e.step for e in acc.Histograms(sorted(histograms)[0])}
    assert steps == {2, 4}


def test_histograms_sample_a_large_layer_and_scale_the_counts_back():
    """A 2M-entry gradient (an embedding of a large vocabulary) is read through a seeded
    sample, never copied whole; the counts still add up to about the layer's size and keep
    its shape."""
    from dataguard.train.stability.monitor import HIST_SAMPLE, Monitor

    model = torch.nn.Sequential(torch.nn.Embedding(40_000, 50), torch.nn.Linear(50, 4))
    gen = torch.Generator().manual_seed(0)
    big = torch.full((40_000, 50), 1e-3)
    big[::2] = 1e-6  # half the rows at 1e-6, half at 1e-3
    model[0].weight.grad = big
    model[1].weight.grad = torch.rand(4, 50, generator=gen) + 0.5
    hists = Monitor(model).histograms()
    emb = next(h for name, h in hists.items() if h["sampled_every"] > 1)
    assert emb["sampled_every"] == -(-2_000_000 // HIST_SAMPLE)
    counts = dict(zip(emb["edges"][:-1], emb["counts"], strict=True))
    in_layer = sum(p.grad.numel() for p in model.parameters() if p.grad is not None)  # both: one "layer"
    assert abs(sum(emb["counts"]) - in_layer) <= 50
    assert abs(counts[-6.0] - counts[-3.0]) <= 0.02 * 2_000_000  # both halves, in their bins
