"""One optimizer step of the loop, and what is recorded about it.

`draw_step` draws the step's micro-batches before the first backward and fixes the step's
loss denominator (THE WEIGHT RULE in `dataguard.train.data.split`); `optimizer_step` applies (or skips) the step of accumulated, clipped gradients with the
lr damping / back-off / spike of this step only; `metrics_record` is the step's line of
``metrics.jsonl``; `guard_after_step` closes a recovery and takes the guard's snapshots;
`update_best` tracks the best evaluation for early stopping.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from dataguard.train.data import Encoded
from dataguard.train.dynamics.recorder import pass_of_rows
from dataguard.train.optim.optimizer import GradVarianceScaler
from dataguard.train.stability.guard import Verdict
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


def optimizer_step(accelerator: Any, optimizer: Any, scheduler: Any, scaler: Any, clip: Any, verdict: Verdict,
                    mean_loss: float, gvs: GradVarianceScaler | None, guard: Any, lr_spike: float,
                    monitor: Any) -> tuple[bool, float, dict[str, float], dict[str, float] | None]:
    """Apply (or skip) the optimizer step of accumulated, clipped gradients; returns (applied,
    base lr used, lr per group kind, update ratios when ``monitor`` is given). The lr damping /
    back-off / spike is for this step only; the scheduler steps only for an applied step."""
    ratios = None
    first = optimizer.param_groups[0]
    if (not clip.finite and scaler is None) or verdict.skip:
        applied = False  # never let a non-finite gradient (or a spike) reach the weights
        if scaler is not None and clip.finite:
            scaler.update()  # unscale_ was called: close this step for the scaler
        # the lr in force (the guard's back-off and a spike included), as an applied step logs it
        in_force = (guard.lr_scale if guard is not None else 1.0) * lr_spike
        lr = first["lr"] / (first.get("lr_mult") or 1.0) * in_force
        groups = {kind: value * in_force for kind, value in lr_groups(optimizer).items()}
    else:
        scheduled = [g["lr"] for g in optimizer.param_groups]
        factor = 1.0
        if gvs is not None and clip.finite:
            factor = gvs.update(clip.total_norm)
        factor = factor * (guard.lr_scale if guard is not None else 1.0) * lr_spike
        if factor != 1.0:
            for g in optimizer.param_groups:
                g["lr"] *= factor
        if monitor is not None:
            monitor.begin_update()
        optimizer.step()  # with a scaler, a non-finite step is skipped inside
        applied = clip.finite and not accelerator.optimizer_step_was_skipped
        if monitor is not None:
            ratios = monitor.update_ratios()
        lr = first["lr"] / (first.get("lr_mult") or 1.0)  # the base lr (x1.0) used
        groups = lr_groups(optimizer)
        if factor != 1.0:  # the damping / back-off is for this step only
            for g, value in zip(optimizer.param_groups, scheduled, strict=True):
                g["lr"] = value
    if applied:
        scheduler.step()
        if guard is not None:
            guard.accept(mean_loss, clip.total_norm)
    optimizer.zero_grad(set_to_none=True)
    return applied, lr, groups, ratios


def metrics_record(step: int, mean_loss: float, lr: float, clip: Any, applied: bool, tokens: int, seconds: float,
                   phase: int, scaler: Any, groups: dict[str, float], stats: dict[str, Any] | None,
                   ratios: dict[str, float] | None) -> dict[str, Any]:
    """The step's metrics line (per-layer statistics on monitored steps)."""
    record = {"step": step, "loss": mean_loss, "lr": lr, "grad_norm": clip.total_norm,
              "clipped": clip.clipped, "skipped": not applied, "tokens": tokens,
              "tokens_per_s": tokens / max(seconds, 1e-9), "phase": phase,
              "amp_scale": float(scaler.get_scale()) if scaler is not None else None, "lr_groups": groups}
    if scaler is not None:
        record["loss_scale"] = float(scaler.get_scale())
    if stats is not None:
        record.update(stats)
        record["update_ratios"] = ratios or {}
    return record


def guard_after_step(guard: Any, step: int, applied: bool, verdict: Verdict, max_grad_norm: float, events: Any,
                     lr: float, model: Any, optimizer: Any, scheduler: Any, scaler: Any) -> None:
    """The end of a recovery window (an event) and the guard's periodic in-memory snapshot."""
    if guard is None:
        return
    if guard.rollbacks and step == guard.recover_until:
        events.add(step, "recovered", "recovery_end", f"clip back to {max_grad_norm:g} after "
                   f"{guard.k['recovery_steps']} steps; lr scale stays x{guard.lr_scale:g}", lr=lr)
    if applied and not verdict.anomalies and not verdict.rollback and step % int(guard.k["snapshot_every"]) == 0:
        guard.take_snapshot(step, model, optimizer, scheduler, scaler)


def update_best(best: dict[str, Any], last_eval: dict[str, float], patience: int | None) -> tuple[bool, bool]:
    """Record an evaluation in ``best`` (metric, bad_evals); (is it the best so far, stop early?)."""
    is_best = False
    if best["metric"] is None or last_eval["loss"] < best["metric"]:
        best.update(metric=last_eval["loss"], bad_evals=0)
        is_best = True
    else:
        best["bad_evals"] += 1
    return is_best, bool(patience and best["bad_evals"] >= patience)
