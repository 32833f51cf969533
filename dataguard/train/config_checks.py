"""Value checks of the ``train:`` settings: each takes (value, key path, locator) and returns
the value to keep or raises a ``ConfigError`` naming the file, line and key.

`dataguard.train.config` maps every setting to one of these (``CHECKS``); the defaults they
fill in (LoRA, guard) live here too.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dataguard.config import _Located

MODULE_TYPES = ("embeddings", "attention", "mlp", "norm", "other", "head")
BUILTIN_MODELS = ("tiny-causal-lm", "tiny-classifier", "minilm")
LORA_DEFAULTS: dict[str, Any] = {"r": 8, "alpha": 16, "dropout": 0.0,
                                 "targets": ["q_proj", "k_proj", "v_proj", "o_proj"]}


GUARD_DEFAULTS: dict[str, Any] = {
    "snapshot_every": 100, "anomaly_window": 100, "max_anomalies": 3, "max_rollbacks": 3, "zscore": 6.0,
    "zscore_window": 100, "weight_bound": 1e6, "lr_backoff": 0.5, "recovery_clip": 0.5, "recovery_steps": 1000}
FAULT_KINDS = ("nan_loss", "inf_loss", "nan_grad", "lr_spike", "garbage_batch")



def default_lr_multipliers() -> dict[str, float]:
    return {"embeddings": 0.1, "attention": 1.0, "mlp": 1.5, "other": 1.0, "head": 1.0}


def default_clip_rules() -> dict[str, dict[str, float]]:
    return {"embeddings": {"value": 0.5}, "attention": {"norm": 1.0}}


Path_ = tuple[Any, ...]
Check = Callable[[Any, Path_, _Located], Any]


# ------------------------------------------------------------------ value checks
def is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def is_num(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and v == v and abs(v) != float("inf")


def integer(minimum: int, optional: bool = False) -> Check:
    def check(v: Any, p: Path_, loc: _Located) -> Any:
        if v is None and optional:
            return None
        if not is_int(v) or v < minimum:
            what = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
            raise loc.error(p, f"must be {what}{' or null' if optional else ''}, got {v!r}")
        return v
    return check


def number(lo: float, hi: float | None = None, *, lo_open: bool = False, hi_open: bool = False) -> Check:
    def check(v: Any, p: Path_, loc: _Located) -> Any:
        ok = is_num(v) and (v > lo if lo_open else v >= lo) and (
            hi is None or (v < hi if hi_open else v <= hi))
        if not ok:
            if lo == 0 and lo_open and hi is None:
                raise loc.error(p, f"must be a positive number, got {v!r}")
            lo_s = f"{'>' if lo_open else '>='} {lo:g}"
            hi_s = "" if hi is None else f" and {'<' if hi_open else '<='} {hi:g}"
            raise loc.error(p, f"must be a number {lo_s}{hi_s}, got {v!r}")
        return float(v)
    return check


def boolean(v: Any, p: Path_, loc: _Located) -> Any:
    if not isinstance(v, bool):
        raise loc.error(p, f"must be true or false, got {v!r}")
    return v


def optional(inner: Check) -> Check:
    """``inner``, or null (the default applies)."""
    def check(v: Any, p: Path_, loc: _Located) -> Any:
        return None if v is None else inner(v, p, loc)
    return check


def choice(*options: str) -> Check:
    def check(v: Any, p: Path_, loc: _Located) -> Any:
        if v not in options:
            raise loc.error(p, f"must be one of {', '.join(options)}, got {v!r}")
        return v
    return check


def text(v: Any, p: Path_, loc: _Located) -> Any:
    if not isinstance(v, str) or not v.strip():
        raise loc.error(p, f"must be a non-empty path or name, got {v!r}")
    return v


def model_name(v: Any, p: Path_, loc: _Located) -> Any:
    text(v, p, loc)
    if v not in BUILTIN_MODELS and not Path(v).expanduser().is_dir():
        raise loc.error(p, f"{v!r} is neither a built-in model ({', '.join(BUILTIN_MODELS)}) nor a local "
                           "Hugging Face model folder")
    return v


def mapping(v: Any, p: Path_, loc: _Located) -> dict[Any, Any]:
    if not isinstance(v, dict):
        raise loc.error(p, f"must be a mapping, got {v!r}")
    return v


def lr_multipliers(v: Any, p: Path_, loc: _Located) -> Any:
    out = default_lr_multipliers()
    for key, m in mapping(v, p, loc).items():
        if key not in MODULE_TYPES:
            raise loc.error(p + (key,), f"unknown module type (expected one of: {', '.join(MODULE_TYPES)})")
        out[key] = number(0.0)(m, p + (key,), loc)
    return out


def lr_patterns(v: Any, p: Path_, loc: _Located) -> Any:
    out = {}
    for key, m in mapping(v, p, loc).items():
        try:
            re.compile(str(key))
        except re.error as exc:
            raise loc.error(p + (key,), f"not a valid regular expression: {exc}") from None
        out[str(key)] = number(0.0)(m, p + (key,), loc)
    return out


def clip_rules(v: Any, p: Path_, loc: _Located) -> Any:
    out: dict[str, dict[str, float]] = {}
    for key, rule in mapping(v, p, loc).items():
        if key not in MODULE_TYPES:
            raise loc.error(p + (key,), f"unknown module type (expected one of: {', '.join(MODULE_TYPES)})")
        if rule is None:  # `embeddings: null` switches a default rule off
            continue
        rule = mapping(rule, p + (key,), loc)
        if len(rule) != 1 or next(iter(rule)) not in ("value", "norm"):
            raise loc.error(p + (key,), f"must be {{value: X}} or {{norm: X}}, got {rule!r}")
        kind, limit = next(iter(rule.items()))
        out[key] = {kind: number(0.0, lo_open=True)(limit, p + (key, kind), loc)}
    return out


def lora(v: Any, p: Path_, loc: _Located) -> Any:
    if v is None or v is False:
        return None
    if v is True:
        return copy.deepcopy(LORA_DEFAULTS)
    out = copy.deepcopy(LORA_DEFAULTS)
    for key, item in mapping(v, p, loc).items():
        here = p + (key,)
        if key not in LORA_DEFAULTS:
            raise loc.error(here, f"unknown key (expected one of: {', '.join(LORA_DEFAULTS)})")
        if key == "r":
            out[key] = integer(1)(item, here, loc)
        elif key == "alpha":
            out[key] = number(0.0, lo_open=True)(item, here, loc)
        elif key == "dropout":
            out[key] = number(0.0, 1.0, hi_open=True)(item, here, loc)
        else:
            if isinstance(item, str):
                item = [item]
            if not isinstance(item, list) or not item or not all(isinstance(t, str) and t for t in item):
                raise loc.error(here, f"must be a non-empty list of module names, got {item!r}")
            out[key] = list(item)
    return out


def boundaries(v: Any, p: Path_, loc: _Located) -> Any:
    if v is None:
        return None
    if (not isinstance(v, list) or not all(is_num(b) and 0 < b <= 1 for b in v)
            or any(a >= b for a, b in zip(v, v[1:], strict=False))):
        raise loc.error(p, f"must be increasing fractions in (0, 1], got {v!r}")
    return [float(b) for b in v]


def guard(v: Any, p: Path_, loc: _Located) -> Any:
    if v is None or v is False:
        return None
    out = copy.deepcopy(GUARD_DEFAULTS)
    if v is True:
        return out
    for key, item in mapping(v, p, loc).items():
        here = p + (key,)
        if key not in GUARD_DEFAULTS:
            raise loc.error(here, f"unknown key (expected one of: {', '.join(GUARD_DEFAULTS)})")
        if key in ("snapshot_every", "anomaly_window", "max_anomalies", "zscore_window"):
            out[key] = integer(1)(item, here, loc)
        elif key in ("max_rollbacks", "recovery_steps"):
            out[key] = integer(0)(item, here, loc)
        elif key == "lr_backoff":
            out[key] = number(0.0, 1.0, lo_open=True)(item, here, loc)
        else:
            out[key] = number(0.0, lo_open=True)(item, here, loc)
    return out


def faults(v: Any, p: Path_, loc: _Located) -> Any:
    if v is None:
        return []
    if not isinstance(v, list):
        raise loc.error(p, f"must be a list of {{step, kind}} mappings, got {v!r}")
    out = []
    for i, item in enumerate(v):
        here = p + (i,)
        item = mapping(item, here, loc)
        for key in item:
            if key not in ("step", "kind", "layer", "factor"):
                raise loc.error(here + (key,), "unknown key (expected one of: step, kind, layer, factor)")
        if "step" not in item or "kind" not in item:
            raise loc.error(here, "a fault needs step and kind")
        fault = {"step": integer(1)(item["step"], here + ("step",), loc),
                 "kind": choice(*FAULT_KINDS)(item["kind"], here + ("kind",), loc),
                 "layer": None, "factor": None}
        if item.get("layer") is not None:
            fault["layer"] = text(item["layer"], here + ("layer",), loc)
        if item.get("factor") is not None:
            fault["factor"] = number(0.0, lo_open=True)(item["factor"], here + ("factor",), loc)
        out.append(fault)
    return out
