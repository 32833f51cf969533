"""The bundled training runner: fine-tunes on what a pipeline wrote (shards + manifest.json).

It reads only the run folder and imports nothing from `dataguard.stages`. At the top:
`config` (the ``train:`` settings, declared with `dataguard.params` constraints; its nested
sections and defaults in `config_checks`), `loop` (the step loop),
`checkpoint` (atomic save/load, rotation, verification), `run_setup`/`prepare` (everything
before the first step), `step` (one optimizer step), `evaluate`, `convert`, `rng`, `errors`.
Sub-packages by job: `tasks` (what differs per task: sft, classify, dpo), `data` (shards ->
examples, the weight rule, the sampler), `model` (loading, dtype, LoRA, groups), `optim`
(losses, the lean forward, optimizer and clipping), `stability` (monitor, guard, faults),
`report` (metrics, events, the training page), `dynamics` (per-row training dynamics).
Names are imported lazily so that reading a config does not import torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "TrainConfig": "config", "load_train_config": "config",
    "RunShards": "data", "Encoded": "data", "LabelMap": "data", "TrainDataError": "data",
    "encode_sft": "data", "encode_classify": "data", "length_cap": "data", "split_validation": "data",
    "run_split": "data",
    "CurriculumSampler": "data.sampler",
    "Trainer": "loop", "evaluate": "evaluate", "build_training_report": "report.page",
    "logit_adjusted_cross_entropy": "optim.losses", "posthoc_adjust": "optim.losses", "causal_lm_loss": "optim.losses",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'dataguard.train' has no attribute {name!r}")
    return getattr(importlib.import_module(f"dataguard.train.{module}"), name)
