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

The trainer holds the run's state as attributes: `run_setup` builds the objects (everything
before the first step, RNG restored last; one attribute per field of `RunSetup`), `state`
groups the ones a step changes (`Trainables`) and the loop's counters (`RunState`), and
`step.StepOutcome` is one step as it went. The helpers take the trainer (typed by a Protocol
of what they read) or these small objects: `step` (drawing the batches, the optimizer step,
best-eval tracking), `metrics_log` (the metrics line, metrics.jsonl / TensorBoard),
`respond` (acting on the guard), `run_checkpoint` (the checkpoint of a step), `prepare`
(resume check, encoding, class tensors, accelerator, run.json), `forward` (one micro-batch:
the loss and each row's scores), `evaluate` and `errors`. This module keeps the loop.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import torch

from dataguard.io.output import MARKER, OutputFolder, OutputFolderError
from dataguard.io.safe_files import LinkRefused, find_link
from dataguard.train import checkpoint as ckpt_mod
from dataguard.train.config import TrainConfig
from dataguard.train.data import Encoded, LabelMap
from dataguard.train.data.sampler import CurriculumSampler
from dataguard.train.dynamics.hook import DynamicsHook, row_scores
from dataguard.train.dynamics.rows import RowScores
from dataguard.train.errors import TrainDiverged, TrainError
from dataguard.train.evaluate import evaluate
from dataguard.train.optim.forward import ForwardOut
from dataguard.train.optim.losses import IGNORE_INDEX
from dataguard.train.optim.optimizer import GradVarianceScaler, clip_gradients
from dataguard.train.prepare import RESUME_KEYS
from dataguard.train.report.jsonl_log import JsonlLog
from dataguard.train.report.metrics_log import (
    MetricsLog,
    advance_bar,
    final_against_best,
    metrics_record,
    progress_bar,
)
from dataguard.train.run_checkpoint import checkpoint_step
from dataguard.train.run_setup import setup_run
from dataguard.train.stability.faults import Fault, FaultPlan, garbage_batch, poison_grads, poison_loss
from dataguard.train.stability.guard import EventLog, Guard
from dataguard.train.stability.monitor import Monitor
from dataguard.train.stability.respond import after_eval, after_step, check_weights, respond
from dataguard.train.state import RunState, Trainables
from dataguard.train.step import (
    ClipSettings,
    StepOutcome,
    across_processes,
    draw_step,
    optimizer_step,
    row_ids,
    update_best,
)
from dataguard.train.tasks import get_task
from dataguard.train.tasks.base import LossSettings, Task

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

    @classmethod
    def of(cls, run_dir: Path, state: RunState, total: int, guard: Guard | None, events: EventLog) -> TrainResult:
        """The result of a run that ended (or stopped) in ``state``."""
        final = ckpt_mod.latest_checkpoint(run_dir)
        return cls(run_dir=run_dir, steps=state.step, total_steps=total,
                   final_loss=state.history[-1]["loss"] if state.history else None, skipped_steps=state.skipped,
                   best_metric=state.best["metric"], best_checkpoint=state.best["checkpoint"],
                   stopped_early=state.stopped_early, last_eval=state.last_eval, history=state.history,
                   checkpoint=final if state.saved else None, rollbacks=guard.rollbacks if guard is not None else 0,
                   events=list(events.events))


class Trainer:
    """Train ``cfg.model`` on the shards of ``cfg.data``; ``fit()`` runs, ``fit(resume=True)``
    continues from the newest complete checkpoint in ``cfg.output``.

    ``on_step(step)`` is called after each optimizer step once its checkpoint (if any) is
    written (tests use it to kill or stop a run at a known point, or to look at the state)."""

    # the run's state, set when `fit` starts: the fields of `run_setup.RunSetup`, then the rest
    accelerator: Any
    model: Any  # accelerate's wrapper, for the forward; trainables.model is the unwrapped model
    trainables: Trainables
    tokenizer: Any
    device: torch.device
    main: bool
    rank: int
    world: int
    kinds: Any
    latest: Path | None
    label_map: LabelMap | None
    enc: Encoded
    val: Encoded | None
    total: int
    sampler: CurriculumSampler
    loss_settings: LossSettings
    pad_id: int
    gvs: GradVarianceScaler | None
    monitor: Monitor
    guard: Guard | None
    plan: FaultPlan
    vocab_size: int
    state: RunState
    metrics: MetricsLog
    events: EventLog
    hists: JsonlLog
    task: Task
    dyn: DynamicsHook | None
    scores: RowScores | None

    def __init__(self, cfg: TrainConfig, *, progress: bool | None = None,
                 on_step: Callable[[int], None] | None = None, echo: Callable[[str], None] | None = None) -> None:
        self.cfg = cfg
        self.progress = sys.stderr.isatty() if progress is None else progress
        self.on_step = on_step
        self.echo = echo or (lambda text: log.info("%s", text))
        self.run_dir = Path(cfg.output)
        self.notes: list[str] = []

    def warn(self, text: str) -> None:
        """A warning for the caller, also kept for ``run.json``."""
        self.notes.append(text)
        warnings.warn(text, stacklevel=3)

    def fit(self, resume: bool = False, *, stop_after: int | None = None) -> TrainResult:
        """Train to ``total_steps`` (or ``stop_after`` steps, as if interrupted there).

        The run folder is claimed like a pipeline's output (``dataguard.io.output``): new,
        empty or already marked as dataguard's, and locked for the run, so a training run
        never writes into a user's folder and two runs never share one.
        """
        with claimed_run_folder(self.run_dir, Path(self.cfg.data)):
            return self._fit(resume, stop_after)

    def _start(self, resume: bool) -> None:
        """Build the run (`setup_run`) and hold its objects."""
        run = setup_run(self.cfg, self.run_dir, resume, echo=self.echo, warn=self.warn, notes=self.notes)
        for f in fields(run):
            setattr(self, f.name, getattr(run, f.name))
        self.task = get_task(self.cfg.task)
        self.dyn = DynamicsHook.start(self.cfg, run, self.run_dir, resume, self.echo if self.main else lambda _: None)
        self.scores = row_scores(self.cfg)

    def _fit(self, resume: bool, stop_after: int | None) -> TrainResult:
        self._start(resume)
        cfg, state = self.cfg, self.state
        bar = progress_bar(self.total, state.step) if self.progress else None
        self.model.train()
        t_last = time.perf_counter()
        while state.step < self.total and not state.stopped_early and (stop_after is None or state.step < stop_after):
            out = self._train_step()
            state.step = out.step
            state.skipped += not out.applied
            weights_due = out.step % cfg.monitor_every == 0 or out.step % cfg.save_every == 0 or out.step == self.total
            check_weights(self, out, weights_due)
            now = time.perf_counter()
            record = metrics_record(out, now - t_last, self.trainables.scaler)
            t_last = now
            self._log(out, record)
            stop = respond(self, out)
            if stop is not None:
                self._close(bar)
                raise TrainDiverged(stop)
            if out.verdict.rollback:
                self.plan.rolled_back()
            after_step(self, out)
            advance_bar(bar, record)
            is_best = self._evaluate_step(out)
            if self.dyn is not None:
                self.dyn.at_eval(out.step, self.model, self.enc, pad_id=self.pad_id, device=self.device,
                                 forward=self._loss)
            if is_best or out.step % cfg.save_every == 0 or out.step == self.total or state.stopped_early:
                checkpoint_step(self, out, is_best)
            if self.on_step is not None:
                self.on_step(out.step)
            if state.stopped_early:
                self.echo(f"early stopping at step {out.step}: no eval improvement in {state.best['bad_evals']} evals")
                break
        self._close(bar)
        if self.main:
            final_against_best(cfg, self.run_dir, state.last_eval, state.best, self.warn)
        return TrainResult.of(self.run_dir, state, self.total, self.guard, self.events)

    def _train_step(self) -> StepOutcome:
        """One optimizer step: its faults, ``grad_accum`` micro-batches forward and backward,
        then (`_apply`) clipping, the guard's verdict and the optimizer step."""
        step = self.state.step + 1
        due = self.plan.due(step) if self.plan else []
        for f in due:
            self.events.add(step, "fault", f.kind, f.describe(), layer=f.layer)
        out = StepOutcome(step=step, phase=self.sampler.phase + 1)  # the phase this step's batches are drawn in
        if self.guard is not None:
            self.guard.enter_phase(out.phase, step)  # a new curriculum phase moves the loss legitimately
        drawn = draw_step(self.accelerator, self.sampler, self.enc, task=self.cfg.task, grad_accum=self.cfg.grad_accum,
                          pad_id=self.pad_id, rank=self.rank, world=self.world,
                          class_weights=self.loss_settings.class_weights)  # slices, step denominator
        loss_sum = 0.0
        for k, (idx, batch) in enumerate(drawn):
            out.rows.extend(row_ids(self.enc, idx))
            batch = {name: v.to(self.device) for name, v in batch.items()}
            if any(f.kind == "garbage_batch" for f in due):
                batch = garbage_batch(batch, self.vocab_size, step)
            out.tokens += int(batch["attention_mask"].sum())
            with self.accelerator.accumulate(self.model):
                forward = self._loss(self.model, batch, drawn.denominator)
                loss = forward.loss
                if self.dyn is not None:  # the forward just done: no extra pass (dataguard.train.dynamics.recorder)
                    self.dyn.record(step, drawn.passes_of(k), idx, forward, batch)
                if due:
                    loss = poison_loss(loss, due)
                self.accelerator.backward(loss * drawn.backward_scale)
                loss_sum += float(loss.detach())
                if self.accelerator.sync_gradients:
                    self._apply(out, loss_sum, due)
        return out

    def _apply(self, out: StepOutcome, loss_sum: float, due: list[Fault]) -> None:
        """The accumulated gradients: unscale, monitor, clip, judge, then the optimizer step."""
        cfg, guard, monitor, scaler = self.cfg, self.guard, self.monitor, self.trainables.scaler
        monitor_step = out.step % cfg.monitor_every == 0
        if scaler is not None:
            self.accelerator.unscale_gradients(self.trainables.optimizer)
        for f in due:
            if f.kind == "nan_grad":
                poison_grads(monitor.layers, f.layer)
        if monitor_step:
            out.stats = monitor.stats()
        if out.step % cfg.histogram_every == 0:
            out.hist = monitor.histograms()
        clip_cfg = cfg if guard is None else ClipSettings(cfg.clip_rules, guard.clip_norm(out.step))
        out.clip = clip_gradients(self.trainables.model, clip_cfg, self.kinds)
        out.loss = loss_sum  # the shares of the step's weighted mean add up
        if self.world > 1:  # the loss of the whole batch: every process judges and logs the same
            out.loss, out.tokens = across_processes(self.accelerator, out.loss, out.tokens, self.device)
        if not out.clip.finite or not math.isfinite(out.loss):
            out.bad_layers = monitor.nonfinite_layers()
        if guard is not None and (scaler is None or out.clip.finite):  # fp16 overflow: the scaler's
            out.verdict = guard.check(out.step, out.loss, out.clip.total_norm, out.clip.finite, out.bad_layers)
        elif guard is not None:  # an fp16 overflow: an anomaly once it persists
            out.verdict = guard.scaler_skipped(out.step, float(scaler.get_scale()))
        optimizer_step(self, out, monitor if monitor_step else None)

    def _log(self, out: StepOutcome, record: dict[str, Any]) -> None:
        """The step's metrics line, its history entry and its histograms."""
        self.state.history.append({k: record[k] for k in ("step", "loss", "lr", "grad_norm", "skipped")})
        self.metrics.write(record)
        if out.hist is not None:
            self.hists.write({"step": out.step, "layers": out.hist})
            self.metrics.write_histograms(out.step, out.hist)

    def _evaluate_step(self, out: StepOutcome) -> bool:
        """Validation loss and accuracy (`evaluate`) every ``eval_every`` steps and at the last;
        whether this is the best evaluation so far."""
        cfg, state, step = self.cfg, self.state, out.step
        if self.val is None or not (step % cfg.eval_every == 0 or step == self.total):
            return False
        state.last_eval = evaluate(self.model, self.val, task=cfg.task, batch_size=cfg.batch_size, pad_id=self.pad_id,
                                   offsets=self.loss_settings.offsets, logit_adjustment=cfg.logit_adjustment,
                                   device=self.device, beta=cfg.dpo_beta)
        self.metrics.write({"step": step, **{f"eval_{k}": v for k, v in state.last_eval.items()}})
        self.model.train()
        after_eval(self, out, state.last_eval["loss"], state.best["metric"])  # the state this eval measured
        is_best, state.stopped_early = update_best(state.best, state.last_eval, cfg.early_stopping_patience)
        return is_best

    def _loss(self, model: Any, batch: dict[str, torch.Tensor], denominator: float | None = None) -> ForwardOut:
        return self.task.forward(model, batch, self.loss_settings, denominator=denominator,
                                 autocast=self.accelerator.autocast)

    def _close(self, bar: Any) -> None:
        """Close the progress bar and the metrics log; write ``dynamics.arrow``."""
        if bar is not None:
            bar.close()
        self.metrics.close()
        if self.dyn is not None:
            self.dyn.finish(self.accelerator)


@contextlib.contextmanager
def claimed_run_folder(run_dir: Path, data: Path) -> Iterator[None]:
    """Hold the run folder for the run (rank 0 claims it; other ranks wait for the claim)."""
    if int(os.environ.get("RANK", "0")) != 0:  # other ranks under `accelerate launch`
        wait_for_claim(run_dir)
        yield
        return
    check_run_folder(run_dir, data)
    folder = OutputFolder(run_dir)
    try:
        folder.claim()
    except OutputFolderError as exc:
        raise TrainError(str(exc)) from None
    link = find_link(run_dir)  # at any depth, checkpoints/ included: never written through
    if link is not None:
        folder.release()
        raise TrainError(str(LinkRefused(link)))
    try:
        yield
    finally:
        folder.release()


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
