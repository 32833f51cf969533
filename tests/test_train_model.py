"""Model loading, module kinds, parameter groups, LoRA checks, schedule and clipping."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from dataguard.train.model.build import (
    ModelError,
    apply_lora,
    describe_groups,
    load_model,
    module_kind,
    param_groups,
)
from dataguard.train.optim.optimizer import (
    ClipResult,
    GradVarianceScaler,
    build_optimizer,
    clip_gradients,
    lr_factor,
    warmup_cosine,
    warmup_steps_for,
)


def _cfg(**kw):
    base = dict(lr=1e-3, weight_decay=0.1, lr_multipliers={"embeddings": 0.1, "attention": 1.0, "mlp": 1.5,
                                                            "other": 1.0, "head": 1.0},
                lr_patterns={}, max_grad_norm=1.0,
                clip_rules={"embeddings": {"value": 0.5}, "attention": {"norm": 1.0}})
    base.update(kw)
    return SimpleNamespace(**base)


@pytest.fixture(scope="module")
def tiny_lm():
    return load_model("sft", "tiny-causal-lm")


@pytest.mark.parametrize("name,kind", [
    # Llama / Qwen / Mistral
    ("model.embed_tokens.weight", "embeddings"),
    ("model.layers.0.self_attn.q_proj.weight", "attention"),
    ("model.layers.0.self_attn.o_proj.bias", "attention"),
    ("model.layers.0.mlp.gate_proj.weight", "mlp"),
    ("model.layers.0.input_layernorm.weight", "norm"),
    ("model.norm.weight", "norm"),
    ("lm_head.weight", "head"),
    # GPT-2
    ("transformer.wte.weight", "embeddings"),
    ("transformer.wpe.weight", "embeddings"),
    ("transformer.h.0.attn.c_attn.weight", "attention"),
    ("transformer.h.0.mlp.c_fc.weight", "mlp"),
    ("transformer.h.0.ln_1.weight", "norm"),
    ("transformer.ln_f.bias", "norm"),
    # BERT
    ("bert.embeddings.word_embeddings.weight", "embeddings"),
    ("bert.embeddings.LayerNorm.weight", "norm"),
    ("bert.encoder.layer.0.attention.self.query.weight", "attention"),
    ("bert.encoder.layer.0.attention.output.dense.weight", "attention"),
    ("bert.encoder.layer.0.attention.output.LayerNorm.bias", "norm"),
    ("bert.encoder.layer.0.intermediate.dense.weight", "mlp"),
    ("bert.encoder.layer.0.output.dense.weight", "mlp"),
    ("classifier.weight", "head"),
    ("score.weight", "head"),
    ("bert.pooler.dense.weight", "other"),
    # peft-wrapped names keep their kind
    ("base_model.model.model.layers.1.self_attn.v_proj.lora_A.default.weight", "attention"),
])
def test_module_kind_by_architecture(name, kind):
    assert module_kind(name) == kind


def test_module_kind_uses_module_type_for_unnamed_norms():
    assert module_kind("blocks.0.pre", nn.LayerNorm(4)) == "norm"


def test_param_groups_lr_multipliers_and_no_decay(tiny_lm):
    model, _ = tiny_lm
    groups = param_groups(model, _cfg())
    by_name = {n: g for g in groups for n in g["names"]}
    assert by_name["model.embed_tokens.weight"]["lr"] == pytest.approx(1e-4)
    assert by_name["model.embed_tokens.weight"]["weight_decay"] == 0.0
    assert by_name["model.layers.0.self_attn.q_proj.weight"]["lr"] == pytest.approx(1e-3)
    assert by_name["model.layers.0.self_attn.q_proj.weight"]["weight_decay"] == 0.1
    assert by_name["model.layers.0.self_attn.q_proj.bias"]["weight_decay"] == 0.0
    assert by_name["model.layers.0.mlp.up_proj.weight"]["lr"] == pytest.approx(1.5e-3)
    assert by_name["model.norm.weight"]["weight_decay"] == 0.0
    # every trainable parameter is in exactly one group
    names = [n for g in groups for n in g["names"]]
    assert sorted(names) == sorted(n for n, p in model.named_parameters() if p.requires_grad)
    table = describe_groups(groups)
    assert "embeddings" in table and "mlp" in table and "decay" in table.splitlines()[0]


def test_lr_patterns_override_kind(tiny_lm):
    model, _ = tiny_lm
    groups = param_groups(model, _cfg(lr_patterns={r"lm_head": 3.0}))
    head = next(g for g in groups if "lm_head.weight" in g["names"])
    assert head["lr"] == pytest.approx(3e-3) and head["rule"] == "pattern lm_head"


def test_load_model_names_classes_and_rejects_wrong_task():
    model, tok = load_model("classify", "tiny-classifier", label_map=["a", "b", "c"])
    assert model.config.num_labels == 3 and model.config.id2label[2] == "c"
    assert tok.pad_token_id is not None
    with pytest.raises(ModelError, match="causal LM"):
        load_model("classify", "tiny-causal-lm", num_labels=2)
    with pytest.raises(ModelError, match="not a folder"):
        load_model("sft", "/no/such/model")


def test_load_model_from_local_folder(tmp_path, tiny_lm):
    model, tok = tiny_lm
    model.save_pretrained(tmp_path / "m")
    tok.save_pretrained(tmp_path / "m")
    again, tok2 = load_model("sft", str(tmp_path / "m"))
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), again.state_dict().values(),
                                                  strict=True))
    assert tok2.chat_template


def test_load_model_does_not_move_global_rng():
    torch.manual_seed(5)
    expected = torch.rand(3)
    torch.manual_seed(5)
    load_model("sft", "tiny-causal-lm")
    assert torch.equal(torch.rand(3), expected)


def test_lora_checks():
    model, _ = load_model("sft", "tiny-causal-lm")
    with pytest.raises(ModelError, match="larger than the hidden size 64"):
        apply_lora(model, {"r": 65}, "sft")
    with pytest.raises(ModelError, match=r"not in the model; its linear modules are: .*q_proj"):
        apply_lora(model, {"r": 4, "targets": ["q_proj", "query"]}, "sft")
    with pytest.raises(ModelError, match="must be > 0"):
        apply_lora(model, {"r": 0}, "sft")
    with pytest.warns(UserWarning, match="does not divide the hidden size"):
        apply_lora(load_model("sft", "tiny-causal-lm")[0], {"r": 6}, "sft")


def test_lora_records_and_weights_change_after_a_step():
    model, _ = load_model("sft", "tiny-causal-lm")
    wrapped, record = apply_lora(model, {"r": 4, "alpha": 8}, "sft")
    assert record["wrapped_layers"] == 8 and 0 < record["trainable_params"] < record["total_params"]
    assert record["targets"] == ["q_proj", "k_proj", "v_proj", "o_proj"]
    lora = {n: p.detach().clone() for n, p in wrapped.named_parameters() if "lora_" in n}
    frozen = {n: p.detach().clone() for n, p in wrapped.named_parameters() if not p.requires_grad}
    opt, _ = build_optimizer(wrapped, _cfg(lr=1e-2))
    ids = torch.randint(0, 200, (2, 12))
    wrapped(input_ids=ids, labels=ids).loss.backward()
    opt.step()
    after = dict(wrapped.named_parameters())
    assert any(not torch.equal(after[n], v) for n, v in lora.items() if "lora_A" in n)
    assert any(not torch.equal(after[n], v) for n, v in lora.items() if "lora_B" in n)
    assert all(torch.equal(after[n], v) for n, v in frozen.items())


def test_lora_on_bert_picks_its_own_projections():
    model, _ = load_model("classify", "tiny-classifier", num_labels=3)
    # the config's Llama-style default targets fall back to BERT's query/key/value
    wrapped, record = apply_lora(model, {"r": 8, "targets": ["q_proj", "k_proj", "v_proj", "o_proj"]},
                                 "classify")
    assert record["targets"] == ["query", "key", "value"]
    assert any("classifier" in n and p.requires_grad for n, p in wrapped.named_parameters())


# ------------------------------------------------------------------ schedule
def test_warmup_cosine_counts_optimizer_steps():
    p = nn.Parameter(torch.zeros(1))
    opt = torch.optim.AdamW([{"params": [p], "lr": 1e-3}, {"params": [nn.Parameter(torch.zeros(1))], "lr": 1e-4}])
    sched = warmup_cosine(opt, total_steps=100, warmup_steps=10, min_lr=1e-5)
    lrs = []
    for _ in range(101):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert lrs[0] == pytest.approx(1e-7)
    assert lrs[10] == pytest.approx(1e-3)
    assert lrs[5] == pytest.approx(1e-7 + (1e-3 - 1e-7) * 0.5)
    assert all(a <= b for a, b in zip(lrs[:10], lrs[1:11], strict=True))
    assert all(a >= b for a, b in zip(lrs[10:100], lrs[11:101], strict=True))
    assert lrs[100] == pytest.approx(1e-5)
    assert lrs[55] == pytest.approx(1e-5 + (1e-3 - 1e-5) * 0.5)
    # the second group keeps its ratio
    assert opt.param_groups[1]["lr"] == pytest.approx(1e-6)


def test_warmup_steps_for():
    assert warmup_steps_for(100, 0.1, None) == 10
    assert warmup_steps_for(7, 0.1, None) == 1
    assert warmup_steps_for(100, 0.1, 25) == 25
    assert lr_factor(0, 10, 0, 0.0, 0.0) == pytest.approx(1.0)
    assert math.isclose(lr_factor(10, 10, 0, 0.0, 0.0), 0.0, abs_tol=1e-12)


def test_scheduler_state_resumes_exactly():
    def make():
        p = nn.Parameter(torch.zeros(1))
        opt = torch.optim.AdamW([p], lr=1e-3)
        return opt, warmup_cosine(opt, 50, 5)

    opt, sched = make()
    for _ in range(12):
        opt.step()
        sched.step()
    opt2, sched2 = make()
    sched2.load_state_dict(sched.state_dict())
    opt2.load_state_dict(opt.state_dict())
    for _ in range(5):
        opt.step()
        sched.step()
        opt2.step()
        sched2.step()
        assert opt.param_groups[0]["lr"] == opt2.param_groups[0]["lr"]


# ------------------------------------------------------------------ clipping
class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(5, 4)
        self.self_attn = nn.Linear(4, 4)
        self.mlp = nn.Linear(4, 4)


def _kinds(net):
    return {"embeddings": [net.embed_tokens.weight], "attention": list(net.self_attn.parameters()),
            "mlp": list(net.mlp.parameters())}


def test_clip_layerwise_rules_then_global():
    net = _Net()
    net.embed_tokens.weight.grad = torch.full((5, 4), 3.0)
    net.self_attn.weight.grad = torch.full((4, 4), 2.0)
    net.self_attn.bias.grad = torch.zeros(4)
    net.mlp.weight.grad = torch.full((4, 4), 0.01)
    net.mlp.bias.grad = torch.zeros(4)
    result = clip_gradients(net, _cfg(max_grad_norm=100.0), _kinds(net))
    assert isinstance(result, ClipResult) and result.finite and not result.clipped
    assert float(net.embed_tokens.weight.grad.abs().max()) == pytest.approx(0.5)
    attn = torch.cat([p.grad.flatten() for p in net.self_attn.parameters()])
    assert float(attn.norm()) == pytest.approx(1.0, rel=1e-4)
    assert result.total_norm == pytest.approx(math.sqrt(20 * 9 + 16 * 4 + 16 * 1e-4), rel=1e-5)
    # then the global clip to 0.1
    net.mlp.weight.grad = torch.full((4, 4), 10.0)
    result = clip_gradients(net, _cfg(max_grad_norm=0.1), _kinds(net))
    assert result.clipped
    total = torch.cat([p.grad.flatten() for p in net.parameters()]).norm()
    assert float(total) == pytest.approx(0.1, rel=1e-4)


def test_nonfinite_gradient_is_reported_and_left_alone():
    net = _Net()
    for p in net.parameters():
        p.grad = torch.ones_like(p)
    net.mlp.weight.grad[0, 0] = float("nan")
    before = {n: p.grad.clone() for n, p in net.named_parameters()}
    result = clip_gradients(net, _cfg(), _kinds(net))
    assert not result.finite
    for n, p in net.named_parameters():
        assert torch.equal(p.grad.nan_to_num(7.0), before[n].nan_to_num(7.0))


def test_grad_variance_scaler_damps_noisy_gradients():
    steady, noisy = GradVarianceScaler(), GradVarianceScaler()
    for i in range(50):
        steady.update(1.0)
        noisy.update(0.1 if i % 2 else 5.0)
    assert steady.factor() == pytest.approx(1.0)
    assert noisy.factor() < 0.8
    clone = GradVarianceScaler()
    clone.load_state_dict(noisy.state_dict())
    assert clone.factor() == noisy.factor()


def test_gradient_checkpointing_gives_the_same_gradients():
    from dataguard.train.model.build import enable_gradient_checkpointing

    ids = torch.randint(0, 250, (2, 16))
    grads = []
    for checkpointing in (False, True):
        model, _ = load_model("sft", "tiny-causal-lm")
        if checkpointing:
            enable_gradient_checkpointing(model)
            assert model.is_activation_checkpointing
        model.train()
        model(input_ids=ids, labels=ids).loss.backward()
        grads.append([p.grad.clone() for p in model.parameters()])
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(*grads, strict=True))
