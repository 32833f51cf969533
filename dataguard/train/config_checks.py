"""Value checks of the ``train:`` settings: each takes (value, key path, locator) and returns
the value to keep or raises a ``ConfigError`` naming the file, line and key.

`dataguard.train.config` maps every setting to one of these (``CHECKS``); the defaults they
fill in (LoRA, guard) live here too.
"""

from __future__ import annotations

import copy
import math
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dataguard.config_yaml import _Located

MODULE_TYPES = ("embeddings", "attention", "mlp", "norm", "other", "head")
BUILTIN_MODELS = ("tiny-causal-lm", "tiny-classifier", "minilm", "smollm2-135m")
LORA_DEFAULTS: dict[str, Any] = {"r": 8, "alpha": 16, "dropout": 0.0,
                                 "targets": ["q_proj", "k_proj", "v_proj", "o_proj"]}


GUARD_DEFAULTS: dict[str, Any] = {
    "snapshot_every": 10, "anomaly_window": 100, "max_anomalies": 3, "max_rollbacks": 3, "zscore": 6.0,
    "zscore_window": 20, "weight_bound": 1e6, "lr_backoff": 0.5, "recovery_clip": 0.5, "recovery_steps": 1000,
    "verify_steps": 10, "worse_than_best": 0.1, "fp16_skips_in_a_row": 8, "fp16_min_scale": 1.0}
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


# Ceilings: far beyond any real run, low enough that nothing downstream overflows (torch's
# seed is a 64-bit integer, libgomp allocates per thread, C longs hold step counts, and an
# Adam step with lr 1e300 is inf).
MAX_COUNT = 10**9
MAX_SEED = 2**63 - 1
MAX_THREADS = 4096
MAX_LR = 10.0

# A plain decimal number as text: YAML 1.1 (PyYAML) reads ``1e300`` and ``1.0e308`` (no dot,
# or an exponent without a sign) as strings, while YAML 1.2 and JSON read them as numbers.
_NUMERIC_TEXT = re.compile(r"[-+]?(\d[\d_]*)?(\.\d*)?([eE][-+]?\d+)?")
_EXPONENT_TEXT = re.compile(r"([-+]?\d+)(?:\.(\d*))?[eE]([-+]?)(\d+)")


def numeric_text(v: Any) -> float | None:
    """The number a string such as ``'1e300'`` spells (inf when too large for a float), or
    None when ``v`` is not such a string."""
    if not isinstance(v, str) or not _NUMERIC_TEXT.fullmatch(v.strip()) or not any(ch.isdigit() for ch in v):
        return None
    return float(v.strip().replace("_", ""))


def _yaml_number_hint(text: str) -> str:
    """How to write ``text`` so that YAML 1.1 reads a number: ``2e-5`` -> ``2.0e-5``."""
    m = _EXPONENT_TEXT.fullmatch(text.strip())
    if not m:
        return "it without quotes"
    whole, frac, sign, exp = m.groups()
    return f"{whole}.{frac or 0}e{sign or '+'}{exp}"


def _text_number_error(v: str, x: float, in_range: bool, what: str, p: Path_, loc: _Located) -> Exception:
    """The error for a number that YAML left as text: out of range says so (not "not a
    number"); in range says how to write it so that YAML reads a number."""
    if not in_range:
        return loc.error(p, f"must be {what}, got {v} (a number out of range)")
    return loc.error(p, f"must be {what}, got {v!r} (YAML reads it as text: write {_yaml_number_hint(v)})")


def integer(minimum: int, optional: bool = False, maximum: int = MAX_COUNT) -> Check:
    """An integer in [minimum, maximum] (or null when ``optional``)."""
    what = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
    bounded = f"a positive integer <= {maximum}" if minimum == 1 else f"an integer in [{minimum}, {maximum}]"
    null = " or null" if optional else ""

    def check(v: Any, p: Path_, loc: _Located) -> Any:
        if v is None and optional:
            return None
        if is_int(v) and minimum <= v <= maximum:
            return v
        if is_int(v) and v > maximum:
            raise loc.error(p, f"must be {bounded}{null}, got {v}")
        x = numeric_text(v)
        if x is not None and not minimum <= x <= maximum:
            raise loc.error(p, f"must be {bounded}{null}, got {v} (a number out of range)")
        if x is not None and x.is_integer():
            raise loc.error(p, f"must be {what}{null}, got {v!r} (YAML reads it as text: write {int(x)})")
        raise loc.error(p, f"must be {what}{null}, got {v!r}")
    return check


def number(lo: float, hi: float | None = None, *, lo_open: bool = False, hi_open: bool = False) -> Check:
    """A finite number within the bounds, kept as a float. Below the range the message is
    the short one (``a positive number``); above it, or as text, it names both bounds."""
    def inside(x: float) -> bool:
        return (x > lo if lo_open else x >= lo) and (hi is None or (x < hi if hi_open else x <= hi))

    hi_s = "" if hi is None else f"{'<' if hi_open else '<='} {hi:g}"
    if lo == 0 and lo_open:
        short = "a positive number"
        full = f"{short} {hi_s}".rstrip()
    else:
        full = short = f"a number {'>' if lo_open else '>='} {lo:g}" + (f" and {hi_s}" if hi_s else "")

    def check(v: Any, p: Path_, loc: _Located) -> Any:
        if is_num(v) and inside(v):
            return float(v)
        x = numeric_text(v)
        if x is not None:
            raise _text_number_error(v, x, math.isfinite(x) and inside(x), full, p, loc)
        above = isinstance(v, int | float) and not isinstance(v, bool) and hi is not None and v > hi
        raise loc.error(p, f"must be {full if above else short}, got {v!r}")
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
        if key not in LORA_DEFAULTS and key != "quantize":
            raise loc.error(here, f"unknown key (expected one of: {', '.join(LORA_DEFAULTS)}, quantize)")
        if key == "r":
            out[key] = integer(1)(item, here, loc)
        elif key == "alpha":
            out[key] = number(0.0, lo_open=True)(item, here, loc)
        elif key == "dropout":
            out[key] = number(0.0, 1.0, hi_open=True)(item, here, loc)
        elif key == "quantize":  # optional: absent means none, so older runs' settings still match
            value = choice("none", "4bit")(item if item is not False else "none", here, loc)
            if value != "none":
                out[key] = value
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
        if key not in GUARD_DEFAULTS and key != "snapshot_in":
            raise loc.error(here, f"unknown key (expected one of: {', '.join(GUARD_DEFAULTS)}, snapshot_in)")
        if key == "snapshot_in":  # optional (absent: auto), so older runs' settings still match
            out[key] = choice("auto", "memory", "disk")(item, here, loc)
        elif key in ("snapshot_every", "anomaly_window", "max_anomalies", "zscore_window", "verify_steps",
                   "fp16_skips_in_a_row"):
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
