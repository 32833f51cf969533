"""The training monitor: per-layer gradient statistics cheap enough to leave on.

Parameters are grouped into a handful of *layers* (``embed``, ``layers.0`` ... ``layers.N``,
``head``, ``other``), not one entry per tensor. Every statistic is computed on the device
with ``torch._foreach_norm`` and stacked per-tensor reductions, then brought to the host with
one ``tolist()`` per call, so there is no host sync per parameter.

- `Monitor.grad_norms` (every step the guard needs it, and on monitor steps): per-layer L2
  gradient norm;
- `Monitor.stats` (every ``monitor_every`` steps): per-layer gradient norms, grad.std /
  param.std, the count of gradient entries with |g| > 1e5 and of weights with |w| > 1e6;
- `Monitor.begin_update` / `Monitor.update_ratios`: ||delta W|| / ||W|| per layer across an
  optimizer step (a copy of the weights is kept only on monitor steps);
- `Monitor.histograms` (every ``histogram_every`` steps): log10 |grad| histograms per layer.
"""

from __future__ import annotations

import math
import re
from typing import Any

import torch
from torch import nn

BIG_GRAD = 1e5
BIG_WEIGHT = 1e6
HIST_EDGES = [float(e) for e in range(-12, 7)]  # log10 |grad| from 1e-12 to 1e6
HIST_SAMPLE = 1 << 18  # entries per layer a histogram reads at most
UPDATE_SAMPLE = 1 << 14  # entries per tensor an update ratio keeps from one monitor step to the next
_BLOCK = re.compile(r"(?:^|\.)(?:layers|layer|h|blocks|block)\.(\d+)\.")


def layer_of(name: str) -> str:
    """The monitor layer of a parameter name (peft prefixes ignored)."""
    m = _BLOCK.search(name)
    if m:
        return f"layers.{int(m.group(1))}"
    low = name.lower()
    if "embed" in low or "wte" in low or "wpe" in low:
        return "embed"
    if any(h in low for h in ("lm_head", "classifier", "score.", "pooler")):
        return "head"
    return "other"


def layer_params(model: nn.Module) -> dict[str, list[nn.Parameter]]:
    """Layer -> trainable parameters, in model order (embed first, head last)."""
    out: dict[str, list[nn.Parameter]] = {}
    for name, p in model.named_parameters():
        if p.requires_grad:
            out.setdefault(layer_of(name), []).append(p)
    rank = {"embed": 0, "other": 2, "head": 3}
    order = sorted(out, key=lambda k: (rank.get(k, 1), int(k.split(".")[1]) if k.startswith("layers.") else 0))
    return {k: out[k] for k in order}


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


class Monitor:
    """Per-layer statistics of one model's trainable parameters."""

    def __init__(self, model: nn.Module) -> None:
        self.layers = layer_params(model)
        self.names = list(self.layers)
        self.params = [p for ps in self.layers.values() for p in ps]
        self.index = torch.tensor([i for i, ps in enumerate(self.layers.values()) for _ in ps])
        self._before: list[torch.Tensor] | None = None
        self._buffers: list[torch.Tensor] | None = None

    def _with_grads(self) -> tuple[list[torch.Tensor], torch.Tensor]:
        grads, idx = [], []
        for p, i in zip(self.params, self.index.tolist(), strict=True):
            if p.grad is not None:
                grads.append(p.grad.detach())
                idx.append(i)
        return grads, torch.tensor(idx, dtype=torch.long)

    def _per_layer(self, values: torch.Tensor, idx: torch.Tensor, squared: bool = True) -> torch.Tensor:
        out = torch.zeros(len(self.names), dtype=torch.float64, device=values.device)
        out.index_add_(0, idx.to(values.device), values.double() ** 2 if squared else values.double())
        return out

    def grad_norms(self) -> dict[str, float | None]:
        """Per-layer gradient L2 norm (None for a non-finite one)."""
        grads, idx = self._with_grads()
        if not grads:
            return {}
        norms = torch.stack(torch._foreach_norm(grads)).float()
        per = self._per_layer(norms, idx).sqrt().tolist()
        present = set(idx.tolist())
        return {n: _finite(v) for i, (n, v) in enumerate(zip(self.names, per, strict=True)) if i in present}

    def nonfinite_layers(self) -> list[str]:
        """Layers whose gradient has a NaN or inf, in backward order (head first); empty when
        every layer is (then no layer went first: the loss did)."""
        norms = self.grad_norms()
        bad = [n for n in reversed(self.names) if n in norms and norms[n] is None]
        return [] if len(bad) == len(norms) else bad

    def stats(self) -> dict[str, Any]:
        """Monitor-step statistics of the current gradients and weights (one host sync)."""
        grads, idx = self._with_grads()
        if not grads:
            return {}
        ps = [p.detach() for p, i in zip(self.params, self.index.tolist(), strict=True) if p.grad is not None]
        g_sq = torch.stack(torch._foreach_norm(grads)).double() ** 2
        w_sq = torch.stack(torch._foreach_norm(ps)).double() ** 2
        g_sum = torch.stack([g.sum() for g in grads]).double()
        w_sum = torch.stack([w.sum() for w in ps]).double()
        count = torch.tensor([g.numel() for g in grads], dtype=torch.float64, device=g_sq.device)
        big_g = _count_above(grads, BIG_GRAD)
        big_w = _count_above(ps, BIG_WEIGHT)
        per = torch.stack([self._per_layer(v, idx, squared=False) for v in (g_sq, w_sq, g_sum, w_sum, count)])
        host = torch.cat([per.flatten(), torch.stack([big_g, big_w]).double()]).tolist()
        n = len(self.names)
        rows = [host[k * n:(k + 1) * n] for k in range(5)]
        present = set(idx.tolist())
        norms, std_ratio = {}, {}
        for i, name in enumerate(self.names):
            if i not in present:
                continue
            gs, ws, gm, wm, c = (rows[k][i] for k in range(5))
            norms[name] = _finite(math.sqrt(gs) if gs >= 0 else math.nan)
            g_var = gs / c - (gm / c) ** 2
            w_var = ws / c - (wm / c) ** 2
            ratio = math.sqrt(max(g_var, 0.0)) / math.sqrt(w_var) if w_var > 0 else math.nan
            std_ratio[name] = _finite(ratio)
        return {"layer_grad_norms": norms, "grad_std_ratio": std_ratio,
                "n_big_grads": int(host[-2]), "n_big_weights": int(host[-1])}

    def begin_update(self) -> None:
        """Keep a fixed sample of each tensor's weights (`update_sample`) to measure the next
        update, in buffers kept between monitor steps. A full copy of a full fine-tune's
        weights (540 MB for SmolLM2-135M) was the largest thing the monitor held."""
        views = [update_sample(p.detach()) for p in self.params]
        if self._buffers is None or [b.shape for b in self._buffers] != [v.shape for v in views]:
            self._buffers = [torch.empty(v.shape, dtype=v.dtype, device=v.device) for v in views]
        torch._foreach_copy_(self._buffers, views)
        self._before = self._buffers

    def update_ratios(self) -> dict[str, float | None]:
        """||delta W|| / ||W|| per layer since `begin_update` (empty without one), each
        tensor's squared norms estimated from its sample and scaled to its size."""
        if self._before is None:
            return {}
        now = [update_sample(p.detach()) for p in self.params]
        torch._foreach_sub_(self._before, now)  # in place: the buffers hold the update now (sign aside)
        delta, self._before = self._before, None
        scale = torch.tensor([p.numel() / max(v.numel(), 1) for p, v in zip(self.params, now, strict=True)],
                             dtype=torch.float64)
        d_sq = torch.stack(torch._foreach_norm(delta)).double().cpu() ** 2 * scale
        w_sq = torch.stack(torch._foreach_norm(now)).double().cpu() ** 2 * scale
        d = self._per_layer(d_sq, self.index, squared=False)
        w = self._per_layer(w_sq, self.index, squared=False)
        ratio = (d.sqrt() / w.sqrt()).tolist()
        return {n: _finite(r) for n, r in zip(self.names, ratio, strict=True)}

    def max_abs_weight(self) -> float:
        """The largest |w| (an inf-norm per tensor: no |w| copy is made)."""
        return float(torch.stack(torch._foreach_norm([p.detach() for p in self.params], float("inf"))).max())

    def histograms(self) -> dict[str, dict[str, list[float]]]:
        """log10 |grad| histograms per layer (zeros and non-finite entries left out), from a
        seeded sample of about ``HIST_SAMPLE`` entries per layer, counts scaled back up: a
        150k-row embedding's gradient is never copied whole."""
        out: dict[str, dict[str, list[float]]] = {}
        lo, hi, bins = HIST_EDGES[0], HIST_EDGES[-1], len(HIST_EDGES) - 1
        for name, ps in self.layers.items():
            grads = [p.grad.detach().reshape(-1) for p in ps if p.grad is not None]
            if not grads:
                continue
            total = sum(g.numel() for g in grads)
            stride = max(1, -(-total // HIST_SAMPLE))
            if stride > 1:  # seeded uniform positions: a stride would alias with the rows' period
                gen = torch.Generator(device=grads[0].device).manual_seed(len(name))
                grads = [g[torch.randint(0, g.numel(), (-(-g.numel() // stride),), generator=gen,
                                         device=g.device)] for g in grads]
            g = torch.cat([g.float() for g in grads]).abs()
            scale = total / max(sum(x.numel() for x in grads), 1)
            g = g[(g > 0) & torch.isfinite(g)]
            counts = torch.histc(g.log10().clamp(lo, hi), bins=bins, min=lo, max=hi) if g.numel() else \
                torch.zeros(bins)
            out[name] = {"edges": list(HIST_EDGES), "counts": [round(c * scale) for c in counts.tolist()],
                         "sampled_every": stride}
        return out


def update_sample(t: torch.Tensor, size: int = UPDATE_SAMPLE) -> torch.Tensor:
    """A fixed, evenly spread view of at most about ``size`` entries of ``t`` (all of a small
    tensor): every ``stride``-th entry, the stride made coprime with the last dimension so
    that the sample walks across columns instead of repeating the same ones."""
    flat = t.reshape(-1)
    if flat.numel() <= size:
        return flat
    stride = -(-flat.numel() // size)
    last = t.shape[-1] if t.dim() else 1
    while math.gcd(stride, last) != 1:
        stride += 1
    return flat[::stride]


def _count_above(tensors: list[torch.Tensor], bound: float) -> torch.Tensor:
    """How many entries exceed ``bound`` in magnitude; counted only in the tensors whose
    inf-norm exceeds it (usually none), so the common case makes no |x| copies."""
    peaks = torch.stack(torch._foreach_norm(tensors, float("inf")))
    over = [t for t, peak in zip(tensors, (peaks > bound).tolist(), strict=True) if peak]
    if not over:
        return torch.zeros((), dtype=torch.long, device=peaks.device)
    return torch.stack([(t.abs() > bound).sum() for t in over]).sum()
