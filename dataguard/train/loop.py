"""The training loop: shards -> batches -> accelerate -> checkpoints, readable top to bottom.

Under ``accelerate launch`` or ``torchrun`` (DDP; sharded FSDP/DeepSpeed is refused in
`prepare.check_distributed_type`) every process draws the same micro-batch from the
seeded sampler and trains on its slice ``rows[rank::world]``, so ``batch_size`` is the global
micro-batch and the data order does not depend on the number of processes.

One optimizer step = ``grad_accum`` micro-batches (accelerate's ``accumulate``), then:
unscale (fp16) -> layer-wise + global clipping -> skip the step if a gradient is not finite
-> optional gradient-variance lr damping -> ``optimizer.step`` -> scheduler step (only for an
applied step: the schedule counts optimizer steps). Metrics go to ``metrics.jsonl`` (and
TensorBoard) every step; evaluation every ``eval_every`` steps keeps the best checkpoint and
drives early stopping; checkpoints every ``save_every`` steps and at the end.

Monitor, guard and faults (``monitor.py``, ``guard.py``, ``faults.py``): on every
``monitor_every``-th step per-layer gradient norms, update ratios, grad/param std ratios and
the counts of huge gradients / weights join the metrics record (``histograms.jsonl`` every
``histogram_every`` steps); the guard skips a step with a non-finite loss or gradient or a
robust-z spike, rolls back to its last in-memory snapshot after ``max_anomalies`` anomalies
within ``anomaly_window`` steps (lr backed off, clipping tightened, Adam moments reset) and
after ``max_rollbacks`` rollbacks raises `TrainDiverged` with ``diagnosis.json``. Every event
(fault, anomaly, skip, rollback, recovered, checkpoint, stop) goes to ``events.jsonl``.

Exact resume: everything that decides the next step is in the checkpoint (weights,
optimizer, scheduler, scaler, RNG states, the sampler's position, the gradient-variance EMA,
the eval/early-stopping state, the guard's state and fired faults), and RNG is restored
last, after every object is built, so a resumed run computes bit-for-bit what the
uninterrupted one would have (fp32, CPU).

Dynamics (``dynamics:``, on by default; `dynamics_hook`): every micro-batch's per-row loss and
logits from the step's own forward go to ``dynamics.arrow`` (one entry per row and epoch; an
evaluation pass over the training rows for runs shorter than an epoch), saved with every
checkpoint so a resumed run writes the same file; anomaly events carry the named rows'
stage scores from the shards (`dynamics_rows`).

The pieces live in their own modules: `run_setup` (everything before the first step, RNG
restored last), `prepare` (resume check, encoding, class tensors, accelerator, run.json),
`forward` (one micro-batch: the loss and each row's scores),
`evaluate`, `metrics_log` (metrics.jsonl / TensorBoard), `respond` (acting on the guard's
verdict), `step` (the optimizer step, the metrics record, best-eval tracking) and `errors`;
this module keeps the loop and the checkpoint save.
"""

from __future__ import annotations

import json
import logging
import math
import os
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from dataguard.io.output import MARKER, OutputFolder, OutputFolderError
from dataguard.io.safe_files import LinkRefused, find_link, write_atomic
from dataguard.train import checkpoint as ckpt_mod
from dataguard.train.config import TrainConfig
from dataguard.train.data import Encoded, LabelMap
from dataguard.train.data.sampler import CurriculumSampler
from dataguard.train.dynamics.hook import DynamicsHook, row_scores
from dataguard.train.errors import TrainDiverged, TrainError
from dataguard.train.evaluate import evaluate
from dataguard.train.optim.forward import ForwardOut
from dataguard.train.optim.losses import IGNORE_INDEX
from dataguard.train.optim.optimizer import GradVarianceScaler, clip_gradients
from dataguard.train.prepare import RESUME_KEYS
from dataguard.train.report.metrics_log import final_against_best, progress_bar
from dataguard.train.run_setup import setup_run
from dataguard.train.stability.faults import garbage_batch, poison_grads, poison_loss
from dataguard.train.stability.guard import Verdict
from dataguard.train.stability.guard_resume import GUARD_SNAPSHOT, snapshot_to_save
from dataguard.train.stability.respond import respond
from dataguard.train.step import (
    ClipSettings,
    across_processes,
    draw_step,
    guard_after_step,
    metrics_record,
    optimizer_step,
    row_ids,
    update_best,
)
from dataguard.train.tasks import get_task
from dataguard.train.tasks.base import LossSettings

__all__ = ["IGNORE_INDEX", "RESUME_KEYS", "TrainDiverged", "TrainError", "TrainResult", "Trainer"]

log = logging.getLogger(__name__)


@dataclass
class TrainResult:
    """What a finished (or stopped) run did."""

    run_dir: Path
    steps: int
    total_steps: int
    final_loss: float | None
    skipped_steps: int
    best_metric: float | None = None
    best_checkpoint: str | None = None
    stopped_early: bool = False
    last_eval: dict[str, float] | None = None
    history: list[dict[str, Any]] = field(default_factory=list)
    checkpoint: Path | None = None
    rollbacks: int = 0
    events: list[dict[str, Any]] = field(default_factory=list)


class Trainer:
    """Train ``cfg.model`` on the shards of ``cfg.data``; ``fit()`` runs, ``fit(resume=True)``
    continues from the newest complete checkpoint in ``cfg.output``.

    ``on_step(step)`` is called after each optimizer step once its checkpoint (if any) is
    written (tests use it to kill or stop a run at a known point)."""

    def __init__(self, cfg: TrainConfig, *, progress: bool | None = None,
                 on_step: Callable[[int], None] | None = None, echo: Callable[[str], None] | None = None) -> None:
        self.cfg = cfg
        self.progress = sys.stderr.isatty() if progress is None else progress
        self.on_step = on_step
        self.echo = echo or (lambda text: log.info("%s", text))
        self.run_dir = Path(cfg.output)
        self.notes: list[str] = []

    def _warn(self, text: str) -> None:
        self.notes.append(text)
        warnings.warn(text, stacklevel=3)

    def fit(self, resume: bool = False, *, stop_after: int | None = None) -> TrainResult:
        """Train to ``total_steps`` (or ``stop_after`` steps, as if interrupted there).

        The run folder is claimed like a pipeline's output (``dataguard.io.output``): new,
        empty or already marked as dataguard's, and locked for the run, so a training run
        never writes into a user's folder and two runs never share one.
        """
        if int(os.environ.get("RANK", "0")) != 0:  # other ranks under `accelerate launch`
            wait_for_claim(self.run_dir)
            return self._fit(resume, stop_after)
        check_run_folder(self.run_dir, Path(self.cfg.data))
        folder = OutputFolder(self.run_dir)
        try:
            folder.claim()
        except OutputFolderError as exc:
            raise TrainError(str(exc)) from None
        link = find_link(self.run_dir)  # at any depth, checkpoints/ included: never written through
        if link is not None:
            folder.release()
            raise TrainError(str(LinkRefused(link)))
        try:
            return self._fit(resume, stop_after)
        finally:
            folder.release()

    def _fit(self, resume: bool, stop_after: int | None) -> TrainResult:
        cfg = self.cfg
        run = setup_run(cfg, self.run_dir, resume, echo=self.echo, warn=self._warn, notes=self.notes)
        accelerator, model, raw_model, tokenizer = run.accelerator, run.model, run.raw_model, run.tokenizer
        optimizer, scheduler, scaler = run.optimizer, run.scheduler, run.scaler
        device, main, rank, world, kinds = run.device, run.main, run.rank, run.world, run.kinds
        latest, label_map, enc, val, total = run.latest, run.label_map, run.enc, run.val, run.total
        sampler, offsets, class_weights, pad_id = run.sampler, run.offsets, run.class_weights, run.pad_id
        gvs, monitor, guard, plan = run.gvs, run.monitor, run.guard, run.plan
        lr_spike, vocab_size = run.lr_spike, run.vocab_size
        step, history, skipped, best = run.step, run.history, run.skipped, run.best
        metrics, events, hists = run.metrics, run.events, run.hists
        dyn = DynamicsHook.start(cfg, run, self.run_dir, resume, self.echo if main else lambda _: None)
        scores = row_scores(cfg)

        def forward(m: Any, batch: dict[str, torch.Tensor], denominator: float | None = None) -> ForwardOut:
            return self._loss(m, batch, offsets, class_weights, denominator, accelerator.autocast)

        bar = progress_bar(total, step) if self.progress else None
        stopped_early = False
        last_eval: dict[str, float] | None = None
        saved_at = step if latest is not None and resume else -1
        model.train()
        t_last = time.perf_counter()
        while step < total:
            if stop_after is not None and step >= stop_after:
                break
            now_step = step + 1
            due = plan.due(now_step) if plan else []
            for f in due:
                events.add(now_step, "fault", f.kind, f.describe(), layer=f.layer)
                if f.kind == "lr_spike":
                    lr_spike *= float(f.factor or 100.0)
            loss_sum, tokens, rows = 0.0, 0, []
            verdict, stats, ratios, hist = Verdict(), None, None, None
            monitor_step = now_step % cfg.monitor_every == 0
            phase = sampler.phase + 1  # the phase this step's batches are drawn in
            if guard is not None:
                guard.enter_phase(phase, now_step)  # a new curriculum phase moves the loss legitimately
            drawn = draw_step(accelerator, sampler, enc, task=cfg.task, grad_accum=cfg.grad_accum, pad_id=pad_id,
                              rank=rank, world=world, class_weights=class_weights)  # slices, step denominator
            for k, (idx, batch) in enumerate(drawn):
                rows.extend(row_ids(enc, idx))
                batch = {k: v.to(device) for k, v in batch.items()}
                if any(f.kind == "garbage_batch" for f in due):
                    batch = garbage_batch(batch, vocab_size, now_step)
                tokens += int(batch["attention_mask"].sum())
                with accelerator.accumulate(model):
                    out = forward(model, batch, drawn.denominator)
                    loss = out.loss
                    if dyn is not None:  # the forward just done: no extra pass (dataguard.train.dynamics.recorder)
                        dyn.record(now_step, drawn.passes_of(k), idx, out, batch)
                    if due:
                        loss = poison_loss(loss, due)
                    accelerator.backward(loss * drawn.backward_scale)
                    loss_sum += float(loss.detach())
                    if accelerator.sync_gradients:
                        if scaler is not None:
                            accelerator.unscale_gradients(optimizer)
                        for f in due:
                            if f.kind == "nan_grad":
                                poison_grads(monitor.layers, f.layer)
                        if monitor_step:
                            stats = monitor.stats()
                        if now_step % cfg.histogram_every == 0:
                            hist = monitor.histograms()
                        clip_cfg = cfg if guard is None else ClipSettings(cfg.clip_rules, guard.clip_norm(now_step))
                        clip = clip_gradients(raw_model, clip_cfg, kinds)
                        mean_loss = loss_sum  # the shares of the step's weighted mean add up
                        if world > 1:  # the loss of the whole batch: every process judges and logs the same
                            mean_loss, tokens = across_processes(accelerator, mean_loss, tokens, device)
                        bad_layers: list[str] = []
                        if not clip.finite or not math.isfinite(mean_loss):
                            bad_layers = monitor.nonfinite_layers()
                        if guard is not None and (scaler is None or clip.finite):  # fp16 overflow: the scaler's
                            verdict = guard.check(now_step, mean_loss, clip.total_norm, clip.finite, bad_layers)
                        elif guard is not None:  # an fp16 overflow: an anomaly once it persists
                            verdict = guard.scaler_skipped(now_step, float(scaler.get_scale()))
                        applied, lr, lr_groups, ratios = optimizer_step(
                            accelerator, optimizer, scheduler, scaler, clip, verdict, mean_loss, gvs, guard,
                            lr_spike, monitor if monitor_step else None)
                        if not applied:
                            skipped += 1
            step += 1
            if guard is not None and applied and (monitor_step or step % cfg.save_every == 0 or step == total):
                weights = guard.check_weights(step, monitor.max_abs_weight())
                if weights.anomalies:
                    verdict = Verdict(anomalies=verdict.anomalies + weights.anomalies, skip=False,
                                      rollback=weights.rollback, stop=weights.stop)
            now = time.perf_counter()
            record = metrics_record(step, mean_loss, lr, clip, applied, tokens, now - t_last, phase, scaler,
                                    lr_groups, stats, ratios)
            t_last = now
            history.append({k: record[k] for k in ("step", "loss", "lr", "grad_norm", "skipped")})
            metrics.write(record)
            if hist is not None:
                hists.write({"step": step, "layers": hist})
                metrics.write_histograms(step, hist)
            stop = respond(self.run_dir, step, verdict, applied, record, rows, bad_layers, guard, events, raw_model,
                           optimizer, scheduler, scaler, scores=scores)
            if stop is not None:
                if bar is not None:
                    bar.close()
                metrics.close()
                if dyn is not None:
                    dyn.finish(accelerator)
                raise TrainDiverged(stop)
            if verdict.rollback:
                lr_spike = 1.0  # the spike lived in the optimizer state that was rolled back
            if guard is not None:
                self._verified(guard.after_step(applied, verdict), step, events, main, lr)
            guard_after_step(guard, step, applied, verdict, cfg.max_grad_norm, events, lr, raw_model, optimizer,
                             scheduler, scaler)
            if bar is not None:
                bar.update(1)
                bar.set_postfix(loss=f"{record['loss']:.4f}", lr=f"{lr:.2e}", gnorm=f"{clip.total_norm:.3g}",
                                tok_s=f"{record['tokens_per_s']:.0f}")
            is_best = False
            if val is not None and (step % cfg.eval_every == 0 or step == total):
                last_eval = self._evaluate(model, val, pad_id, offsets, device)
                metrics.write({"step": step, **{f"eval_{k}": v for k, v in last_eval.items()}})
                model.train()
                if guard is not None:
                    self._verified(guard.after_eval(last_eval["loss"], best["metric"]), step, events, main, lr)
                    if applied and not verdict.anomalies and guard.eval_in_band(last_eval["loss"], best["metric"]):
                        self._verified(guard.verify_current(step, raw_model, optimizer, scheduler, scaler), step,
                                       events, main, lr)  # the state this eval measured
                is_best, stopped_early = update_best(best, last_eval, cfg.early_stopping_patience)
            if dyn is not None:
                dyn.at_eval(step, model, enc, pad_id=pad_id, device=device, forward=forward)
            if is_best or step % cfg.save_every == 0 or step == total or stopped_early:
                if is_best:
                    best["checkpoint"] = f"step-{step:06d}"
                path = self.run_dir
                if guard is not None and applied and not verdict.anomalies:  # pending until verified; taken
                    guard.take_snapshot(step, raw_model, optimizer, scheduler, scaler)  # first: the save records it
                dyn_files = dyn.checkpoint_files(accelerator, main) if dyn is not None else {}
                if main:
                    path = save_run_checkpoint(
                        self.run_dir, self.cfg, step, raw_model, tokenizer, optimizer, scheduler, scaler, sampler,
                        history, label_map, skipped, best, gvs, self._warn,
                        {"guard": guard.state_dict() if guard is not None else None,
                         "faults": {**plan.state_dict(), "lr_spike": lr_spike}},
                        snapshot_to_save(guard, self.run_dir, step), dyn_files)
                    events.add(step, "checkpoint", "save", str(path), lr=lr)
                accelerator.wait_for_everyone()
                if main and guard is not None and guard.snapshot is not None and guard.snapshot.step == step:
                    ckpt_mod.mark_verified(self.run_dir, step, f"verified by the guard at step {step}: its eval")
                saved_at = step
                if is_best and main:
                    write_atomic(self.run_dir / "best.json", json.dumps(
                        {"checkpoint": str(path), "eval_loss": best["metric"], "step": step}) + "\n")
            if self.on_step is not None:
                self.on_step(step)
            if stopped_early:
                self.echo(f"early stopping at step {step}: no eval improvement in {best['bad_evals']} evals")
                break
        if bar is not None:
            bar.close()
        metrics.close()
        if dyn is not None:
            dyn.finish(accelerator)
        if main:
            final_against_best(self.cfg, self.run_dir, last_eval, best, self._warn)
        final = ckpt_mod.latest_checkpoint(self.run_dir)
        return TrainResult(run_dir=self.run_dir, steps=step, total_steps=total,
                             final_loss=history[-1]["loss"] if history else None, skipped_steps=skipped,
                             best_metric=best["metric"], best_checkpoint=best["checkpoint"],
                             stopped_early=stopped_early, last_eval=last_eval, history=history,
                             checkpoint=final if saved_at >= 0 else None,
                             rollbacks=guard.rollbacks if guard is not None else 0, events=list(events.events))

    def _verified(self, snap: Any, step: int, events: Any, main: bool, lr: float) -> None:
        """A snapshot the guard just verified: an event, and its checkpoint's VERIFIED marker."""
        if snap is None:
            return
        marked = ckpt_mod.mark_verified(self.run_dir, snap.step, f"verified by the guard after step {snap.step}: "
                                        f"{snap.clean_steps} clean steps") if main else None
        events.add(step, "verified", "clean_steps" if snap.clean_steps else "eval",
                   f"the state of step {snap.step} is a rollback target"
                   + (f"; {marked.name} marked verified" if marked is not None else ""), lr=lr)

    def _loss(self, model: Any, batch: dict[str, torch.Tensor], offsets: torch.Tensor | None,
              class_weights: torch.Tensor | None, denominator: float | None = None,
              autocast: Any = None) -> ForwardOut:
        cfg = self.cfg
        settings = LossSettings(offsets=offsets, logit_adjustment=cfg.logit_adjustment,
                                label_smoothing=cfg.label_smoothing, class_weights=class_weights, beta=cfg.dpo_beta)
        return get_task(cfg.task).forward(model, batch, settings, denominator=denominator, autocast=autocast)

    def _evaluate(self, model: Any, val: Encoded, pad_id: int, offsets: torch.Tensor | None,
                  device: torch.device) -> dict[str, float]:
        """Validation loss and accuracy (`dataguard.train.evaluate.evaluate`)."""
        cfg = self.cfg
        return evaluate(model, val, task=cfg.task, batch_size=cfg.batch_size, pad_id=pad_id, offsets=offsets,
                        logit_adjustment=cfg.logit_adjustment, device=device, beta=cfg.dpo_beta)


def wait_for_claim(run_dir: Path, timeout_s: float = 600.0) -> None:
    """Another rank waits until rank 0 has claimed the run folder (its marker is written):
    anything it wrote first (the token cache) would make the folder look like a user's, and
    rank 0 would refuse it. Rank 0 failing to claim stops the launcher, and with it this rank."""
    deadline = time.monotonic() + timeout_s
    while not (run_dir / MARKER).is_file():
        if time.monotonic() > deadline:
            raise TrainError(f"{run_dir}: rank 0 did not claim the run folder within {timeout_s:.0f} s")
        time.sleep(0.05)


def check_run_folder(run_dir: Path, data: Path) -> None:
    """Refuse a run folder that is, holds or sits inside the pipeline output it trains on: the
    run would overwrite the pipeline's ``run.json`` (or train on its own files)."""
    run, shards = run_dir.resolve(), data.resolve()
    if run == shards or shards.is_relative_to(run) or run.is_relative_to(shards):
        raise TrainError(f"output {run_dir}: the run folder must be apart from the pipeline output it trains "
                         f"on ({data}); choose another output")


def save_run_checkpoint(run_dir: Path, cfg: TrainConfig, step: int, model: Any, tokenizer: Any, optimizer: Any,
                        scheduler: Any, scaler: Any, sampler: CurriculumSampler, history: list[dict[str, Any]],
                        label_map: LabelMap | None, skipped: int, best: dict[str, Any],
                        gvs: GradVarianceScaler | None, warn: Callable[[str], None],
                        guard_state: dict[str, Any] | None = None,
                        guard_snapshot: dict[str, torch.Tensor] | None = None,
                        more_files: dict[str, dict[str, torch.Tensor]] | None = None) -> Path:
    """Save the step's checkpoint with the loop's own state; a refused save is a warning and
    the newest complete checkpoint (or the run folder) is returned instead."""
    extra = {"skipped_steps": skipped, "best": dict(best),
             "grad_variance": gvs.state_dict() if gvs is not None else None, **(guard_state or {})}
    try:
        return ckpt_mod.save_checkpoint(
            run_dir, step, model, optimizer, scheduler, scaler, sampler.state_dict(),
            ckpt_mod.capture_rng(), history, label_map.to_json() if label_map else None, cfg.to_dict(),
            tokenizer=tokenizer, extra=extra, keep=cfg.keep_checkpoints,
            protect=[best["checkpoint"]] if best.get("checkpoint") else [],
            weight_bound=float(cfg.guard["weight_bound"]) if cfg.guard else None,
            tensor_files={**({GUARD_SNAPSHOT: guard_snapshot} if guard_snapshot else {}), **(more_files or {})} or None)
    except ckpt_mod.CheckpointError as exc:
        warn(str(exc))
        return ckpt_mod.latest_checkpoint(run_dir) or run_dir
