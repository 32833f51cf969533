"""The training loop: shards -> batches -> accelerate -> checkpoints, readable top to bottom.

Under ``accelerate launch`` (DDP/FSDP) every process draws the same micro-batch from the
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

import numpy as np
import torch

from dataguard.io.output import OutputFolder, OutputFolderError
from dataguard.train import checkpoint as ckpt_mod
from dataguard.train.config import TrainConfig
from dataguard.train.data import (
    Encoded,
    LabelMap,
    RunShards,
    TrainDataError,
    class_vector,
    curriculum_schedule,
    encode_classify,
    encode_sft,
    length_cap,
    run_split,
    tokenizer_mismatch,
)
from dataguard.train.faults import FaultPlan, garbage_batch, poison_grads, poison_loss
from dataguard.train.guard import EventLog, Guard, JsonlLog, Verdict, write_diagnosis
from dataguard.train.losses import causal_lm_loss, logit_adjusted_cross_entropy, posthoc_adjust
from dataguard.train.model import (
    apply_lora,
    describe_groups,
    enable_gradient_checkpointing,
    groups_record,
    kind_params,
    load_model,
)
from dataguard.train.monitor import Monitor
from dataguard.train.optim import (
    GradVarianceScaler,
    build_optimizer,
    clip_gradients,
    warmup_cosine,
    warmup_steps_for,
)
from dataguard.train.sampler import CurriculumSampler, steps_per_epoch

log = logging.getLogger(__name__)
IGNORE_INDEX = -100
# Settings that decide the schedule, the data order or the parameters: a resume must keep them.
RESUME_KEYS = ("task", "model", "data", "seed", "precision", "batch_size", "grad_accum", "max_steps", "epochs",
               "lr", "warmup_ratio", "warmup_steps", "min_lr", "lr_multipliers", "lr_patterns", "lora",
               "max_length", "packing", "eval_fraction", "curriculum", "curriculum_unit", "curriculum_boundaries")


class TrainError(RuntimeError):
    """A run that cannot start or continue (message says what to change)."""


class TrainDiverged(TrainError):
    """The guard stopped a diverging run (one line naming the step, cause and diagnosis file)."""


@dataclass
class _ClipSettings:
    """The clipping settings of one step (the guard tightens ``max_grad_norm`` while recovering)."""

    clip_rules: Any
    max_grad_norm: float


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

    # ------------------------------------------------------------------------ setup
    def _warn(self, text: str) -> None:
        self.notes.append(text)
        warnings.warn(text, stacklevel=3)

    def _accelerator(self) -> Any:
        from accelerate import Accelerator
        from accelerate.utils import GradScalerKwargs

        cfg = self.cfg
        cuda = torch.cuda.is_available()
        if cfg.device == "cuda" and not cuda:
            raise TrainError("device: cuda, but torch sees no CUDA device (use device: auto or cpu)")
        on_cpu = cfg.device == "cpu" or (cfg.device == "auto" and not cuda)
        if cfg.precision == "fp16" and on_cpu:
            raise TrainError("precision fp16 needs a CUDA device (use bf16 or fp32 on CPU)")
        _release_accelerator_state(cfg.precision)
        handlers = [GradScalerKwargs(init_scale=2.0 ** 16, growth_interval=2000)] if cfg.precision == "fp16" else []
        return Accelerator(mixed_precision={"fp32": "no", "bf16": "bf16", "fp16": "fp16"}[cfg.precision],
                           gradient_accumulation_steps=cfg.grad_accum, cpu=on_cpu, kwargs_handlers=handlers)

    def _encode(self, run: RunShards, tokenizer: Any, label_map: LabelMap | None,
                train_idx: np.ndarray, val_idx: np.ndarray) -> tuple[Encoded, Encoded | None, int | None]:
        cfg = self.cfg
        train_table, val_table = run.table.take(train_idx), run.table.take(val_idx)
        if cfg.task == "sft":
            cap, counted_by = length_cap(run.manifest)
            max_length = cfg.max_length or cap
            if cfg.max_length is None and cap is not None:
                mismatch = tokenizer_mismatch(counted_by, tokenizer)
                if mismatch:
                    self._warn(mismatch)
            train = encode_sft(train_table, tokenizer, max_length, packing=cfg.packing)
            val = self._encode_val(lambda: encode_sft(val_table, tokenizer, max_length), len(val_idx))
            return train, val, max_length
        assert label_map is not None
        train = encode_classify(train_table, tokenizer, label_map, cfg.max_length)
        val = self._encode_val(lambda: encode_classify(val_table, tokenizer, label_map, cfg.max_length),
                               len(val_idx))
        return train, val, cfg.max_length

    def _encode_val(self, encode: Callable[[], Encoded], n_rows: int) -> Encoded | None:
        """The validation examples, or None (with a note) when no row survives encoding."""
        if not n_rows:
            return None
        try:
            return encode()
        except TrainDataError as exc:
            self._warn(f"no validation: {exc}")
            return None

    def _class_tensors(self, run: RunShards, label_map: LabelMap, enc: Encoded,
                       device: torch.device) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """(logit offsets, class weights) in label-map order, on ``device``."""
        offsets = class_vector(run.training, label_map, "logit_offsets")
        off = (torch.tensor([math.nan if v is None else float(v) for v in offsets], device=device)
               if offsets is not None else None)
        weights = None
        if self.cfg.class_balanced:
            cw = class_vector(run.training, label_map, "class_weights")
            if cw is None:  # no longtail stage: inverse frequency of the training rows, mean 1
                counts = np.bincount(np.asarray(enc.class_ids), minlength=len(label_map)).astype(np.float64)
                inv = np.where(counts > 0, 1.0 / np.maximum(counts, 1), 0.0)
                cw = list(inv * (counts > 0).sum() / max(inv.sum(), 1e-12))
            weights = torch.tensor([1.0 if v is None else float(v) for v in cw], dtype=torch.float32, device=device)
        if self.cfg.logit_adjustment and off is None:
            self._warn("logit_adjustment is on but the manifest has no logit offsets (no longtail stage); "
                       "training with plain cross-entropy")
        return off, weights

    # -------------------------------------------------------------------------- fit
    def fit(self, resume: bool = False, *, stop_after: int | None = None) -> TrainResult:
        """Train to ``total_steps`` (or ``stop_after`` steps, as if interrupted there).

        The run folder is claimed like a pipeline's output (``dataguard.io.output``): new,
        empty or already marked as dataguard's, and locked for the run, so a training run
        never writes into a user's folder and two runs never share one.
        """
        if int(os.environ.get("RANK", "0")) != 0:  # other ranks under `accelerate launch`
            return self._fit(resume, stop_after)
        folder = OutputFolder(self.run_dir)
        try:
            folder.claim()
        except OutputFolderError as exc:
            raise TrainError(str(exc)) from None
        try:
            return self._fit(resume, stop_after)
        finally:
            folder.release()

    def _fit(self, resume: bool, stop_after: int | None) -> TrainResult:
        cfg = self.cfg
        if cfg.threads is not None:
            # On a shared or small CPU, torch's default (all cores) can be 10x slower per step
            # than one thread; float sums may round differently per setting, so keep it fixed
            # across a resume (it is part of the saved settings).
            torch.set_num_threads(cfg.threads)
        torch.manual_seed(cfg.seed)
        np.random.seed(cfg.seed % 2 ** 32)
        import random

        random.seed(cfg.seed)
        run = RunShards.open(cfg.data, task=cfg.task)
        latest = ckpt_mod.latest_checkpoint(self.run_dir)
        if not resume and latest is not None:
            raise TrainError(f"{self.run_dir} already has checkpoints (newest {latest.name}); resume with "
                             "--resume, or choose another output")
        if resume and latest is not None:
            self._check_resumable(latest)
        if resume and latest is None:
            self.echo(f"no complete checkpoint in {self.run_dir}; starting from step 0")
        self.run_dir.mkdir(parents=True, exist_ok=True)

        label_map = None
        if cfg.task == "classify":
            label_map = LabelMap.from_run(run.table, run.training)
            if latest is not None and resume and (latest / "label_map.json").is_file():
                label_map = LabelMap.load(latest / "label_map.json")
        model, tokenizer = load_model(cfg.task, cfg.model, label_map=label_map)
        lora_record = None
        if cfg.lora:
            model, lora_record = apply_lora(model, cfg.lora, cfg.task)
            self.echo(f"LoRA: {lora_record['trainable_params']:,} trainable of {lora_record['total_params']:,} "
                      f"parameters in {lora_record['wrapped_layers']} layers")
        if cfg.gradient_checkpointing:
            enable_gradient_checkpointing(model)

        train_idx, val_idx, split_source = run_split(run, cfg.eval_fraction, cfg.seed)
        enc, val, max_length = self._encode(run, tokenizer, label_map, train_idx, val_idx)
        total = cfg.max_steps or steps_per_epoch(int(np.sum(enc.repeat)), cfg.batch_size, cfg.grad_accum) * cfg.epochs

        schedule = curriculum_schedule(run.training, label_map) if (cfg.curriculum and label_map) else None
        boundaries = cfg.curriculum_boundaries or (schedule[1] if schedule else None)
        sampler = CurriculumSampler(len(enc), repeat=enc.repeat,
                                    class_ids=enc.class_ids if schedule else None,
                                    phase_multipliers=schedule[0] if schedule else None, boundaries=boundaries,
                                    total_steps=total, batch_size=cfg.batch_size, seed=cfg.seed,
                                    unit=cfg.curriculum_unit, grad_accum=cfg.grad_accum, epochs=cfg.epochs)

        optimizer, groups = build_optimizer(model, cfg)
        table = describe_groups(groups)
        self.echo("parameter groups:\n" + table)
        warmup = warmup_steps_for(total, cfg.warmup_ratio, cfg.warmup_steps)
        scheduler = warmup_cosine(optimizer, total, warmup, min_lr=cfg.min_lr, base_lr=cfg.lr)

        accelerator = self._accelerator()
        model, optimizer = accelerator.prepare(model, optimizer)
        scaler = accelerator.scaler
        device = accelerator.device
        raw_model = accelerator.unwrap_model(model)
        main = accelerator.is_main_process  # one writer of files under several processes
        rank, world = accelerator.process_index, accelerator.num_processes
        if world > cfg.batch_size:
            raise TrainError(f"batch_size {cfg.batch_size} is smaller than the {world} processes; each needs a row")
        kinds = kind_params(raw_model)
        offsets = class_weights = None
        if cfg.task == "classify":
            offsets, class_weights = self._class_tensors(run, label_map, enc, device)
        pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        gvs = GradVarianceScaler() if cfg.grad_variance_scaling else None
        monitor = Monitor(raw_model)
        guard = Guard(cfg.guard, cfg.max_grad_norm) if cfg.guard else None
        plan = FaultPlan(cfg.faults)
        for f in plan.faults:
            if f.kind == "nan_grad" and f.layer is not None and f.layer not in monitor.layers:
                raise TrainError(f"fault at step {f.step}: no layer {f.layer!r} (layers: {', '.join(monitor.names)})")
        lr_spike = 1.0
        vocab_size = int(getattr(raw_model.config, "vocab_size", 0) or 0) or 256

        step, history, skipped = 0, [], 0
        best: dict[str, Any] = {"metric": None, "checkpoint": None, "bad_evals": 0}
        rng_state = None
        if resume and latest is not None:
            loaded = ckpt_mod.load_checkpoint(latest, raw_model, optimizer, scheduler, scaler)
            if loaded.sampler_state:
                sampler.load_state_dict(loaded.sampler_state)
            step, history, rng_state = loaded.step, list(loaded.history), loaded.rng
            skipped = int(loaded.extra.get("skipped_steps", 0))
            best.update(loaded.extra.get("best", {}))
            if gvs is not None and loaded.extra.get("grad_variance"):
                gvs.load_state_dict(loaded.extra["grad_variance"])
            if guard is not None and loaded.extra.get("guard"):
                guard.load_state_dict(loaded.extra["guard"])
            plan.load_state_dict(loaded.extra.get("faults") or {})
            lr_spike = float((loaded.extra.get("faults") or {}).get("lr_spike", 1.0))
            self.echo(f"resumed from {latest} at step {step}")
        if main:
            self._write_summary(groups, lora_record, split_source, enc, val, total, warmup, max_length, label_map)
        metrics = _Metrics(self.run_dir, cfg.tensorboard and main, resume_step=step, warn=self._warn,
                           enabled=main)
        resumed_at = step if resume and latest is not None else None
        events = EventLog(self.run_dir if main else None, resume_step=resumed_at)
        hists = JsonlLog(self.run_dir / "histograms.jsonl" if main else None, resume_step=resumed_at)
        if guard is not None:
            guard.take_snapshot(step, raw_model, optimizer, scheduler, scaler)
        if main and label_map is not None and not (self.run_dir / "label_map.json").exists():
            label_map.save(self.run_dir / "label_map.json")
        if rng_state is not None:
            ckpt_mod.restore_rng(rng_state)  # last: nothing after this may draw before training

        bar = _bar(total, step) if self.progress else None
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
            for _ in range(cfg.grad_accum):
                idx, mult = sampler.next_batch()
                if world > 1:  # every process draws the same batch and trains on its own slice
                    idx, mult = idx[rank::world], mult[rank::world]
                rows.extend(_row_ids(enc, idx))
                batch = {k: v.to(device) for k, v in enc.collate(idx, pad_id, mult).items()}
                if any(f.kind == "garbage_batch" for f in due):
                    batch = garbage_batch(batch, vocab_size, now_step)
                tokens += int(batch["attention_mask"].sum())
                with accelerator.accumulate(model):
                    loss = self._loss(model, batch, offsets, class_weights)
                    if due:
                        loss = poison_loss(loss, due)
                    accelerator.backward(loss)
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
                        clip_cfg = cfg if guard is None else _ClipSettings(cfg.clip_rules, guard.clip_norm(now_step))
                        clip = clip_gradients(raw_model, clip_cfg, kinds)
                        mean_loss = loss_sum / cfg.grad_accum
                        bad_layers: list[str] = []
                        if not clip.finite or not math.isfinite(mean_loss):
                            bad_layers = monitor.nonfinite_layers()
                        if guard is not None and (scaler is None or clip.finite):  # fp16 overflow: the scaler's
                            seen = mean_loss
                            if world > 1:  # every process must take the same decision: judge the mean loss
                                seen = float(accelerator.reduce(torch.tensor(mean_loss, device=device), "mean"))
                            verdict = guard.check(now_step, seen, clip.total_norm, clip.finite, bad_layers)
                        first = optimizer.param_groups[0]
                        if (not clip.finite and scaler is None) or verdict.skip:
                            applied = False  # never let a non-finite gradient (or a spike) reach the weights
                            if scaler is not None and clip.finite:
                                scaler.update()  # unscale_ was called: close this step for the scaler
                            lr = first["lr"] / (first.get("lr_mult") or 1.0)
                            lr_groups = _lr_groups(optimizer)
                        else:
                            scheduled = [g["lr"] for g in optimizer.param_groups]
                            factor = 1.0
                            if gvs is not None and clip.finite:
                                factor = gvs.update(clip.total_norm)
                            factor = factor * (guard.lr_scale if guard is not None else 1.0) * lr_spike
                            if factor != 1.0:
                                for g in optimizer.param_groups:
                                    g["lr"] *= factor
                            if monitor_step:
                                monitor.begin_update()
                            optimizer.step()  # with a scaler, a non-finite step is skipped inside
                            applied = clip.finite and not accelerator.optimizer_step_was_skipped
                            if monitor_step:
                                ratios = monitor.update_ratios()
                            lr = first["lr"] / (first.get("lr_mult") or 1.0)  # the base lr (x1.0) used
                            lr_groups = _lr_groups(optimizer)
                            if factor != 1.0:  # the damping / back-off is for this step only
                                for g, value in zip(optimizer.param_groups, scheduled, strict=True):
                                    g["lr"] = value
                        if applied:
                            scheduler.step()
                            if guard is not None:
                                guard.accept(mean_loss, clip.total_norm)
                        else:
                            skipped += 1
                        optimizer.zero_grad(set_to_none=True)
            step += 1
            if guard is not None and applied and (monitor_step or step % cfg.save_every == 0 or step == total):
                weights = guard.check_weights(step, monitor.max_abs_weight())
                if weights.anomalies:
                    verdict = Verdict(anomalies=verdict.anomalies + weights.anomalies, skip=False,
                                      rollback=weights.rollback, stop=weights.stop)
            now = time.perf_counter()
            record = {"step": step, "loss": loss_sum / cfg.grad_accum, "lr": lr, "grad_norm": clip.total_norm,
                      "clipped": clip.clipped, "skipped": not applied, "tokens": tokens,
                      "tokens_per_s": tokens / max(now - t_last, 1e-9), "phase": sampler.phase + 1,
                      "amp_scale": float(scaler.get_scale()) if scaler is not None else None, "lr_groups": lr_groups}
            t_last = now
            if scaler is not None:
                record["loss_scale"] = float(scaler.get_scale())
            if stats is not None:
                record.update(stats)
                record["update_ratios"] = ratios or {}
            history.append({k: record[k] for k in ("step", "loss", "lr", "grad_norm", "skipped")})
            metrics.write(record)
            if hist is not None:
                hists.write({"step": step, "layers": hist})
            stop = self._respond(step, verdict, applied, record, rows, bad_layers, guard, events, raw_model,
                                 optimizer, scheduler, scaler)
            if stop is not None:
                if bar is not None:
                    bar.close()
                metrics.close()
                raise TrainDiverged(stop)
            if verdict.rollback:
                lr_spike = 1.0  # the spike lived in the optimizer state that was rolled back
            if guard is not None and guard.rollbacks and step == guard.recover_until:
                events.add(step, "recovered", "recovery_end", f"clip back to {cfg.max_grad_norm:g} after "
                           f"{guard.k['recovery_steps']} steps; lr scale stays x{guard.lr_scale:g}", lr=lr)
            if guard is not None and applied and not verdict.anomalies and not verdict.rollback \
                    and step % int(guard.k["snapshot_every"]) == 0:
                guard.take_snapshot(step, raw_model, optimizer, scheduler, scaler)
            if bar is not None:
                bar.update(1)
                bar.set_postfix(loss=f"{record['loss']:.4f}", lr=f"{lr:.2e}", gnorm=f"{clip.total_norm:.3g}",
                                tok_s=f"{record['tokens_per_s']:.0f}")
            is_best = False
            if val is not None and (step % cfg.eval_every == 0 or step == total):
                last_eval = self._evaluate(model, val, pad_id, offsets, device)
                metrics.write({"step": step, **{f"eval_{k}": v for k, v in last_eval.items()}})
                model.train()
                if best["metric"] is None or last_eval["loss"] < best["metric"]:
                    best.update(metric=last_eval["loss"], bad_evals=0)
                    is_best = True
                else:
                    best["bad_evals"] += 1
                stopped_early = bool(cfg.early_stopping_patience and best["bad_evals"] >= cfg.early_stopping_patience)
            if is_best or step % cfg.save_every == 0 or step == total or stopped_early:
                if is_best:
                    best["checkpoint"] = f"step-{step:06d}"
                path = self.run_dir
                if main:
                    path = self._save(step, raw_model, tokenizer, optimizer, scheduler, scaler, sampler, history,
                                      label_map, skipped, best, gvs,
                                      {"guard": guard.state_dict() if guard is not None else None,
                                       "faults": {**plan.state_dict(), "lr_spike": lr_spike}})
                    events.add(step, "checkpoint", "save", str(path), lr=lr)
                accelerator.wait_for_everyone()
                if guard is not None:  # a resumed run's snapshot is this checkpoint: keep the same one here
                    guard.take_snapshot(step, raw_model, optimizer, scheduler, scaler)
                saved_at = step
                if is_best and main:
                    (self.run_dir / "best.json").write_text(json.dumps(
                        {"checkpoint": str(path), "eval_loss": best["metric"], "step": step}) + "\n")
            if self.on_step is not None:
                self.on_step(step)
            if stopped_early:
                self.echo(f"early stopping at step {step}: no eval improvement in {best['bad_evals']} evals")
                break
        if bar is not None:
            bar.close()
        metrics.close()
        final = ckpt_mod.latest_checkpoint(self.run_dir)
        result = TrainResult(run_dir=self.run_dir, steps=step, total_steps=total,
                             final_loss=history[-1]["loss"] if history else None, skipped_steps=skipped,
                             best_metric=best["metric"], best_checkpoint=best["checkpoint"],
                             stopped_early=stopped_early, last_eval=last_eval, history=history,
                             checkpoint=final if saved_at >= 0 else None,
                             rollbacks=guard.rollbacks if guard is not None else 0, events=list(events.events))
        return result

    def _respond(self, step: int, verdict: Verdict, applied: bool, record: dict[str, Any], rows: list[str],
                 bad_layers: list[str], guard: Guard | None, events: EventLog, model: Any, optimizer: Any,
                 scheduler: Any, scaler: Any) -> str | None:
        """Log the step's anomalies and apply the guard's verdict; returns the stop message, if any."""
        lr = record["lr"]
        for a in verdict.anomalies:
            events.add(step, "anomaly", a["cause"], a["detail"], layer=a["layer"], rows=rows, lr=lr)
            if guard is not None:
                if guard.first_layer is None and a["layer"]:
                    guard.first_layer = a["layer"]
                guard.bad_rows.extend(r for r in rows if r not in guard.bad_rows)
                del guard.bad_rows[1000:]
        if not applied:
            cause = verdict.anomalies[0]["cause"] if verdict.anomalies else (
                "nonfinite_grad" if math.isfinite(record["loss"]) else "nonfinite_loss")
            detail = "optimizer step skipped (no update, no scheduler step)"
            if not verdict.anomalies and bad_layers:
                detail += f"; non-finite gradient in {', '.join(bad_layers)}"
            events.add(step, "skip", cause, detail, layer=bad_layers[0] if bad_layers else None, rows=rows, lr=lr)
        if guard is None:
            return None
        cause = verdict.anomalies[-1]["cause"] if verdict.anomalies else ""
        if verdict.stop:
            k = guard.k
            events.add(step, "stop", cause, f"{guard.rollbacks} rollbacks (max_rollbacks {k['max_rollbacks']}) "
                       f"did not stop the anomalies", layer=guard.first_layer, rows=guard.bad_rows, lr=lr)
            first = next((e for e in events.events if e["kind"] == "anomaly"), None)
            path = self.run_dir / "diagnosis.json"
            if events.path is not None:
                path = write_diagnosis(self.run_dir, first["step"] if first else step,
                                       first["cause"] if first else cause, guard.first_layer, guard.bad_rows,
                                       events.events)
            return (f"training diverged at step {step}: {cause} after {guard.rollbacks} rollback(s); first bad "
                    f"layer {guard.first_layer or 'unknown'}; diagnosis in {path}")
        if verdict.rollback:
            target = guard.roll_back(step, model, optimizer, scheduler, scaler)
            k = guard.k
            events.add(step, "rollback", cause,
                       f"restored the state of step {target}; lr x{guard.lr_scale:g}, clip max_norm "
                       f"{guard.clip_norm(step + 1):g} until step {guard.recover_until}, Adam moments reset; "
                       f"the batches since step {target} are not replayed",
                       layer=guard.first_layer, rows=rows, lr=lr * guard.lr_scale)
        return None

    def _check_resumable(self, latest: Path) -> None:
        """Refuse a resume whose settings would not continue the same run."""
        try:
            saved = json.loads((latest / "state.json").read_text()).get("config") or {}
        except (OSError, ValueError) as exc:
            raise TrainError(f"{latest}: unreadable state.json ({exc})") from None
        mine = self.cfg.to_dict()
        changed = [f"{k} {saved[k]!r} -> {mine.get(k)!r}" for k in RESUME_KEYS
                   if k in saved and saved[k] != mine.get(k)]
        if changed:
            raise TrainError(f"cannot resume {self.run_dir}: settings differ from its checkpoint "
                             f"({'; '.join(changed)}); use the same settings or a new output")

    # ----------------------------------------------------------------------- pieces
    def _loss(self, model: Any, batch: dict[str, torch.Tensor], offsets: torch.Tensor | None,
              class_weights: torch.Tensor | None) -> torch.Tensor:
        cfg = self.cfg
        out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
        if cfg.task == "sft":
            return causal_lm_loss(out.logits, batch["labels"], sample_weights=batch["sample_weight"])
        return logit_adjusted_cross_entropy(
            out.logits, batch["labels"], offsets=offsets if cfg.logit_adjustment else None,
            label_smoothing=cfg.label_smoothing, class_weights=class_weights, sample_weights=batch["sample_weight"])

    @torch.no_grad()
    def _evaluate(self, model: Any, val: Encoded, pad_id: int, offsets: torch.Tensor | None,
                  device: torch.device) -> dict[str, float]:
        """Unweighted validation loss and accuracy (classify: accuracy of the balanced
        prediction, post-hoc adjusted when the model was trained without the offsets)."""
        model.eval()
        cfg = self.cfg
        losses, correct, count = [], 0, 0
        per_class: dict[int, list[int]] = {}
        for start in range(0, len(val), cfg.batch_size):
            idx = list(range(start, min(start + cfg.batch_size, len(val))))
            batch = {k: v.to(device) for k, v in val.collate(idx, pad_id).items()}
            logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits.float()
            if cfg.task == "sft":
                losses.append((float(causal_lm_loss(logits, batch["labels"])), len(idx)))
                pred, gold = logits[:, :-1].argmax(-1), batch["labels"][:, 1:]
                mask = gold != IGNORE_INDEX
                correct += int((pred[mask] == gold[mask]).sum())
                count += int(mask.sum())
                continue
            losses.append((float(logit_adjusted_cross_entropy(logits, batch["labels"])), len(idx)))
            scored = logits
            if offsets is not None and not cfg.logit_adjustment:
                scored = posthoc_adjust(logits, offsets)
            pred = scored.argmax(-1)
            for p, g in zip(pred.tolist(), batch["labels"].tolist(), strict=True):
                per_class.setdefault(g, [0, 0])
                per_class[g][0] += int(p == g)
                per_class[g][1] += 1
                correct += int(p == g)
                count += 1
        n = sum(k for _, k in losses)
        out = {"loss": sum(v * k for v, k in losses) / max(n, 1), "accuracy": correct / max(count, 1)}
        if per_class:
            out["balanced_accuracy"] = float(np.mean([c / t for c, t in per_class.values()]))
        return out

    def _save(self, step: int, model: Any, tokenizer: Any, optimizer: Any, scheduler: Any, scaler: Any,
              sampler: CurriculumSampler, history: list[dict[str, Any]], label_map: LabelMap | None,
              skipped: int, best: dict[str, Any], gvs: GradVarianceScaler | None,
              guard_state: dict[str, Any] | None = None) -> Path:
        extra = {"skipped_steps": skipped, "best": dict(best),
                 "grad_variance": gvs.state_dict() if gvs is not None else None, **(guard_state or {})}
        try:
            return ckpt_mod.save_checkpoint(
                self.run_dir, step, model, optimizer, scheduler, scaler, sampler.state_dict(),
                ckpt_mod.capture_rng(), history, label_map.to_json() if label_map else None, self.cfg.to_dict(),
                tokenizer=tokenizer, extra=extra, keep=self.cfg.keep_checkpoints,
                protect=[best["checkpoint"]] if best.get("checkpoint") else [])
        except ckpt_mod.CheckpointError as exc:
            self._warn(str(exc))
            return ckpt_mod.latest_checkpoint(self.run_dir) or self.run_dir

    def _write_summary(self, groups: list[dict[str, Any]], lora: dict[str, Any] | None, split_source: str,
                       enc: Encoded, val: Encoded | None, total: int, warmup: int, max_length: int | None,
                       label_map: LabelMap | None) -> None:
        (self.run_dir / "param_groups.txt").write_text(describe_groups(groups) + "\n")
        summary = {"config": self.cfg.to_dict(), "total_steps": total, "warmup_steps": warmup,
                   "max_length": max_length, "train_examples": len(enc), "val_examples": len(val) if val else 0,
                   "split": split_source, "dropped": enc.dropped, "param_groups": groups_record(groups),
                   "lora": lora, "classes": len(label_map) if label_map else None, "notes": self.notes}
        (self.run_dir / "run.json").write_text(json.dumps(summary, indent=1, default=str) + "\n")


class _Metrics:
    """metrics.jsonl (one object per line) and, when asked and installed, TensorBoard."""

    def __init__(self, run_dir: Path, tensorboard: bool, *, resume_step: int,
                 warn: Callable[[str], None], enabled: bool = True) -> None:
        self.path = run_dir / "metrics.jsonl"
        self.fh: Any = None
        self.tb = None
        if not enabled:
            return
        if self.path.exists():  # drop what a killed run logged after its last checkpoint
            kept = [line for line in self.path.read_text().splitlines()
                    if line.strip() and json.loads(line).get("step", 0) <= resume_step]
            self.path.write_text("".join(line + "\n" for line in kept))
        self.fh = open(self.path, "a")  # noqa: SIM115 - closed in close()
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self.tb = SummaryWriter(str(run_dir / "tensorboard"), purge_step=resume_step + 1)
            except ImportError:
                warn("tensorboard is not installed; metrics go to metrics.jsonl only")

    def write(self, record: dict[str, Any]) -> None:
        if self.fh is None:
            return
        self.fh.write(json.dumps(record) + "\n")
        self.fh.flush()
        if self.tb is not None:
            for key, value in record.items():
                if key != "step" and isinstance(value, int | float) and not isinstance(value, bool):
                    self.tb.add_scalar(f"train/{key}" if not key.startswith("eval_") else f"eval/{key[5:]}",
                                       value, record["step"])

    def close(self) -> None:
        if self.fh is not None:
            self.fh.close()
        if self.tb is not None:
            self.tb.close()


def _row_ids(enc: Encoded, idx: list[int]) -> list[str]:
    """The data row ids of a micro-batch (every row of a pack)."""
    if enc.packed_rows is not None:
        return [r for i in idx for r in enc.packed_rows[i]]
    return [enc.row_ids[i] for i in idx]


def _lr_groups(optimizer: Any) -> dict[str, float]:
    """The lr each kind of parameter group used (first group of a kind)."""
    out: dict[str, float] = {}
    for g in optimizer.param_groups:
        out.setdefault(str(g.get("kind", "all")), float(g["lr"]))
    return out


def _release_accelerator_state(precision: str) -> None:
    """accelerate keeps one process-wide state; a second run in the same process (tests, a
    notebook) with another precision would be refused. Outside a distributed launch it is
    safe to drop and rebuild it."""
    from accelerate.state import AcceleratorState, PartialState
    from accelerate.utils import DistributedType

    if not AcceleratorState._shared_state:
        return
    wanted = {"fp32": "no", "bf16": "bf16", "fp16": "fp16"}[precision]
    state = AcceleratorState()
    if PartialState().distributed_type == DistributedType.NO and str(state.mixed_precision) != wanted:
        AcceleratorState._reset_state()


def _bar(total: int, start: int) -> Any:
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=start, desc="train", unit="step", dynamic_ncols=True)
