"""AdamW over the module-type groups, warmup + cosine by optimizer step, clipping rules.

The schedule counts *optimizer* steps (one per ``grad_accum`` micro-batches, none for a
skipped step), so it is the same whatever the accumulation and it resumes from the
scheduler's own counter. Clipping is layer-wise first (per module type: by value or by norm),
then global L2 ``clip_grad_norm_``; a non-finite gradient is reported so the caller skips the
step: it never reaches the weights.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.optim.lr_scheduler import LambdaLR

from dataguard.train.model import param_groups

DEFAULT_CLIP_RULES = {"embeddings": {"value": 0.5}, "attention": {"norm": 1.0}}


def build_optimizer(model: nn.Module, cfg: Any) -> tuple[torch.optim.AdamW, list[dict[str, Any]]]:
    """torch AdamW on `param_groups` (layer-wise lr, no decay on norms/biases/embeddings)."""
    groups = param_groups(model, cfg)
    torch_groups = [{k: v for k, v in g.items() if k not in ("names", "n_params")} for g in groups]
    optimizer = torch.optim.AdamW(torch_groups, lr=float(cfg.lr), betas=(0.9, 0.999), eps=1e-8)
    return optimizer, groups


def warmup_steps_for(total_steps: int, warmup_ratio: float, warmup_steps: int | None) -> int:
    """``warmup_steps`` when set, else ``ceil(warmup_ratio * total_steps)``."""
    if warmup_steps is not None:
        return min(int(warmup_steps), total_steps)
    return min(math.ceil(warmup_ratio * total_steps), total_steps)


def lr_factor(step: int, total_steps: int, warmup_steps: int, start_factor: float, min_factor: float) -> float:
    """Multiplier of the peak lr after ``step`` optimizer steps: linear from ``start_factor``
    to 1 over the warmup, then cosine from 1 to ``min_factor`` at ``total_steps``."""
    if warmup_steps > 0 and step < warmup_steps:
        return start_factor + (1.0 - start_factor) * step / warmup_steps
    span = max(total_steps - warmup_steps, 1)
    progress = min(max(step - warmup_steps, 0) / span, 1.0)
    return min_factor + (1.0 - min_factor) * 0.5 * (1.0 + math.cos(math.pi * progress))


class _Schedule:
    """Picklable lr lambda (a plain object, so LambdaLR.state_dict keeps its settings)."""

    def __init__(self, total: int, warmup: int, start: float, floor: float) -> None:
        self.total, self.warmup, self.start, self.floor = total, warmup, start, floor

    def __call__(self, step: int) -> float:
        return lr_factor(step, self.total, self.warmup, self.start, self.floor)


def warmup_cosine(optimizer: torch.optim.Optimizer, total_steps: int, warmup_steps: int, *,
                  start_lr: float = 1e-7, min_lr: float = 0.0, base_lr: float | None = None) -> LambdaLR:
    """LambdaLR: linear warmup from ``start_lr`` to the peak, cosine down to ``min_lr``.

    ``start_lr`` and ``min_lr`` are for ``base_lr`` (the configured lr, multiplier 1; default:
    the highest group lr); every group keeps its ratio to it (an embedding group at x0.1 warms
    up from 0.1 x start_lr).
    """
    peak = base_lr if base_lr is not None else max(g.get("initial_lr", g["lr"]) for g in optimizer.param_groups)
    start = min(start_lr / peak, 1.0) if peak > 0 else 0.0
    floor = min(min_lr / peak, 1.0) if peak > 0 else 0.0
    return LambdaLR(optimizer, _Schedule(max(int(total_steps), 1), int(warmup_steps), start, floor))


@dataclass
class ClipResult:
    """What clipping found: the global L2 norm before clipping, whether every gradient is
    finite (if not, the caller must skip the step), and whether the global clip scaled."""

    total_norm: float
    finite: bool
    clipped: bool
    rules_applied: dict[str, float] | None = None


def _grads(params: Iterable[nn.Parameter]) -> list[torch.Tensor]:
    return [p.grad for p in params if p.grad is not None]


def grad_norm(params: Iterable[nn.Parameter]) -> torch.Tensor:
    grads = _grads(params)
    if not grads:
        return torch.zeros(())
    return torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g.detach().float(), 2)
                                                 for g in grads]), 2)


def clip_gradients(model: nn.Module, cfg: Any, kinds: Mapping[str, list[nn.Parameter]]) -> ClipResult:
    """Layer-wise rules (``cfg.clip_rules``: kind -> {"value": v} or {"norm": n}), then global
    ``clip_grad_norm_(max_norm, 2.0)``. Nothing is modified when a gradient is not finite."""
    params = [p for p in model.parameters() if p.requires_grad and p.grad is not None]
    pre = grad_norm(params)
    if not torch.isfinite(pre):
        return ClipResult(total_norm=float(pre), finite=False, clipped=False)
    rules = getattr(cfg, "clip_rules", None)
    rules = DEFAULT_CLIP_RULES if rules is None else rules
    applied: dict[str, float] = {}
    for kind, rule in rules.items():
        group = [p for p in kinds.get(kind, []) if p.grad is not None]
        if not group:
            continue
        if "value" in rule:
            torch.nn.utils.clip_grad_value_(group, float(rule["value"]))
            applied[kind] = float(rule["value"])
        if "norm" in rule:
            norm = torch.nn.utils.clip_grad_norm_(group, float(rule["norm"]), 2.0)
            applied[kind] = float(norm)
    max_norm = float(getattr(cfg, "max_grad_norm", 1.0) or 0.0)
    total = float(pre)
    clipped = False
    if max_norm > 0:
        after_rules = float(torch.nn.utils.clip_grad_norm_(params, max_norm, 2.0))
        clipped = after_rules > max_norm
    return ClipResult(total_norm=total, finite=True, clipped=clipped, rules_applied=applied)


class GradVarianceScaler:
    """Damps the lr when gradients get noisy: keeps EMAs of the gradient norm and its square,
    and returns ``1 / (1 + k * cv^2)`` (cv = std/mean of the norm), clamped to [floor, 1].
    Off by default; its state is two floats and a count, saved with the checkpoint."""

    def __init__(self, beta: float = 0.98, k: float = 1.0, floor: float = 0.1) -> None:
        self.beta, self.k, self.floor = beta, k, floor
        self.mean = 0.0
        self.sq = 0.0
        self.count = 0

    def update(self, norm: float) -> float:
        if not math.isfinite(norm):
            return self.factor()
        self.count += 1
        self.mean = self.beta * self.mean + (1 - self.beta) * norm
        self.sq = self.beta * self.sq + (1 - self.beta) * norm * norm
        return self.factor()

    def factor(self) -> float:
        if self.count < 2:
            return 1.0
        correction = 1 - self.beta ** self.count
        mean, sq = self.mean / correction, self.sq / correction
        var = max(sq - mean * mean, 0.0)
        cv2 = var / (mean * mean) if mean > 0 else 0.0
        return max(self.floor, 1.0 / (1.0 + self.k * cv2))

    def state_dict(self) -> dict[str, float]:
        return {"beta": self.beta, "k": self.k, "floor": self.floor, "mean": self.mean, "sq": self.sq,
                "count": self.count}

    def load_state_dict(self, state: Mapping[str, float]) -> None:
        self.mean, self.sq, self.count = float(state["mean"]), float(state["sq"]), int(state["count"])
