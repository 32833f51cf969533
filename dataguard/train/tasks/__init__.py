"""Training tasks by the name a train config gives (``task: sft``): what differs between
supervised fine-tuning and classification lives in one class per task (`Task`), so the loop,
the data, model and report code ask the task instead of testing its name.

Entries are import paths, as in the stage registry: reading a config (which checks the name)
must not import torch. Adding a task is a module here with a `Task` subclass and a line in
`TASK_PATHS` (CONTRIBUTING.md, "How to add a training task").
"""

from __future__ import annotations

import importlib
from functools import cache
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dataguard.train.tasks.base import Task

TASK_PATHS: dict[str, str] = {
    "sft": "dataguard.train.tasks.sft:SFTTask",
    "classify": "dataguard.train.tasks.classify:ClassifyTask",
    "dpo": "dataguard.train.tasks.dpo:DPOTask",
}
TASK_NAMES: tuple[str, ...] = tuple(TASK_PATHS)
# Tasks whose examples are token streams that `packing` can concatenate. A name set, not a
# class attribute, because the train config checks it before torch is imported.
PACKING_TASKS: frozenset[str] = frozenset({"sft"})
# Tasks whose reference model is the base with the LoRA adapter switched off: they need `lora`.
ADAPTER_REFERENCE_TASKS: frozenset[str] = frozenset({"dpo"})


@cache
def get_task(name: str) -> Task:
    """The task registered under ``name`` (one shared, stateless instance); a ValueError
    naming the known tasks otherwise."""
    if name not in TASK_PATHS:
        raise ValueError(f"unknown task {name!r}; known: {', '.join(TASK_NAMES)}")
    module_name, _, attr = TASK_PATHS[name].partition(":")
    return getattr(importlib.import_module(module_name), attr)()
