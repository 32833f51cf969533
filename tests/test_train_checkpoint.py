"""Checkpoints: complete round trip, atomicity, rotation, refusal of non-finite state, key layouts."""

from __future__ import annotations

import random
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from dataguard.train.checkpoint import (
    COMPLETE,
    OWNER,
    CheckpointError,
    capture_rng,
    complete_checkpoints,
    latest_checkpoint,
    load_checkpoint,
    restore_rng,
    rotate,
    save_checkpoint,
)
from dataguard.train.convert import ConvertError, load_state_into
from dataguard.train.model.build import apply_lora, load_model
from dataguard.train.optim.optimizer import build_optimizer, warmup_cosine

CFG = SimpleNamespace(lr=1e-3, weight_decay=0.01, lr_multipliers=None, lr_patterns=None)


def _trained(steps: int = 2, lora: bool = False):
    model, tok = load_model("sft", "tiny-causal-lm")
    if lora:
        model, _ = apply_lora(model, {"r": 4}, "sft")
    opt, _ = build_optimizer(model, CFG)
    sched = warmup_cosine(opt, 10, 2)
    gen = torch.Generator().manual_seed(0)
    for _ in range(steps):
        ids = torch.randint(0, 250, (2, 10), generator=gen)
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        sched.step()
        opt.zero_grad()
    return model, tok, opt, sched


def _save(run, step, model, opt, sched, **kw):
    return save_checkpoint(run, step, model, opt, sched, None, {"epoch": 0, "offset": step}, capture_rng(),
                           [{"step": step, "loss": 1.0}], {"classes": ["a"]}, {"task": "sft"}, **kw)


def test_round_trip_restores_everything(tmp_path):
    model, tok, opt, sched = _trained()
    path = _save(tmp_path, 2, model, opt, sched, tokenizer=tok)
    assert path.name == "step-000002" and (path / COMPLETE).is_file()
    assert (path / "model.safetensors").is_file() and (path / "tokenizer.json").is_file()
    fresh, _ = load_model("sft", "tiny-causal-lm")
    opt2, _ = build_optimizer(fresh, CFG)
    sched2 = warmup_cosine(opt2, 10, 2)
    loaded = load_checkpoint(path, fresh, opt2, sched2)
    assert loaded.step == 2 and loaded.sampler_state == {"epoch": 0, "offset": 2}
    assert loaded.history == [{"step": 2, "loss": 1.0}] and loaded.label_map == {"classes": ["a"]}
    for (n, a), b in zip(model.state_dict().items(), fresh.state_dict().values(), strict=True):
        assert torch.equal(a, b), n
    assert sched2.state_dict()["last_epoch"] == 2
    assert opt2.param_groups[0]["lr"] == opt.param_groups[0]["lr"]
    for s1, s2 in zip(opt.state.values(), opt2.state.values(), strict=True):
        assert torch.equal(s1["exp_avg"], s2["exp_avg"]) and torch.equal(s1["exp_avg_sq"], s2["exp_avg_sq"])


def test_rng_states_round_trip(tmp_path):
    random.seed(1)
    np.random.seed(1)
    torch.manual_seed(1)
    state = capture_rng()
    torch.save(state, tmp_path / "rng.pt")
    expected = (random.random(), np.random.rand(), torch.rand(2))
    restore_rng(torch.load(tmp_path / "rng.pt", weights_only=True))
    got = (random.random(), np.random.rand(), torch.rand(2))
    assert got[0] == expected[0] and got[1] == expected[1] and torch.equal(got[2], expected[2])


def test_incomplete_checkpoints_are_ignored_and_cleaned(tmp_path):
    model, _, opt, sched = _trained(1)
    _save(tmp_path, 1, model, opt, sched)
    root = tmp_path / "checkpoints"
    killed = root / "step-000005.tmp-99999"  # a save killed before its rename: owner file, no COMPLETE
    killed.mkdir()
    (killed / OWNER).write_text("written by dataguard train\n")
    (root / "step-000007").mkdir()  # a folder without any dataguard marker: not ours
    (root / "step-000008.tmp-99999").mkdir()  # named like a temp folder, but not ours either
    assert latest_checkpoint(tmp_path).name == "step-000001"
    with pytest.raises(CheckpointError, match="not a complete checkpoint"):
        load_checkpoint(root / "step-000007")
    rotate(tmp_path, 2)
    # Only what dataguard provably wrote is cleaned; a folder it did not write is never deleted.
    assert sorted(p.name for p in root.iterdir()) == ["step-000001", "step-000007", "step-000008.tmp-99999"]


def test_rotation_keeps_last_k_newest_and_best(tmp_path):
    model, _, opt, sched = _trained(1)
    for step in (1, 2, 3, 4, 5):
        _save(tmp_path, step, model, opt, sched, keep=2, protect=["step-000002"])
    assert [p.name for p in complete_checkpoints(tmp_path)] == ["step-000002", "step-000004", "step-000005"]
    rotate(tmp_path, 1)  # never the newest, even at keep=1
    assert [p.name for p in complete_checkpoints(tmp_path)] == ["step-000005"]


def test_refuses_non_finite_state(tmp_path):
    model, _, opt, sched = _trained(1)
    with torch.no_grad():
        next(model.parameters())[0, 0] = float("inf")
    with pytest.raises(CheckpointError, match="not finite"):
        _save(tmp_path, 1, model, opt, sched)
    assert latest_checkpoint(tmp_path) is None
    assert not any((tmp_path / "checkpoints").glob("step-000001*"))


def test_lora_checkpoint_holds_only_the_adapter(tmp_path):
    model, _, opt, sched = _trained(2, lora=True)
    path = _save(tmp_path, 2, model, opt, sched)
    assert (path / "adapter_model.safetensors").is_file() and not (path / "model.safetensors").exists()
    fresh, _ = load_model("sft", "tiny-causal-lm")
    fresh, _ = apply_lora(fresh, {"r": 4}, "sft")
    load_checkpoint(path, fresh)
    for (n, a), b in zip(model.state_dict().items(), fresh.state_dict().values(), strict=True):
        assert torch.equal(a, b), n


def test_either_key_layout_loads_into_either_model():
    plain, _ = load_model("sft", "tiny-causal-lm", seed=3)
    peft_model, _ = apply_lora(load_model("sft", "tiny-causal-lm")[0], {"r": 4}, "sft")
    prefixed = {f"base_model.model.{k}": v for k, v in plain.state_dict().items()}
    target, _ = load_model("sft", "tiny-causal-lm")
    load_state_into(target, prefixed)  # PEFT-prefixed keys into a plain model
    assert all(torch.equal(a, b) for a, b in zip(plain.state_dict().values(), target.state_dict().values(),
                                                  strict=True))
    load_state_into(peft_model, plain.state_dict(), strict=False)  # plain keys into a peft model
    base = peft_model.state_dict()["base_model.model.model.layers.0.self_attn.q_proj.base_layer.weight"]
    assert torch.equal(base, plain.state_dict()["model.layers.0.self_attn.q_proj.weight"])
    bad = dict(plain.state_dict())
    bad["model.extra.weight"] = torch.zeros(1)
    del bad["lm_head.weight"]
    with pytest.raises(ConvertError, match=r"model\.extra\.weight.*missing.*lm_head\.weight"):
        load_state_into(target, bad)
