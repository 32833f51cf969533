"""Validation of the drift stage's parameters: each error is a StageConfigError naming its parameter."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from dataguard.stage import StageConfigError
from dataguard.stages.drift.reference import TEXT_ROLES

CORRECTIONS = (None, "importance_weights", "resample")


def is_num(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and bool(np.isfinite(x))


def pair(name: str, value: Any, low: float, high: float) -> tuple[float, float]:
    """Two increasing numbers in (low, high]."""
    if (not isinstance(value, Sequence) or isinstance(value, str) or len(value) != 2
            or not all(is_num(v) for v in value) or not low < value[0] < value[1] <= high):
        raise StageConfigError(f"{name} must be two increasing numbers in ({low}, {high}], got {value!r}", param=name)
    return float(value[0]), float(value[1])


def names(name: str, value: Any) -> list[str]:
    if isinstance(value, str) or not isinstance(value, Sequence) or not all(isinstance(v, str) and v for v in value):
        raise StageConfigError(f"{name} must be a list of column names, got {value!r}", param=name)
    if len(set(value)) != len(value):
        raise StageConfigError(f"{name} lists a column twice: {list(value)!r}", param=name)
    return list(value)


def integer(name: str, value: Any, low: int, high: int | None = None) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < low or (high is not None and value > high):
        bound = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise StageConfigError(f"{name} must be an integer {bound}, got {value!r}", param=name)
    return value


def text_mode(value: Any) -> str | bool:
    if value is True:
        value = "prompt"
    if value is not False and value not in TEXT_ROLES:
        raise StageConfigError(f"text must be true, false or one of {sorted(TEXT_ROLES)}, got {value!r}", param="text")
    return value


def column_name(name: str, value: Any) -> str | None:
    if value is not None and (not isinstance(value, str) or not value):
        raise StageConfigError(f"{name} must be a column name or null, got {value!r}", param=name)
    return value


def check(p: dict[str, Any]) -> dict[str, Any]:
    """The checked, normalised parameters (see DriftStage for their meaning)."""
    out = dict(p)
    out["columns"] = names("columns", p["columns"])
    out["categorical"] = names("categorical", p["categorical"])
    both = sorted(set(out["columns"]) & set(out["categorical"]))
    if both:
        raise StageConfigError(f"columns and categorical overlap: {both}", param="categorical")
    out["text"] = text_mode(p["text"])
    out["bins"] = integer("bins", p["bins"], 2)
    if not is_num(p["epsilon"]) or not 0 < p["epsilon"] <= 0.01:
        raise StageConfigError(f"epsilon must be in (0, 0.01], got {p['epsilon']!r}", param="epsilon")
    out["epsilon"] = float(p["epsilon"])
    out["thresholds"] = pair("thresholds", p["thresholds"], 0.0, float("inf"))
    out["kl_thresholds"] = pair("kl_thresholds", p["kl_thresholds"], 0.0, float("inf"))
    out["auc_thresholds"] = pair("auc_thresholds", p["auc_thresholds"], 0.5, 1.0)
    out["mmd_thresholds"] = pair("mmd_thresholds", p["mmd_thresholds"], 0.0, 1.0)
    out["text_sample"] = integer("text_sample", p["text_sample"], 10)
    out["mmd_sample"] = integer("mmd_sample", p["mmd_sample"], 0, 5000)
    if 0 < out["mmd_sample"] < 10:
        raise StageConfigError(f"mmd_sample must be 0 (off) or an integer in [10, 5000], got {p['mmd_sample']!r}",
                               param="mmd_sample")
    out["mmd_permutations"] = integer("mmd_permutations", p["mmd_permutations"], 20, 10_000)
    if p["correct"] not in CORRECTIONS:
        raise StageConfigError(f"correct must be one of {CORRECTIONS}, got {p['correct']!r}", param="correct")
    if p["target"] is not None and p["target"] not in out["columns"] and p["target"] not in out["categorical"]:
        raise StageConfigError(f"target must be one of columns/categorical, got {p['target']!r}", param="target")
    out["weight_column"] = column_name("weight_column", p["weight_column"])
    out["label_column"] = column_name("label_column", p["label_column"])
    if not is_num(p["max_weight"]) or p["max_weight"] <= 1:
        raise StageConfigError(f"max_weight must be a number > 1, got {p['max_weight']!r}", param="max_weight")
    out["max_weight"] = float(p["max_weight"])
    if not isinstance(p["seed"], int) or isinstance(p["seed"], bool):
        raise StageConfigError(f"seed must be an integer, got {p['seed']!r}", param="seed")
    return out
