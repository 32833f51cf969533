"""One optimizer step of the loop.

`draw_step` draws the step's micro-batches before the first backward and fixes the step's
loss denominator (THE WEIGHT RULE in `dataguard.train.data.split`); `StepOutcome` is what the
step did, filled in as it runs; `optimizer_step` applies (or skips) the step of accumulated,
clipped gradients with the lr damping / back-off / spike of this step only; `update_best`
tracks the best evaluation for early stopping.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from dataguard.train.data import Encoded
from dataguard.train.dynamics.recorder import pass_of_rows
from dataguard.train.optim.optimizer import ClipResult, GradVarianceScaler
from dataguard.train.stability.faults import FaultPlan
from dataguard.train.stability.guard import Guard, Verdict
from dataguard.train.stability.monitor import Monitor
from dataguard.train.state import Trainables
from dataguard.train.tasks import get_task


def across_processes(accelerator: Any, loss_share: float, tokens: int, device: Any) -> tuple[float, int]:
    """(the step's loss, total tokens): every process's loss is its share of the step's
    weighted mean (all divided by the same step-wide denominator), so the shares add up,
    whatever the sizes of the slices, and a run logs what one process would."""
    both = accelerator.reduce(torch.tensor([loss_share, float(tokens)], dtype=torch.float64, device=device), "sum")
    return float(both[0]), int(both[1])


@dataclass
class StepBatches:
    """This process's micro-batches of one optimizer step (collated, on the CPU) and the
    step's denominator. The loss of each micro-batch is ``sum(w * loss) / denominator``, its
    share of the step's weighted mean; ``backward_scale`` undoes the ``1 / grad_accum`` of
    ``accelerator.backward`` and the ``1 / processes`` of DDP's gradient average, so the
    gradient is that of the sum of the shares: the step's weighted mean."""

    indices: list[list[int]]
    batches: list[dict[str, torch.Tensor]]
    denominator: float
    backward_scale: float
    passes: list[list[int]] | None = None  # the epoch each row was drawn in (dynamics)

    def __iter__(self) -> Iterator[tuple[list[int], dict[str, torch.Tensor]]]:
        return iter(zip(self.indices, self.batches, strict=True))

    def passes_of(self, k: int) -> list[int]:
        """The epochs of micro-batch ``k``'s rows."""
        return self.passes[k] if self.passes is not None else [0] * len(self.indices[k])


def draw_step(accelerator: Any, sampler: Any, enc: Encoded, *, task: str, grad_accum: int, pad_id: int,
              rank: int = 0, world: int = 1, class_weights: torch.Tensor | None = None) -> StepBatches:
    """Draw and collate the step's ``grad_accum`` micro-batches up front (every process draws
    the same batches and keeps its slice ``rows[rank::world]``), and sum their weight mass
    over all processes: the denominator has to be known before the first backward, so that
    a row's weight means the same with any micro-batch size, accumulation or process count."""
    indices, batches, passes = [], [], []
    for _ in range(grad_accum):
        epoch = sampler.epoch
        idx, mult = sampler.next_batch()
        drawn_in = pass_of_rows(epoch, sampler.epoch, sampler.offset, len(idx), exact=sampler.multipliers is None)
        if world > 1:
            idx, mult, drawn_in = idx[rank::world], mult[rank::world], drawn_in[rank::world]
        indices.append(idx)
        passes.append(drawn_in)
        batches.append(enc.collate(idx, pad_id, mult))
    mass = sum(get_task(task).weight_mass(b, class_weights) for b in batches)
    if world > 1:
        mass = float(accelerator.reduce(torch.tensor([mass], dtype=torch.float64, device=accelerator.device), "sum")[0])
    return StepBatches(indices, batches, mass, float(accelerator.gradient_accumulation_steps * world), passes)


@dataclass
class StepOutcome:
    """One optimizer step as it went, filled in as it runs: the metrics line logs it, the
    guard's verdict judges it and `respond` acts on it. ``loss`` is the step's weighted mean
    over every process; ``clip`` is set once the gradients are clipped; ``stats``, ``ratios`` and
    ``hist`` are the monitor's, on the steps it looks."""

    step: int
    phase: int
    rows: list[str] = field(default_factory=list)
    tokens: int = 0
    loss: float = math.nan
    clip: ClipResult | None = None
    bad_layers: list[str] = field(default_factory=list)
    verdict: Verdict = field(default_factory=Verdict)
    applied: bool = False
    lr: float = math.nan
    lr_groups: dict[str, float] = field(default_factory=dict)
    stats: dict[str, Any] | None = None
    ratios: dict[str, float] | None = None
    hist: dict[str, Any] | None = None


@dataclass
class ClipSettings:
    """The clipping settings of one step (the guard tightens ``max_grad_norm`` while recovering)."""

    clip_rules: Any
    max_grad_norm: float


def row_ids(enc: Encoded, idx: list[int]) -> list[str]:
    """The data row ids of a micro-batch (every row of a pack)."""
    if enc.packed_rows is not None:
        return [r for i in idx for r in enc.packed_rows[i]]
    return [enc.row_ids[i] for i in idx]


def lr_groups(optimizer: Any) -> dict[str, float]:
    """The lr each kind of parameter group used (first group of a kind)."""
    out: dict[str, float] = {}
    for g in optimizer.param_groups:
        out.setdefault(str(g.get("kind", "all")), float(g["lr"]))
    return out


class StepObjects(Protocol):
    """What `optimizer_step` reads of the trainer: the objects the step changes or consults."""

    accelerator: Any
    trainables: Trainables
    gvs: GradVarianceScaler | None
    guard: Guard | None
    plan: FaultPlan


def optimizer_step(run: StepObjects, out: StepOutcome, monitor: Monitor | None) -> None:
    """Apply (or skip) the optimizer step of accumulated, clipped gradients; sets ``out.applied``,
    the base lr used, the lr per group kind and the update ratios (when ``monitor`` is given).
    The lr damping / back-off / spike is for this step only; the scheduler steps only for an
    applied step."""
    optimizer, scaler, clip, guard = run.trainables.optimizer, run.trainables.scaler, out.clip, run.guard
    assert clip is not None, "the optimizer step follows clipping"
    first = optimizer.param_groups[0]
    if (not clip.finite and scaler is None) or out.verdict.skip:
        out.applied = False  # never let a non-finite gradient (or a spike) reach the weights
        if scaler is not None and clip.finite:
            scaler.update()  # unscale_ was called: close this step for the scaler
        # the lr in force (the guard's back-off and a spike included), as an applied step logs it
        in_force = (guard.lr_scale if guard is not None else 1.0) * run.plan.lr_spike
        out.lr = first["lr"] / (first.get("lr_mult") or 1.0) * in_force
        out.lr_groups = {kind: value * in_force for kind, value in lr_groups(optimizer).items()}
    else:
        scheduled = [g["lr"] for g in optimizer.param_groups]
        factor = 1.0
        if run.gvs is not None and clip.finite:
            factor = run.gvs.update(clip.total_norm)
        factor = factor * (guard.lr_scale if guard is not None else 1.0) * run.plan.lr_spike
        if factor != 1.0:
            for g in optimizer.param_groups:
                g["lr"] *= factor
        if monitor is not None:
            monitor.begin_update()
        optimizer.step()  # with a scaler, a non-finite step is skipped inside
        out.applied = clip.finite and not run.accelerator.optimizer_step_was_skipped
        if monitor is not None:
            out.ratios = monitor.update_ratios()
        out.lr = first["lr"] / (first.get("lr_mult") or 1.0)  # the base lr (x1.0) used
        out.lr_groups = lr_groups(optimizer)
        if factor != 1.0:  # the damping / back-off is for this step only
            for g, value in zip(optimizer.param_groups, scheduled, strict=True):
                g["lr"] = value
    if out.applied:
        run.trainables.scheduler.step()
        if guard is not None:
            guard.accept(out.loss, clip.total_norm)
    optimizer.zero_grad(set_to_none=True)


def update_best(best: dict[str, Any], last_eval: dict[str, float], patience: int | None) -> tuple[bool, bool]:
    """Record an evaluation in ``best`` (metric, bad_evals); (is it the best so far, stop early?)."""
    is_best = False
    if best["metric"] is None or last_eval["loss"] < best["metric"]:
        best.update(metric=last_eval["loss"], bad_evals=0)
        is_best = True
    else:
        best["bad_evals"] += 1
    return is_best, bool(patience and best["bad_evals"] >= patience)
