"""Setting up a run: the checks made before any work, the thread count, the resume check,
encoding the split, class tensors, the accelerator, run.json."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import fields
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import torch

from dataguard.io.safe_files import write_atomic
from dataguard.train.config import TrainConfig
from dataguard.train.config_checks import BUILTIN_MODELS
from dataguard.train.data import (
    Encoded,
    LabelMap,
    RunShards,
    TrainDataError,
    class_vector,
    pack,
)
from dataguard.train.data.shards import data_changed
from dataguard.train.data.token_cache import cache_key, cached_encoding
from dataguard.train.errors import TrainError
from dataguard.train.model.base_dtype import BaseDtypeError, check_quantize
from dataguard.train.model.build import check_model, describe_groups, groups_record
from dataguard.train.tasks import get_task

# Settings that decide the schedule, the data order or the parameters: a resume must keep them.
RESUME_KEYS = ("task", "model", "data", "seed", "precision", "batch_size", "grad_accum", "max_steps", "epochs",
               "lr", "warmup_ratio", "warmup_steps", "min_lr", "lr_multipliers", "lr_patterns", "lora",
               "max_length", "packing", "eval_fraction", "curriculum", "curriculum_unit", "curriculum_boundaries",
               "threshold_rows")

Warn = Callable[[str], None]
PATH_KEYS = ("data", "output", "model")  # recorded absolute; compared as paths on resume


def absolute_paths(cfg: TrainConfig) -> None:
    """Make ``data``, ``output`` and a model folder absolute, in place: the settings saved in
    run.json and each checkpoint then name the same folders from any working directory, so
    `dataguard train RUN --resume` works wherever it is typed."""
    cfg.data = os.path.abspath(os.path.expanduser(cfg.data))
    cfg.output = os.path.abspath(os.path.expanduser(cfg.output))
    if cfg.model not in BUILTIN_MODELS and Path(cfg.model).expanduser().is_dir():
        cfg.model = os.path.abspath(os.path.expanduser(cfg.model))


def preflight(cfg: TrainConfig) -> None:
    """The cheap refusals (device, precision, model folder), before shards are read or
    tokenized: a wrong setting costs a second, not the encoding of the whole run."""
    on_cpu = check_device(cfg)
    if cfg.precision == "fp8":
        check_fp8(cfg, on_cpu)
    try:
        check_quantize(cfg.lora, on_cpu=on_cpu, task=cfg.task)
    except BaseDtypeError as exc:
        raise TrainError(str(exc)) from None
    check_model(cfg.task, cfg.model)


def check_device(cfg: TrainConfig) -> bool:
    """Refuse a device / precision this machine cannot run; True when the run is on CPU."""
    cuda = torch.cuda.is_available()
    if cfg.device == "cuda" and not cuda:
        raise TrainError("device: cuda, but torch sees no CUDA device (use device: auto or cpu)")
    on_cpu = cfg.device == "cpu" or (cfg.device == "auto" and not cuda)
    if cfg.precision == "fp16" and on_cpu:
        raise TrainError("precision fp16 needs a CUDA device (use bf16 or fp32 on CPU)")
    return on_cpu


CPUINFO = Path("/proc/cpuinfo")  # a test points it elsewhere
BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")


def cpu_lacks_bf16() -> bool:
    """True when this CPU has no bf16 instructions, so torch emulates bf16 matmuls: measured
    on such a CPU, MiniLM trained at ~20 tokens/s in bf16 against ~420 in fp32. False when
    the CPU has them or cannot be read (no warning beats a wrong one)."""
    try:
        flags = next((line.split(":", 1)[1].split() for line in CPUINFO.read_text().splitlines()
                      if line.startswith("flags")), None)
    except OSError:
        return False
    return flags is not None and not any(flag in flags for flag in BF16_CPU_FLAGS)


# ---------------------------------------------------------------------------- threads
CGROUP_ROOT = Path("/sys/fs/cgroup")  # cgroup v2 (a test points it elsewhere)


def usable_cpus() -> int:
    """The CPUs this process may use: its affinity mask, capped by a cgroup v2 CPU quota
    (a container's `--cpus 2` on a 64-core host leaves 64 CPUs in the mask)."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cpus = os.cpu_count() or 1
    quota = cgroup_cpu_quota()
    return max(1, min(cpus, quota) if quota is not None else cpus)


def cgroup_cpu_quota() -> int | None:
    """Whole CPUs allowed by ``cpu.max`` of this process's cgroup or any parent (the
    smallest), or None when no quota is set or cgroup v2 is not mounted."""
    folder = CGROUP_ROOT / _own_cgroup().lstrip("/")
    limits: list[int] = []
    for probe in (folder, *folder.parents):
        try:
            quota, period = (probe / "cpu.max").read_text().split()[:2]
            if quota != "max":
                limits.append(max(1, int(int(quota) / int(period))))
        except (OSError, ValueError):
            pass
        if probe == CGROUP_ROOT:
            break
    return min(limits) if limits else None


def _own_cgroup() -> str:
    """This process's cgroup v2 path (``0::/...`` in /proc/self/cgroup), or ``/``."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return "/"
    return next((line.split("::", 1)[1].strip() for line in lines if line.startswith("0::")), "/")


def choose_threads(cfg: TrainConfig, run_dir: Path, resume: bool) -> dict[str, Any]:
    """The CPU math threads of this run and why (recorded in run.json).

    torch's default is every core of the machine, whatever this process may use: on a loaded
    2-core box or in a CPU-limited container it oversubscribes and a step gets several times
    slower. Unset ``threads`` therefore takes the usable CPUs divided by the processes of
    this machine (``LOCAL_WORLD_SIZE`` under torchrun / accelerate). Float sums may round
    differently with another count, so a resumed run keeps the count its run.json recorded.
    """
    if cfg.threads is not None:
        return {"count": cfg.threads, "from": "config"}
    if resume:
        try:
            saved = json.loads((run_dir / "run.json").read_text()).get("threads") or {}
            if isinstance(saved.get("count"), int) and saved["count"] >= 1:
                return {"count": saved["count"], "from": "resumed run"}
        except (OSError, ValueError, AttributeError):
            pass
    try:
        local = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    except ValueError:
        local = 1
    cpus = usable_cpus()
    return {"count": max(1, cpus // local),
            "from": f"{cpus} usable CPU{'s' * (cpus > 1)} / {local} local process{'es' * (local > 1)}"}


def check_resumable(cfg: TrainConfig, run_dir: Path, latest: Path, manifest: dict[str, Any]) -> None:
    """Refuse a resume whose settings or data (the shards and what the runner reads from their
    ``manifest``) would not continue the same run: the sampler's position indexes rows, so
    other rows would mix two datasets in one run without a word."""
    try:
        state = json.loads((latest / "state.json").read_text())
    except (OSError, ValueError) as exc:
        raise TrainError(f"{latest}: unreadable state.json ({exc})") from None
    saved = state.get("config") or {}
    if data_changed(state, manifest):  # None: an older checkpoint recorded nothing to compare
        raise TrainError(f"cannot resume {run_dir}: the shards in {cfg.data} changed since {latest.name} was saved "
                         "(other rows, or other class priors, offsets, curriculum or length cap from another pipeline run); "
                         "train into a new output")
    changed = changed_settings(saved, cfg)
    if changed:
        raise TrainError(f"cannot resume {run_dir}: settings differ from its checkpoint "
                         f"({'; '.join(changed)}); use the same settings or a new output")


# settings that change where and how a run is written or watched, not the model it trains
RUN_ONLY_KEYS = frozenset({"output", "threads", "device", "save_every", "keep_checkpoints", "log_every",
                           "tensorboard", "monitor_every", "histogram_every", "gradient_checkpointing"})


def model_keys() -> tuple[str, ...]:
    """Every setting that changes the trained model (all but `RUN_ONLY_KEYS`): what a finished
    run must match to stand for a config (`dataguard.loop_rounds.training_state`)."""
    return tuple(f.name for f in fields(TrainConfig) if f.name not in RUN_ONLY_KEYS)


def changed_settings(saved: dict[str, Any], cfg: TrainConfig, keys: Sequence[str] = RESUME_KEYS) -> list[str]:
    """``key old -> new`` for each setting a checkpoint's ``saved`` config differs from
    ``cfg`` in, among ``keys`` (by default those a run cannot change midway, `RESUME_KEYS`;
    paths compared as paths; a key the checkpoint predates is not compared)."""
    mine = cfg.to_dict()
    return [f"{k} {saved[k]!r} -> {mine.get(k)!r}" for k in keys
            if k in saved and saved[k] != mine.get(k) and not _same_path(k, saved[k], mine.get(k))]


def _same_path(key: str, saved: Any, mine: Any) -> bool:
    """A run saved before paths were recorded absolute names the same folder relative to here."""
    return (key in PATH_KEYS and isinstance(saved, str) and isinstance(mine, str)
            and os.path.abspath(os.path.expanduser(saved)) == os.path.abspath(os.path.expanduser(mine)))


def encode_split(cfg: TrainConfig, run: RunShards, tokenizer: Any, label_map: LabelMap | None,
                 train_idx: np.ndarray, val_idx: np.ndarray, warn: Warn, *, cache_dir: Path | None = None,
                 note: Callable[[str], None] | None = None,
                 context: int | None = None) -> tuple[Encoded, Encoded | None, int | None]:
    """(training examples, validation examples or None, max_length) of the split.

    ``cache_dir`` (the run's ``token_cache``): encode once into memory-mapped Arrow and reuse
    it on resume and in every process (`dataguard.train.data.token_cache`). ``context``: the
    model's context length, the cut for SFT rows when neither ``max_length`` nor a length
    stage gives one."""
    kind = get_task(cfg.task)
    max_length = kind.max_length(cfg.max_length, run.manifest, tokenizer, warn, context)

    def encode(table: pa.Table) -> Encoded:
        return kind.encode(table, tokenizer, max_length=max_length, label_map=label_map,
                           allow_empty=cache_dir is not None)

    def split(name: str, idx: np.ndarray) -> Encoded:
        if cache_dir is None or not kind.token_cache:
            return encode(run.table.take(idx))
        key = cache_key(task=cfg.task, manifest=run.manifest, indices=idx, tokenizer=tokenizer,
                        max_length=max_length, classes=label_map.classes if label_map is not None else None)
        enc = cached_encoding(cache_dir / key, name, lambda: run.table.take(idx), encode, cfg.task, note)
        if not len(enc):
            raise TrainDataError(f"no {kind.row_noun} row left to train on (dropped: {enc.dropped})")
        return enc

    train = split("train", train_idx)
    if cfg.packing:  # the config allows it only for PACKING_TASKS
        train = pack(train, max_length)
    val = encode_val(lambda: split("val", val_idx), len(val_idx), warn)
    return train, val, max_length


def encode_val(encode: Callable[[], Encoded], n_rows: int, warn: Warn) -> Encoded | None:
    """The validation examples, or None (with a note) when no row survives encoding."""
    if not n_rows:
        return None
    try:
        return encode()
    except TrainDataError as exc:
        warn(f"no validation: {exc}")
        return None


def class_tensors(cfg: TrainConfig, run: RunShards, label_map: LabelMap, enc: Encoded, device: torch.device,
                  warn: Warn) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(logit offsets, class weights) in label-map order, on ``device``."""
    offsets = class_vector(run.training, label_map, "logit_offsets")
    off = (torch.tensor([math.nan if v is None else float(v) for v in offsets], device=device)
           if offsets is not None else None)
    weights = None
    if cfg.class_balanced:
        cw = class_vector(run.training, label_map, "class_weights")
        if cw is None:  # no longtail stage: inverse frequency of the training rows, mean 1
            counts = np.bincount(np.asarray(enc.class_ids), minlength=len(label_map)).astype(np.float64)
            inv = np.where(counts > 0, 1.0 / np.maximum(counts, 1), 0.0)
            cw = list(inv * (counts > 0).sum() / max(inv.sum(), 1e-12))
        weights = torch.tensor([1.0 if v is None else float(v) for v in cw], dtype=torch.float32, device=device)
    if cfg.logit_adjustment and off is None:
        warn("logit_adjustment is on but the manifest has no logit offsets (no longtail stage); "
             "training with plain cross-entropy")
    return off, weights


MIXED_PRECISION = {"fp32": "no", "bf16": "bf16", "fp16": "fp16", "fp8": "fp8"}
FP8_MIN_CAPABILITY = (8, 9)  # Ada / Hopper and newer have FP8 tensor cores


def fp8_recipe(cfg: TrainConfig, on_cpu: bool) -> Any:
    """accelerate's torchao FP8 recipe, after checking that this run can use it (`check_fp8`).

    torchao swaps the model's inner ``nn.Linear`` layers (both dimensions divisible by 16;
    the first and the last one stay in high precision) for float8 training layers with
    dynamic scaling.
    """
    check_fp8(cfg, on_cpu)
    from accelerate.utils import AORecipeKwargs
    from torchao.float8 import Float8LinearConfig

    # plain weight tensors: the float8 all-gather wrapper (an FSDP2 optimisation) would replace
    # the parameters the optimizer already holds, and safetensors cannot save it.
    # pad_inner_dim: FP8 GEMMs need inner dimensions that are multiples of 16, and the weight
    # gradient's inner dimension is the micro-batch's token count (rows x padded width, any
    # number): torchao pads it with zeros, which adds nothing to the sums (pytorch/ao#3111)
    return AORecipeKwargs(config=Float8LinearConfig(enable_fsdp_float8_all_gather=False, pad_inner_dim=True))


def check_fp8(cfg: TrainConfig, on_cpu: bool) -> None:
    """Refuse fp8 without torchao, with LoRA, or on a GPU without FP8 units (older than
    compute capability 8.9: refused rather than silently emulated); on CPU it runs emulated
    (useful to test a configuration, never faster) with a warning."""
    try:  # (dataguard/__init__.py quiets torchao's kernel-load warnings)
        import torchao.float8  # noqa: F401
    except ImportError:
        raise TrainError("precision fp8 needs torchao (pip install torchao)") from None
    if cfg.lora:
        raise TrainError("precision fp8 does not combine with lora (torchao would convert the adapters' "
                         "base layers under peft); use bf16 with LoRA")
    if not on_cpu:  # on CPU it runs emulated; setup_run says so
        major, minor = torch.cuda.get_device_capability()
        if (major, minor) < FP8_MIN_CAPABILITY:
            raise TrainError(f"precision fp8 needs a GPU with compute capability >= 8.9 (H100, L4, RTX 40xx); "
                             f"this one has {major}.{minor}: use bf16")


def fp8_layers(model: torch.nn.Module) -> tuple[int, int]:
    """(linear layers training in float8, all linear layers) after ``accelerator.prepare``."""
    linear = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    return sum(type(m).__name__ == "Float8Linear" for m in linear), len(linear)


def make_accelerator(cfg: TrainConfig) -> Any:
    """The `accelerate.Accelerator` for ``cfg.device`` / ``cfg.precision`` / ``cfg.grad_accum``."""
    from accelerate import Accelerator
    from accelerate.utils import GradScalerKwargs

    on_cpu = check_device(cfg)
    release_accelerator_state(cfg.precision)
    handlers: list[Any] = []
    if cfg.precision == "fp16":
        handlers = [GradScalerKwargs(init_scale=2.0 ** 16, growth_interval=2000)]
    elif cfg.precision == "fp8":
        handlers = [fp8_recipe(cfg, on_cpu)]
    accelerator = Accelerator(mixed_precision=MIXED_PRECISION[cfg.precision],
                              gradient_accumulation_steps=cfg.grad_accum, cpu=on_cpu, kwargs_handlers=handlers)
    check_distributed_type(str(accelerator.distributed_type))
    return accelerator


SHARDED = ("FSDP", "DEEPSPEED", "MEGATRON_LM")


def check_distributed_type(kind: str) -> None:
    """Refuse sharded training (FSDP, DeepSpeed ZeRO, Megatron) in one line: a checkpoint here
    holds each process's whole optimizer state and the guard snapshots whole tensors, neither
    of which a shard has, so a resume or a rollback would silently lose state."""
    name = kind.rsplit(".", 1)[-1].upper()
    if name in SHARDED:
        raise TrainError(f"{name} (sharded training) is not supported: checkpoints and guard snapshots hold whole "
                         "tensors; launch DDP instead (accelerate launch --multi_gpu, or torchrun), with LoRA or "
                         "lora.quantize: 4bit when the model does not fit one GPU")


def release_accelerator_state(precision: str) -> None:
    """accelerate keeps one process-wide state; a second run in the same process (tests, a
    notebook) with another precision would be refused. Outside a distributed launch it is
    safe to drop and rebuild it."""
    from accelerate.state import AcceleratorState, PartialState
    from accelerate.utils import DistributedType

    if not AcceleratorState._shared_state:
        return
    wanted = MIXED_PRECISION[precision]
    state = AcceleratorState()
    if PartialState().distributed_type == DistributedType.NO and str(state.mixed_precision) != wanted:
        AcceleratorState._reset_state()


def write_summary(run_dir: Path, cfg: TrainConfig, notes: list[str], groups: list[dict[str, Any]],
                  lora: dict[str, Any] | None, split_source: str, enc: Encoded, val: Encoded | None, total: int,
                  warmup: int, max_length: int | None, label_map: LabelMap | None, processes: int = 1,
                  threads: dict[str, Any] | None = None, manifest: dict[str, Any] | None = None) -> None:
    """``param_groups.txt`` and ``run.json`` (the settings, sizes, split, threads and notes of
    the run, and the names and sha256 of the input files its shards came from, which the data
    side checks before it reads the run's verdicts by row id: `dataguard.run.trained_inputs`)."""
    from dataguard.run.trained_inputs import recorded_inputs

    write_atomic(run_dir / "param_groups.txt", describe_groups(groups) + "\n")
    summary = {"config": cfg.to_dict(), "total_steps": total, "warmup_steps": warmup,
               "max_length": max_length, "processes": processes, "threads": threads, "train_examples": len(enc), "val_examples": len(val) if val else 0,
               "split": split_source, "dropped": enc.dropped,
               "folded_system": int(getattr(enc, "folded_system", 0)), "param_groups": groups_record(groups),
               "lora": lora, "classes": len(label_map) if label_map else None, "notes": notes,
               "inputs": recorded_inputs(manifest or {})}
    write_atomic(run_dir / "run.json", json.dumps(summary, indent=1, default=str) + "\n")
