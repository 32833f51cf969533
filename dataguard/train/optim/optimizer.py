"""AdamW over the module-type groups, warmup + cosine by optimizer step, clipping rules.

The schedule counts *optimizer* steps (one per ``grad_accum`` micro-batches, none for a
skipped step), so it is the same whatever the accumulation and it resumes from the
scheduler's own counter. Clipping is layer-wise first (per module type: by value or by norm),
then global L2 ``clip_grad_norm_``; a non-finite gradient is reported so the caller skips the
step: it never reaches the weights.

Tied embeddings (Qwen2.5 0.5B-3B, SmolLM2, Gemma, Llama-3.2 1B/3B: ``lm_head.weight`` *is*
``embed_tokens.weight``). ``named_parameters`` yields a shared tensor once, under its first
name, so the kind-by-name split would file it as embeddings (x0.1 lr, value clip 0.5) and
leave the head empty. Rule: **a tied matrix is the output head too, so it trains as the head
(the head's lr multiplier, the head's clipping rule) and keeps the embeddings' no weight
decay**; it gets a group of its own, kind ``head``, rule ``embeddings (tied to head)`` (what
the printed table, ``param_groups.txt`` and run.json show), and is in exactly one group.
Why: its gradient is dominated by the head side (every position, a dense softmax gradient
over the whole vocabulary) while the embedding side adds a few sparse rows; at x0.1 the
whole output projection would learn ten times slower than in the untied model, and a 0.5
value clip meant for sparse rare-token rows would bend the head's dense gradient. No decay
because decaying a row shrinks a rarely-seen token both as an input and as a logit. An
``lr_patterns`` regex matching any of its names (``lm_head`` included) still wins.
Tying is detected on the model, not on ``config.tie_word_embeddings`` alone (that flag
defaults to True on classifiers that have no LM head): one trainable tensor reached under an
embeddings name and a head name (same Parameter, or the same storage), or the input and
output embeddings' weights being the same tensor.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.optim.lr_scheduler import LambdaLR

from dataguard.train.model.build import module_kind, param_groups

DEFAULT_CLIP_RULES = {"embeddings": {"value": 0.5}, "attention": {"norm": 1.0}}
TIED_RULE = "embeddings (tied to head)"


def _storage(p: torch.Tensor) -> tuple[int, tuple[int, ...]] | None:
    if p.numel() == 0 or p.device.type == "meta":
        return None
    return (p.data_ptr(), tuple(p.shape))


def _io_weight(model: nn.Module, getter: str) -> Any:
    try:
        return getattr(getattr(model, getter)(), "weight", None)
    except (AttributeError, NotImplementedError, TypeError):
        return None


def tied_parameters(model: nn.Module) -> dict[int, list[str]]:
    """``id(param)`` -> every name of a trainable tensor that is both an input embedding and
    the output head (see the module docstring); empty for an untied model."""
    names: dict[int, list[str]] = {}
    params: dict[int, nn.Parameter] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        if p.requires_grad:
            names.setdefault(id(p), []).append(name)
            params[id(p)] = p
    by_storage: dict[Any, list[int]] = {}
    for pid, p in params.items():
        by_storage.setdefault(_storage(p) or ("id", pid), []).append(pid)
    inp, out = _io_weight(model, "get_input_embeddings"), _io_weight(model, "get_output_embeddings")
    same_io = (isinstance(inp, torch.Tensor) and isinstance(out, torch.Tensor)
               and (inp is out or (_storage(inp) is not None and _storage(inp) == _storage(out))))
    tied: dict[int, list[str]] = {}
    for pids in by_storage.values():
        all_names = [n for pid in pids for n in names[pid]]
        by_io = same_io and any(params[pid] is inp or params[pid] is out for pid in pids)
        if by_io or (len(all_names) > 1 and {"embeddings", "head"} <= {module_kind(n) for n in all_names}):
            for pid in pids:
                tied[pid] = all_names
    return tied


def _tied_groups(groups: list[dict[str, Any]], tied: Mapping[int, list[str]], cfg: Any) -> list[dict[str, Any]]:
    """Move every tied tensor out of the group its first name put it in, into a group of its
    own with the tied rule; groups left empty go."""
    head_mult = float((getattr(cfg, "lr_multipliers", None) or {}).get("head", 1.0))
    patterns = [(re.compile(p), float(m)) for p, m in (getattr(cfg, "lr_patterns", None) or {}).items()]
    out: list[dict[str, Any]] = []
    for g in groups:
        keep = [(p, n) for p, n in zip(g["params"], g["names"], strict=True) if id(p) not in tied]
        for p, name in zip(g["params"], g["names"], strict=True):
            if id(p) not in tied:
                continue
            mult, rule = head_mult, TIED_RULE
            for rx, m in patterns:
                if any(rx.search(n) for n in tied[id(p)]):
                    mult, rule = m, f"pattern {rx.pattern}; {TIED_RULE}"
                    break
            out.append({"params": [p], "names": [name], "kind": "head", "lr": float(cfg.lr) * mult,
                        "lr_mult": mult, "weight_decay": 0.0, "rule": rule,
                        "tied_names": list(tied[id(p)]), "n_params": p.numel()})
        if keep:
            g = dict(g, params=[p for p, _ in keep], names=[n for _, n in keep])
            g["n_params"] = sum(p.numel() for p in g["params"])
            out.append(g)
    return out


def clip_kinds(model: nn.Module, kinds: Mapping[str, list[nn.Parameter]]) -> dict[str, list[nn.Parameter]]:
    """``kinds`` with every tied tensor filed under ``head`` only (the head's clipping rule)."""
    tied = tied_parameters(model)
    if not tied:
        return dict(kinds)
    out = {k: [p for p in ps if id(p) not in tied] for k, ps in kinds.items()}
    head = out.setdefault("head", [])
    seen = {id(p) for p in head}
    for ps in kinds.values():
        for p in ps:
            if id(p) in tied and id(p) not in seen:
                head.append(p)
                seen.add(id(p))
    return out


def build_optimizer(model: nn.Module, cfg: Any) -> tuple[torch.optim.AdamW, list[dict[str, Any]]]:
    """torch AdamW on `param_groups` (layer-wise lr, no decay on norms/biases/embeddings); a
    tied embedding/head matrix gets its own group under the tied rule (module docstring)."""
    groups = param_groups(model, cfg)
    tied = tied_parameters(model)
    if tied:
        groups = _tied_groups(groups, tied, cfg)
    torch_groups = [{k: v for k, v in g.items() if k not in ("names", "n_params", "tied_names")} for g in groups]
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
    ``clip_grad_norm_(max_norm, 2.0)``. Nothing is modified when a gradient is not finite.
    A tied embedding/head matrix follows the head's rule, whatever ``kinds`` filed it under."""
    params = [p for p in model.parameters() if p.requires_grad and p.grad is not None]
    pre = grad_norm(params)
    if not torch.isfinite(pre):
        return ClipResult(total_norm=float(pre), finite=False, clipped=False)
    rules = getattr(cfg, "clip_rules", None)
    rules = DEFAULT_CLIP_RULES if rules is None else rules
    applied: dict[str, float] = {}
    kinds = clip_kinds(model, kinds)
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
