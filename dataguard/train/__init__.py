"""The bundled training runner: fine-tunes on what a pipeline wrote (shards + manifest.json).

It reads only the run folder and imports nothing from `dataguard.stages`. Modules:
`config` (the ``train:`` settings), `data` (shards -> tokenized examples, the weight rule),
`sampler` (seeded, resumable curriculum sampler), `losses` (logit-adjusted CE, causal LM),
`model`/`tiny` (loading, LoRA, parameter groups), `optim` (AdamW groups, schedule, clipping),
`checkpoint` (atomic save/load, rotation), `run_setup`/`prepare` (everything before the first
step), `loop` (the step loop), `evaluate`, `metrics_log`, `monitor`/`guard`/`respond`/`faults`
(detect, skip, roll back, stop; fault injection), `report*` (the training page), `convert`.
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
    "CurriculumSampler": "sampler",
    "Trainer": "loop", "evaluate": "evaluate", "build_training_report": "report",
    "logit_adjusted_cross_entropy": "losses", "posthoc_adjust": "losses", "causal_lm_loss": "losses",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'dataguard.train' has no attribute {name!r}")
    return getattr(importlib.import_module(f"dataguard.train.{module}"), name)
