"""Building a run before its first step: seeds, data, model, optimizer, accelerator, resumed state.

`setup_run` does, in order, everything `Trainer.fit` does before its loop; the RNG states of a
resumed run are restored last, after every object is built, so that nothing draws from them
before training (exact resume).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dataguard.train import checkpoint as ckpt_mod
from dataguard.train.config import TrainConfig
from dataguard.train.data import Encoded, LabelMap, RunShards, curriculum_schedule, curriculum_unit, run_split
from dataguard.train.data.sampler import CurriculumSampler, steps_per_epoch
from dataguard.train.data.threshold_rows import THRESHOLD_CLASS, add_threshold_class, relabel_threshold_rows
from dataguard.train.data.token_cache import FOLDER as TOKEN_CACHE
from dataguard.train.errors import TrainError
from dataguard.train.model.base_dtype import base_dtype, quantization_config
from dataguard.train.model.build import (
    apply_lora,
    describe_groups,
    enable_gradient_checkpointing,
    kind_params,
    load_model,
)
from dataguard.train.optim.optimizer import (
    GradVarianceScaler,
    build_optimizer,
    warmup_cosine,
    warmup_steps_for,
)
from dataguard.train.prepare import (
    check_resumable,
    choose_threads,
    class_tensors,
    cpu_lacks_bf16,
    encode_split,
    fp8_layers,
    make_accelerator,
    preflight,
    write_summary,
)
from dataguard.train.report.metrics_log import MetricsLog
from dataguard.train.stability.faults import FaultPlan
from dataguard.train.stability.guard import EventLog, Guard, JsonlLog
from dataguard.train.stability.guard_resume import restore_guard
from dataguard.train.stability.monitor import Monitor
from dataguard.train.stability.snapshot_store import SpillFolder
from dataguard.train.state import RunState, Trainables
from dataguard.train.tasks import get_task
from dataguard.train.tasks.base import LossSettings


@dataclass
class RunSetup:
    """Everything the training loop starts from (``state``: step 0's counters, or the resumed
    checkpoint's); the trainer holds each field as an attribute of its own. ``model`` is
    accelerate's wrapper, which runs the forward; ``trainables.model`` is the unwrapped one."""

    accelerator: Any
    model: Any
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


def setup_run(cfg: TrainConfig, run_dir: Path, resume: bool, *, echo: Callable[[str], None],
              warn: Callable[[str], None], notes: list[str]) -> RunSetup:
    """Seed, open the run's shards, build model/data/optimizer/accelerator and load the newest
    checkpoint when resuming; ``notes`` (the warnings so far) go to ``run.json``."""
    preflight(cfg)  # device, precision, model folder: refused before any shard is read
    threads = choose_threads(cfg, run_dir, resume)  # usable CPUs / local processes; kept on resume
    torch.set_num_threads(threads["count"])
    torch.manual_seed(cfg.seed)
    np.random.seed(cfg.seed % 2 ** 32)
    import random

    random.seed(cfg.seed)
    run = RunShards.open(cfg.data, task=cfg.task)
    latest = ckpt_mod.latest_checkpoint(run_dir)
    if not resume and latest is not None:
        raise TrainError(f"{run_dir} already has checkpoints (newest {latest.name}); resume with "
                         "--resume, or choose another output")
    if resume and latest is not None:
        def note(line: str) -> None:
            echo(line)
            notes.append(line)

        latest, latest_verified = ckpt_mod.resume_checkpoint(run_dir, note)
        if latest is None:
            raise TrainError(f"{run_dir}: every checkpoint is damaged; nothing can be resumed safely "
                             "(start a new run in another folder)")
        newest = ckpt_mod.latest_checkpoint(run_dir)
        skipped = ""
        if newest is not None and newest != latest:  # a verified newer one was passed over as damaged
            skipped = f" (newer, {'damaged' if ckpt_mod.is_verified(newest) else 'not verified by the guard'}: " \
                      f"{newest.name})"
        note(f"resuming from {latest.name}, the newest "
             + ("verified checkpoint" + skipped if latest_verified
                else "intact checkpoint (none was verified by the guard yet)"))
    if resume and latest is not None:
        check_resumable(cfg, run_dir, latest, run.manifest)
    if resume and latest is None:
        echo(f"no complete checkpoint in {run_dir}; starting from step 0")
    run_dir.mkdir(parents=True, exist_ok=True)

    label_map = None
    if get_task(cfg.task).has_classes:
        label_map = LabelMap.from_run(run.table, run.training)
        if latest is not None and resume and (latest / "label_map.json").is_file():
            label_map = LabelMap.load(latest / "label_map.json")
        if cfg.threshold_rows:
            label_map = add_threshold_class(label_map)
    model, tokenizer = load_model(cfg.task, cfg.model, label_map=label_map, dtype=base_dtype(cfg.precision, cfg.lora),
                                  quantization=quantization_config(cfg.lora))
    lora_record = None
    if cfg.lora:
        model, lora_record = apply_lora(model, cfg.lora, cfg.task)
        for param in model.parameters():  # adapters and a new head train in fp32 over a bf16 base
            if param.requires_grad and param.dtype != torch.float32:
                param.data = param.data.float()
        echo(f"LoRA: {lora_record['trainable_params']:,} trainable of {lora_record['total_params']:,} "
                  f"parameters in {lora_record['wrapped_layers']} layers")
    if cfg.gradient_checkpointing:
        enable_gradient_checkpointing(model)

    train_idx, val_idx, split_source = run_split(run, cfg.eval_fraction, cfg.seed)
    enc, val, max_length = encode_split(
        cfg, run, tokenizer, label_map, train_idx, val_idx, warn, cache_dir=run_dir / TOKEN_CACHE, note=echo,
        context=getattr(getattr(model, "config", None), "max_position_embeddings", None))
    if cfg.threshold_rows and label_map is not None:
        fake = relabel_threshold_rows(enc, label_map, cfg.threshold_rows, cfg.seed)
        line = (f"threshold rows (set {cfg.threshold_rows}): {fake:,} of {len(enc):,} training rows train as "
                f"class {THRESHOLD_CLASS}, so the dynamics learn the noise stage's cut; a diagnostic run, its "
                "head has one extra output")
        echo(line)
        notes.append(line)
        if not fake:
            warn(f"threshold_rows: {len(enc):,} training rows are fewer than one per class plus one; no row trains "
                 "as the fake class, so the noise stage will learn its cut from the mixture")
    per_epoch = steps_per_epoch(int(np.sum(enc.repeat)), cfg.batch_size, cfg.grad_accum)
    total = cfg.max_steps or per_epoch * cfg.epochs
    # a schedule in epochs counts the epochs the run will actually make (max_steps wins)
    epochs = -(-total // per_epoch) if cfg.max_steps else cfg.epochs

    schedule = curriculum_schedule(run.training, label_map) if (cfg.curriculum and label_map) else None
    boundaries = cfg.curriculum_boundaries or (schedule[1] if schedule else None)
    sampler = CurriculumSampler(len(enc), repeat=enc.repeat,
                                class_ids=enc.class_ids if schedule else None,
                                phase_multipliers=schedule[0] if schedule else None, boundaries=boundaries,
                                total_steps=total, batch_size=cfg.batch_size, seed=cfg.seed,
                                unit=cfg.curriculum_unit or curriculum_unit(run.training),
                                grad_accum=cfg.grad_accum, epochs=epochs)

    optimizer, groups = build_optimizer(model, cfg)
    table = describe_groups(groups)
    echo("parameter groups:\n" + table)
    warmup = warmup_steps_for(total, cfg.warmup_ratio, cfg.warmup_steps)
    scheduler = warmup_cosine(optimizer, total, warmup, min_lr=cfg.min_lr, base_lr=cfg.lr)

    accelerator = make_accelerator(cfg)
    model, optimizer = accelerator.prepare(model, optimizer)
    scaler = accelerator.scaler
    device = accelerator.device
    raw_model = accelerator.unwrap_model(model)
    if cfg.precision == "fp8":
        converted, linear = fp8_layers(raw_model)
        if converted == 0:
            raise TrainError("precision fp8: no linear layer qualifies (both dimensions must be multiples of 16; "
                             "the first and the last stay in high precision): use bf16")
        note = f"fp8: {converted} of {linear} linear layers train in float8 (torchao, dynamic scaling)"
        echo(note)
        notes.append(note)
        if device.type == "cpu":
            warn("precision fp8 on CPU is emulated: it checks the configuration, it is not faster")
    if cfg.precision == "bf16" and device.type == "cpu" and cpu_lacks_bf16():
        warn("precision bf16 on this CPU is emulated (no avx512_bf16 / amx_bf16): expect it to be many times "
             "slower than fp32 (MiniLM measured ~20x); use fp32 on CPU unless the bf16 base is needed for memory")
    main = accelerator.is_main_process  # one writer of files under several processes
    rank, world = accelerator.process_index, accelerator.num_processes
    if world > cfg.batch_size:
        raise TrainError(f"batch_size {cfg.batch_size} is smaller than the {world} processes; each needs a row")
    kinds = kind_params(raw_model)
    offsets = class_weights = None
    if get_task(cfg.task).has_classes:
        offsets, class_weights = class_tensors(cfg, run, label_map, enc, device, warn)
        if cfg.threshold_rows and offsets is not None:
            offsets = None  # the fake class has no prior; AUM is read from plain cross-entropy, as Pleiss et al.
            line = "threshold_rows: the manifest's logit offsets are not applied (no prior for the fake class)"
            echo(line)
            notes.append(line)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    gvs = GradVarianceScaler() if cfg.grad_variance_scaling else None
    monitor = Monitor(raw_model)
    guard = Guard(cfg.guard, cfg.max_grad_norm, warmup_steps=warmup,
                  spill=SpillFolder(run_dir, rank) if device.type == "cpu" else None) if cfg.guard else None
    plan = FaultPlan(cfg.faults)
    for f in plan.faults:
        if f.kind == "nan_grad" and f.layer is not None and f.layer not in monitor.layers:
            raise TrainError(f"fault at step {f.step}: no layer {f.layer!r} (layers: {', '.join(monitor.names)})")
    vocab_size = int(getattr(raw_model.config, "vocab_size", 0) or 0) or 256

    parts = Trainables(raw_model, optimizer, scheduler, scaler)
    state = RunState(data=run.fingerprint)
    rng_state = None
    if resume and latest is not None:
        loaded = ckpt_mod.load_checkpoint(latest, raw_model, optimizer, scheduler, scaler)
        if loaded.sampler_state:
            sampler.load_state_dict(loaded.sampler_state)
        state.step, state.history, rng_state = loaded.step, list(loaded.history), loaded.rng
        state.skipped = int(loaded.extra.get("skipped_steps", 0))
        state.best.update(loaded.extra.get("best", {}))
        state.stopped_early = bool(loaded.extra.get("stopped_early"))  # a resume does not train past it
        state.saved = True
        if gvs is not None and loaded.extra.get("grad_variance"):
            gvs.load_state_dict(loaded.extra["grad_variance"])
        if guard is not None and loaded.extra.get("guard"):
            guard.load_state_dict(loaded.extra["guard"])
            restore_guard(guard.snapshots, loaded.extra["guard"], latest, run_dir, state.step, parts,
                          note=lambda line: (echo(line), notes.append(line)))
        plan.load_state_dict(loaded.extra.get("faults") or {})
        echo(f"resumed from {latest} at step {state.step}")
    step = state.step
    if main:
        write_summary(run_dir, cfg, notes, groups, lora_record, split_source, enc, val, total, warmup,
                      max_length, label_map, processes=world, threads=threads, manifest=run.manifest)
    metrics = MetricsLog(run_dir, cfg.tensorboard and main, resume_step=step, warn=warn, enabled=main,
                         total=total, log_every=cfg.log_every)
    resumed_at = step if resume and latest is not None else None
    events = EventLog(run_dir if main else None, resume_step=resumed_at)
    hists = JsonlLog(run_dir / "histograms.jsonl" if main else None, resume_step=resumed_at)
    if guard is not None and guard.snapshots.target is None:  # a fresh start (or an older checkpoint): verified
        guard.snapshots.take(step, parts, verified=True)
    if main and label_map is not None and not (run_dir / "label_map.json").exists():
        label_map.save(run_dir / "label_map.json")
    if rng_state is not None:
        ckpt_mod.restore_rng(rng_state)  # last: nothing after this may draw before training
    loss = LossSettings(offsets=offsets, logit_adjustment=cfg.logit_adjustment, label_smoothing=cfg.label_smoothing,
                        class_weights=class_weights, beta=cfg.dpo_beta)
    return RunSetup(accelerator=accelerator, model=model, trainables=parts, tokenizer=tokenizer, device=device,
                    main=main, rank=rank, world=world, kinds=kinds, latest=latest, label_map=label_map, enc=enc,
                    val=val, total=total, sampler=sampler, loss_settings=loss, pad_id=pad_id, gvs=gvs, monitor=monitor,
                    guard=guard, plan=plan, vocab_size=vocab_size, state=state, metrics=metrics, events=events,
                    hists=hists)
