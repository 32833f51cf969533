"""The guard never restores, resumes from or exports a bad state (issue #23).

Each fault kind is injected one step after a checkpoint (``save_every`` 10, fault at 21 or
29) into a 40-step run of the tiny causal LM on the sample data. Before the change, a
checkpoint also took the guard's snapshot on any step, so the 100x lr spike rolled back to
the post-spike state three times and stopped; the 1e20 spike saved checkpoints with
max|w| 1.8e17; a garbage batch was not flagged; `convert` took the newest (worst) checkpoint.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from dataguard.io.readers import InputSpec
from dataguard.pipeline import Pipeline
from dataguard.train.checkpoint import complete_checkpoints, is_verified, read_weights
from dataguard.train.config import load_train_config
from dataguard.train.convert import convert_checkpoint, find_checkpoint
from dataguard.train.errors import TrainDiverged
from dataguard.train.evaluate import evaluate
from dataguard.train.loop import Trainer
from dataguard.train.stability.guard import Guard, Verdict
from dataguard.train.state import Trainables

REPO = Path(__file__).resolve().parent.parent
STEPS = 40
BOUND = 1e6


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("guard-data") / "out"
    Pipeline([], workers=1).run([InputSpec(path=str(REPO / "sample_data/alpaca_en_demo.json"))], out)
    return out


def _cfg(data: Path, out: Path, faults: list, **kw):
    values = {"task": "sft", "model": "tiny-causal-lm", "data": str(data), "output": str(out), "max_steps": STEPS,
              "batch_size": 4, "grad_accum": 2, "lr": 3e-3, "warmup_ratio": 0.1, "max_length": 128,
              "eval_every": 10, "save_every": 10, "keep_checkpoints": 10, "tensorboard": False, "threads": 1,
              "faults": faults}
    values.update(kw)
    return load_train_config(values)


def _events(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def clean(data, tmp_path_factory):
    run = tmp_path_factory.mktemp("clean") / "run"
    return Trainer(_cfg(data, run, [])).fit()


FAULTS = {
    "nan_loss": [{"step": 21, "kind": "nan_loss"}],
    "inf_loss": [{"step": 21, "kind": "inf_loss"}],
    "nan_grad": [{"step": 21, "kind": "nan_grad"}],
    "lr_spike_100": [{"step": 29, "kind": "lr_spike", "factor": 100}],
    "lr_spike_1000": [{"step": 29, "kind": "lr_spike", "factor": 1000}],
    "lr_spike_1e20": [{"step": 29, "kind": "lr_spike", "factor": 1e20}],
    "garbage_batch": [{"step": 25, "kind": "garbage_batch"}],
}


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_each_fault_recovers_or_stops_and_no_bad_state_is_kept(data, clean, tmp_path, fault):
    run = tmp_path / "run"
    cfg = _cfg(data, run, FAULTS[fault])
    try:
        result = Trainer(cfg).fit()
    except TrainDiverged as exc:  # a stop is allowed, with its diagnosis
        assert (run / "diagnosis.json").is_file() and "diverged" in str(exc)
        result = None
    events = _events(run)
    if result is not None:
        final, reference = result.last_eval["loss"], clean.last_eval["loss"]
        assert final <= reference * 1.10, (fault, final, reference)
    # every rollback went to a verified state from before the fault
    fault_step = FAULTS[fault][0]["step"]
    verified = {e["step"] for e in events if e["kind"] == "verified"}
    for e in events:
        if e["kind"] == "rollback":
            target = int(e["detail"].split("state of step ")[1].split(";")[0])
            assert target < fault_step and target in verified | {0}, e
    # no checkpoint on disk holds a weight over the bound or a non-finite one
    for ckpt in complete_checkpoints(run):
        for name, tensor in read_weights(ckpt).items():
            assert torch.isfinite(tensor).all() and float(tensor.abs().max()) <= BOUND, (ckpt.name, name)
    if fault == "garbage_batch":  # loss ~2x the running loss: caught now that warmup is out of the window
        assert any(e["kind"] == "anomaly" and e["step"] == 25 for e in events), events


def test_lr_spike_rolls_back_to_a_verified_state_and_convert_takes_the_best(data, clean, tmp_path):
    run = tmp_path / "run"
    result = Trainer(_cfg(data, run, FAULTS["lr_spike_1000"])).fit()
    events = _events(run)
    rollbacks = [e for e in events if e["kind"] == "rollback"]
    assert len(rollbacks) == 1 and "state of step 20" in rollbacks[0]["detail"], rollbacks
    metrics = {r["step"]: r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if "loss" in r}
    assert metrics[30]["skipped"] and metrics[30]["lr"] > 100 * metrics[28]["lr"]  # the lr in force, spike included
    assert metrics[33]["lr"] < metrics[28]["lr"]  # after the rollback: backed off, the schedule not rewound
    by_name = {c.name: c for c in complete_checkpoints(run)}
    assert not is_verified(by_name["step-000030"])  # written after the spike: on disk, never trusted
    assert is_verified(by_name["step-000020"]) and is_verified(by_name["step-000040"])
    # convert defaults to the best eval; its model evaluates within 10% of the best eval loss
    best = find_checkpoint(run)
    assert best.name == Path(json.loads((run / "best.json").read_text())["checkpoint"]).name
    out = convert_checkpoint(run, tmp_path / "model")
    from transformers import AutoModelForCausalLM

    from dataguard.train.data import RunShards, run_split
    from dataguard.train.model.build import load_model
    from dataguard.train.prepare import encode_split

    model = AutoModelForCausalLM.from_pretrained(str(out), local_files_only=True)
    cfg = _cfg(data, tmp_path / "x", [])
    shards = RunShards.open(cfg.data, task="sft")
    _, tokenizer = load_model("sft", "tiny-causal-lm")
    train_idx, val_idx, _ = run_split(shards, cfg.eval_fraction, cfg.seed)
    _, val, _ = encode_split(cfg, shards, tokenizer, None, train_idx, val_idx, lambda _: None)
    got = evaluate(model, val, task="sft", batch_size=4, pad_id=tokenizer.pad_token_id or 0, offsets=None,
                   logit_adjustment=False, device=torch.device("cpu"))["loss"]
    assert got <= result.best_metric * 1.10, (got, result.best_metric)


def test_resume_takes_the_newest_verified_checkpoint_and_says_so(data, tmp_path, capsys):
    run = tmp_path / "run"
    Trainer(_cfg(data, run, FAULTS["lr_spike_1000"], max_steps=30)).fit()
    assert [c.name for c in complete_checkpoints(run)][-1] == "step-000030"
    lines: list[str] = []
    trainer = Trainer(_cfg(data, run, FAULTS["lr_spike_1000"], max_steps=30), echo=lines.append)
    trainer.fit(resume=True)
    said = "\n".join(lines)
    assert "resuming from step-000020, the newest verified checkpoint (newer, not verified by the guard: " \
           "step-000030)" in said, said


def test_a_run_that_ends_worse_than_its_best_warns_and_names_the_best(data, tmp_path):
    run = tmp_path / "run"
    # guard off: nothing undoes the spike, so the last eval is far worse than the best one
    cfg = _cfg(data, run, [{"step": 35, "kind": "lr_spike", "factor": 1000}], guard=False)
    with pytest.warns(UserWarning, match="worse than the best"):
        Trainer(cfg).fit()
    summary = json.loads((run / "run.json").read_text())
    assert "worse than the best" in summary["final_warning"] and "step-0000" in summary["final_warning"]
    from dataguard.train.report.page_data import collect

    assert collect(run)["status"] == "worse_than_best"


# ------------------------------------------------------------------------ the guard alone
def _guard(**knobs) -> tuple[Guard, torch.nn.Module, torch.optim.Optimizer]:
    guard = Guard(load_train_config({"task": "sft", "model": "tiny-causal-lm", "data": "x",
                                     "guard": knobs or True}).guard, 1.0)
    model = torch.nn.Linear(3, 3)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    return guard, model, opt


def test_a_pending_snapshot_needs_clean_steps_and_an_anomaly_discards_it():
    guard, model, opt = _guard(verify_steps=3)
    guard.snapshots.take(0, Trainables(model, opt, None), verified=True)
    with torch.no_grad():
        model.weight.add_(1.0)
    guard.snapshots.take(5, Trainables(model, opt, None))
    assert guard.snapshots.target.step == 0 and [p.step for p in guard.snapshots.pending] == [5]
    assert guard.snapshots.after_step(True, clean=True) is None and guard.snapshots.after_step(False, clean=True) is None
    assert guard.snapshots.after_step(True, Verdict(anomalies=[{"cause": "loss_spike"}]).clean) is None
    assert guard.snapshots.pending == [] and guard.snapshots.target.step == 0  # discarded: the state may hold the bad update
    guard.snapshots.take(8, Trainables(model, opt, None))
    for _ in range(2):
        assert guard.snapshots.after_step(True, clean=True) is None
    assert guard.snapshots.after_step(True, clean=True).step == 8 and guard.snapshots.target.step == 8


def test_an_eval_within_the_band_verifies_sooner_and_one_outside_does_not():
    guard, model, opt = _guard()
    guard.snapshots.take(10, Trainables(model, opt, None))
    assert guard.snapshots.after_eval(5.0, best=3.0) is None  # more than 10% worse than the best
    assert guard.snapshots.after_eval(math.nan, best=3.0) is None
    assert guard.snapshots.after_eval(3.2, best=3.0).step == 10


def test_each_state_is_reported_verified_once(clean):
    """A snapshot taken at an evaluation step is verified by that evaluation, and the state the
    evaluation measured is that same snapshot: one event, not two."""
    verified = [e for e in _events(clean.run_dir) if e["kind"] == "verified"]
    states = [int(e["detail"].split("state of step ")[1].split(" ")[0]) for e in verified]
    assert any(e["cause"] == "eval" for e in verified) and len(states) == len(set(states)), verified
    guard, model, opt = _guard()
    parts = Trainables(model, opt, None)
    guard.snapshots.take(10, parts)
    assert guard.snapshots.after_eval(3.0, best=3.0).step == 10
    assert guard.snapshots.verify_current(10, parts) is None and guard.snapshots.target.step == 10


def test_a_state_over_the_bound_or_not_finite_is_never_a_snapshot():
    guard, model, opt = _guard()
    with torch.no_grad():
        model.weight[0, 0] = 2e6
    assert guard.snapshots.take(3, Trainables(model, opt, None)) is False and guard.snapshots.pending == []
    with torch.no_grad():
        model.weight[0, 0] = math.nan
    assert guard.snapshots.take(4, Trainables(model, opt, None), verified=True) is False and guard.snapshots.target is None


def test_rollback_restores_the_verified_weights_but_keeps_the_schedule():
    guard, model, opt = _guard()
    guard.snapshots.take(0, Trainables(model, opt, None), verified=True)
    saved = model.weight.detach().clone()
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + s))
    for _ in range(4):
        model(torch.ones(1, 3)).sum().backward()
        opt.step()
        sched.step()
        opt.zero_grad()
    lr_now = opt.param_groups[0]["lr"]
    guard.snapshots.take(4, Trainables(model, opt, sched))  # pending: not a rollback target
    assert guard.roll_back(5, Trainables(model, opt, sched)) == 0
    assert torch.equal(model.weight, saved) and opt.param_groups[0]["lr"] == lr_now and not opt.state
    assert guard.snapshots.pending == []


def test_no_verified_state_means_stop_not_rollback():
    guard, model, opt = _guard(max_anomalies=1)
    verdict = guard.check(30, math.nan, math.nan, False, [])
    assert verdict.stop and not verdict.rollback


def test_fp16_overflows_become_anomalies_once_they_persist():
    guard, model, opt = _guard(fp16_skips_in_a_row=3, max_anomalies=2, fp16_min_scale=1.0)
    guard.snapshots.take(0, Trainables(model, opt, None), verified=True)
    assert not guard.scaler_skipped(1, 2.0 ** 15).anomalies  # the scale settling: normal
    assert not guard.scaler_skipped(2, 2.0 ** 14).anomalies
    third = guard.scaler_skipped(3, 2.0 ** 13)
    assert [a["cause"] for a in third.anomalies] == ["fp16_overflow"] and third.skip
    guard.accept(1.0, 1.0, step=4)  # an applied step resets the run of skips
    assert guard.skips_in_a_row == 0
    low = guard.scaler_skipped(5, 0.5)  # below the floor: an anomaly at once
    assert low.anomalies and low.rollback  # the second anomaly in the window


def test_a_new_curriculum_phase_restarts_the_spike_windows():
    """Admitting new classes raises the loss for a good reason: not a spike (the ready classify
    config rolled back at each phase change before)."""
    guard, model, opt = _guard()
    guard.snapshots.take(0, Trainables(model, opt, None), verified=True)
    guard.enter_phase(1, 1)
    for step in range(1, 31):
        guard.check(step, 1.0 + 0.01 * (step % 3), 1.0, True, [])
        guard.accept(1.0 + 0.01 * (step % 3), 1.0)
    guard.enter_phase(2, 31)
    assert not guard.check(31, 2.5, 1.0, True, []).anomalies  # the windows restarted
    guard.enter_phase(2, 32)  # the same phase: nothing changes
    for step in range(32, 52):
        guard.check(step, 2.5, 1.0, True, [])
        guard.accept(2.5, 1.0)
    assert guard.check(52, 9.0, 1.0, True, []).anomalies  # a spike within the phase is still one


def test_sft_eval_loss_is_the_token_mean_whatever_the_batch_size(data):
    """Rows of unequal length: a mean of per-batch means moved with batch_size; the token mean
    does not (and equals the hand-computed mean over every supervised token)."""
    from dataguard.train.data import RunShards, run_split
    from dataguard.train.model.build import load_model
    from dataguard.train.prepare import encode_split

    torch.manual_seed(0)
    model, tokenizer = load_model("sft", "tiny-causal-lm")
    cfg = _cfg(data, Path("unused"), [])
    shards = RunShards.open(cfg.data, task="sft")
    train_idx, val_idx, _ = run_split(shards, cfg.eval_fraction, cfg.seed)
    _, val, _ = encode_split(cfg, shards, tokenizer, None, train_idx, val_idx, lambda _: None)
    kw = {"task": "sft", "pad_id": tokenizer.pad_token_id or 0, "offsets": None, "logit_adjustment": False,
          "device": torch.device("cpu")}
    by_size = [evaluate(model, val, batch_size=b, **kw)["loss"] for b in (1, 3, 7)]
    total, tokens = 0.0, 0
    with torch.no_grad():
        for i in range(len(val)):
            batch = val.collate([i], kw["pad_id"])
            logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
            labels = batch["labels"][:, 1:]
            mask = labels != -100
            tok = torch.nn.functional.cross_entropy(logits[:, :-1][mask], labels[mask], reduction="sum")
            total, tokens = total + float(tok), tokens + int(mask.sum())
    assert max(by_size) - min(by_size) < 1e-4 and abs(by_size[0] - total / tokens) < 1e-4, (by_size, total / tokens)


def test_a_tied_matrix_is_snapshotted_once_and_a_rollback_restores_both_names():
    from transformers import AutoModelForCausalLM, Qwen2Config

    config = Qwen2Config(vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=True)
    model = AutoModelForCausalLM.from_config(config)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    guard, _, _ = _guard()
    opt = torch.optim.AdamW(model.parameters())
    guard.snapshots.take(0, Trainables(model, opt, None), verified=True)
    names = set(guard.snapshots.target.model)
    assert ("lm_head.weight" in names) != ("model.embed_tokens.weight" in names)  # one copy, not two
    saved = model.lm_head.weight.detach().clone()
    with torch.no_grad():
        model.model.embed_tokens.weight.add_(1.0)
    guard.roll_back(1, Trainables(model, opt, None))
    assert torch.equal(model.lm_head.weight, saved) and model.lm_head.weight is model.model.embed_tokens.weight
