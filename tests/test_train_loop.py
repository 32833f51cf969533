"""The training loop end to end on CPU: loss falls, exact resume (also after kill -9),
skipped non-finite steps, evaluation / early stopping, LoRA on MiniLM and its conversion."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dataguard.config_yaml import ConfigError
from dataguard.io.readers import InputSpec
from dataguard.pipeline import Pipeline
from dataguard.train import loop
from dataguard.train.checkpoint import complete_checkpoints, latest_checkpoint, read_weights
from dataguard.train.config import load_train_config
from dataguard.train.loop import Trainer, TrainError

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def sft_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("sft") / "out"
    Pipeline([], workers=1).run([InputSpec(path=str(REPO / "sample_data/alpaca_en_demo.json"))], out)
    return out


@pytest.fixture(scope="module")
def cls_run(tmp_path_factory) -> Path:
    from dataguard.config import load_config

    folder = tmp_path_factory.mktemp("cls")
    spec = folder / "p.yaml"
    spec.write_text(
        "inputs:\n"
        f"  - {{path: {REPO / 'sample_data/banking77/train.csv'}, name: b77, format: labelled_text, "
        "aliases: {category: label}}\n"
        f"output: {folder / 'out'}\n"
        "stages:\n  - longtail: {tau: 1.0, phases: [0.5, 0.8], tail_boost: 2.0, seed: 0}\n")
    config = load_config(spec)
    config.pipeline(progress=False, workers=1).run(config.inputs, config.output)
    return folder / "out"


def _sft(data: Path, out: Path, **kw):
    values = {"task": "sft", "model": "tiny-causal-lm", "data": str(data), "output": str(out), "max_steps": 6,
              "batch_size": 2, "lr": 3e-3, "max_length": 96, "eval_every": 3, "save_every": 3,
              "tensorboard": False, "log_every": 1}
    values.update(kw)
    return load_train_config(values)


def _cls(data: Path, out: Path, **kw):
    values = {"task": "classify", "model": "tiny-classifier", "data": str(data), "output": str(out),
              "max_steps": 6, "batch_size": 8, "grad_accum": 2, "lr": 2e-3, "max_length": 32, "eval_every": 3,
              "save_every": 3, "tensorboard": False, "class_balanced": True, "eval_fraction": 0.03}
    values.update(kw)
    return load_train_config(values)


def _same_weights(a: Path, b: Path) -> None:
    wa, wb = read_weights(latest_checkpoint(a)), read_weights(latest_checkpoint(b))
    assert wa.keys() == wb.keys()
    for key in wa:
        assert torch.equal(wa[key], wb[key]), key


def test_sft_loss_falls_and_records_the_run(sft_run, tmp_path):
    cfg = _sft(sft_run, tmp_path / "run", max_steps=16, batch_size=4, eval_every=8, save_every=8,
               tensorboard=True, keep_checkpoints=1)
    result = Trainer(cfg).fit()
    losses = [h["loss"] for h in result.history]
    assert result.steps == 16 and len(losses) == 16 and all(math.isfinite(v) for v in losses)
    assert sum(losses[-3:]) / 3 < sum(losses[:3]) / 3 - 0.5, losses
    run = tmp_path / "run"
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [x for x in lines if "loss" in x]
    assert [x["step"] for x in steps] == list(range(1, 17))
    assert {"lr", "grad_norm", "tokens_per_s", "tokens"} <= set(steps[0])
    assert steps[0]["lr"] == pytest.approx(1e-7)  # warmup from 1e-7, counted in optimizer steps
    assert any("eval_loss" in x for x in lines)
    record = json.loads((run / "run.json").read_text())
    assert record["param_groups"] and record["total_steps"] == 16 and record["max_length"] == 96
    assert "embeddings" in (run / "param_groups.txt").read_text()
    assert any((run / "tensorboard").iterdir())
    assert result.last_eval and 0.0 <= result.last_eval["accuracy"] <= 1.0
    assert latest_checkpoint(run).name == "step-000016"


def test_exact_resume_classify_with_curriculum_and_dropout(cls_run, tmp_path):
    straight = Trainer(_cls(cls_run, tmp_path / "a")).fit()
    Trainer(_cls(cls_run, tmp_path / "b")).fit(stop_after=3)
    assert latest_checkpoint(tmp_path / "b").name == "step-000003"
    with pytest.raises(TrainError, match="already has checkpoints"):
        Trainer(_cls(cls_run, tmp_path / "b")).fit()
    resumed = Trainer(_cls(cls_run, tmp_path / "b")).fit(resume=True)
    assert resumed.steps == straight.steps == 6
    assert [h["loss"] for h in resumed.history] == [h["loss"] for h in straight.history]
    _same_weights(tmp_path / "a", tmp_path / "b")
    assert json.loads((tmp_path / "b" / "label_map.json").read_text())["classes"]
    metrics = [json.loads(x) for x in (tmp_path / "b" / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in metrics if "loss" in x] == list(range(1, 7))
    # the manifest's schedule [0.25, 0.5] of 6 optimizer steps: steps 1-2, step 3, steps 4-6
    assert [x["phase"] for x in metrics if "loss" in x] == [1, 1, 2, 3, 3, 3]


_KILLER = """
import os, signal, sys
from dataguard.train.config import load_train_config
from dataguard.train.loop import Trainer
cfg = load_train_config(dict(task="sft", model="tiny-causal-lm", data=sys.argv[1], output=sys.argv[2],
    max_steps=6, batch_size=2, lr=3e-3, max_length=96, eval_every=3, save_every=2, tensorboard=False))
def kill(step):
    if step == 4:
        os.kill(os.getpid(), signal.SIGKILL)
Trainer(cfg, on_step=kill).fit()
"""


def test_sigkill_after_checkpoint_then_resume_is_bitwise_identical(sft_run, tmp_path):
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.run([sys.executable, "-c", _KILLER, str(sft_run), str(tmp_path / "killed")],
                          env=env, cwd=REPO, capture_output=True, timeout=300)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()[-2000:]
    assert latest_checkpoint(tmp_path / "killed").name == "step-000004"
    Trainer(_sft(sft_run, tmp_path / "killed", save_every=2)).fit(resume=True)
    Trainer(_sft(sft_run, tmp_path / "straight", save_every=2)).fit()
    _same_weights(tmp_path / "straight", tmp_path / "killed")


def test_non_finite_loss_skips_the_step(sft_run, tmp_path, monkeypatch):
    trainer = Trainer(_sft(sft_run, tmp_path / "run", max_steps=3, eval_every=10, save_every=10))
    real = Trainer._loss
    calls = {"n": 0}

    def poisoned(self, *args):
        calls["n"] += 1
        out = real(self, *args)
        return dataclasses.replace(out, loss=out.loss * float("nan")) if calls["n"] == 2 else out

    monkeypatch.setattr(Trainer, "_loss", poisoned)
    result = trainer.fit()
    assert result.skipped_steps == 1 and [h["skipped"] for h in result.history] == [False, True, False]
    weights = read_weights(latest_checkpoint(tmp_path / "run"))
    assert all(torch.isfinite(w).all() for w in weights.values())
    # the schedule counts applied optimizer steps only: step 3 has the lr of step 2
    assert result.history[2]["lr"] == result.history[1]["lr"]


def test_early_stopping_keeps_the_best_checkpoint(sft_run, tmp_path, monkeypatch):
    evals = iter([3.0, 2.0, 2.5, 2.6, 2.7, 2.8])

    def fake_eval(*args, **kwargs):
        return {"loss": next(evals), "accuracy": 0.0}

    monkeypatch.setattr(loop, "evaluate", fake_eval)
    cfg = _sft(sft_run, tmp_path / "run", max_steps=6, eval_every=1, save_every=100, keep_checkpoints=1,
               early_stopping_patience=2)
    result = Trainer(cfg).fit()
    assert result.stopped_early and result.steps == 4
    assert result.best_checkpoint == "step-000002" and result.best_metric == 2.0
    names = sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir())
    assert names == ["step-000002", "step-000004"]
    assert json.loads((tmp_path / "run" / "best.json").read_text())["step"] == 2


def test_sft_max_length_from_length_cap_warns_on_other_tokenizer(tmp_path):
    from dataguard.config import load_config

    spec = tmp_path / "p.yaml"
    spec.write_text(f"inputs:\n  - {{path: {REPO / 'sample_data/alpaca_en_demo.json'}, name: alpaca}}\n"
                    f"output: {tmp_path / 'out'}\nstages:\n  - length: {{percentile: 90, factor: 1.5}}\n")
    config = load_config(spec)
    config.pipeline(progress=False, workers=1).run(config.inputs, config.output)
    cfg = _sft(tmp_path / "out", tmp_path / "run", max_length=None, max_steps=1, eval_every=10)
    with pytest.warns(UserWarning, match="length cap was counted with tokenizer"):
        Trainer(cfg).fit()
    record = json.loads((tmp_path / "run" / "run.json").read_text())
    assert record["max_length"] == json.loads((tmp_path / "out" / "manifest.json").read_text())[
        "training"]["length"]["cap"]


def test_config_errors_before_training(sft_run, tmp_path):
    with pytest.raises(TrainError, match="fp16 needs a CUDA device"):
        Trainer(_sft(sft_run, tmp_path / "a", precision="fp16", device="cpu")).fit()


def test_bf16_lora_packing_and_gradient_checkpointing_train(sft_run, tmp_path):
    cfg = _sft(sft_run, tmp_path / "run", max_steps=2, precision="bf16", eval_every=10, packing=True,
               max_length=192, gradient_checkpointing=True, lora={"r": 4}, grad_variance_scaling=True)
    result = Trainer(cfg).fit()
    assert result.steps == 2 and all(math.isfinite(h["loss"]) for h in result.history)
    ckpt = latest_checkpoint(tmp_path / "run")
    assert (ckpt / "adapter_model.safetensors").is_file()
    assert json.loads((ckpt / "state.json").read_text())["extra"]["grad_variance"]["count"] == 2


def test_minilm_lora_classify_then_convert_round_trip(cls_run, tmp_path):
    from transformers import AutoModelForSequenceClassification

    from dataguard.train.convert import convert_checkpoint, load_run_model

    cfg = _cls(cls_run, tmp_path / "run", model="minilm", max_steps=2, grad_accum=1, lr=5e-3, eval_every=2,
               save_every=2, lora={"r": 4, "targets": ["query", "value"]}, logit_adjustment=False,
               eval_fraction=0.02)
    result = Trainer(cfg).fit()
    assert result.last_eval and "balanced_accuracy" in result.last_eval
    record = json.loads((tmp_path / "run" / "run.json").read_text())
    assert record["lora"]["trainable_params"] > 0 and record["lora"]["targets"] == ["query", "value"]
    ckpt = latest_checkpoint(tmp_path / "run")
    assert (ckpt / "adapter_model.safetensors").is_file() and not (ckpt / "model.safetensors").exists()
    lora_model = load_run_model(ckpt, task="classify", model_spec="minilm").eval()
    out = convert_checkpoint(tmp_path / "run", tmp_path / "merged")
    merged = AutoModelForSequenceClassification.from_pretrained(str(out), local_files_only=True).eval()
    ids = torch.randint(100, 2000, (3, 12))
    with torch.no_grad():
        a = lora_model(input_ids=ids).logits
        b = merged(input_ids=ids).logits
    assert torch.allclose(a, b, atol=1e-5), (a - b).abs().max()
    assert merged.config.id2label[0] == json.loads((tmp_path / "run" / "label_map.json").read_text())["classes"][0]


def test_cli_train_resume_and_convert(sft_run, tmp_path, capsys):
    from transformers import AutoModelForCausalLM

    from dataguard.cli import main

    spec = tmp_path / "train.yaml"
    spec.write_text(f"task: sft\nmodel: tiny-causal-lm\ndata: {sft_run}\noutput: {tmp_path / 'run'}\n"
                    "max_steps: 4\nbatch_size: 2\nlr: 0.003\nmax_length: 96\ntensorboard: false\n"
                    "save_every: 2\nlora: {r: 4, alpha: 8}\n")
    assert main(["train", str(spec), "--quiet", "--max-steps", "4"]) == 0
    assert "steps 4/4" in capsys.readouterr().out
    assert main(["train", str(spec), "--quiet"]) == 1
    assert "already has checkpoints" in capsys.readouterr().err
    assert main(["train", str(spec), "--quiet", "--resume", "--max-steps", "6"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "max_steps 4 -> 6" in err
    assert main(["train", str(spec), "--quiet", "--resume"]) == 0  # already finished: nothing to do
    assert main(["train", str(tmp_path / "run"), "--quiet", "--resume"]) == 0  # settings from the run
    assert main(["train", str(tmp_path / "run")]) == 2
    assert "pass a config file, or --resume" in capsys.readouterr().err
    bad = tmp_path / "bad.yaml"
    bad.write_text("task: sft\nmodel: tiny-causal-lm\ndata: x\nlr: -1\n")
    assert main(["train", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("dataguard: config error:") and "lr" in err
    assert main(["convert", str(tmp_path / "run"), str(tmp_path / "merged")]) == 0
    merged = AutoModelForCausalLM.from_pretrained(str(tmp_path / "merged"), local_files_only=True)
    assert not any("lora" in n for n, _ in merged.named_parameters())
    assert main(["convert", str(tmp_path / "nothing"), str(tmp_path / "m2")]) == 1
    assert "neither a checkpoint nor a run folder" in capsys.readouterr().err


def test_training_never_writes_into_a_users_folder(tmp_path: Path) -> None:
    data = tmp_path / "shards"
    Pipeline([], workers=1).run([InputSpec(path=REPO / "sample_data" / "alpaca_en_demo.json")], data)
    user = tmp_path / "mine"
    user.mkdir()
    (user / "run.json").write_text("my own run.json")
    cfg = load_train_config({"task": "sft", "model": "tiny-causal-lm", "data": str(data), "output": str(user),
                             "max_steps": 1, "batch_size": 2, "max_length": 128, "tensorboard": False})
    with pytest.raises(TrainError, match="not empty"):
        Trainer(cfg).fit()
    assert (user / "run.json").read_text() == "my own run.json"
    assert sorted(p.name for p in user.iterdir()) == ["run.json"]


def test_fp8_trains_through_torchao_and_refuses_lora(sft_run, tmp_path):
    """precision fp8: accelerate's torchao recipe swaps the inner linear layers for float8
    ones (emulated on CPU); the loss falls, the layers' weights move, checkpoints save plain
    tensors, and LoRA is refused up front."""
    cfg = _sft(sft_run, tmp_path / "fp8", precision="fp8", max_steps=8, batch_size=4, save_every=4,
               keep_checkpoints=2, eval_every=8)
    result = Trainer(cfg).fit()
    losses = [h["loss"] for h in result.history]
    assert result.steps == 8 and losses[-1] < losses[0] - 0.3, losses
    notes = json.loads((tmp_path / "fp8" / "run.json").read_text())["notes"]
    converted = [n for n in notes if n.startswith("fp8:")]
    assert converted and int(converted[0].split()[1]) > 0, notes
    assert any("emulated" in n for n in notes)
    first, last = (read_weights(p) for p in complete_checkpoints(tmp_path / "fp8"))
    mlp = next(k for k in first if "mlp" in k and k.endswith("weight"))
    assert not torch.equal(first[mlp], last[mlp]) and first[mlp].dtype == torch.float32
    with pytest.raises(ConfigError, match="precision: fp8 does not combine with lora"):  # at load, naming the key
        _sft(sft_run, tmp_path / "fp8-lora", precision="fp8", lora={"r": 4})


def test_a_resume_on_rebuilt_shards_is_refused(tmp_path):
    """The sampler's position indexes rows: resuming on other shards at the same path would mix
    two datasets in one run. Checkpoints record the shards' fingerprint; such a resume is refused
    in one line, and the same shards still resume."""
    src = json.loads((REPO / "sample_data/alpaca_en_demo.json").read_text())
    (tmp_path / "a.json").write_text(json.dumps(src[:120]))
    data = tmp_path / "data"
    Pipeline([], workers=1).run([InputSpec(path=str(tmp_path / "a.json"), name="a")], data)
    Trainer(_sft(data, tmp_path / "run", save_every=2)).fit(stop_after=2)
    from dataguard.train.data import RunShards

    state = json.loads((latest_checkpoint(tmp_path / "run") / "state.json").read_text())
    assert state["extra"]["data_fingerprint"] == RunShards.open(data, task="sft").fingerprint
    (tmp_path / "a.json").write_text(json.dumps(src[:100]))  # the same input, fewer rows, rebuilt in place
    Pipeline([], workers=1).run([InputSpec(path=str(tmp_path / "a.json"), name="a")], data, fresh=True)
    with pytest.raises(TrainError, match=r"the shards in .*data changed since step-000002 was saved") as err:
        Trainer(_sft(data, tmp_path / "run", save_every=2)).fit(resume=True)
    assert "\n" not in str(err.value)
    (tmp_path / "a.json").write_text(json.dumps(src[:120]))  # the rows it trained on: resumes
    Pipeline([], workers=1).run([InputSpec(path=str(tmp_path / "a.json"), name="a")], data, fresh=True)
    assert Trainer(_sft(data, tmp_path / "run", save_every=2)).fit(resume=True).steps == 6


def test_a_resume_on_the_same_shards_with_other_logit_offsets_is_refused(tmp_path):
    """The loss reads the manifest's logit offsets beside the shards: a longtail stage re-run
    with another ``tau`` writes byte-identical shards but another loss, so the resume is refused
    too (before, it mixed the two losses into weights that match neither run)."""
    from banking_slice import banking_rows, banking_shards

    from dataguard.stages.longtail import LongTailStage

    rows = banking_rows(("card_arrival", "exchange_rate", "pin_blocked"), 30)[:70]  # 30 / 30 / 10
    data = banking_shards(tmp_path, rows)
    source = InputSpec(path=str(tmp_path / "bank.csv"), format="labelled_text", aliases={"category": "label"})

    def rebuild(tau: float) -> bytes:
        Pipeline([LongTailStage(tau=tau, weighting="none")], workers=1).run([source], data, fresh=True)
        return b"".join(p.read_bytes() for p in sorted((data / "data").glob("*.arrow")))

    shards = rebuild(1.0)
    cfg = load_train_config({"task": "classify", "model": "tiny-classifier", "data": str(data),
                             "output": str(tmp_path / "run"), "max_steps": 4, "batch_size": 16, "save_every": 2,
                             "eval_every": 4, "logit_adjustment": True, "tensorboard": False, "threads": 1})
    Trainer(cfg, progress=False).fit(stop_after=2)
    assert rebuild(3.0) == shards  # the same rows, other offsets
    with pytest.raises(TrainError, match=r"the shards in .* changed since step-000002 was saved"):
        Trainer(cfg, progress=False).fit(resume=True)
    rebuild(1.0)
    assert Trainer(cfg, progress=False).fit(resume=True).steps == 4
