"""Losses of the training runner against hand-computed values and torch's own cross-entropy."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from dataguard.train.optim.losses import (
    causal_lm_loss,
    causal_lm_weight_mass,
    clean_offsets,
    cross_entropy_weight_mass,
    logit_adjusted_cross_entropy,
    posthoc_adjust,
)


@pytest.fixture
def batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return torch.randn(6, 4, generator=g), torch.tensor([0, 1, 2, 3, 0, 1])


def test_plain_cross_entropy_without_offsets(batch):
    logits, y = batch
    assert torch.allclose(logit_adjusted_cross_entropy(logits, y), F.cross_entropy(logits, y))


def test_hand_computed_adjusted_loss():
    # one sample, two classes, logits 0/0, priors 0.8/0.2, tau 1 -> offsets log(0.8), log(0.2)
    offsets = [math.log(0.8), math.log(0.2)]
    loss = logit_adjusted_cross_entropy(torch.zeros(1, 2), torch.tensor([1]), offsets=offsets)
    # softmax(log .8, log .2) = (.8, .2): the rare class needs a larger margin -> -log(0.2)
    assert loss.item() == pytest.approx(-math.log(0.2), rel=1e-6)


def test_hand_computed_label_smoothing():
    # logits (2, 0), target 0, smoothing 0.1 over 2 classes: 0.95 * -log p0 + 0.05 * -log p1
    p0 = math.exp(2) / (math.exp(2) + 1)
    want = 0.95 * -math.log(p0) + 0.05 * -math.log(1 - p0)
    got = logit_adjusted_cross_entropy(torch.tensor([[2.0, 0.0]]), torch.tensor([0]), label_smoothing=0.1)
    assert got.item() == pytest.approx(want, rel=1e-6)


def test_offsets_and_tau_equal_shifted_logits(batch):
    logits, y = batch
    offsets = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    got = logit_adjusted_cross_entropy(logits, y, offsets=offsets, tau=0.5, label_smoothing=0.1)
    want = F.cross_entropy(logits + 0.5 * offsets, y, label_smoothing=0.1)
    assert torch.allclose(got, want)


def test_class_weights_match_torch_mean(batch):
    logits, y = batch
    cw = torch.tensor([1.0, 2.0, 0.5, 3.0])
    got = logit_adjusted_cross_entropy(logits, y, class_weights=cw, label_smoothing=0.1)
    assert torch.allclose(got, F.cross_entropy(logits, y, weight=cw, label_smoothing=0.1))


def test_sample_weights_normalised_by_sum(batch):
    logits, y = batch
    sw = torch.tensor([1.0, 0.0, 2.0, 1.0, 0.5, 3.0])
    per = F.cross_entropy(logits, y, reduction="none")
    got = logit_adjusted_cross_entropy(logits, y, sample_weights=sw)
    assert torch.allclose(got, (per * sw).sum() / sw.sum())
    # scaling every weight changes nothing; an integer weight equals repeating the row
    assert torch.allclose(logit_adjusted_cross_entropy(logits, y, sample_weights=sw * 7), got)
    two = logit_adjusted_cross_entropy(logits[:2], y[:2], sample_weights=[1.0, 2.0])
    assert torch.allclose(two, F.cross_entropy(logits[[0, 1, 1]], y[[0, 1, 1]]))


def test_zero_weights_give_zero_loss_and_finite_grad(batch):
    logits, y = batch
    logits = logits.clone().requires_grad_(True)
    loss = logit_adjusted_cross_entropy(logits, y, sample_weights=torch.zeros(6))
    loss.backward()
    assert loss.item() == 0.0 and torch.isfinite(logits.grad).all()


def test_nan_offsets_of_absent_classes_are_finite(batch):
    logits, y = batch
    offsets = [math.log(0.6), None, float("nan"), math.log(0.4)]
    cleaned = clean_offsets(offsets)
    assert torch.isfinite(cleaned).all() and cleaned[1] == cleaned[2] == cleaned.min()
    logits = logits.clone().requires_grad_(True)
    loss = logit_adjusted_cross_entropy(logits, y, offsets=offsets, label_smoothing=0.1,
                                        sample_weights=torch.rand(6))
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(logits.grad).all()
    assert torch.isfinite(clean_offsets([None, None])).all()


def test_offsets_count_must_match(batch):
    logits, y = batch
    with pytest.raises(ValueError, match="3 logit offsets for 4 classes"):
        logit_adjusted_cross_entropy(logits, y, offsets=[0.0, 0.0, 0.0])


def test_posthoc_adjust_is_subtraction(batch):
    logits, _ = batch
    off = torch.tensor([0.1, -0.2, 0.3, float("nan")])
    got = posthoc_adjust(logits, off)
    assert torch.allclose(got, logits - clean_offsets(off))
    # a head-favoured tie goes to the rare class after adjustment
    tied = torch.zeros(1, 2)
    assert posthoc_adjust(tied, [math.log(0.9), math.log(0.1)]).argmax().item() == 1


def test_causal_lm_loss_shift_and_ignore():
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(2, 5, 7, generator=g, requires_grad=True)
    labels = torch.tensor([[-100, -100, 3, 4, -100], [-100, 1, 2, 3, 6]])
    got = causal_lm_loss(logits, labels)
    # sample 0: positions 1, 2 predict 3, 4; sample 1: positions 0..3 predict 1, 2, 3, 6
    t0 = F.cross_entropy(logits[0, [1, 2]], torch.tensor([3, 4]), reduction="sum")
    t1 = F.cross_entropy(logits[1, [0, 1, 2, 3]], torch.tensor([1, 2, 3, 6]), reduction="sum")
    assert torch.allclose(got, (t0 + t1) / 6)  # one mean over the 6 supervised tokens
    # every token carries its row's weight: 2 tokens x 3 + 4 tokens x 1
    assert torch.allclose(causal_lm_loss(logits, labels, torch.tensor([3.0, 1.0])), (3 * t0 + t1) / (3 * 2 + 4))
    assert causal_lm_weight_mass(labels, [3.0, 1.0]).item() == 10.0
    got.backward()
    assert torch.isfinite(logits.grad).all()


def test_causal_lm_loss_sample_without_tokens_counts_zero():
    logits = torch.randn(2, 4, 5)
    labels = torch.tensor([[-100, -100, -100, -100], [-100, 1, 2, -100]])
    want = F.cross_entropy(logits[1, [0, 1]], torch.tensor([1, 2]))
    assert torch.allclose(causal_lm_loss(logits, labels, [5.0, 1.0]), want)
    assert causal_lm_loss(logits, torch.full((2, 4), -100)).item() == 0.0


def test_causal_lm_equal_weights_are_the_plain_token_mean():
    g = torch.Generator().manual_seed(2)
    logits = torch.randn(3, 6, 9, generator=g)
    labels = torch.randint(0, 9, (3, 6), generator=g)
    labels[0, :4] = -100
    labels[2, 1:3] = -100
    plain = F.cross_entropy(logits[:, :-1].reshape(-1, 9), labels[:, 1:].reshape(-1), ignore_index=-100)
    assert causal_lm_loss(logits, labels).item() == pytest.approx(plain.item(), rel=1e-6)
    assert causal_lm_loss(logits, labels, [2.5, 2.5, 2.5]).item() == pytest.approx(plain.item(), rel=1e-6)


@pytest.mark.parametrize("task", ["classify", "sft"])
def test_shares_of_a_step_add_up_to_the_whole_batch(task):
    """Split a batch of rows weighted 1, 2, 10 into micro-batches and normalise each by the
    step's mass: the shares' sum and its gradient are the whole batch's loss and gradient.
    Normalising each micro-batch by its own mass (the old rule) is not."""
    g = torch.Generator().manual_seed(3)
    w = torch.tensor([1.0, 2.0, 10.0])
    if task == "sft":
        logits = torch.randn(3, 7, 11, generator=g)
        labels = torch.randint(0, 11, (3, 7), generator=g)
        labels[0, :2] = -100
        labels[1, 5:] = -100

        def loss(rows, d=None):
            return causal_lm_loss(leaf[rows], labels[rows], w[rows], denominator=d)

        mass = causal_lm_weight_mass(labels, w)
    else:
        logits = torch.randn(3, 4, generator=g)
        labels = torch.tensor([2, 0, 3])
        cw = torch.tensor([0.5, 1.0, 2.0, 1.5])

        def loss(rows, d=None):
            return logit_adjusted_cross_entropy(leaf[rows], labels[rows], class_weights=cw, sample_weights=w[rows],
                                                label_smoothing=0.1, denominator=d)

        mass = cross_entropy_weight_mass(labels, w, cw)
    leaf = logits.clone().requires_grad_(True)
    whole = loss([0, 1, 2])
    (want,) = torch.autograd.grad(whole, leaf)
    shares = [loss([i], mass) for i in range(3)]
    (got,) = torch.autograd.grad(sum(shares), leaf)
    assert float(sum(shares).detach()) == pytest.approx(float(whole.detach()), rel=1e-6)
    assert torch.allclose(got, want, atol=1e-7)
    (own,) = torch.autograd.grad(sum(loss([i]) for i in range(3)) / 3, leaf)
    assert not torch.allclose(own, want, atol=1e-3)


def test_weight_mass_of_classify_rows():
    y = torch.tensor([0, 2, 2])
    assert cross_entropy_weight_mass(y).item() == 3.0
    assert cross_entropy_weight_mass(y, [1.0, 2.0, 10.0]).item() == 13.0
    assert cross_entropy_weight_mass(y, [1.0, 2.0, 10.0], [3.0, 1.0, 0.5]).item() == 3.0 + 1.0 + 5.0
    assert cross_entropy_weight_mass(y).dtype == torch.float64


def test_zero_step_mass_gives_zero_loss_and_finite_grad():
    logits = torch.randn(2, 5, 7, requires_grad=True)
    labels = torch.tensor([[-100, 1, 2, 3, 4], [-100, 1, 2, 3, 4]])
    loss = causal_lm_loss(logits, labels, [0.0, 0.0], denominator=0.0)
    loss.backward()
    assert loss.item() == 0.0 and torch.isfinite(logits.grad).all() and not logits.grad.any()
