"""The ``train:`` settings, validated like the pipeline config (file:line:key errors).

A config is either a standalone YAML file of train keys, or a pipeline YAML with a
``train:`` section (then ``data`` defaults to the pipeline's ``output``). Every problem is
one `dataguard.config.ConfigError` such as ``p.yaml:12: train.lr: must be a positive
number, got -1``. Unknown keys are listed with the accepted ones. Relative paths are kept
as written (taken from the working directory, like the pipeline's).
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from dataguard.config import ConfigError, _Located, load_yaml_document

MODULE_TYPES = ("embeddings", "attention", "mlp", "norm", "other", "head")
BUILTIN_MODELS = ("tiny-causal-lm", "tiny-classifier", "minilm")
LORA_DEFAULTS: dict[str, Any] = {"r": 8, "alpha": 16, "dropout": 0.0,
                                 "targets": ["q_proj", "k_proj", "v_proj", "o_proj"]}


GUARD_DEFAULTS: dict[str, Any] = {
    "snapshot_every": 100, "anomaly_window": 100, "max_anomalies": 3, "max_rollbacks": 3, "zscore": 6.0,
    "zscore_window": 100, "weight_bound": 1e6, "lr_backoff": 0.5, "recovery_clip": 0.5, "recovery_steps": 1000}
FAULT_KINDS = ("nan_loss", "inf_loss", "nan_grad", "lr_spike", "garbage_batch")


def _default_lr_multipliers() -> dict[str, float]:
    return {"embeddings": 0.1, "attention": 1.0, "mlp": 1.5, "other": 1.0, "head": 1.0}


def _default_clip_rules() -> dict[str, dict[str, float]]:
    return {"embeddings": {"value": 0.5}, "attention": {"norm": 1.0}}


@dataclass
class TrainConfig:
    """Every setting of a training run; defaults are the issue's (seeded) stability defaults."""

    task: str
    model: str
    data: str
    output: str
    seed: int = 0
    threads: int | None = None  # CPU math threads for this run; None leaves torch's default
    device: str = "auto"
    precision: str = "fp32"
    batch_size: int = 8
    grad_accum: int = 1
    max_steps: int | None = None
    epochs: int = 1
    lr: float = 2e-5
    weight_decay: float = 0.01
    warmup_ratio: float = 0.1
    warmup_steps: int | None = None
    min_lr: float = 0.0
    lr_multipliers: dict[str, float] = field(default_factory=_default_lr_multipliers)
    lr_patterns: dict[str, float] = field(default_factory=dict)
    max_grad_norm: float = 1.0
    clip_rules: dict[str, dict[str, float]] = field(default_factory=_default_clip_rules)
    label_smoothing: float = 0.1
    logit_adjustment: bool = True
    class_balanced: bool = False
    curriculum: bool = True
    curriculum_unit: str | None = None  # None: the manifest's unit (steps unless it says epochs)
    curriculum_boundaries: list[float] | None = None  # None: the manifest's boundaries
    lora: dict[str, Any] | None = None
    gradient_checkpointing: bool = False
    max_length: int | None = None
    packing: bool = False
    eval_every: int = 50
    eval_fraction: float = 0.1
    early_stopping_patience: int | None = None
    save_every: int = 100
    keep_checkpoints: int = 2
    log_every: int = 10
    tensorboard: bool = True
    grad_variance_scaling: bool = False
    monitor_every: int = 10
    histogram_every: int = 1000
    guard: dict[str, Any] | None = field(default_factory=lambda: copy.deepcopy(GUARD_DEFAULTS))
    faults: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able copy, recorded in the run folder."""
        return copy.deepcopy(asdict(self))


Path_ = tuple[Any, ...]
Check = Callable[[Any, Path_, _Located], Any]


# ------------------------------------------------------------------ value checks
def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and v == v and abs(v) != float("inf")


def _int(minimum: int, optional: bool = False) -> Check:
    def check(v: Any, p: Path_, loc: _Located) -> Any:
        if v is None and optional:
            return None
        if not _is_int(v) or v < minimum:
            what = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
            raise loc.error(p, f"must be {what}{' or null' if optional else ''}, got {v!r}")
        return v
    return check


def _num(lo: float, hi: float | None = None, *, lo_open: bool = False, hi_open: bool = False) -> Check:
    def check(v: Any, p: Path_, loc: _Located) -> Any:
        ok = _is_num(v) and (v > lo if lo_open else v >= lo) and (
            hi is None or (v < hi if hi_open else v <= hi))
        if not ok:
            if lo == 0 and lo_open and hi is None:
                raise loc.error(p, f"must be a positive number, got {v!r}")
            lo_s = f"{'>' if lo_open else '>='} {lo:g}"
            hi_s = "" if hi is None else f" and {'<' if hi_open else '<='} {hi:g}"
            raise loc.error(p, f"must be a number {lo_s}{hi_s}, got {v!r}")
        return float(v)
    return check


def _bool(v: Any, p: Path_, loc: _Located) -> Any:
    if not isinstance(v, bool):
        raise loc.error(p, f"must be true or false, got {v!r}")
    return v


def _optional(inner: Check) -> Check:
    """``inner``, or null (the default applies)."""
    def check(v: Any, p: Path_, loc: _Located) -> Any:
        return None if v is None else inner(v, p, loc)
    return check


def _choice(*options: str) -> Check:
    def check(v: Any, p: Path_, loc: _Located) -> Any:
        if v not in options:
            raise loc.error(p, f"must be one of {', '.join(options)}, got {v!r}")
        return v
    return check


def _text(v: Any, p: Path_, loc: _Located) -> Any:
    if not isinstance(v, str) or not v.strip():
        raise loc.error(p, f"must be a non-empty path or name, got {v!r}")
    return v


def _model(v: Any, p: Path_, loc: _Located) -> Any:
    _text(v, p, loc)
    if v not in BUILTIN_MODELS and not Path(v).expanduser().is_dir():
        raise loc.error(p, f"{v!r} is neither a built-in model ({', '.join(BUILTIN_MODELS)}) nor a local "
                           "Hugging Face model folder")
    return v


def _mapping(v: Any, p: Path_, loc: _Located) -> dict[Any, Any]:
    if not isinstance(v, dict):
        raise loc.error(p, f"must be a mapping, got {v!r}")
    return v


def _lr_multipliers(v: Any, p: Path_, loc: _Located) -> Any:
    out = _default_lr_multipliers()
    for key, m in _mapping(v, p, loc).items():
        if key not in MODULE_TYPES:
            raise loc.error(p + (key,), f"unknown module type (expected one of: {', '.join(MODULE_TYPES)})")
        out[key] = _num(0.0)(m, p + (key,), loc)
    return out


def _lr_patterns(v: Any, p: Path_, loc: _Located) -> Any:
    out = {}
    for key, m in _mapping(v, p, loc).items():
        try:
            re.compile(str(key))
        except re.error as exc:
            raise loc.error(p + (key,), f"not a valid regular expression: {exc}") from None
        out[str(key)] = _num(0.0)(m, p + (key,), loc)
    return out


def _clip_rules(v: Any, p: Path_, loc: _Located) -> Any:
    out: dict[str, dict[str, float]] = {}
    for key, rule in _mapping(v, p, loc).items():
        if key not in MODULE_TYPES:
            raise loc.error(p + (key,), f"unknown module type (expected one of: {', '.join(MODULE_TYPES)})")
        if rule is None:  # `embeddings: null` switches a default rule off
            continue
        rule = _mapping(rule, p + (key,), loc)
        if len(rule) != 1 or next(iter(rule)) not in ("value", "norm"):
            raise loc.error(p + (key,), f"must be {{value: X}} or {{norm: X}}, got {rule!r}")
        kind, limit = next(iter(rule.items()))
        out[key] = {kind: _num(0.0, lo_open=True)(limit, p + (key, kind), loc)}
    return out


def _lora(v: Any, p: Path_, loc: _Located) -> Any:
    if v is None or v is False:
        return None
    if v is True:
        return copy.deepcopy(LORA_DEFAULTS)
    out = copy.deepcopy(LORA_DEFAULTS)
    for key, item in _mapping(v, p, loc).items():
        here = p + (key,)
        if key not in LORA_DEFAULTS:
            raise loc.error(here, f"unknown key (expected one of: {', '.join(LORA_DEFAULTS)})")
        if key == "r":
            out[key] = _int(1)(item, here, loc)
        elif key == "alpha":
            out[key] = _num(0.0, lo_open=True)(item, here, loc)
        elif key == "dropout":
            out[key] = _num(0.0, 1.0, hi_open=True)(item, here, loc)
        else:
            if isinstance(item, str):
                item = [item]
            if not isinstance(item, list) or not item or not all(isinstance(t, str) and t for t in item):
                raise loc.error(here, f"must be a non-empty list of module names, got {item!r}")
            out[key] = list(item)
    return out


def _boundaries(v: Any, p: Path_, loc: _Located) -> Any:
    if v is None:
        return None
    if (not isinstance(v, list) or not all(_is_num(b) and 0 < b <= 1 for b in v)
            or any(a >= b for a, b in zip(v, v[1:], strict=False))):
        raise loc.error(p, f"must be increasing fractions in (0, 1], got {v!r}")
    return [float(b) for b in v]


def _guard(v: Any, p: Path_, loc: _Located) -> Any:
    if v is None or v is False:
        return None
    out = copy.deepcopy(GUARD_DEFAULTS)
    if v is True:
        return out
    for key, item in _mapping(v, p, loc).items():
        here = p + (key,)
        if key not in GUARD_DEFAULTS:
            raise loc.error(here, f"unknown key (expected one of: {', '.join(GUARD_DEFAULTS)})")
        if key in ("snapshot_every", "anomaly_window", "max_anomalies", "zscore_window"):
            out[key] = _int(1)(item, here, loc)
        elif key in ("max_rollbacks", "recovery_steps"):
            out[key] = _int(0)(item, here, loc)
        elif key == "lr_backoff":
            out[key] = _num(0.0, 1.0, lo_open=True)(item, here, loc)
        else:
            out[key] = _num(0.0, lo_open=True)(item, here, loc)
    return out


def _faults(v: Any, p: Path_, loc: _Located) -> Any:
    if v is None:
        return []
    if not isinstance(v, list):
        raise loc.error(p, f"must be a list of {{step, kind}} mappings, got {v!r}")
    out = []
    for i, item in enumerate(v):
        here = p + (i,)
        item = _mapping(item, here, loc)
        for key in item:
            if key not in ("step", "kind", "layer", "factor"):
                raise loc.error(here + (key,), "unknown key (expected one of: step, kind, layer, factor)")
        if "step" not in item or "kind" not in item:
            raise loc.error(here, "a fault needs step and kind")
        fault = {"step": _int(1)(item["step"], here + ("step",), loc),
                 "kind": _choice(*FAULT_KINDS)(item["kind"], here + ("kind",), loc),
                 "layer": None, "factor": None}
        if item.get("layer") is not None:
            fault["layer"] = _text(item["layer"], here + ("layer",), loc)
        if item.get("factor") is not None:
            fault["factor"] = _num(0.0, lo_open=True)(item["factor"], here + ("factor",), loc)
        out.append(fault)
    return out


CHECKS: dict[str, Check] = {
    "task": _choice("sft", "classify"),
    "model": _model,
    "data": _text,
    "output": _text,
    "seed": _int(0),
    "threads": _int(1, optional=True),
    "device": _choice("auto", "cpu", "cuda"),
    "precision": _choice("fp32", "bf16", "fp16", "fp8"),
    "batch_size": _int(1),
    "grad_accum": _int(1),
    "max_steps": _int(1, optional=True),
    "epochs": _int(1),
    "lr": _num(0.0, lo_open=True),
    "weight_decay": _num(0.0),
    "warmup_ratio": _num(0.0, 1.0, hi_open=True),
    "warmup_steps": _int(0, optional=True),
    "min_lr": _num(0.0),
    "lr_multipliers": _lr_multipliers,
    "lr_patterns": _lr_patterns,
    "max_grad_norm": _num(0.0, lo_open=True),
    "clip_rules": _clip_rules,
    "label_smoothing": _num(0.0, 1.0, hi_open=True),
    "logit_adjustment": _bool,
    "class_balanced": _bool,
    "curriculum": _bool,
    "curriculum_unit": _optional(_choice("steps", "epochs")),
    "curriculum_boundaries": _boundaries,
    "lora": _lora,
    "gradient_checkpointing": _bool,
    "max_length": _int(1, optional=True),
    "packing": _bool,
    "eval_every": _int(1),
    "eval_fraction": _num(0.0, 1.0, hi_open=True),
    "early_stopping_patience": _int(1, optional=True),
    "save_every": _int(1),
    "keep_checkpoints": _int(1),
    "log_every": _int(1),
    "tensorboard": _bool,
    "grad_variance_scaling": _bool,
    "monitor_every": _int(1),
    "histogram_every": _int(1),
    "guard": _guard,
    "faults": _faults,
}
REQUIRED = ("task", "model", "data")
assert set(CHECKS) == {f.name for f in fields(TrainConfig)}


# ------------------------------------------------------------------ loading
def _expand_dotted(overrides: dict[str, Any]) -> dict[str, Any]:
    """``{"lora.r": 4}`` -> ``{"lora": {"r": 4}}`` (split at the first dot only, so a
    regular expression in ``lr_patterns.<regex>`` keeps its dots)."""
    out: dict[str, Any] = {}
    for key, value in overrides.items():
        head, dot, rest = str(key).partition(".")
        if dot:
            nested = out.setdefault(head, {})
            if not isinstance(nested, dict):
                raise ConfigError(f"<override>: {key}: {head} is set both as a value and as a mapping")
            nested[rest] = value
        else:
            out[key] = value
    return out


def load_train_config(source: str | Path | dict[str, Any], *,
                      overrides: dict[str, Any] | None = None) -> TrainConfig:
    """A validated TrainConfig from a YAML file (standalone, or a pipeline YAML's ``train:``
    section) or a dict; ``overrides`` (e.g. from the command line, ``{"lr": 1e-4}``) win."""
    pipeline_output: Any = None
    if isinstance(source, dict):
        data: Any = source
        loc = _Located("<config>", None)
    else:
        path = Path(source)
        data, loc = load_yaml_document(path)
    if not isinstance(data, dict):
        raise loc.error((), "the train config must be a mapping of keys")
    prefix: Path_ = ()
    if "train" in data:
        pipeline_output = data.get("output")
        prefix = ("train",)
        data = data["train"]
        if not isinstance(data, dict):
            raise loc.error(prefix, f"must be a mapping of train settings, got {data!r}")
    elif "inputs" in data or "stages" in data:
        raise loc.error((), "a pipeline config without a train: section; add one (train: {task: ..., model: ...})")
    values = dict(data)
    overrides = _expand_dotted(overrides or {})
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(values.get(key), dict) and key != "lr_patterns":
            values[key] = {**values[key], **value}
        else:
            values[key] = value
    for key in values:
        if key not in CHECKS:
            where = loc if key in data else _Located("<override>", None)
            raise where.error(prefix + (key,), f"unknown key (expected one of: {', '.join(CHECKS)})")
    if "data" not in values and isinstance(pipeline_output, str):
        values["data"] = pipeline_output
    missing = [k for k in REQUIRED if k not in values]
    if missing:
        raise loc.error(prefix, f"missing required key{'s' if len(missing) > 1 else ''}: {', '.join(missing)}")
    if "output" not in values:
        values["output"] = str(values["data"]).rstrip("/") + "-train"
    checked: dict[str, Any] = {}
    for key, value in values.items():
        where = loc if key in data and not (overrides and key in overrides) else _Located("<override>", None)
        checked[key] = CHECKS[key](value, prefix + (key,), where)
    if checked.get("warmup_steps") is not None and checked.get("max_steps") is not None \
            and checked["warmup_steps"] > checked["max_steps"]:
        raise loc.error(prefix + ("warmup_steps",), f"must not exceed max_steps ({checked['max_steps']}), "
                                                   f"got {checked['warmup_steps']}")
    if checked.get("packing") and checked["task"] != "sft":
        raise loc.error(prefix + ("packing",), "packing applies to task sft only")
    return TrainConfig(**checked)
