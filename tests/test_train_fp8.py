"""FP8 training pads the inner dimension of every float8 GEMM to a multiple of 16, whatever the
micro-batch's token count: FP8 tensor cores refuse anything else (pytorch/ao#3111). On CPU
torchao runs the same float8 code path emulated; the shapes it hands to ``torch._scaled_mm``
are the shapes a GPU kernel would get."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from dataguard.train.config import load_train_config
from dataguard.train.loop import Trainer

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def data(alpaca_shards) -> Path:
    return alpaca_shards


def test_every_float8_gemm_gets_inner_dimensions_in_multiples_of_16(data, tmp_path, monkeypatch):
    calls: list[tuple[tuple[int, ...], tuple[int, ...]]] = []
    widths: list[int] = []
    real_mm = torch._scaled_mm

    def recording_scaled_mm(a, b, *args, **kwargs):  # observe the kernel's operands, then run it
        calls.append((tuple(a.shape), tuple(b.shape)))
        return real_mm(a, b, *args, **kwargs)

    from torchao.float8 import float8_ops

    real_pad = float8_ops.pad_tensor_for_matmul

    def recording_pad(tensor, dims):  # the sizes before padding
        widths.append(int(tensor.shape[dims if isinstance(dims, int) else dims[0]]))
        return real_pad(tensor, dims=dims)

    monkeypatch.setattr(torch, "_scaled_mm", recording_scaled_mm)
    monkeypatch.setattr(float8_ops, "pad_tensor_for_matmul", recording_pad)
    cfg = load_train_config({
        "task": "sft", "model": "tiny-causal-lm", "data": str(data), "output": str(tmp_path / "run"),
        "precision": "fp8", "max_steps": 2, "batch_size": 3, "max_length": 95, "lr": 1e-3,
        "eval_every": 10, "save_every": 10, "tensorboard": False, "device": "cpu"})
    trainer = Trainer(cfg, progress=False)
    result = trainer.fit()
    assert result.steps == 2 and calls
    for a, b in calls:
        assert a[1] == b[0] and a[1] % 16 == 0, (a, b)
    # the weight-gradient GEMMs' inner dimension is the micro-batch's token count: some were
    # not multiples of 16 before padding (3 rows x any width), none after
    assert any(w % 16 for w in widths), sorted(set(widths))
    token_dims = {a[1] for a, _ in calls} - {64, 128}  # the tiny model's hidden and MLP widths
    assert token_dims and all(d % 16 == 0 for d in token_dims), token_dims

