"""The frozen base in bf16 under LoRA (adapters and a new head in fp32), full fine-tuning kept
in fp32, QLoRA refused off CUDA in one line, and `convert` writing the dtype the run loaded."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from dataguard.config_yaml import ConfigError
from dataguard.train import prepare
from dataguard.train.checkpoint import latest_checkpoint
from dataguard.train.config import load_train_config
from dataguard.train.convert import convert_checkpoint
from dataguard.train.errors import TrainError
from dataguard.train.loop import Trainer
from dataguard.train.model.base_dtype import base_dtype, convert_dtype

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def sft_data(alpaca_shards) -> Path:
    return alpaca_shards


def _cfg(data: Path, out: Path, **kw):
    values = {"task": "sft", "model": "tiny-causal-lm", "data": str(data), "output": str(out), "max_steps": 4,
              "batch_size": 2, "lr": 3e-3, "max_length": 64, "eval_every": 2, "save_every": 2,
              "tensorboard": False, "device": "cpu"}
    values.update(kw)
    return load_train_config(values)


def test_the_rule():
    assert base_dtype("bf16", {"r": 8}) == torch.bfloat16
    assert base_dtype("bf16", None) == torch.float32  # full fine-tuning keeps fp32 master weights
    assert base_dtype("fp32", {"r": 8}) == torch.float32
    assert base_dtype("fp32", {"r": 8, "quantize": "4bit"}) == torch.bfloat16  # 4-bit merges into bf16
    assert convert_dtype({"precision": "bf16", "lora": {"r": 8}}) == torch.bfloat16
    assert convert_dtype({"precision": "bf16", "lora": {"r": 8}}, "fp32") == torch.float32


def test_bf16_lora_holds_the_base_in_bf16_trains_resumes_and_converts_in_bf16(sft_data, tmp_path):
    seen = {}

    def on_step(trainer_step: int) -> None:
        if trainer_step == 1:
            model = trainer.trainables.model  # the unwrapped model the trainer holds
            seen["base"] = {p.dtype for n, p in model.named_parameters() if not p.requires_grad}
            seen["trained"] = {p.dtype for n, p in model.named_parameters() if p.requires_grad}

    trainer = Trainer(_cfg(sft_data, tmp_path / "run", precision="bf16", lora={"r": 4}), progress=False,
                      on_step=on_step)
    result = trainer.fit(stop_after=2)
    assert result.steps == 2
    Trainer(_cfg(sft_data, tmp_path / "run", precision="bf16", lora={"r": 4}), progress=False).fit(resume=True)
    assert seen["base"] == {torch.bfloat16}
    assert seen["trained"] == {torch.float32}  # peft's adapters are fp32 under the bf16 base
    history = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert all(torch.isfinite(torch.tensor(h["loss"])) for h in history if "loss" in h)
    assert latest_checkpoint(tmp_path / "run").name == "step-000004"

    out = convert_checkpoint(tmp_path / "run", tmp_path / "model", "newest")
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        dtypes = {f.get_slice(k).get_dtype() for k in f.keys()}
    assert dtypes == {"BF16"}
    from dataguard.cli import main  # the override, as a user gives it

    assert main(["convert", str(tmp_path / "run"), str(tmp_path / "model32"), "--checkpoint", "newest",
                 "--dtype", "fp32"]) == 0
    with safe_open(str(tmp_path / "model32" / "model.safetensors"), "pt") as f:
        assert {f.get_slice(k).get_dtype() for k in f.keys()} == {"F32"}
    assert main(["convert", str(tmp_path / "run"), str(tmp_path / "model8"), "--dtype", "int8"]) == 2  # usage
    assert not (tmp_path / "model8").exists()


def test_full_fine_tuning_under_bf16_keeps_fp32_weights(sft_data, tmp_path, monkeypatch):
    cpuinfo = tmp_path / "cpuinfo"  # a CPU without bf16 units (like this CI box): the run says so
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu sse2 avx avx2 fma\n")
    monkeypatch.setattr(prepare, "CPUINFO", cpuinfo)
    with pytest.warns(UserWarning, match="bf16 on this CPU is emulated"):
        Trainer(_cfg(sft_data, tmp_path / "run", precision="bf16", max_steps=2), progress=False).fit()
    assert any("emulated" in n for n in json.loads((tmp_path / "run" / "run.json").read_text())["notes"])
    out = convert_checkpoint(tmp_path / "run", tmp_path / "model", "newest")
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        assert {f.get_slice(k).get_dtype() for k in f.keys()} == {"F32"}


def test_cpu_bf16_units_are_read_from_cpuinfo(tmp_path, monkeypatch):
    cpuinfo = tmp_path / "cpuinfo"
    monkeypatch.setattr(prepare, "CPUINFO", cpuinfo)
    assert prepare.cpu_lacks_bf16() is False  # unreadable: no warning rather than a wrong one
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512_bf16\n")
    assert prepare.cpu_lacks_bf16() is False
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu avx2 amx_tile amx_bf16\n")
    assert prepare.cpu_lacks_bf16() is False
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu avx2 avx512f\n")
    assert prepare.cpu_lacks_bf16() is True
    cpuinfo.write_text("processor\t: 0\n")  # no flags line (not x86): unknown, no warning
    assert prepare.cpu_lacks_bf16() is False


def test_qlora_is_refused_off_cuda_in_one_line_before_reading_shards(tmp_path):
    cfg = _cfg(tmp_path / "no-such-data", tmp_path / "run", lora={"r": 4, "quantize": "4bit"})
    with pytest.raises(TrainError) as err:
        Trainer(cfg, progress=False).fit()
    text = str(err.value)
    assert "\n" not in text and "CUDA" in text and "quantize" in text


def test_a_bad_quantize_value_names_the_key(tmp_path):
    spec = tmp_path / "t.yaml"
    spec.write_text("task: sft\nmodel: tiny-causal-lm\ndata: d\noutput: o\nlora:\n  r: 4\n  quantize: 8bit\n")
    with pytest.raises(ConfigError) as err:
        load_train_config(spec)
    assert "t.yaml:7" in str(err.value) and "lora.quantize" in str(err.value)
