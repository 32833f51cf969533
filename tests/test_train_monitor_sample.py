"""Update ratios from a fixed sample of each tensor agree with the exact ratios, and the
monitor keeps a sample, not a copy of the weights."""

from __future__ import annotations

import torch

from dataguard.train.model.tiny import tiny_causal_lm
from dataguard.train.stability.monitor import UPDATE_SAMPLE, Monitor, update_sample


def _exact(model, before):
    ratios = {}
    for name, p in model.named_parameters():
        ratios[name] = float((p.detach() - before[name]).norm() / p.detach().norm())
    return ratios


def test_sampled_update_ratios_track_the_exact_ones_after_real_adamw_steps():
    model = tiny_causal_lm(4000, seed=0, hidden_size=128)  # embeddings: 512k entries, sampled
    monitor = Monitor(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = torch.randint(0, 4000, (4, 32), generator=torch.Generator().manual_seed(0))
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    monitor.begin_update()
    assert sum(b.numel() for b in monitor._buffers) < sum(p.numel() for p in model.parameters()) // 4
    model(input_ids=ids, labels=ids).loss.backward()
    opt.step()
    got = monitor.update_ratios()
    exact = _exact(model, before)
    for layer, params in monitor.layers.items():
        names = [n for n, p in model.named_parameters() if any(p is q for q in params)]
        d = sum(float((dict(model.named_parameters())[n].detach() - before[n]).norm()) ** 2 for n in names)
        w = sum(float(dict(model.named_parameters())[n].detach().norm()) ** 2 for n in names)
        want = (d / w) ** 0.5
        assert abs(got[layer] - want) <= 0.1 * want, (layer, got[layer], want)
    assert exact  # the exact per-tensor ratios were computed from real updates


def test_the_sample_spreads_across_columns():
    t = torch.arange(512 * 256, dtype=torch.float32).reshape(512, 256)
    view = update_sample(t)
    assert view.numel() <= UPDATE_SAMPLE + 1
    columns = (view.long() % 256).unique()
    assert len(columns) == 256  # a stride sharing a factor with 256 would keep a few columns only
    small = torch.ones(10)
    assert update_sample(small).numel() == 10
