"""The lean SFT loss (head on scored positions, checkpointed chunks) gives the plain loss and
the plain gradients, with and without LoRA, and is taken only where it is exact."""

from __future__ import annotations

import math

import pytest
import torch

from dataguard.train.model.build import apply_lora
from dataguard.train.model.tiny import tiny_causal_lm
from dataguard.train.optim.forward import lean_parts, lm_loss_lean
from dataguard.train.optim.losses import causal_lm_loss
from dataguard.train.tasks import get_task
from dataguard.train.tasks.base import LossSettings


def _batch(vocab: int, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab, (3, 21), generator=g)
    mask = torch.ones_like(ids)
    mask[2, 15:] = 0  # a right-padded row
    labels = ids.clone()
    labels[:, :7] = -100  # a masked prompt
    labels[2, 15:] = -100
    labels[1, :] = -100  # a row with nothing to score
    return {"input_ids": ids, "attention_mask": mask, "labels": labels,
            "sample_weight": torch.tensor([1.0, 0.5, 2.0])}


def _plain(model, batch, denominator=None):
    out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
    return causal_lm_loss(out.logits, batch["labels"], sample_weights=batch["sample_weight"], denominator=denominator)


def _grads(model) -> dict[str, torch.Tensor]:
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
@pytest.mark.parametrize("chunk", [5, 1024])
def test_lean_loss_and_gradients_match_the_plain_path(arch, chunk):
    model = tiny_causal_lm(97, seed=1, arch=arch)
    batch = _batch(97)
    plain = _plain(model, batch, denominator=7.0)
    plain.backward()
    want = _grads(model)
    model.zero_grad()
    decoder, head = lean_parts(model)
    lean = lm_loss_lean(decoder, head, batch, denominator=7.0, chunk_tokens=chunk)
    lean.loss.backward()
    got = _grads(model)
    assert torch.allclose(lean.loss, plain, rtol=1e-5, atol=1e-6)
    assert set(got) == set(want)
    for name, g in want.items():
        assert torch.allclose(got[name], g, rtol=1e-4, atol=1e-6), name
    assert math.isnan(float(lean.row_loss[1]))  # nothing scored in row 1
    assert lean.row_loss[0] > 0 and lean.row_loss[2] > 0


def test_lean_loss_under_lora_trains_the_same_adapters():
    model, _ = apply_lora(tiny_causal_lm(97, seed=2), {"r": 4}, "sft")
    batch = _batch(97, seed=3)
    _plain(model, batch).backward()
    want = _grads(model)
    model.zero_grad()
    out = get_task("sft").forward(model, batch, LossSettings())
    out.loss.backward()
    got = _grads(model)
    assert lean_parts(model) is not None  # the PEFT wrapper is seen through
    assert set(got) == set(want) and all("lora_" in n for n in got)
    for name, g in want.items():
        assert torch.allclose(got[name], g, rtol=1e-4, atol=1e-7), name


def test_a_batch_with_nothing_to_score_gives_zero_loss_and_zero_gradients():
    model = tiny_causal_lm(97, seed=4)
    batch = _batch(97)
    batch["labels"][:] = -100
    out = get_task("sft").forward(model, batch, LossSettings())
    out.loss.backward()
    assert float(out.loss.detach()) == 0.0
    assert all(torch.count_nonzero(p.grad) == 0 for p in model.parameters() if p.grad is not None)
    assert torch.isnan(out.row_loss).all()


def test_soft_capped_and_ddp_models_take_the_plain_path():
    model = tiny_causal_lm(97, seed=5)
    model.config.final_logit_softcapping = 30.0  # Gemma 2: logits are capped inside forward
    assert lean_parts(model) is None
    gpt2 = pytest.importorskip("transformers").GPT2LMHeadModel(
        pytest.importorskip("transformers").GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=97))
    assert lean_parts(gpt2) is None
    out = get_task("sft").forward(gpt2, _batch(97), LossSettings())  # the plain path still gives row losses
    assert out.row_loss.shape == (3,) and math.isnan(float(out.row_loss[1]))


def test_classify_reports_raw_logits_and_row_losses():
    from dataguard.train.model.tiny import tiny_classifier

    model = tiny_classifier(4, vocab_size=100, seed=0)
    ids = torch.randint(1, 100, (5, 9), generator=torch.Generator().manual_seed(0))
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": torch.tensor([0, 1, 2, 3, 0]),
             "sample_weight": torch.ones(5)}
    out = get_task("classify").forward(
        model, batch, LossSettings(offsets=torch.tensor([0.0, -1.0, -2.0, -3.0]), logit_adjustment=True))
    assert out.logits is not None and out.logits.shape == (5, 4) and not out.logits.requires_grad
    expected = torch.nn.functional.cross_entropy(out.logits, batch["labels"], reduction="none")
    assert torch.allclose(out.row_loss, expected)
    assert out.loss.requires_grad
