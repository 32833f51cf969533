"""What the nested ``train:`` settings may be, declared with `dataguard.params` constraints,
and the defaults they fill in (LoRA, guard, learning-rate multipliers, clipping rules).

`dataguard.train.config` declares the top-level keys (``CONSTRAINTS``) from these; the one
generic checker (`dataguard.config_yaml.Located.checked`) reports any problem at the file,
line and key path (``train.lora.r``, ``faults[0].kind``) and cleans the value (numbers as
floats, a section's defaults filled in).
"""

from __future__ import annotations

from typing import Any

from dataguard.params import Allowed, Folder, Interval, ListOf, MapOf, OneKey, Options, Pattern, Section, Text

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


# Ceilings: far beyond any real run, low enough that nothing downstream overflows (torch's
# seed is a 64-bit integer, libgomp allocates per thread, C longs hold step counts, and an
# Adam step with lr 1e300 is inf). Named in a message only to a value they concern.
MAX_COUNT = 10**9
MAX_SEED = 2**63 - 1
MAX_THREADS = 4096
MAX_LR = 10.0


def count(low: int = 1, ceiling: int = MAX_COUNT) -> Interval:
    """A count of steps, rows or items: an integer >= ``low`` up to a ceiling."""
    return Interval(int, low, ceiling=ceiling)


POSITIVE = Interval(float, 0, closed="right")  # > 0
NON_NEGATIVE = Interval(float, 0)
BELOW_ONE = Interval(float, 0, 1, closed="left")  # [0, 1): a ratio, a smoothing
MODEL: Allowed = [Options(*BUILTIN_MODELS), Folder("a local Hugging Face model folder")]

LORA = Section(
    fields={"r": [count()], "alpha": [POSITIVE], "dropout": [BELOW_ONE],
            "targets": [ListOf(Text(), min_len=1, lone=True)],
            "quantize": [Options("none", "4bit", False)]},
    defaults=LORA_DEFAULTS, switch=True,
    unset={"quantize": ("none", False)})  # absent means none, so older runs' settings still match

_GUARD_COUNTS = {"snapshot_every", "anomaly_window", "max_anomalies", "zscore_window", "verify_steps",
                 "fp16_skips_in_a_row"}


def _guard_field(key: str) -> Allowed:
    if key in _GUARD_COUNTS:
        return [count()]
    if key in ("max_rollbacks", "recovery_steps"):
        return [count(0)]
    if key == "lr_backoff":
        return [Interval(float, 0, 1, closed="right")]
    return [POSITIVE]


GUARD = Section(
    fields={**{key: _guard_field(key) for key in GUARD_DEFAULTS},
            "snapshot_in": [Options("auto", "memory", "disk")]},  # optional (absent: auto), as older runs
    defaults=GUARD_DEFAULTS, switch=True)

FAULT = Section(
    fields={"step": [count()], "kind": [Options(*FAULT_KINDS)], "layer": [Text(blank=False), None],
            "factor": [POSITIVE, None]},
    required=("step", "kind"), defaults={"layer": None, "factor": None})

LR_MULTIPLIERS = Section(  # the defaults' order first: the order the parameter groups are built in
    fields={key: [NON_NEGATIVE] for key in [*default_lr_multipliers(), *MODULE_TYPES]},
    defaults=default_lr_multipliers())
LR_PATTERNS = MapOf(Pattern(), NON_NEGATIVE)
# `embeddings: null` switches a default rule off
CLIP_RULES = MapOf(Options(*MODULE_TYPES), (OneKey(("value", "norm"), POSITIVE), None))
BOUNDARIES = ListOf(Interval(float, 0, 1, closed="right"), increasing=True)
