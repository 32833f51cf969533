"""The ``train:`` settings, validated like the pipeline config (file:line:key errors).

A config is either a standalone YAML file of train keys, or a pipeline YAML with a
``train:`` section (then ``data`` defaults to the pipeline's ``output``). Every problem is
one `dataguard.config.ConfigError` such as ``p.yaml:12: train.lr: must be a positive
number, got -1``; so is a bad value in the ``manifest.json`` of an existing ``data``
folder (`dataguard.train.data.manifest_schema`). Unknown keys are listed with the accepted ones.
What each key may be is declared in ``CONSTRAINTS`` (`dataguard.params`, as a stage declares
its parameters); only the checks that relate two keys live in `load_train_config`.
Relative paths are kept as written (taken from the working directory, like the pipeline's).
"""

from __future__ import annotations

import copy
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from dataguard.config_yaml import ConfigError, _Located, load_yaml_document
from dataguard.params import FLAG, Allowed, Interval, ListOf, Options, Text
from dataguard.train import config_checks as C
from dataguard.train.config_checks import GUARD_DEFAULTS
from dataguard.train.data.manifest_schema import preflight
from dataguard.train.errors import TrainDataError
from dataguard.train.tasks import ADAPTER_REFERENCE_TASKS, PACKING_TASKS, TASK_NAMES

Path_ = tuple[Any, ...]  # a key path such as ("train", "lora", "r")


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
    lr_multipliers: dict[str, float] = field(default_factory=C.default_lr_multipliers)
    lr_patterns: dict[str, float] = field(default_factory=dict)
    max_grad_norm: float = 1.0
    clip_rules: dict[str, dict[str, float]] = field(default_factory=C.default_clip_rules)
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
    # training dynamics per row, RUN/dynamics.arrow (issue #27; dataguard/train/dynamics*.py)
    dynamics: bool = True
    dynamics_pass: str = "auto"  # auto | train (the step's own forward) | eval (an extra pass per evaluation)
    threshold_rows: int = 0  # classify: 1 or 2 trains that set of rows under a fake class (Pleiss et al.)
    dpo_beta: float = 0.1  # task dpo: the temperature of the preference loss (TRL's beta)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able copy, recorded in the run folder."""
        return copy.deepcopy(asdict(self))


# What each setting may be (`dataguard.params`, as a stage's ``constraints``); the defaults are
# the TrainConfig fields above, and tests/test_defaults_checked.py holds them to these.
CONSTRAINTS: dict[str, Allowed] = {
    "task": [Options(*TASK_NAMES)],
    "model": C.MODEL,
    "data": [Text(blank=False)],
    "output": [Text(blank=False)],
    "seed": [C.count(0, C.MAX_SEED)],
    "threads": [C.count(1, C.MAX_THREADS), None],
    "device": [Options("auto", "cpu", "cuda")],
    "precision": [Options("fp32", "bf16", "fp16", "fp8")],
    "batch_size": [C.count()],
    "grad_accum": [C.count()],
    "max_steps": [C.count(), None],
    "epochs": [C.count()],
    "lr": [Interval(float, 0, closed="right", ceiling=C.MAX_LR)],
    "weight_decay": [C.NON_NEGATIVE],
    "warmup_ratio": [C.BELOW_ONE],
    "warmup_steps": [C.count(0), None],
    "min_lr": [Interval(float, 0, ceiling=C.MAX_LR)],
    "lr_multipliers": [C.LR_MULTIPLIERS],
    "lr_patterns": [C.LR_PATTERNS],
    "max_grad_norm": [C.POSITIVE],
    "clip_rules": [C.CLIP_RULES],
    "label_smoothing": [C.BELOW_ONE],
    "logit_adjustment": FLAG,
    "class_balanced": FLAG,
    "curriculum": FLAG,
    "curriculum_unit": [Options("steps", "epochs"), None],
    "curriculum_boundaries": [C.BOUNDARIES, None],
    "lora": [C.LORA, None],
    "gradient_checkpointing": FLAG,
    "max_length": [C.count(), None],
    "packing": FLAG,
    "eval_every": [C.count()],
    "eval_fraction": [C.BELOW_ONE],
    "early_stopping_patience": [C.count(), None],
    "save_every": [C.count()],
    "keep_checkpoints": [C.count()],
    "log_every": [C.count()],
    "tensorboard": FLAG,
    "grad_variance_scaling": FLAG,
    "monitor_every": [C.count()],
    "histogram_every": [C.count()],
    "guard": [C.GUARD, None],
    "faults": [ListOf(C.FAULT), None],  # null: none (an empty `faults:` with its items commented out)
    "dynamics": FLAG,
    "dynamics_pass": [Options("auto", "train", "eval")],
    "threshold_rows": [C.count(0, 2)],
    "dpo_beta": [C.POSITIVE],
}
REQUIRED = ("task", "model", "data")
assert set(CONSTRAINTS) == {f.name for f in fields(TrainConfig)}


def checked_setting(key: str, value: Any, path: Path_, loc: _Located) -> Any:
    """``value`` of setting ``key`` as kept (cleaned), or the ConfigError at ``path``'s line."""
    out = loc.checked(path, CONSTRAINTS[key], value)
    return [] if key == "faults" and out is None else out


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
        if key not in CONSTRAINTS:
            where = loc if key in data else _Located("<override>", None)
            raise where.error(prefix + (key,), f"unknown key (expected one of: {', '.join(CONSTRAINTS)})")
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
        checked[key] = checked_setting(key, value, prefix + (key,), where)
    if checked.get("warmup_steps") is not None and checked.get("max_steps") is not None \
            and checked["warmup_steps"] > checked["max_steps"]:
        raise loc.error(prefix + ("warmup_steps",), f"must not exceed max_steps ({checked['max_steps']}), "
                                                   f"got {checked['warmup_steps']}")
    if checked.get("min_lr", 0.0) > checked.get("lr", TrainConfig.lr):
        raise loc.error(prefix + ("min_lr",), f"must not exceed lr ({checked.get('lr', TrainConfig.lr):g}), "
                                              f"got {checked['min_lr']:g}")
    if checked["task"] in ADAPTER_REFERENCE_TASKS and not checked.get("lora"):
        raise loc.error(prefix + ("task",), f"task {checked['task']} needs lora: (its reference model is the base "
                                            "with the adapter switched off)")
    if checked.get("precision") == "fp8" and checked.get("lora"):
        raise loc.error(prefix + ("precision",), "fp8 does not combine with lora (torchao would convert the "
                                                 "adapters' base layers under peft); use bf16 with LoRA")
    if checked.get("packing") and checked["task"] not in PACKING_TASKS:
        raise loc.error(prefix + ("packing",), f"packing applies to task {', '.join(sorted(PACKING_TASKS))} only")
    if checked.get("threshold_rows"):
        if checked["task"] != "classify":
            raise loc.error(prefix + ("threshold_rows",), "applies to task classify only (the rows get a fake class)")
        if checked.get("dynamics") is False:
            raise loc.error(prefix + ("threshold_rows",), "needs dynamics: true (the rows' AUM is what it learns "
                                                         "the cut from)")
    _check_manifest(checked["data"])
    return TrainConfig(**checked)


def _check_manifest(data: str) -> None:
    """The run folder's manifest.json against its typed schema, now: a hand-edited or
    foreign manifest is refused like a bad config (one line naming manifest.json and the key
    path), not minutes later inside training. A folder not made yet is checked when opened."""
    try:
        preflight(data)
    except TrainDataError as exc:
        raise ConfigError(str(exc)) from None
