"""The drift stage's parameters: what each may be (``CONSTRAINTS``, checked generically
before ``__init__``), the rules between them and their normalised values (``check``, a
`DriftSettings` the stage holds and hands to the helpers that read its settings)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from dataguard.embed.settings import CONSTRAINTS as EMBEDDER
from dataguard.params import OPTIONAL_NAME, Allowed, Interval, ListOf, Options, Satisfies, Text
from dataguard.stage import StageConfigError
from dataguard.stages.drift.reference import TEXT_ROLES

CORRECTIONS = (None, "importance_weights", "resample")


def _pair(low: float, high: float | None) -> list[Satisfies]:
    """Two increasing numbers in (low, high]."""
    bound = Interval(float, low, high, closed="right")

    def ok(value: Any) -> bool:
        return ListOf(bound, min_len=2, max_len=2).ok(value) and value[0] < value[1]

    return [Satisfies(ok, f"two increasing numbers in ({low:g}, {'inf' if high is None else f'{high:g}'}]")]


_COLUMNS = [ListOf(Text(), unique=True)]

CONSTRAINTS: dict[str, Allowed] = {
    "reference": [Satisfies(lambda v: isinstance(v, pa.Table | str | Path | Mapping),
                            "a path, an input mapping or a table")],
    "columns": _COLUMNS,
    "categorical": _COLUMNS,
    "text": [Options(True, False, *sorted(TEXT_ROLES))],
    "bins": [Interval(int, 2)],
    "epsilon": [Interval(float, 0, 0.01, closed="right")],
    "thresholds": _pair(0.0, None),
    "kl_thresholds": _pair(0.0, None),
    "auc_thresholds": _pair(0.5, 1.0),
    "mmd_thresholds": _pair(0.0, 1.0),
    "mmd_sample": [Options(0), Interval(int, 10, 5000)],
    "mmd_permutations": [Interval(int, 20, 10_000)],
    "text_sample": [Interval(int, 10)],
    "correct": [Options(*CORRECTIONS)],
    "target": OPTIONAL_NAME,
    "max_weight": [Interval(float, 1, closed="neither")],
    "weight_column": OPTIONAL_NAME,
    "label_column": OPTIONAL_NAME,
    "seed": [Interval(int)],
    "backend": EMBEDDER["backend"],
    "max_seq_length": EMBEDDER["max_seq_length"],
}


@dataclass(frozen=True)
class DriftSettings:
    """Every parameter but the reference, normalised (see DriftStage for their meaning)."""

    columns: tuple[str, ...]
    categorical: tuple[str, ...]
    text: str | bool
    bins: int
    epsilon: float
    thresholds: tuple[float, float]
    kl_thresholds: tuple[float, float]
    auc_thresholds: tuple[float, float]
    mmd_thresholds: tuple[float, float]
    mmd_sample: int
    mmd_permutations: int
    text_sample: int
    correct: str | None
    target: str | None
    max_weight: float
    weight_column: str | None
    label_column: str | None
    seed: int
    backend: str
    max_seq_length: int | None


def check(p: dict[str, Any]) -> DriftSettings:
    """The normalised parameters, after the rules that relate them; each error names its
    parameter."""
    out = dict(p)
    out["columns"], out["categorical"] = tuple(p["columns"]), tuple(p["categorical"])
    both = sorted(set(out["columns"]) & set(out["categorical"]))
    if both:
        raise StageConfigError(f"columns and categorical overlap: {both}", param="categorical")
    out["text"] = "prompt" if p["text"] is True else p["text"]
    out["epsilon"] = float(p["epsilon"])
    for name in ("thresholds", "kl_thresholds", "auc_thresholds", "mmd_thresholds"):
        out[name] = (float(p[name][0]), float(p[name][1]))
    if p["target"] is not None and p["target"] not in out["columns"] and p["target"] not in out["categorical"]:
        raise StageConfigError(f"target must be one of columns/categorical, got {p['target']!r}", param="target")
    out["max_weight"] = float(p["max_weight"])
    return DriftSettings(**out)
